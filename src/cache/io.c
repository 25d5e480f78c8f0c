/* Backing I/O on behalf of the cache: requests clamped to the export,
 * counted, and bounce buffers for runs that cross folios; the fills that
 * bring a step's blocks uptodate; the log of the backing writes; the
 * backing's map as the iterator's steps ask for it. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

unsigned char *
io_bounce (struct cache *c)
{
  unsigned char *buf = pthread_getspecific (c->bounce_key);

  if (buf == NULL) {
    if (posix_memalign ((void **) &buf, 4096, c->cfg.max_io_bytes) != 0) {
      errno = ENOMEM;
      return NULL;
    }
    pthread_setspecific (c->bounce_key, buf);
  }
  return buf;
}

int
io_read (struct cache *c, void *buf, uint64_t len, uint64_t off)
{
  uint64_t n = off >= c->size ? 0 : len;

  if (off + n > c->size)
    n = c->size - off;
  if (n < len)
    memset ((char *) buf + n, 0, len - n);
  if (n == 0)
    return 0;
  OPSTAT_ADD (c, backing_read_ops, 1);
  OPSTAT_ADD (c, backing_read_bytes, n);
  if (c->b->ops->read (c->b, buf, n, off) == -1) {
    OPSTAT_ADD (c, read_errors, 1);
    return -1;
  }
  return 0;
}

int
io_write (struct cache *c, const void *buf, uint64_t len, uint64_t off,
          unsigned flags)
{
  if (off >= c->size)
    return 0;
  if (off + len > c->size)
    len = c->size - off;
  OPSTAT_ADD (c, backing_write_ops, 1);
  OPSTAT_ADD (c, backing_write_bytes, len);
  uint64_t t0 = now_ns ();
  struct ledger_send ls;
  int r = ledger_send_begin (c, &ls, flags);
  if (r == 0)
    r = c->b->ops->write (c->b, buf, len, off, flags);
  r = ledger_send_end (c, &ls, r);        /* keeps or sets errno */
  int err = errno;
  OPSTAT_ADD (c, backing_write_ns, now_ns () - t0);
  backing_written (c, off, len);             /* failed: maybe partly */
  errno = err;
  return r;
}

/* Copy global blocks [start, end) (inside the window, all cached) from
 * src, which holds them in a row, and mark them uptodate. */
static void
fill_copy (struct cache *c, struct window *w, uint64_t start, uint64_t end,
           const unsigned char *src)
{
  uint32_t bpf = c->blocks_per_folio;

  for (uint64_t b = start; b < end;) {
    struct folio *f = w->f[b / bpf - w->start];
    uint32_t i = (uint32_t) (b % bpf);
    uint32_t cnt = (uint32_t) (bpf - i < end - b ? bpf - i : end - b);
    memcpy (f->data + block_pos (c, i), src + block_pos (c, b - start),
            block_pos (c, cnt));
    folio_persist_data (c, f, i, i + cnt);
    folio_set_uptodate (c, f, i, i + cnt);
    folio_persist_bits (c, f);
    b += cnt;
  }
}

/* Read global blocks [start, end) (inside the window, all cached) with
 * one request, straight into folio memory when they sit in one folio. */
static int
fill_data (struct cache *c, struct window *w, uint64_t start, uint64_t end)
{
  uint64_t off = block_pos (c, start), len = block_pos (c, end - start);
  uint64_t fi = folio_of (c, off);
  uint32_t bpf = c->blocks_per_folio;

  if (folio_of (c, off + len - 1) == fi) {
    struct folio *f = w->f[fi - w->start];
    uint64_t in = off - folio_pos (c, fi);
    uint32_t i = (uint32_t) (start % bpf), e = (uint32_t) ((end - 1) % bpf) + 1;
    if (io_read (c, f->data + in, len, off) == -1)
      return -1;
    folio_persist_data (c, f, i, e);
    folio_set_uptodate (c, f, i, e);
    folio_persist_bits (c, f);
    return 0;
  }
  unsigned char *bounce = io_bounce (c);
  if (bounce == NULL || io_read (c, bounce, len, off) == -1)
    return -1;
  fill_copy (c, w, start, end, bounce);
  return 0;
}

/* Zero-fill global blocks [start, end): the backing says they read as 0. */
static void
fill_zero (struct cache *c, struct window *w, uint64_t start, uint64_t end)
{
  uint32_t bpf = c->blocks_per_folio;

  for (uint64_t b = start; b < end; b++) {
    struct folio *f = w->f[b / bpf - w->start];
    uint32_t i = (uint32_t) (b % bpf);
    memset (f->data + block_pos (c, i), 0, (size_t) 1 << c->block_shift);
    folio_persist_data (c, f, i, i + 1);
    folio_set_uptodate (c, f, i, i + 1);
    if (i + 1 == bpf || b + 1 == end)
      folio_persist_bits (c, f);
  }
}

static int
map_with (struct cache *c, uint64_t start, uint64_t end,
          struct backing_extent *ext, bool cached)
{
  if (end > c->size)
    end = c->size;
  *ext = (struct backing_extent) { start, end - start, BACKING_DATA };
  if (!(c->b->caps & BACKING_CAN_MAP) || c->b->ops->map == NULL)
    return 0;
  if (cached) {
    /* Not known without asking: data, which is always safe (a hole the
     * backing is read for reads as zeroes). */
    if (c->b->ops->map_cached == NULL ||
        c->b->ops->map_cached (c->b, start, end - start, ext) == -1) {
      *ext = (struct backing_extent) { start, end - start, BACKING_DATA };
      return 0;
    }
  } else if (c->b->ops->map (c->b, start, end - start, ext) == -1)
    return -1;
  if (ext->length == 0)
    *ext = (struct backing_extent) { start, end - start, BACKING_DATA };
  else if (ext->offset + ext->length > end)
    ext->length = end - ext->offset;
  return 0;
}

int
cache_map (struct cache *c, uint64_t start, uint64_t end,
           struct backing_extent *ext)
{
  return map_with (c, start, end, ext, false);
}

int
cache_map_cached (struct cache *c, uint64_t start, uint64_t end,
                  struct backing_extent *ext)
{
  return map_with (c, start, end, ext, true);
}

/* A block that is only partly a hole counts as data. */
int
io_extent_blocks (struct cache_iter *it, uint64_t start, uint64_t end,
               uint64_t *run_end, bool *hole)
{
  struct cache *c = it->c;
  struct backing_extent ext;
  uint64_t bmask = ((uint64_t) 1 << c->block_shift) - 1;
  uint64_t e;

  if (cache_iter_map (it, block_pos (c, start), &ext) == -1)
    return -1;
  uint64_t xend = ext.offset + ext.length;
  if (ext.type != BACKING_DATA) {
    if (xend >= c->size)           /* the export's last block may be short */
      xend = (c->size + bmask) & ~bmask;
    e = block_of (c, xend);
  } else
    e = block_of (c, xend + bmask);
  *hole = ext.type != BACKING_DATA && e > start;
  if (e <= start)
    e = start + 1;
  *run_end = e < end ? e : end;
  return 0;
}

int
io_fill (struct cache_iter *it, uint64_t start, uint64_t end)
{
  struct cache *c = it->c;
  const struct fetch_src *src = it->src;
  uint64_t max_blocks = c->cfg.max_io_bytes >> c->block_shift;

  while (start < end) {
    uint64_t run_end;
    bool hole;
    if (io_extent_blocks (it, start, end, &run_end, &hole) == -1)
      return -1;
    if (hole)
      fill_zero (c, &it->w, start, run_end);
    else if (src && block_pos (c, start) >= src->off &&
             block_pos (c, start) < src->end && fetch_src_fresh (c, src)) {
      /* Fetched by a parked miss: as far as the fetch goes. */
      uint64_t e = block_of (c, src->end);
      if (run_end > e)
        run_end = e;
      fill_copy (c, &it->w, start, run_end,
                 src->buf + (block_pos (c, start) - src->base));
    } else if (it->flags & CI_NOWAIT) {
      errno = EAGAIN;
      return -1;
    } else {
      if (run_end - start > max_blocks)
        run_end = start + max_blocks;
      if (fill_data (c, &it->w, start, run_end) == -1)
        return -1;
    }
    start = run_end;
  }
  return 0;
}

/* ---- the fills of a request's or readahead's step ---- */

/* Bring blocks [start, end) of the step uptodate from the backing, or
 * under CACHE_NOWAIT give up before anything changed (but for a parked
 * miss's fill: io_fill knows what it may do without waiting). */
int
step_fill (struct cache_iter *it, uint64_t start, uint64_t end)
{
  if ((it->flags & CI_NOWAIT) && it->src == NULL) {
    errno = EAGAIN;
    return -1;
  }
  return io_fill (it, start, end);
}

/* Bring every block of the step uptodate: one fill per contiguous run of
 * missing blocks.  *missed is set if any was missing. */
int
fill_range (struct cache_iter *it, bool *missed)
{
  struct cache *c = it->c;
  struct window *w = &it->w;
  uint64_t b = block_of (c, it->pos), end = block_of (c, it->step_end - 1) + 1;

  while ((b = window_next (c, w, FP_UPTODATE, false, b, end)) < end) {
    uint64_t run_end = window_next (c, w, FP_UPTODATE, true, b, end);
    if (step_fill (it, b, run_end) == -1)
      return -1;
    *missed = true;
    b = run_end;
  }
  return 0;
}

/* The step's folios: w.f[*first .. *last]. */
void
step_folios (const struct cache_iter *it, uint64_t *first, uint64_t *last)
{
  *first = folio_of (it->c, it->pos) - it->w.start;
  *last = folio_of (it->c, it->step_end - 1) - it->w.start;
}

/* ---- the backing write log (fetch.c: is what a parked read fetched still
 * the backing's content?) ---- */

void
backing_written (struct cache *c, uint64_t off, uint64_t len)
{
  lock_or_die (&c->wlog_lock);
  c->wlog_gen++;
  c->wlog[c->wlog_gen % WLOG_SIZE].off = off;
  c->wlog[c->wlog_gen % WLOG_SIZE].end = off + len;
  unlock_or_die (&c->wlog_lock);
}

uint64_t
wlog_now (struct cache *c)
{
  uint64_t g;

  lock_or_die (&c->wlog_lock);
  g = c->wlog_gen;
  unlock_or_die (&c->wlog_lock);
  return g;
}

/* Has no backing write touched [off, end) since the log was at gen?  No
 * when more writes came than the log keeps. */
static bool
wlog_untouched (struct cache *c, uint64_t gen, uint64_t off, uint64_t end)
{
  bool ok;

  lock_or_die (&c->wlog_lock);
  ok = c->wlog_gen - gen < WLOG_SIZE;
  for (uint64_t g = gen + 1; ok && g <= c->wlog_gen; g++)
    ok = !(c->wlog[g % WLOG_SIZE].off < end && off < c->wlog[g % WLOG_SIZE].end);
  unlock_or_die (&c->wlog_lock);
  return ok;
}

bool
fetch_src_fresh (struct cache *c, const struct fetch_src *src)
{
  return wlog_untouched (c, src->gen, src->off, src->end);
}

/* ---- the backing's map for a step (cache-int.h) ---- */

int
cache_iter_map (struct cache_iter *it, uint64_t off,
                struct backing_extent *ext)
{
  struct backing_extent *m = &it->map;

  assert (it->held);
  if (!it->mapped || off < m->offset || off - m->offset >= m->length) {
    /* A try may not wait for the backing's answer: what it knows. */
    if (((it->flags & CI_NOWAIT) ? cache_map_cached : cache_map)
        (it->c, off, folio_pos (it->c, it->w.end), m) == -1)
      return -1;
    it->mapped = true;
  }
  *ext = *m;
  return 0;
}
