/* Writeback: dirty blocks to the backing, only the dirty ones, adjacent
 * runs merged across folios up to max_io_bytes (iomap_writepage_map and
 * ifs_find_dirty_range in the kernel).  A failed write leaves its blocks
 * dirty; they are retried by the next pass. */
#include <errno.h>
#include <string.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

/* Runs at least this long go out with BACKING_DIRECT: for a stream, the
 * copy into the host's page cache (and its writeback) costs more CPU than
 * the device write, and the data is cached here already; short runs stay
 * buffered, where the kernel merges them before the flush. */
#define WB_DIRECT_MIN (256u << 10)

/* Do the folios of global blocks [start, end) lie one after the other in
 * the store's memory (one folio; or slots handed out in order, as a
 * stream gets them), so that the run needs no bounce copy? */
static bool
wb_run_contiguous (struct cache *c, struct window *w, uint64_t start,
                   uint64_t end)
{
  uint32_t bpf = c->blocks_per_folio;
  size_t fsize = (size_t) 1 << c->folio_shift;

  for (uint64_t fi = start / bpf + 1; fi <= (end - 1) / bpf; fi++)
    if (w->f[fi - w->start]->data != w->f[fi - 1 - w->start]->data + fsize)
      return false;
  return true;
}

/* Send global blocks [start, end), all dirty and cached in w, to the
 * backing, from the folios' memory (writers of them wait: they are under
 * writeback or the caller holds their stripes). */
static int
wb_run_io (struct cache *c, struct window *w, uint64_t start, uint64_t end,
           unsigned flags)
{
  uint32_t bpf = c->blocks_per_folio;
  uint64_t off = block_pos (c, start), len = block_pos (c, end - start);
  struct folio *f = w->f[start / bpf - w->start];
  const unsigned char *src;
  int r;

  if (wb_run_contiguous (c, w, start, end))
    src = f->data + block_pos (c, start % bpf);
  else {
    unsigned char *bounce = io_bounce (c);
    if (bounce == NULL)
      return -1;
    for (uint64_t b = start; b < end; b++) {
      struct folio *g = w->f[b / bpf - w->start];
      memcpy (bounce + block_pos (c, b - start),
              g->data + block_pos (c, b % bpf), (size_t) 1 << c->block_shift);
    }
    src = bounce;
  }
  r = io_write (c, src, len, off,
                flags | (len >= WB_DIRECT_MIN ? BACKING_DIRECT : 0));
  if (r == -1) {
    int err = errno;
    STAT_ADD (c, writeback_errors, 1);
    ledger_write_failed (c, err);
    errno = err;
    return -1;
  }
  ledger_write_ok (c);
  return 0;
}

/* Blocks written with flags stay unstable until the backing flushes? A
 * persistent store keeps them until then, whatever the backing
 * (store-pmem.c). */
static bool
wb_unstable (struct cache *c, unsigned flags)
{
  return ((c->b->caps & BACKING_VOLATILE) ||
          store_has (c->store, STORE_DURABLE)) && !(flags & BACKING_FUA);
}

/* Global blocks [start, end) of folio f (its stripe held) reached the
 * backing: the part inside f is written. */
static void
wb_folio_written (struct cache *c, struct folio *f, uint64_t start,
                  uint64_t end, bool unstable)
{
  uint64_t fb = f->index * c->blocks_per_folio;
  uint64_t fe = fb + c->blocks_per_folio;
  uint64_t s = start > fb ? start : fb, e = end < fe ? end : fe;

  if (s < e)
    folio_written (c, f, (uint32_t) (s - fb), (uint32_t) (e - fb), unstable);
}

/* Write global blocks [start, end), all dirty and cached in the locked
 * window w. */
static int
wb_run (struct cache *c, struct window *w, uint64_t start, uint64_t end,
        unsigned flags)
{
  uint32_t bpf = c->blocks_per_folio;

  if (wb_run_io (c, w, start, end, flags) == -1)
    return -1;
  for (uint64_t fi = start / bpf; fi <= (end - 1) / bpf; fi++)
    wb_folio_written (c, w->f[fi - w->start], start, end,
                      wb_unstable (c, flags));
  return 0;
}

int
wb_window (struct cache *c, struct window *w, uint64_t start, uint64_t end,
           unsigned flags)
{
  uint64_t max_blocks = c->cfg.max_io_bytes >> c->block_shift;
  uint64_t b = start;
  int err = 0;

  while ((b = window_next (c, w, FP_DIRTY, true, b, end)) < end) {
    uint64_t cap = end - b > max_blocks ? b + max_blocks : end;
    uint64_t run_end = window_next (c, w, FP_DIRTY, false, b, cap);
    if (wb_run (c, w, b, run_end, flags) == -1 && err == 0)
      err = errno;
    if (backing_unreachable (err))
      break;                    /* the other runs would only wait too */
    b = run_end;
  }
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* Is folio f worth writing in this pass?  The one background policy (the
 * kernel's wb_over_bg_thresh): over the background threshold, or with
 * writers waiting for room, every dirty folio; else those dirty for longer
 * than dirty_expire_ms.  Without the stripe it is a hint (dirtied_ms is
 * atomic): wb_batch_begin asks again under it. */
bool
wb_wanted (struct cache *c, const struct folio *f, bool all)
{
  if (all || STAT_GET (c, dirty_bytes) > c->dirty_background ||
      c->space_waiters > 0)
    return true;
  return f->dirtied_ms + c->cfg.dirty_expire_ms <= now_ms ();
}

/* Cut the dirty runs of the batch's folios (their stripes held), merged
 * across folios up to max_io_bytes.  Past WB_RUNS_MAX runs the batch ends
 * with the folio of the last run (the rest of that one is left for a
 * later batch: b->cut); the folios after it are let go. */
static void
wb_batch_cut (struct cache *c, struct wb_batch *b)
{
  struct window *w = &b->w;
  uint32_t bpf = c->blocks_per_folio;
  uint64_t max_blocks = c->cfg.max_io_bytes >> c->block_shift;
  uint64_t end = w->end * bpf, blk = w->start * bpf;

  b->nr_runs = 0;
  b->cut = false;
  while ((blk = window_next (c, w, FP_DIRTY, true, blk, end)) < end) {
    if (b->nr_runs == WB_RUNS_MAX) {
      uint64_t last = (b->run[b->nr_runs - 1].end - 1) / bpf + 1;
      b->cut = blk < last * bpf;
      range_unlock (c, last, w->end);
      w->end = last;
      return;
    }
    uint64_t cap = end - blk > max_blocks ? blk + max_blocks : end;
    uint64_t run_end = window_next (c, w, FP_DIRTY, false, blk, cap);
    b->run[b->nr_runs].start = blk;
    b->run[b->nr_runs].end = run_end;
    b->nr_runs++;
    blk = run_end;
  }
}

/* Take the dirty folio fi into b->w (trylock: the walk never waits on a
 * stripe, whose holder may be doing backing I/O, with walk_lock held),
 * then, while a dirty run reaches the end of the last folio, the next
 * folio too, so that the run goes out whole wherever the batch started;
 * up to max_io_bytes of folios, so that a stream makes batches the walk's
 * threads write side by side.  Then cut the runs, mark the folios under
 * writeback and let their stripes go. */
enum wb_begin
wb_batch_begin (struct cache *c, struct wb_batch *b, uint64_t fi, bool all)
{
  struct window *w = &b->w;
  uint32_t last_block = c->blocks_per_folio - 1;
  uint64_t max = c->cfg.max_io_bytes >> c->folio_shift;

  if (max < 2)
    max = 2;                    /* a run may always cross one boundary */
  if (max > WINDOW_MAX)
    max = WINDOW_MAX;
  if (!trylock_or_die (stripe_of (c, fi)))
    return WB_BUSY;
  struct folio *f = folio_lookup (c, fi);
  if (f == NULL || f->nr_dirty == 0 || !wb_wanted (c, f, all) ||
      f->writeback) {
    bool busy = f != NULL && f->writeback;
    unlock_or_die (stripe_of (c, fi));
    return busy ? WB_BUSY : WB_SKIP;
  }
  w->start = fi;
  w->f[0] = f;
  w->end = fi + 1;
  while (w->end - fi < max && w->end < c->nr_folios &&
         folio_block_dirty (c, w->f[w->end - fi - 1], last_block)) {
    uint64_t next = w->end;
    if (!trylock_or_die (stripe_of (c, next)))
      break;
    struct folio *g = folio_lookup (c, next);
    if (g == NULL || g->writeback || !folio_block_dirty (c, g, 0)) {
      unlock_or_die (stripe_of (c, next));
      break;
    }
    w->f[next - fi] = g;
    w->end = next + 1;
  }
  wb_batch_cut (c, b);
  if (all) {
    /* A flush's pass takes these folios off its set now, with their
     * dirty runs cut: what is dirtied from here on is the next flush's.
     * A batch cut short leaves its last folio on the set (the rest of
     * its runs is still to write). */
    lock_or_die (&c->lock);
    for (uint64_t i = w->start; i < w->end - (b->cut ? 1 : 0); i++)
      fidx_mark (&c->index, i, FIDX_TOWRITE, false);
    unlock_or_die (&c->lock);
  }
  for (uint64_t i = w->start; i < w->end; i++) {
    w->f[i - w->start]->writeback = true;
    unlock_or_die (stripe_of (c, i));
  }
  return WB_GOT;
}

/* The batch's I/O is over: the runs that reached the backing (ok[i]) are
 * written, and each folio's writeback ends, one stripe at a time. */
static void
wb_batch_end (struct cache *c, struct wb_batch *b, const bool *ok,
              unsigned flags)
{
  struct window *w = &b->w;
  bool unstable = wb_unstable (c, flags);
  uint32_t bpf = c->blocks_per_folio;
  unsigned i = 0;

  for (uint64_t fi = w->start; fi < w->end; fi++) {
    struct folio *f = w->f[fi - w->start];
    lock_or_die (stripe_of (c, fi));
    while (i < b->nr_runs && b->run[i].end <= fi * bpf)
      i++;                         /* runs are in block order */
    for (unsigned j = i; j < b->nr_runs && b->run[j].start < (fi + 1) * bpf;
         j++)
      if (ok[j])
        wb_folio_written (c, f, b->run[j].start, b->run[j].end, unstable);
    f->writeback = false;
    pthread_cond_broadcast (&c->stripes[fi % NSTRIPES].wb_done);
    unlock_or_die (stripe_of (c, fi));
  }
}

int
wb_batch_write (struct cache *c, struct wb_batch *b, unsigned flags)
{
  bool ok[WB_RUNS_MAX] = { false };
  int err = 0;

  for (unsigned i = 0; i < b->nr_runs; i++) {
    if (wb_run_io (c, &b->w, b->run[i].start, b->run[i].end, flags) == 0)
      ok[i] = true;
    else if (err == 0)
      err = errno;
    if (backing_unreachable (err))
      break;                    /* the other runs would only wait too */
  }
  wb_batch_end (c, b, ok, flags);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* Apply fn to every cached folio (marked only, if marked), each under its
 * stripe lock. */
static void
folios_each_locked (struct cache *c, bool marked,
                    void (*fn) (struct cache *, struct folio *, bool),
                    bool arg)
{
  for (uint64_t fi = 0; fi < c->nr_folios; fi++) {
    lock_or_die (&c->lock);
    struct folio *f = fidx_find (&c->index, &fi, c->nr_folios, marked);
    unlock_or_die (&c->lock);
    if (f == NULL)
      break;
    lock_or_die (stripe_of (c, fi));
    f = folio_lookup (c, fi);
    if (f != NULL)
      fn (c, f, arg);
    unlock_or_die (stripe_of (c, fi));
  }
}

/* The backing may have lost what it acknowledged since the last good
 * flush (the ledger says so): cached writes go back to dirty (writeback
 * redoes them); passthrough writes cannot be redone: when the ledger
 * counts them lost, every later flush fails (ledger_flush_error) and
 * clean copies are forgotten, to read what the backing really has. */
static void
wb_lost (struct cache *c)
{
  bool pt_lost = ledger_lost (c);

  folios_each_locked (c, true, folio_settle, true);
  if (pt_lost)
    wb_invalidate_clean (c);
}

int
wb_stabilize (struct cache *c)
{
  struct ledger_flush lf;
  /* A previous run's writes in doubt: not even tried, nothing written
   * since is settled (and FLUSH fails even with nothing to write). */
  int refused = ledger_flush_refused (c);

  if (!ledger_flush_begin (c, &lf, refused != 0) && !refused)
    return 0;
  STAT_ADD (c, backing_flush_ops, 1);
  uint64_t t0 = now_ns ();
  errno = refused;
  int r = refused ? -1 : c->b->ops->flush (c->b);
  r = ledger_flush_answer (c, &lf, r);
  int err = errno ? errno : EIO;
  STAT_ADD (c, backing_flush_ns, now_ns () - t0);
  if (r == -1) {
    /* A failed flush after writes is a loss (ledger.c): the blocks are
     * dirty at once, rewritten even if no client flushes again. */
    if (ledger_flush_failed (c, &lf, err))
      wb_lost (c);
    errno = err;
    return -1;
  }
  if (!ledger_flush_ok (c, &lf)) {
    if (STAT_GET (c, unstable_bytes) > 0)
      folios_each_locked (c, true, folio_settle, false);
    return 0;
  }
  wb_lost (c);
  return 1;
}

/* Dirty and unstable blocks stay: the cache answers for them. */
static void
forget_clean (struct cache *c, struct folio *f, bool unused)
{
  (void) unused;
  for (uint32_t i = 0; i < c->blocks_per_folio; i++)
    if (!folio_block_dirty (c, f, i) && !folio_test (c, f, FP_UNSTABLE, i))
      folio_clear_uptodate (c, f, i, i + 1);
  folio_persist_bits (c, f);   /* a warm restart must not trust them */
}

void
wb_invalidate_clean (struct cache *c)
{
  folios_each_locked (c, false, forget_clean, false);
}
