/* The buffered read and write paths (iomap_read_folio / iomap_write_begin
 * and _end): whole windows of folios under their range lock, block-granular
 * read-modify-write, FUA and write-through by writing back the range. */
#include <errno.h>
#include <string.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

static struct folio *
window_folio (struct cache *c, struct window *w, uint64_t blk)
{
  return w->f[blk / c->blocks_per_folio - w->start];
}

/* Bring every block of the step uptodate: one fill per contiguous run of
 * missing blocks.  *missed is set if any was missing. */
static int
fill_range (struct cache_iter *it, bool *missed)
{
  struct cache *c = it->c;
  struct window *w = &it->w;
  uint64_t b = block_of (c, it->pos), end = block_of (c, it->step_end - 1) + 1;

  while ((b = window_next (c, w, FP_UPTODATE, false, b, end)) < end) {
    uint64_t run_end = window_next (c, w, FP_UPTODATE, true, b, end);
    if (io_fill (it, b, run_end) == -1)
      return -1;
    *missed = true;
    b = run_end;
  }
  return 0;
}

/* Copy between buf and the window's folios; to_folio picks the direction. */
static void
copy_range (struct cache *c, struct window *w, void *buf, uint64_t off,
            uint64_t len, bool to_folio)
{
  unsigned char *p = buf;

  while (len > 0) {
    uint64_t fi = folio_of (c, off);
    uint64_t in = off - folio_pos (c, fi);
    uint64_t n = ((uint64_t) 1 << c->folio_shift) - in;
    struct folio *f = w->f[fi - w->start];
    if (n > len)
      n = len;
    if (to_folio && c->persistent)   /* persisted before the bits */
      store_pmem_write (c->store, f->data + in, p, n);
    else if (to_folio)
      memcpy (f->data + in, p, n);
    else
      memcpy (p, f->data + in, n);
    p += n;
    off += n;
    len -= n;
  }
}

/* Copy the step's part of the buffer (at the request's start) out of the
 * cache, filling what is missing first.  buf NULL: prefetch. */
static int64_t
read_step (struct cache_iter *it, unsigned char *buf, bool *missed)
{
  uint64_t len = it->step_end - it->pos;

  if (fill_range (it, missed) == -1)
    return -1;
  if (buf)
    copy_range (it->c, &it->w, buf + (it->pos - it->start), it->pos, len,
                false);
  return (int64_t) len;
}

int
cache_read (struct cache *c, void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct cache_iter it;
  bool missed = false;
  int r;

  if (range_check (c, len, off) == -1)
    return -1;
  if (len == 0)
    return 0;
  if (buf != NULL) {
    STAT_ADD (c, read_ops, 1);
    STAT_ADD (c, client_read_bytes, len);
  }
  if (use_direct (c, len, flags))
    return buf ? direct_read (c, buf, len, off) : 0;
  cache_iter_init (&it, c, off, len, CI_ALLOC);
  while ((r = cache_iter_next (&it)) > 0)
    it.done = read_step (&it, buf, &missed);
  if (buf != NULL) {
    if (missed) STAT_ADD (c, read_misses, 1);
    else if (r == 0) STAT_ADD (c, read_hits, 1);
  }
  return r;
}

int
cache_prefetch (struct cache *c, uint64_t len, uint64_t off)
{
  return cache_read (c, NULL, len, off, 0);
}

/* Is block blk only partly covered by [off, end)?  Bytes past the export's
 * end do not count: a write up to the end covers the short last block. */
static bool
block_partial (struct cache *c, uint64_t blk, uint64_t off, uint64_t end)
{
  uint64_t bstart = block_pos (c, blk), bend = block_pos (c, blk + 1);

  if (bend > c->size)
    bend = c->size;
  return off > bstart || end < bend;
}

/* Read-modify-write: a partly written block that is not uptodate is read
 * first, that block only (rule 1). */
static int
fill_edges (struct cache_iter *it)
{
  struct cache *c = it->c;
  uint64_t off = it->pos, end = it->step_end;
  uint64_t edge[2] = { block_of (c, off), block_of (c, end - 1) };
  uint32_t bpf = c->blocks_per_folio;

  for (int i = 0; i < 2; i++) {
    if (i == 1 && edge[1] == edge[0])
      break;
    struct folio *f = window_folio (c, &it->w, edge[i]);
    if (block_partial (c, edge[i], off, end) &&
        !folio_block_uptodate (c, f, edge[i] % bpf) &&
        io_fill (it, edge[i], edge[i] + 1) == -1)
      return -1;
  }
  return 0;
}

/* Mark blocks [start, end) (global) uptodate and dirty. */
static void
dirty_blocks (struct cache *c, struct window *w, uint64_t start,
              uint64_t end)
{
  uint32_t bpf = c->blocks_per_folio;

  for (uint64_t b = start; b < end;) {
    struct folio *f = window_folio (c, w, b);
    uint32_t i = (uint32_t) (b % bpf);
    uint32_t n = (uint32_t) (bpf - i < end - b ? bpf - i : end - b);
    folio_set_uptodate (c, f, i, i + n);
    folio_set_dirty (c, f, i, i + n);
    folio_persist_bits (c, f);         /* after the data, before the reply */
    b += n;
  }
}

/* Copy the step's part of the buffer (at the request's start) into the
 * cache; with CACHE_WRITE_NOW write it back before returning. */
static int64_t
write_step (struct cache_iter *it, const unsigned char *buf, unsigned flags)
{
  struct cache *c = it->c;
  uint64_t off = it->pos, len = it->step_end - it->pos;
  uint64_t start = block_of (c, off), end = block_of (c, off + len - 1) + 1;

  if (fill_edges (it) == -1)
    return -1;
  copy_range (c, &it->w, (void *) (buf + (off - it->start)), off, len, true);
  dirty_blocks (c, &it->w, start, end);
  if ((flags & CACHE_WRITE_NOW) &&
      wb_window (c, &it->w, start, end, BACKING_FUA) == -1)
    return -1;
  return (int64_t) len;
}

int
cache_write (struct cache *c, const void *buf, uint64_t len, uint64_t off,
             unsigned flags)
{
  struct cache_iter it;
  int r;

  if (range_check (c, len, off) == -1 || writable_check (c) == -1)
    return -1;
  if (len == 0)
    return 0;
  STAT_ADD (c, client_write_bytes, len);
  if (use_direct (c, len, flags))
    return direct_write (c, buf, len, off, flags);
  /* FUA with flush=store: durable once the store is synced below. */
  if (c->cfg.mode == CACHE_WRITETHROUGH ||
      ((flags & CACHE_FUA) && c->sinfo.flush != CACHE_FLUSH_STORE))
    flags |= CACHE_WRITE_NOW;
  cache_iter_init (&it, c, off, len,
                   CI_ALLOC | (flags & CACHE_WRITE_NOW ? 0 : CI_THROTTLE));
  while ((r = cache_iter_next (&it)) > 0)
    it.done = write_step (&it, buf, flags);
  if (r == 0 && (flags & CACHE_FUA))
    r = cache_store_sync (c);
  return r;
}
