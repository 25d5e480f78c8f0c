/* Writes received straight into folio memory (foliod/cache.h,
 * cache_write_prepare): the whole folios of a write are free slots that
 * the caller fills outside any lock; the commit swaps them into the index
 * under the window's stripes, in place of the folios cached there, whose
 * data they overwrite entirely.  Until then no one can see them: they are
 * in neither the index nor the LRU, and their bits are clear (a slot goes
 * free reset, and an abort leaves it so).
 *
 * The store must let slot memory hold data before the slot is indexed
 * (STORE_EARLY_DATA: the ram and ssd stores, not a mapped one).  A
 * durable store gets the protocol's order at the commit: set_index, the
 * data persisted, then the bits.  A store whose dropped slots wait for a
 * sync (STORE_REUSE_SYNC: the ssd log still holds the old folio's
 * records) keeps a folio cached at that number: the prepared data is
 * copied into it, as a write would, and the prepared slot goes back
 * free, never indexed. */
#include <errno.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

/* A prepare takes slots only while more than this share of the cache
 * stays free: prepared folios held by slow clients never take the room
 * that other requests need (they would have to evict for it). */
#define PREP_RESERVE_DIV 8u

static bool
prep_applies (const struct cache *c, uint64_t len)
{
  return c->cfg.mode == CACHE_WRITEBACK &&
         store_has (c->store, STORE_EARLY_DATA) && !use_direct (c, len, 0);
}

int
cache_write_prepare (struct cache *c, uint64_t len, uint64_t off,
                     struct cache_prep *p)
{
  uint64_t fsize = (uint64_t) 1 << c->folio_shift;

  p->n = 0;
  if (range_check (c, len, off) == -1 || writable_check (c) == -1 ||
      ledger_io_refused (c) == -1)
    return -1;
  uint64_t fa = folio_of (c, off + fsize - 1), fb = folio_of (c, off + len);
  if (!prep_applies (c, len) || fb <= fa || fb - fa > CACHE_PREP_MAX ||
      fb - fa > c->window || throttle_would_wait (c, len) ||
      !slots_take_free (c, (uint32_t) (fb - fa),
                        c->store->nslots / PREP_RESERVE_DIV, p->slot)) {
    errno = EAGAIN;
    return -1;
  }
  p->n = (unsigned) (fb - fa);
  p->edges_done = 0;
  p->off = folio_pos (c, fa);
  p->len = folio_pos (c, fb - fa);
  p->folio_size = fsize;
  for (unsigned i = 0; i < p->n; i++)
    p->data[i] = c->folios[p->slot[i]].data;
  return 0;
}

void
cache_write_abort (struct cache *c, struct cache_prep *p)
{
  if (p->n == 0)
    return;
  slots_give_back (c, p->n, p->slot);
  p->n = 0;
}

/* The prepared folio nf's data into old, cached at its number, as a
 * whole-folio write (STORE_REUSE_SYNC: old's slot may not go free yet). */
static void
prep_copy (struct cache *c, struct folio *old, const struct folio *nf)
{
  uint32_t bpf = c->blocks_per_folio;

  store_write (c->store, old->data, nf->data, (size_t) 1 << c->folio_shift);
  folio_set_uptodate (c, old, 0, bpf);
  folio_set_dirty (c, old, 0, bpf);
  folio_persist_bits (c, old);
}

/* Folio i of p takes the place of whatever is cached at its number (the
 * window's stripes held).  Last first, so that the slots set free go back
 * in the order that gives the next prepare consecutive memory. */
static int
prep_swap (struct cache *c, struct cache_prep *p, struct window *w)
{
  uint32_t bpf = c->blocks_per_folio;
  int r = 0;

  for (unsigned i = p->n; i-- > 0;) {
    struct folio *nf = &c->folios[p->slot[i]], *old = w->f[i];
    if (old != NULL && old->ra)
      ra_dropped (c, old);           /* readahead brought it, unread */
    if (old != NULL && store_has (c->store, STORE_REUSE_SYNC)) {
      prep_copy (c, old, nf);
      slots_give_back (c, 1, &p->slot[i]);   /* clear, never indexed */
      continue;
    }
    if (old != NULL)
      folio_drop (c, old, 0, bpf);   /* all of it is overwritten */
    if (folio_replace (c, old, nf, w->start + i) == -1) {
      slots_give_back (c, 1, &p->slot[i]);   /* its bits still clear */
      r = -1;                        /* ENOMEM: the others still go in */
      continue;
    }
    folio_persist_data (c, nf, 0, bpf);      /* after set_index */
    folio_set_uptodate (c, nf, 0, bpf);
    folio_set_dirty (c, nf, 0, bpf);
    folio_persist_bits (c, nf);
  }
  p->n = 0;
  return r;
}

/* The window of folios [start, end), none of them under writeback (the
 * swap frees the folios it replaces).  0, or -1/errno with nothing held. */
static int
prep_window (struct cache *c, struct window *w, uint64_t start, uint64_t end)
{
  for (;;) {
    if (window_begin (c, w, start, end, false) == -1)
      return -1;
    uint64_t busy = wb_window_busy (c, w);
    if (busy == UINT64_MAX)
      return 0;
    window_end (c, w);
    wb_wait_folio (c, busy);
  }
}

int
cache_write_commit (struct cache *c, struct cache_prep *p, unsigned flags)
{
  uint64_t fi = folio_of (c, p->off);
  struct window w;
  int r;

  if (flags & CACHE_NOWAIT) {
    if (throttle_would_wait (c, p->len) ||
        window_try_begin (c, &w, fi, fi + p->n, false) == -1) {
      errno = EAGAIN;
      return -1;
    }
    if (wb_window_busy (c, &w) != UINT64_MAX) {
      window_end (c, &w);
      errno = EAGAIN;
      return -1;
    }
  } else if (throttle_dirty (c, p->len) == -1 ||
             prep_window (c, &w, fi, fi + p->n) == -1) {
    int err = errno;
    cache_write_abort (c, p);
    errno = err;
    return -1;
  }
  r = prep_swap (c, p, &w);
  window_end (c, &w);
  if (r == -1) {
    errno = ENOMEM;
    return -1;
  }
  OPSTAT_ADD (c, client_write_bytes, p->len);
  return 0;
}
