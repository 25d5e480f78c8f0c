/* The cache's own state of a range, block by block (the foliod:cache
 * metadata context): cached, dirty, unstable.  What a FLUSH or a shutdown
 * would write is the dirty blocks; what a FLUSH would make the backing
 * keep is the unstable ones.
 *
 * A folio's bits are read under its stripe lock, as every writer changes
 * them; the index is searched under the index lock, so the answer is a
 * snapshot of each folio at the time it was looked at (the state of a
 * range can change as soon as the lock is dropped, as for any answer of
 * block status). */
#include "cache/cache-int.h"
#include "cache/ops.h"

struct state_emitter {
  cache_state_fn fn;
  void *opaque;
  uint64_t start, end;      /* pending extent, merged with like neighbours */
  uint32_t state;
  int stop;                 /* fn asked to stop */
};

static void
state_emit (struct state_emitter *e, uint64_t end, uint32_t state)
{
  if (end <= e->end)
    return;
  if (state != e->state) {
    if (!e->stop && e->end > e->start)
      e->stop = e->fn (e->opaque, e->start, e->end - e->start, e->state);
    e->start = e->end;
    e->state = state;
  }
  e->end = end;
}

static uint32_t
block_state (const struct cache *c, const struct folio *f, uint32_t blk)
{
  uint32_t s = 0;

  if (folio_test (c, f, FP_UPTODATE, blk))
    s |= CACHE_STATE_CACHED;
  if (folio_test (c, f, FP_DIRTY, blk))
    s |= CACHE_STATE_DIRTY;
  if (folio_test (c, f, FP_UNSTABLE, blk))
    s |= CACHE_STATE_UNSTABLE;
  return s;
}

int
cache_state_status (struct cache *c, uint64_t len, uint64_t off,
                    cache_state_fn fn, void *opaque)
{
  struct state_emitter e = { .fn = fn, .opaque = opaque, .start = off,
                             .end = off };
  uint64_t end = off + len;

  if (range_check (c, len, off) == -1)
    return -1;
  while (e.end < end && !e.stop) {
    uint64_t fi = folio_of (c, e.end);
    lock_or_die (&c->lock);
    struct folio *f = fidx_find (&c->index, &fi, folio_of (c, end - 1) + 1,
                                 false);
    unlock_or_die (&c->lock);
    if (f == NULL || folio_pos (c, fi) > e.end) {
      /* Not in the cache up to the next cached folio. */
      uint64_t next = f ? folio_pos (c, fi) : end;
      state_emit (&e, next < end ? next : end, 0);
      continue;
    }
    uint64_t fstart = folio_pos (c, fi);
    uint64_t fend = folio_pos (c, fi + 1) < end ? folio_pos (c, fi + 1) : end;
    pthread_mutex_t *m = stripe_of (c, fi);
    lock_or_die (m);
    lock_or_die (&c->lock);
    f = fidx_get (&c->index, fi);       /* evicted meanwhile? */
    unlock_or_die (&c->lock);
    while (e.end < fend) {
      uint32_t blk = (uint32_t) ((e.end - fstart) >> c->block_shift);
      uint64_t bend = fstart + block_pos (c, blk + 1);
      state_emit (&e, bend < fend ? bend : fend,
                  f ? block_state (c, f, blk) : 0);
    }
    unlock_or_die (m);
  }
  if (!e.stop && e.end > e.start)
    fn (opaque, e.start, e.end - e.start, e.state);
  return 0;
}
