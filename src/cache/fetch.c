/* Misses that hold no thread: the backing reads what the request misses
 * into the caller's buffer asynchronously (cache_fetch), and once it has,
 * the caller puts it into the cache and answers from there
 * (cache_read_fetched).  The server parks a read miss so, instead of a
 * worker blocked for the remote's round trip (bench/remote-read: 5
 * context switches per miss that way, 2 this way).
 *
 * The read rules hold as for cache_read (io_fill is the one front door):
 * the fetch covers only the blocks missing, rounded out to whole blocks
 * (so a sub-block read caches its block), and not the holes the backing's
 * map knows without asking the remote (they are zero-filled, not read;
 * where it does not know, the blocks are read as data: a hole reads as
 * zeroes); readahead is told of the read when the fetch starts (and its
 * fills ask the map, which the backing then knows).  A window that is busy
 * makes cache_fetch decline: the caller then reads on a thread that may
 * wait.
 *
 * Coherence.  The data fetched is the backing's content at some moment
 * after the fetch started.  A block still missing when it is put into
 * the cache takes it only if no backing write (write, zero, trim) touched
 * the fetched range since the fetch started (the write log, io.c); else
 * it is read again, as cache_read would: a write acknowledged before the
 * read was sent, that reached the backing after the remote served the
 * fetch and whose folio was evicted since, would come back stale (in the
 * reply and in the cache).  Blocks the cache has (uptodate) are answered
 * from the cache, over the fetched bytes. */
#include <errno.h>
#include <string.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

static uint64_t
block_down (const struct cache *c, uint64_t off)
{
  return off & ~(((uint64_t) 1 << c->block_shift) - 1);
}

static uint64_t
block_up (const struct cache *c, uint64_t off)
{
  return block_down (c, off + ((uint64_t) 1 << c->block_shift) - 1);
}

uint64_t
cache_fetch_room (struct cache *c, uint64_t len, uint64_t off)
{
  return block_up (c, off + len) - block_down (c, off);
}

/* The step's missing blocks that are data (holes excepted): widen
 * [*fs, *fe) (bytes; *fs == *fe: none yet) to cover them. */
static int64_t
plan_step (struct cache_iter *it, uint64_t *fs, uint64_t *fe)
{
  struct cache *c = it->c;
  struct window *w = &it->w;
  uint64_t b = block_of (c, it->pos), end = block_of (c, it->step_end - 1) + 1;

  while ((b = window_next (c, w, FP_UPTODATE, false, b, end)) < end) {
    uint64_t run_end = window_next (c, w, FP_UPTODATE, true, b, end);
    while (b < run_end) {
      uint64_t e;
      bool hole;
      if (io_extent_blocks (it, b, run_end, &e, &hole) == -1)
        return -1;
      if (!hole) {
        if (*fs == *fe)
          *fs = block_pos (c, b);
        *fe = block_pos (c, e);
      }
      b = e;
    }
  }
  return (int64_t) (it->step_end - it->pos);
}

int
cache_fetch (struct cache *c, void *buf, uint64_t len, uint64_t off,
             struct cache_fetched *fx, void (*done) (void *opaque, int err),
             void *opaque)
{
  struct cache_iter it;
  uint64_t lo = block_down (c, off), hi = block_up (c, off + len);
  uint64_t fs = lo, fe = lo;
  int r;

  /* With any store: the fetch lands in buf, never in slot memory, and
   * io_fill's fill_copy keeps the store's order (into the indexed slot,
   * persist the data, uptodate, persist the bits) as fill_data does.  Not
   * over the export's short last block (io_read's zeroes), nor for what
   * bypasses the cache. */
  if (!c->b->ops->read_async || len == 0 ||
      range_check (c, len, off) == -1 || hi > c->b->size ||
      len > c->cfg.max_io_bytes || use_direct (c, len, 0)) {
    errno = ENOTSUP;
    return -1;
  }
  /* What to fetch: a try (no waiting for a stripe, nor for the map). */
  cache_iter_init (&it, c, lo, hi - lo, CI_NOWAIT);
  while ((r = cache_iter_next (&it)) > 0)
    it.done = plan_step (&it, &fs, &fe);
  if (r == -1) {
    errno = EAGAIN;             /* a stripe busy */
    return -1;
  }
  fx->base = fs < off ? fs : off;
  fx->off = fs;
  fx->end = fe;
  fx->gen = wlog_now (c);
  if (fs == fe)                 /* all cached or holes: nothing to wait for */
    done (opaque, 0);
  else if (c->b->ops->read_async (c->b, (unsigned char *) buf + (fs - fx->base),
                                  fe - fs, fs, done, opaque) == -1)
    return -1;
  else {
    OPSTAT_ADD (c, backing_read_ops, 1);
    OPSTAT_ADD (c, backing_read_bytes, fe - fs);
  }
  /* As cache_read notes a miss before it waits: the window past it is
   * fetched meanwhile. */
  ra_note (c, off, len);
  return 0;
}

void
fetch_src_init (struct fetch_src *src, const void *buf,
                const struct cache_fetched *fx)
{
  src->buf = buf;
  src->base = fx->base;
  src->off = fx->off;
  src->end = fx->end;
  src->gen = fx->gen;
}
