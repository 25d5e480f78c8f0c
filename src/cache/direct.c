/* Requests that go straight to the backing — direct reads and writes,
 * zero, trim — kept coherent with the cache.  Each piece of one (a window
 * of folios, piece_end) holds the stripes of the folios it touches (cached
 * or not) across its backing I/O, so no fill or writeback of those folios
 * can interleave; then it brings the cached copies in line with what the
 * backing now holds. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

enum fix_kind {
  FIX_WRITE,  /* backing now holds src over the range */
  FIX_ZERO,   /* backing now reads zeroes over the range */
  FIX_DROP,   /* whole blocks discarded: forget them */
  FIX_FAILED, /* backing content unknown: forget clean copies, keep the
               * ones the cache answers for */
  FIX_OVERLAY,/* direct read: copy dirty blocks into the caller's buffer */
};

struct fix {
  enum fix_kind kind;
  uint64_t off, end;         /* the request */
  const unsigned char *src;  /* FIX_WRITE: data at off */
  unsigned char *dst;        /* FIX_OVERLAY: buffer at off */
  bool unflushed;            /* FIX_WRITE, FIX_ZERO: the backing may still
                              * lose it (not FUA) */
};

/* The store's copy of [s, e) inside folio f changed. */
static void
fix_persist_bytes (struct cache *c, struct folio *f, uint64_t s, uint64_t e)
{
  uint64_t in = s - folio_pos (c, f->index);

  if (store_has (c->store, STORE_DURABLE))
    (void) c->store->ops->persist (c->store, f->data + in, e - s);
}

/* Apply the fix to block i of folio f, whose part [s, e) (export offsets)
 * the request covers.  Returns true when it changed the data of a block
 * a persistent store keeps across a crash (dirty or unstable). */
static bool
fix_block (struct cache *c, struct folio *f, uint32_t i, uint64_t s,
           uint64_t e, const struct fix *x)
{
  uint64_t bstart = folio_pos (c, f->index) + block_pos (c, i);
  uint64_t bend = bstart + ((uint64_t) 1 << c->block_shift);
  bool whole = s == bstart && (e == bend || (e == c->size && bend > e));
  bool uptodate = folio_block_uptodate (c, f, i);
  unsigned char *p = f->data + (s - folio_pos (c, f->index));
  bool kept;

  switch (x->kind) {
  case FIX_WRITE:
  case FIX_ZERO:
    if (!whole && !uptodate)
      return false;             /* nothing cached to update */
    kept = store_has (c->store, STORE_DURABLE) &&
           (folio_block_dirty (c, f, i) || folio_test (c, f, FP_UNSTABLE, i));
    store_write_begin (c->store, p, e - s);
    if (x->kind == FIX_WRITE) memcpy (p, x->src + (s - x->off), e - s);
    else memset (p, 0, e - s);
    store_write_end (c->store, p, e - s);
    fix_persist_bytes (c, f, s, e);
    if (!whole)
      return kept;
    folio_set_uptodate (c, f, i, i + 1);
    /* A persistent store answers for a dirty block after a crash: until
     * the backing has flushed what replaced it, the block stays in the
     * store as written back but unstable (its new data, persisted above),
     * as a writeback leaves it; clean, a crash that lost the backing's
     * write would bring back neither version. */
    if (x->unflushed && store_has (c->store, STORE_DURABLE) &&
        folio_block_dirty (c, f, i))
      folio_written (c, f, i, i + 1, true);
    else
      folio_clear_dirty (c, f, i, i + 1);
    return kept;
  case FIX_DROP:
    /* Unstable too: after a trim the block may read as anything, so a
     * loss of the write before it needs no rewrite. */
    folio_drop (c, f, i, i + 1);
    return false;
  case FIX_FAILED:
    /* An unstable block was acknowledged and is still ours to make
     * durable, and the failed request may have half overwritten it in
     * the backing: write it again. */
    if (folio_test (c, f, FP_UNSTABLE, i))
      folio_set_dirty (c, f, i, i + 1);
    else if (!folio_block_dirty (c, f, i))
      folio_clear_uptodate (c, f, i, i + 1);
    return false;
  case FIX_OVERLAY:
    if (folio_block_dirty (c, f, i))
      memcpy (x->dst + (s - x->off), p, e - s);
    return false;
  }
  return false;
}

/* Returns true when it changed a block the store keeps (fix_block). */
static bool
fix_folio (struct cache *c, struct folio *f, const struct fix *x)
{
  uint64_t fstart = folio_pos (c, f->index);
  uint64_t s = x->off > fstart ? x->off : fstart;
  uint64_t fend = fstart + ((uint64_t) 1 << c->folio_shift);
  uint64_t e = x->end < fend ? x->end : fend;
  bool kept = false;

  while (s < e) {
    uint32_t i = (uint32_t) ((s - fstart) >> c->block_shift);
    uint64_t bend = fstart + block_pos (c, i + 1);
    uint64_t be = e < bend ? e : bend;
    kept |= fix_block (c, f, i, s, be, x);
    s = be;
  }
  if (x->kind != FIX_OVERLAY)
    folio_persist_bits (c, f);
  return kept;
}

/* The caller holds the stripes of the folios of x (a piece).  Returns
 * true when it changed a block the store keeps (fix_block). */
static bool
fix_cached (struct cache *c, const struct fix *x)
{
  uint64_t end = folio_of (c, x->end - 1) + 1;
  struct folio *f;
  bool kept = false;

  for (uint64_t fi = folio_of (c, x->off);
       (f = cached_folio_next (c, &fi, end)) != NULL; fi++)
    kept |= fix_folio (c, f, x);
  return kept;
}

/* Passthrough requests leave no copy in the cache: if the backing loses
 * them before a flush, nothing can write them again and every later flush
 * fails (see cache_flush).
 *  - Writes are counted (passthrough_done) rather than made durable: an
 *    extra flush per direct write would cost more than the rare loss.
 *    That covers O_DIRECT too: the kernel took the data, but a device's
 *    volatile cache may still lose it until fdatasync succeeds.
 *  - Zeroes and trims are made durable at once where FUA is native (a
 *    remote: its restart is a routine loss and must stay invisible).
 *    Elsewhere (a file) FUA is a whole fdatasync per request, so zeroes
 *    are counted like writes, and trims not at all: a lost trim leaves
 *    the old data, which a trim allows. */
static unsigned
durable_flags (struct cache *c, unsigned flags)
{
  if ((c->b->caps & BACKING_VOLATILE) && (c->b->caps & BACKING_CAN_FUA))
    return flags | CACHE_FUA;
  return flags;
}

static unsigned
backing_flags (unsigned flags)
{
  return (flags & CACHE_FUA ? BACKING_FUA : 0) |
         (flags & CACHE_MAY_TRIM ? BACKING_MAY_TRIM : 0) |
         (flags & CACHE_FAST_ZERO ? BACKING_FAST_ZERO : 0);
}

enum pass_op { PASS_WRITE, PASS_ZERO, PASS_TRIM };

/* A passthrough request without FUA succeeded (sent in the ledger's
 * view): a write or zero the backing could still lose is counted, and
 * flush=store needs the backing's flush for it (ledger.c).  True when
 * the ledger counts it lost already. */
static bool
passthrough_done (struct cache *c, enum pass_op op, uint64_t view)
{
  return ledger_passthrough_written (c, view,
                                     op != PASS_TRIM &&
                                     (c->b->caps & BACKING_VOLATILE),
                                     op != PASS_TRIM);
}

/* A range request goes to the backing a window of folios at a time, each
 * piece under its own folios' stripes: one over many folios never holds
 * the whole stripe table across its backing I/O (a 1 GiB trim would
 * freeze every cached folio meanwhile).  A failed piece ends the request;
 * the pieces before it are done, as a failed NBD request allows.  The end
 * of the piece starting at byte off of a request ending at end: */
static uint64_t
piece_end (struct cache *c, uint64_t off, uint64_t end)
{
  uint64_t e = folio_pos (c, folio_of (c, off) + c->window);

  return e < end ? e : end;
}

/* Piece [off, end) of the request x. */
static struct fix
fix_piece (const struct fix *x, uint64_t off, uint64_t end)
{
  struct fix px = *x;

  px.off = off;
  px.end = end;
  if (x->src)
    px.src = x->src + (off - x->off);
  if (x->dst)
    px.dst = x->dst + (off - x->off);
  return px;
}

int
direct_read (struct cache *c, void *buf, uint64_t len, uint64_t off)
{
  struct fix x = { .kind = FIX_OVERLAY, .off = off, .end = off + len,
                   .dst = buf };

  OPSTAT_ADD (c, direct_read_ops, 1);
  OPSTAT_ADD (c, direct_read_bytes, len);
  for (uint64_t p = off, pe; p < x.end; p = pe) {
    pe = piece_end (c, p, x.end);
    struct fix px = fix_piece (&x, p, pe);
    uint64_t start = folio_of (c, p), end = folio_of (c, pe - 1) + 1;
    range_lock (c, start, end);
    int r = io_read (c, px.dst, pe - p, p);
    if (r == 0)
      fix_cached (c, &px);  /* dirty blocks are newer than the backing */
    int err = errno;
    range_unlock (c, start, end);
    if (r == -1) {
      errno = err;
      return -1;
    }
  }
  return 0;
}

/* The first cached folio of [start, end) (stripes held) under writeback,
 * or UINT64_MAX. */
static uint64_t
range_busy (struct cache *c, uint64_t start, uint64_t end)
{
  struct folio *f;

  for (uint64_t fi = start; (f = cached_folio_next (c, &fi, end)) != NULL;
       fi++)
    if (f->writeback)
      return fi;
  return UINT64_MAX;
}

/* Send one piece of a write-class request straight to the backing under
 * the stripes of its folios, then bring the cached copies in line
 * (x->kind says how on success; on failure clean copies are forgotten). */
static int
passthrough_piece (struct cache *c, enum pass_op op, struct fix *x,
                   unsigned flags)
{
  uint64_t off = x->off, len = x->end - x->off;
  uint64_t start = folio_of (c, off), end = folio_of (c, x->end - 1) + 1;
  int r;

  for (;;) {
    range_lock (c, start, end);
    uint64_t busy = range_busy (c, start, end);
    if (busy == UINT64_MAX)
      break;
    /* Neither the backing nor the cached copy may change under a
     * writeback of it: wait for it with no stripe held. */
    range_unlock (c, start, end);
    wb_wait_folio (c, busy);
  }
  uint64_t view = ledger_passthrough_view (c);
  struct ledger_send ls;
  switch (op) {
  case PASS_WRITE:
    r = io_write (c, x->src, len, off, backing_flags (flags));
    break;
  case PASS_ZERO:
    OPSTAT_ADD (c, backing_zero_ops, 1);
    OPSTAT_ADD (c, backing_zero_bytes, len);
    r = ledger_send_begin (c, &ls, backing_flags (flags));
    if (r == 0)
      r = c->b->ops->zero (c->b, len, off, backing_flags (flags));
    r = ledger_send_end (c, &ls, r);
    break;
  case PASS_TRIM:
    OPSTAT_ADD (c, backing_trim_ops, 1);
    r = ledger_send_begin (c, &ls, backing_flags (flags));
    if (r == 0)
      r = c->b->ops->trim (c->b, len, off, backing_flags (flags));
    r = ledger_send_end (c, &ls, r);
    break;
  default:
    abort ();
  }
  int err = errno;
  if (op != PASS_WRITE)         /* io_write logged the write */
    backing_written (c, off, len);
  /* Lost already: what the backing holds is unknown, as after a
   * failure (the clean copies are forgotten). */
  if (r == 0 && !(flags & CACHE_FUA) && passthrough_done (c, op, view))
    x->kind = FIX_FAILED;
  if (r == -1)
    x->kind = FIX_FAILED;
  x->unflushed = !(flags & CACHE_FUA);
  bool kept = fix_cached (c, x);
  range_unlock (c, start, end);
  /* A FUA request is answered as durable: on a deferred store the cached
   * copy's new state (clean, new data) must be durable too, or a crash
   * brings the store's older dirty version back over the backing.  So is
   * one that is not FUA but changed a block the store keeps (dirty, or
   * unstable): the backing has the new data, the store's log only the
   * older version until its next sync, which a crash would bring back
   * over the backing's newer data (foliod(8): "never an older one";
   * issue 33 item 17).  A deferred store only: the others persisted the
   * new data already. */
  if (r == 0 && ((flags & CACHE_FUA) || kept) &&
      (c->store->caps & STORE_DEFERRED) && cache_store_sync (c) == -1) {
    err = errno;
    r = -1;
  }
  errno = err;
  return r;
}

/* A write-class request [x->off, x->end), piece by piece. */
static int
passthrough (struct cache *c, enum pass_op op, struct fix *x, unsigned flags)
{
  if (op != PASS_WRITE)
    flags = durable_flags (c, flags);
  for (uint64_t p = x->off, pe; p < x->end; p = pe) {
    pe = piece_end (c, p, x->end);
    struct fix px = fix_piece (x, p, pe);
    if (passthrough_piece (c, op, &px, flags) == -1)
      return -1;
  }
  return 0;
}

int
direct_write (struct cache *c, const void *buf, uint64_t len, uint64_t off,
              unsigned flags)
{
  struct fix x = { .kind = FIX_WRITE, .off = off, .end = off + len,
                   .src = buf };

  OPSTAT_ADD (c, direct_write_ops, 1);
  OPSTAT_ADD (c, direct_write_bytes, len);
  return passthrough (c, PASS_WRITE, &x, flags);
}

int
cache_zero (struct cache *c, uint64_t len, uint64_t off, unsigned flags)
{
  struct fix x = { .kind = FIX_ZERO, .off = off, .end = off + len };

  if (range_check (c, len, off) == -1 || writable_check (c) == -1 ||
      ledger_io_refused (c) == -1)
    return -1;
  if (len == 0)
    return 0;
  if ((flags & CACHE_FAST_ZERO) && !(c->b->caps & BACKING_CAN_FAST_ZERO)) {
    errno = ENOTSUP;
    return -1;
  }
  OPSTAT_ADD (c, client_zero_bytes, len);
  return passthrough (c, PASS_ZERO, &x, flags);
}

/* Trim whole blocks only: the parts of partial blocks keep their data. */
int
cache_trim (struct cache *c, uint64_t len, uint64_t off, unsigned flags)
{
  uint64_t bmask = ((uint64_t) 1 << c->block_shift) - 1;
  uint64_t end = off + len;

  if (range_check (c, len, off) == -1 || writable_check (c) == -1 ||
      ledger_io_refused (c) == -1)
    return -1;
  OPSTAT_ADD (c, client_trim_bytes, len);
  if (!(c->b->caps & BACKING_CAN_TRIM))
    return 0;                      /* advisory: nothing to do */
  off = (off + bmask) & ~bmask;
  if (end != c->size)
    end &= ~bmask;
  if (off >= end)
    return 0;
  struct fix x = { .kind = FIX_DROP, .off = off, .end = end };
  return passthrough (c, PASS_TRIM, &x, flags);
}
