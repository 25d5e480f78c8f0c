/* The folio map: the stripes (range locks), the stripe-guarded hash of
 * cached folios the hit path looks folios up in, and the waits on the
 * writeback mark.  See the lock order in cache-int.h.  It calls nothing
 * of the cache's: everyone above takes its locks and looks up here. */
#include <assert.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

pthread_mutex_t *
stripe_of (struct cache *c, uint64_t fi)
{
  return &c->stripes[fi % NSTRIPES].lock;
}

/* Call fn on each stripe of folios [start, end), in ascending stripe
 * order (the only order in which several stripes are taken).  At most a
 * window's worth: a longer range goes a window at a time (direct.c), so
 * no one ever holds the whole stripe table. */
static void
stripes_each (struct cache *c, uint64_t start, uint64_t end,
              void (*fn) (pthread_mutex_t *))
{
  uint64_t n = end - start;
  uint32_t s0 = start % NSTRIPES;

  assert (n <= WINDOW_MAX);
  if (s0 + n > NSTRIPES) { /* wraps: the low stripes come first */
    for (uint32_t s = 0; s < s0 + n - NSTRIPES; s++)
      fn (&c->stripes[s].lock);
    n = NSTRIPES - s0;
  }
  for (uint32_t s = s0; s < s0 + n; s++)
    fn (&c->stripes[s].lock);
}

static void
stripes_lock (struct cache *c, uint64_t start, uint64_t end)
{
  uint64_t n = end - start;
  uint32_t s0 = start % NSTRIPES;

  assert (n <= WINDOW_MAX);
  if (s0 + n > NSTRIPES) { /* wraps: the low stripes come first */
    for (uint32_t s = 0; s < s0 + n - NSTRIPES; s++)
      lock_counted (&c->stripes[s].lock, OPSTAT_PTR (c, lock_waits_stripe));
    n = NSTRIPES - s0;
  }
  for (uint32_t s = s0; s < s0 + n; s++)
    lock_counted (&c->stripes[s].lock, OPSTAT_PTR (c, lock_waits_stripe));
}

void
range_lock (struct cache *c, uint64_t start, uint64_t end)
{
  stripes_lock (c, start, end);
}

void
range_unlock (struct cache *c, uint64_t start, uint64_t end)
{
  stripes_each (c, start, end, unlock_or_die);
}

/* ---- the stripe-guarded hash of cached folios (c->buckets) ---- */

static struct folio **
bucket_of (struct cache *c, uint64_t fi)
{
  return &c->buckets[fi % NSTRIPES +
                     NSTRIPES * ((fi / NSTRIPES) &
                                 (c->buckets_per_stripe - 1))];
}

struct folio *
folio_lookup (struct cache *c, uint64_t fi)
{
  struct folio *f = *bucket_of (c, fi);

  while (f != NULL && f->index != fi)
    f = f->hnext;
  return f;
}

/* f (its index set) goes into or out of its bucket; its stripe held. */
void
bucket_add (struct cache *c, struct folio *f)
{
  struct folio **b = bucket_of (c, f->index);

  f->hnext = *b;
  *b = f;
}

void
bucket_del (struct cache *c, struct folio *f)
{
  struct folio **p = bucket_of (c, f->index);

  while (*p != f)
    p = &(*p)->hnext;
  *p = f->hnext;
  f->hnext = NULL;
}

/* ---- the writeback mark (f->writeback, set and cleared by writeback.c
 * under the stripe) ---- */

void
wb_wait_folio (struct cache *c, uint64_t fi)
{
  pthread_mutex_t *m = stripe_of (c, fi);
  struct folio *f;

  lock_or_die (m);
  /* Looked up again after every wait: once its writeback ended, the
   * folio may have been evicted and its slot may hold another folio
   * (of another stripe) under writeback.  The I/O is bounded by the
   * backing's timeouts; the wait rechecks every second all the same. */
  while ((f = folio_lookup (c, fi)) != NULL && f->writeback)
    cond_wait_ms (&c->stripes[fi % NSTRIPES].wb_done, m, 1000);
  unlock_or_die (m);
}

uint64_t
wb_window_busy (struct cache *c, const struct window *w)
{
  (void) c;
  for (uint64_t fi = w->start; fi < w->end; fi++) {
    const struct folio *f = w->f[fi - w->start];
    if (f != NULL && f->writeback)
      return fi;
  }
  return UINT64_MAX;
}
