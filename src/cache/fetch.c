/* Misses that hold no thread: the backing reads the request's range into
 * the caller's buffer asynchronously (cache_fetch), and once it has, the
 * caller puts what it got into the cache and answers from there
 * (cache_read_fetched).  The server parks a read miss so, instead of a
 * worker blocked for the remote's round trip (bench/remote-read: 5
 * context switches per miss that way, 2 this way).
 *
 * Coherence.  The data fetched is the backing's content at some moment
 * after the fetch started.  A block still missing when it is put into
 * the cache takes it only if the backing has not been written (write,
 * zero, trim: backing_gen) since the fetch started; else it is read
 * again, as cache_read would: a write acknowledged before the read was
 * sent, that reached the backing after the remote served the fetch and
 * whose folio was evicted since, would come back stale (in the reply and
 * in the cache).  Blocks the cache has (uptodate) are answered from the
 * cache, over the fetched bytes.  Only whole blocks go into the cache. */
#include <errno.h>
#include <string.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

int
cache_fetch (struct cache *c, void *buf, uint64_t len, uint64_t off,
             uint64_t *gen, void (*done) (void *opaque, int err),
             void *opaque)
{
  /* Not with a persistent store (a fill there persists data and bits in
   * an order fill_data knows), nor past the export's end (io_read's
   * zeroes), nor for what bypasses the cache. */
  if (!c->b->ops->read_async || c->persistent || len == 0 ||
      range_check (c, len, off) == -1 || off + len > c->b->size ||
      len > c->cfg.max_io_bytes || use_direct (c, len, 0)) {
    errno = ENOTSUP;
    return -1;
  }
  *gen = atomic_load (&c->backing_gen);
  if (c->b->ops->read_async (c->b, buf, len, off, done, opaque) == -1)
    return -1;
  STAT_ADD (c, backing_read_ops, 1);
  STAT_ADD (c, backing_read_bytes, len);
  return 0;
}

/* The step's blocks: missing ones from buf (if the backing is unchanged
 * since gen), then the whole step from the cache into buf. */
static int64_t
fetched_step (struct cache_iter *it, unsigned char *buf, uint64_t gen,
              bool *missed)
{
  struct cache *c = it->c;
  struct window *w = &it->w;
  uint64_t b = block_of (c, it->pos), end = block_of (c, it->step_end - 1) + 1;
  uint32_t bpf = c->blocks_per_folio;
  bool fresh = atomic_load (&c->backing_gen) == gen;

  while ((b = window_next (c, w, FP_UPTODATE, false, b, end)) < end) {
    uint64_t run_end = window_next (c, w, FP_UPTODATE, true, b, end);
    *missed = true;
    /* Written since: the fetched bytes may predate a write acknowledged
     * before this read was sent (written back and evicted since), so
     * they answer nothing: read again, as cache_read would. */
    if (!fresh) {
      if (it->flags & CI_NOWAIT) {
        errno = EAGAIN;
        return -1;
      }
      if (io_fill (it, b, run_end) == -1)
        return -1;
      b = run_end;
      continue;
    }
    for (; b < run_end; b++) {
      struct folio *f = w->f[b / bpf - w->start];
      uint32_t i = (uint32_t) (b % bpf);
      if (f == NULL || folio_block_dirty (c, f, i) ||
          block_pos (c, b) < it->start || block_pos (c, b + 1) > it->end)
        continue;               /* only whole blocks the fetch has */
      memcpy (f->data + block_pos (c, i), buf + (block_pos (c, b) - it->start),
              (size_t) 1 << c->block_shift);
      folio_set_uptodate (c, f, i, i + 1);
    }
    b = run_end;
  }
  /* What the cache has now (also what was just put in) is the answer;
   * blocks that stayed missing keep the fetched bytes. */
  for (uint64_t pos = it->pos; pos < it->step_end;) {
    uint64_t blk = block_of (c, pos);
    uint64_t next = block_pos (c, blk + 1) < it->step_end
                    ? block_pos (c, blk + 1) : it->step_end;
    struct folio *f = w->f[blk / bpf - w->start];
    if (f && folio_block_uptodate (c, f, (uint32_t) (blk % bpf)))
      memcpy (buf + (pos - it->start),
              f->data + (pos - folio_pos (c, folio_of (c, pos))), next - pos);
    pos = next;
  }
  return (int64_t) (it->step_end - it->pos);
}

int
cache_read_fetched (struct cache *c, void *buf, uint64_t len, uint64_t off,
                    uint64_t gen, unsigned flags)
{
  struct cache_iter it;
  bool missed = false, nowait = (flags & CACHE_NOWAIT) != 0;
  int r;

  if (range_check (c, len, off) == -1)
    return -1;
  cache_iter_init (&it, c, off, len, nowait ? CI_NOWAIT | CI_ALLOC : CI_ALLOC);
  while ((r = cache_iter_next (&it)) > 0)
    it.done = fetched_step (&it, buf, gen, &missed);
  if (r == 0) {
    STAT_ADD (c, read_ops, 1);
    STAT_ADD (c, client_read_bytes, len);
    if (missed) STAT_ADD (c, read_misses, 1);
    else STAT_ADD (c, read_hits, 1);
  }
  return r;
}
