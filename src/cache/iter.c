/* The request iterator, in the shape of the kernel's iomap_iter: the caller
 * loops over steps, the iterator takes and releases the windows between
 * them (see cache-int.h). */
#include <assert.h>
#include <errno.h>

#include "cache/cache-int.h"

void
cache_iter_init (struct cache_iter *it, struct cache *c, uint64_t off,
                 uint64_t len, unsigned flags)
{
  /* Field by field: the window (2 KiB of pointers) is filled by each
   * step's lookup, not cleared per request. */
  it->c = c;
  it->start = it->pos = it->step_end = off;
  it->end = off + len;
  it->flags = flags;
  it->done = 0;
  it->held = it->over = it->mapped = false;
  it->src = NULL;
}

/* The iteration is over: r is 0 (done) or -1 (errno kept). */
static int
iter_over (struct cache_iter *it, int r)
{
  it->over = true;
  return r;
}

/* Lock and look up folios [fi, fend) as the flags say; readahead may
 * get fewer (it->w.end). */
static int
iter_begin (struct cache_iter *it, uint64_t fi, uint64_t fend)
{
  struct cache *c = it->c;

  if (it->flags & CI_READAHEAD)
    return window_ra_begin (c, &it->w, fi, fend);
  return ((it->flags & CI_NOWAIT) ? window_try_begin : window_begin)
    (c, &it->w, fi, fend, it->flags & CI_ALLOC);
}

/* Take the window holding it->pos, as many folios of the rest of the
 * request as a window takes. */
static int
iter_window (struct cache_iter *it)
{
  struct cache *c = it->c;
  uint64_t fi = folio_of (c, it->pos), fend = folio_of (c, it->end - 1) + 1;

  if (fend - fi > c->window)
    fend = fi + c->window;
  for (;;) {
    if (iter_begin (it, fi, fend) == -1)
      return -1;
    uint64_t busy = (it->flags & CI_STABLE) ? wb_window_busy (c, &it->w)
                                            : UINT64_MAX;
    if (busy == UINT64_MAX)
      break;
    /* A block to change is being written back: wait for that folio with
     * no stripe held (its writeback ends under its stripe), then again. */
    window_end (c, &it->w);
    if (it->flags & CI_NOWAIT) {
      errno = EAGAIN;
      return -1;
    }
    wb_wait_folio (c, busy);
  }
  fend = it->w.end;
  it->held = true;
  it->step_end = folio_pos (c, fend) < it->end ? folio_pos (c, fend)
                                                : it->end;
  it->done = 0;
  return 0;
}

/* The first call's wait for the dirty limit, or EAGAIN under CI_NOWAIT. */
static int
iter_throttle (struct cache_iter *it)
{
  uint64_t len = it->end - it->start;

  if (!(it->flags & CI_NOWAIT))
    return throttle_dirty (it->c, len);
  if (!throttle_would_wait (it->c, len))
    return 0;
  errno = EAGAIN;
  return -1;
}

int
cache_iter_next (struct cache_iter *it)
{
  struct cache *c = it->c;

  assert (!it->over);          /* 0 or -1 ended the loop */
  if (it->held) {
    int err = errno;
    window_end (c, &it->w);
    it->held = false;
    it->mapped = false;        /* the stripes no longer keep it true */
    if (it->done < 0) {
      errno = err;
      return iter_over (it, -1);
    }
    assert (it->done > 0 && (uint64_t) it->done <= it->step_end - it->pos);
    it->pos += (uint64_t) it->done;
  } else if ((it->flags & CI_THROTTLE) &&     /* the first call */
             iter_throttle (it) == -1)
    return iter_over (it, -1);
  if (it->pos >= it->end)
    return iter_over (it, 0);
  if (iter_window (it) == -1)
    return iter_over (it, -1);
  return 1;
}
