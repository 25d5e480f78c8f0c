/* The buffered read and write paths (iomap_read_folio / iomap_write_begin
 * and _end): whole windows of folios under their range lock, block-granular
 * read-modify-write, FUA and write-through by writing back the range. */
#include <errno.h>
#include <string.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

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
    if (to_folio && store_has (c->store, STORE_DURABLE))
      store_write (c->store, f->data + in, p, n); /* before the bits */
    else if (to_folio)
      memcpy (f->data + in, p, n);
    else
      memcpy (p, f->data + in, n);
    p += n;
    off += n;
    len -= n;
  }
}

/* A client read the step's folios: those readahead brought are counted
 * as its hits (the client read them before they were evicted). */
static void
read_seen (struct cache_iter *it)
{
  uint64_t first, last;

  step_folios (it, &first, &last);
  for (uint64_t i = first; i <= last; i++)
    if (it->w.f[i]->ra)
      ra_read (it->c, it->w.f[i]);
}

/* Copy the step's part of the buffer (at the request's start) out of the
 * cache, filling what is missing first.  buf NULL: prefetch. */
static int64_t
read_step (struct cache_iter *it, unsigned char *buf, bool *missed)
{
  uint64_t len = it->step_end - it->pos;

  if (fill_range (it, missed) == -1)
    return -1;
  if (buf) {
    copy_range (it->c, &it->w, buf + (it->pos - it->start), it->pos, len,
                false);
    if (it->c->ra)
      read_seen (it);
  }
  return (int64_t) len;
}

int
cache_read (struct cache *c, void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct cache_iter it;
  bool missed = false, nowait = (flags & CACHE_NOWAIT) != 0;
  int r;

  if (range_check (c, len, off) == -1 || ledger_io_refused (c) == -1)
    return -1;
  if (len == 0)
    return 0;
  if (nowait && use_direct (c, len, flags)) {
    errno = EAGAIN;
    return -1;
  }
  if (buf != NULL && !nowait) {
    OPSTAT_ADD (c, read_ops, 1);
    OPSTAT_ADD (c, client_read_bytes, len);
  }
  if (use_direct (c, len, flags))
    return buf ? direct_read (c, buf, len, off) : 0;
  /* A read that may continue a stream is noted before a miss waits for
   * the backing (the window past it is fetched meanwhile); a try once it
   * succeeded (else its retry is); any other read only if it missed. */
  bool noted = buf != NULL && !nowait && ra_follows (c, off);
  if (noted)
    ra_note (c, off, len);
  /* A try allocates nothing: a folio not cached is a miss anyway. */
  cache_iter_init (&it, c, off, len, nowait ? CI_NOWAIT : CI_ALLOC);
  while ((r = cache_iter_next (&it)) > 0)
    it.done = read_step (&it, buf, &missed);
  if (buf != NULL && nowait && r == 0) {
    OPSTAT_ADD (c, read_ops, 1);
    OPSTAT_ADD (c, client_read_bytes, len);
    if (ra_follows (c, off))
      ra_note (c, off, len);
  }
  if (buf != NULL && !nowait && !noted && missed)
    ra_note (c, off, len);
  if (buf != NULL) {
    if (missed) OPSTAT_ADD (c, read_misses, 1);
    else if (r == 0) OPSTAT_ADD (c, read_hits, 1);
  }
  return r;
}

int
cache_read_fetched (struct cache *c, void *buf, uint64_t len, uint64_t off,
                    struct cache_fetched *fx, unsigned flags)
{
  struct cache_iter it;
  struct fetch_src src;
  bool missed = false;
  int r;

  if (range_check (c, len, off) == -1 || ledger_io_refused (c) == -1)
    return -1;
  /* The fetched bytes sit at buf + (x - fx->base), fx->base <= off: a
   * step copies its answer (to buf + (x - off)) over fetched bytes it
   * has put into the cache already. */
  fetch_src_init (&src, buf, fx);
  cache_iter_init (&it, c, off, len, CI_ALLOC |
                   ((flags & CACHE_NOWAIT) ? CI_NOWAIT : 0));
  it.src = &src;
  while ((r = cache_iter_next (&it)) > 0)
    it.done = read_step (&it, buf, &missed);
  /* A try that gave up may have copied answers over fetched bytes (when
   * the fetch began before off): the retry reads what is missing again. */
  if (r == -1 && (flags & CACHE_NOWAIT))
    fx->end = fx->off;
  if (r == 0) {                 /* readahead was told at the fetch */
    OPSTAT_ADD (c, read_ops, 1);
    OPSTAT_ADD (c, client_read_bytes, len);
    if (missed) OPSTAT_ADD (c, read_misses, 1);
    else OPSTAT_ADD (c, read_hits, 1);
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
    /* f is NULL only under CI_NOWAIT (not yet created): then a partial
     * block of it would need a read. */
    if (block_partial (c, edge[i], off, end) &&
        (f == NULL || !folio_block_uptodate (c, f, edge[i] % bpf)) &&
        step_fill (it, edge[i], edge[i] + 1) == -1)
      return -1;
  }
  return 0;
}

/* A mapped store (STORE_MAPPED): an edge block the step covers only in
 * part and that turns dirty now holds bytes no client wrote since the
 * last FLUSH (a fill from the backing, a clean copy).  They are persisted
 * (and on a deferred store synced) before the write changes the block, so
 * that a crash never brings them back as the slot's older data under the
 * new dirty bit (a page store: the bitmap's page may reach the media
 * before the data's).  0, or -1/errno with nothing changed (EAGAIN under
 * CI_NOWAIT when a sync would be needed). */
static int
keep_unwritten (struct cache_iter *it)
{
  struct cache *c = it->c;
  uint64_t off = it->pos, end = it->step_end;
  uint64_t edge[2] = { block_of (c, off), block_of (c, end - 1) };
  uint32_t bpf = c->blocks_per_folio;
  bool synced = false;

  if (!store_has (c->store, STORE_MAPPED))
    return 0;
  for (int k = 0; k < 2; k++) {
    if (k == 1 && edge[1] == edge[0])
      break;
    struct folio *f = window_folio (c, &it->w, edge[k]);
    uint32_t i = (uint32_t) (edge[k] % bpf);
    if (f == NULL || !block_partial (c, edge[k], off, end) ||
        !folio_block_uptodate (c, f, i) || folio_block_dirty (c, f, i) ||
        folio_test (c, f, FP_UNSTABLE, i))
      continue;
    if (store_has (c->store, STORE_DEFERRED) && (it->flags & CI_NOWAIT)) {
      errno = EAGAIN;
      return -1;
    }
    folio_persist_data (c, f, i, i + 1);
    synced = true;
  }
  if (synced && store_has (c->store, STORE_DEFERRED))
    return cache_store_sync (c);
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

  /* Under CI_NOWAIT the folios are created only once nothing can fail
   * (a try is one window, one step): a try that gives up changed
   * nothing, no clean folio was evicted for it. */
  if (fill_edges (it) == -1 || keep_unwritten (it) == -1 ||
      ((it->flags & CI_NOWAIT) && window_alloc_free (c, &it->w) == -1))
    return -1;
  copy_range (c, &it->w, (void *) (buf + (off - it->start)), off, len, true);
  dirty_blocks (c, &it->w, start, end);
  if ((flags & CACHE_WRITE_NOW) &&
      wb_window (c, &it->w, start, end, BACKING_FUA) == -1)
    return -1;
  return (int64_t) len;
}

/* May a CACHE_NOWAIT write start?  Not if it must reach the backing
 * before returning, nor over more than one window: a later window that
 * could not be taken would leave it half done. */
static bool
write_may_try (const struct cache *c, uint64_t len, uint64_t off,
               unsigned flags)
{
  return !(flags & CACHE_FUA) && c->cfg.mode == CACHE_WRITEBACK
    && !use_direct (c, len, flags)
    && folio_of (c, off + len - 1) - folio_of (c, off) < c->window;
}

int
cache_write (struct cache *c, const void *buf, uint64_t len, uint64_t off,
             unsigned flags)
{
  struct cache_iter it;
  bool nowait = (flags & CACHE_NOWAIT) != 0;
  int r;

  if (range_check (c, len, off) == -1 || writable_check (c) == -1 ||
      ledger_io_refused (c) == -1)
    return -1;
  if (len == 0)
    return 0;
  if (nowait && !write_may_try (c, len, off, flags)) {
    errno = EAGAIN;
    return -1;
  }
  if (!nowait)
    OPSTAT_ADD (c, client_write_bytes, len);
  if (use_direct (c, len, flags))
    return direct_write (c, buf, len, off, flags);
  /* Writethrough, and FUA unless flush=store (then the store sync below
   * makes it durable), write the data back before the reply.  Without a
   * native FUA the backing flushes once per such write (a file:
   * fdatasync): leave the blocks dirty and join a flush instead, so that
   * concurrent FUA writes (and writethrough) share a pass and a backing
   * flush (flush-group.h). */
  bool now = c->cfg.mode == CACHE_WRITETHROUGH ||
             ((flags & CACHE_FUA) && c->sinfo.flush != CACHE_FLUSH_STORE);
  bool grouped = now && !(c->b->caps & BACKING_CAN_FUA);
  if (now && !grouped)
    flags |= CACHE_WRITE_NOW;
  cache_iter_init (&it, c, off, len, CI_STABLE | (now ? 0 : CI_THROTTLE)
                   | (nowait ? CI_NOWAIT : CI_ALLOC));
  while ((r = cache_iter_next (&it)) > 0)
    it.done = write_step (&it, buf, flags);
  if (r == 0 && grouped)
    r = cache_write_back (c);
  else if (r == 0 && (flags & CACHE_FUA))
    r = cache_store_sync (c);
  if (r == 0 && (flags & CACHE_FUA) && (r = ledger_durable_refused (c))) {
    errno = r;
    r = -1;
  }
  if (nowait && r == 0)
    OPSTAT_ADD (c, client_write_bytes, len);
  return r;
}
