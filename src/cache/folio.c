/* Per-block state of a folio: one plane of bits per enum folio_plane (as
 * the kernel's iomap_folio_state), searched a word at a time.  Helpers keep
 * the counters in step. */
#include <assert.h>
#include <string.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

/* Bits [lo, hi) of one word, 0 <= lo < hi <= 64. */
static inline uint64_t
word_mask (uint32_t lo, uint32_t hi)
{
  return (hi == 64 ? ~0ull : (1ull << hi) - 1) & (~0ull << lo);
}

/* Set (on) or clear bits [start, end), a word at a time; returns how many
 * changed. */
static uint32_t
bits_assign (uint64_t *bits, uint32_t start, uint32_t end, bool on)
{
  uint32_t changed = 0;

  while (start < end) {
    uint32_t w = start / 64, hi = end - w * 64 < 64 ? end - w * 64 : 64;
    uint64_t m = word_mask (start % 64, hi);
    uint64_t flip = (on ? ~bits[w] : bits[w]) & m;
    if (flip != 0) {           /* no store: the line stays shared */
      changed += (uint32_t) __builtin_popcountll (flip);
      /* Relaxed atomic: a store's committer reads the words as they
       * change (store-ssd.c block_live). */
      __atomic_store_n (&bits[w], bits[w] ^ flip, __ATOMIC_RELAXED);
    }
    start = w * 64 + hi;
  }
  return changed;
}

/* The first bit in [start, end) that is set (on) or clear, else end: a
 * word at a time, counting trailing zeros (the kernel's find_next_bit). */
static uint32_t
bits_next (const uint64_t *bits, uint32_t start, uint32_t end, bool on)
{
  uint64_t flip = on ? 0 : ~0ull;

  while (start < end) {
    uint32_t w = start / 64;
    uint64_t word = (bits[w] ^ flip) & (~0ull << (start % 64));
    if (word) {
      uint32_t i = w * 64 + (uint32_t) __builtin_ctzll (word);
      return i < end ? i : end;
    }
    start = (w + 1) * 64;
  }
  return end;
}

static inline uint32_t
bits_next_set (const uint64_t *bits, uint32_t start, uint32_t end)
{
  return bits_next (bits, start, end, true);
}

static inline uint32_t
bits_next_clear (const uint64_t *bits, uint32_t start, uint32_t end)
{
  return bits_next (bits, start, end, false);
}

/* Where block blk's bit of plane p is in the folio's bitmap. */
static inline uint32_t
plane_bit (const struct cache *c, enum folio_plane p, uint32_t blk)
{
  return (uint32_t) p * c->blocks_per_folio + blk;
}

bool
folio_test (const struct cache *c, const struct folio *f,
            enum folio_plane p, uint32_t blk)
{
  uint32_t i = plane_bit (c, p, blk);

  return f->bits[i / 64] & (1ull << (i % 64));
}

uint32_t
folio_next (const struct cache *c, const struct folio *f,
            enum folio_plane p, bool on, uint32_t start, uint32_t end)
{
  uint32_t s = plane_bit (c, p, start), e = plane_bit (c, p, end);
  uint32_t i = on ? bits_next_set (f->bits, s, e)
                  : bits_next_clear (f->bits, s, e);

  return i - plane_bit (c, p, 0);
}

uint64_t
window_next (const struct cache *c, const struct window *w,
             enum folio_plane p, bool on, uint64_t start, uint64_t end)
{
  uint32_t bpf = c->blocks_per_folio;

  for (uint64_t b = start; b < end;) {
    uint64_t fb = b - b % bpf;                 /* the folio's first block */
    uint64_t fend = end - fb < bpf ? end : fb + bpf;
    const struct folio *f = w->f[b / bpf - w->start];
    if (f == NULL) {
      if (!on)
        return b;                              /* no bit of it is set */
    } else {
      uint32_t i = folio_next (c, f, p, on, (uint32_t) (b - fb),
                               (uint32_t) (fend - fb));
      if (fb + i < fend)
        return fb + i;
    }
    b = fend;
  }
  return end;
}

bool
folio_block_uptodate (const struct cache *c, const struct folio *f,
                      uint32_t blk)
{
  return folio_test (c, f, FP_UPTODATE, blk);
}

bool
folio_block_dirty (const struct cache *c, const struct folio *f, uint32_t blk)
{
  return folio_test (c, f, FP_DIRTY, blk);
}

/* Set or clear blocks [start, end) of plane p; returns how many changed. */
static uint32_t
folio_assign (struct cache *c, struct folio *f, enum folio_plane p,
              uint32_t start, uint32_t end, bool on)
{
  return bits_assign (f->bits, plane_bit (c, p, start), plane_bit (c, p, end),
                      on);
}

/* Are blocks [start, end) of plane p all set (on) or all clear? */
static bool
folio_all (const struct cache *c, const struct folio *f, enum folio_plane p,
           bool on, uint32_t start, uint32_t end)
{
  return folio_next (c, f, p, !on, start, end) == end;
}

/* Move a counter of f by the blocks that changed: it never exceeds the
 * folio's blocks (a miscount would wrap it). */
static void
folio_count (const struct cache *c, uint32_t *nr, uint32_t changed, bool on)
{
  if (changed == 0)
    return;
  assert (on || *nr >= changed);
  *nr = on ? *nr + changed : *nr - changed;
  assert (*nr <= c->blocks_per_folio);
}

void
folio_set_uptodate (struct cache *c, struct folio *f, uint32_t start,
                    uint32_t end)
{
  uint32_t added = folio_assign (c, f, FP_UPTODATE, start, end, true);

  folio_count (c, &f->nr_uptodate, added, true);
}

/* The cache forgets its copy: only of blocks it does not answer for
 * (dirty ones are newer than the backing, unstable ones it may have to
 * write again: both must stay uptodate). */
void
folio_clear_uptodate (struct cache *c, struct folio *f, uint32_t start,
                      uint32_t end)
{
  assert (folio_all (c, f, FP_DIRTY, false, start, end));
  assert (folio_all (c, f, FP_UNSTABLE, false, start, end));
  uint32_t removed = folio_assign (c, f, FP_UPTODATE, start, end, false);

  folio_count (c, &f->nr_uptodate, removed, false);
}

static bool
folio_marked (const struct folio *f)
{
  return f->nr_dirty > 0 || f->nr_unstable > 0;
}

/* The folio's mark in the index must follow folio_marked(). */
static void
folio_mark (struct cache *c, struct folio *f, bool was_marked)
{
  bool marked = folio_marked (f);

  if (marked == was_marked)
    return;
  index_lock (c);
  fidx_set_mark (&c->index, f->index, marked);
  if (!marked)
    pthread_cond_broadcast (&c->space_cv);
  unlock_or_die (&c->lock);
  if (!marked)
    throttle_wake (c);
}

void
folio_set_dirty (struct cache *c, struct folio *f, uint32_t start,
                 uint32_t end)
{
  bool was = folio_marked (f);

  assert (folio_all (c, f, FP_UPTODATE, true, start, end)); /* dirty => uptodate */
  uint32_t added = folio_assign (c, f, FP_DIRTY, start, end, true);

  if (added == 0)
    return;
  if (f->nr_dirty == 0)
    f->dirtied_ms = now_ms ();
  folio_count (c, &f->nr_dirty, added, true);
  STAT_ADD (c, dirty_bytes, (uint64_t) added << c->block_shift);
  folio_mark (c, f, was);
}

void
folio_clear_dirty (struct cache *c, struct folio *f, uint32_t start,
                   uint32_t end)
{
  bool was = folio_marked (f);
  uint32_t removed = folio_assign (c, f, FP_DIRTY, start, end, false);

  if (removed == 0)
    return;
  folio_count (c, &f->nr_dirty, removed, false);
  atomic_fetch_sub_explicit (&c->st.dirty_bytes,
                             (uint64_t) removed << c->block_shift,
                             memory_order_relaxed);
  if (f->nr_dirty == 0)
    f->dirtied_ms = 0;
  folio_mark (c, f, was);
}

static void
folio_assign_unstable (struct cache *c, struct folio *f, uint32_t start,
                       uint32_t end, bool on)
{
  bool was = folio_marked (f);

  assert (!on || folio_all (c, f, FP_UPTODATE, true, start, end));
  uint32_t changed = folio_assign (c, f, FP_UNSTABLE, start, end, on);
  uint64_t bytes = (uint64_t) changed << c->block_shift;

  folio_count (c, &f->nr_unstable, changed, on);
  if (on)
    STAT_ADD (c, unstable_bytes, bytes);
  else
    atomic_fetch_sub (&c->st.unstable_bytes, bytes);
  folio_mark (c, f, was);
}

void
folio_written (struct cache *c, struct folio *f, uint32_t start,
               uint32_t end, bool unstable)
{
  /* Unstable first, so that the folio stays marked throughout, and
   * persisted first: a block must never be neither (store-pmem.c). */
  if (unstable) {
    folio_assign_unstable (c, f, start, end, true);
    folio_persist_bits (c, f);
  }
  folio_clear_dirty (c, f, start, end);
  folio_persist_bits (c, f);
}

void
folio_settle (struct cache *c, struct folio *f, bool lost)
{
  uint32_t bpf = c->blocks_per_folio, i = 0;

  while ((i = folio_next (c, f, FP_UNSTABLE, true, i, bpf)) < bpf) {
    uint32_t e = folio_next (c, f, FP_UNSTABLE, false, i, bpf);
    if (lost) {
      folio_set_dirty (c, f, i, e);
      folio_persist_bits (c, f);      /* dirty before unstable goes */
    }
    folio_assign_unstable (c, f, i, e, false);
    i = e;
  }
  folio_persist_bits (c, f);
}

void
folio_drop (struct cache *c, struct folio *f, uint32_t start, uint32_t end)
{
  folio_clear_dirty (c, f, start, end);
  folio_assign_unstable (c, f, start, end, false);
  folio_clear_uptodate (c, f, start, end);
  folio_persist_bits (c, f);
}

/* Forget all state: the slot is about to hold another folio.  Only a
 * clean, stable folio may be forgotten (rule 4: dirty data is never
 * dropped). */
void
folio_reset (struct cache *c, struct folio *f)
{
  uint32_t bpf = c->blocks_per_folio;

  assert (f->nr_dirty == 0 && f->nr_unstable == 0);
  assert (folio_all (c, f, FP_DIRTY, false, 0, bpf));
  assert (folio_all (c, f, FP_UNSTABLE, false, 0, bpf));
  for (uint32_t w = 0; w < c->store->bitmap_words; w++)
    __atomic_store_n (&f->bits[w], 0, __ATOMIC_RELAXED);   /* as bits_assign */
  f->nr_uptodate = f->nr_dirty = f->nr_unstable = 0;
  f->dirtied_ms = 0;
  f->ra = false;                /* the caller counted it (ra_dropped) */
}

/* ---- the readahead flag (f->ra: filled by readahead, unread) ---- */

void
ra_filled (struct cache *c, struct folio *f)
{
  f->ra = true;
  atomic_fetch_add (&c->ra_unread, 1);
}

void
ra_read (struct cache *c, struct folio *f)
{
  f->ra = false;
  atomic_fetch_sub (&c->ra_unread, 1);
  OPSTAT_ADD (c, readahead_hits, 1);
}

void
ra_dropped (struct cache *c, struct folio *f)
{
  f->ra = false;
  atomic_fetch_sub (&c->ra_unread, 1);
  OPSTAT_ADD (c, readahead_wasted, 1);
}
