/* Per-block state of a folio: uptodate bits, then dirty bits (as in the
 * kernel's iomap_folio_state).  Helpers keep the counters in step. */
#include <string.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

static inline bool
bit_test (const uint64_t *bits, uint32_t i)
{
  return bits[i / 64] & (1ull << (i % 64));
}

/* Set (on) or clear bits [start, end); returns how many changed. */
static uint32_t
bits_assign (uint64_t *bits, uint32_t start, uint32_t end, bool on)
{
  uint32_t changed = 0;

  for (uint32_t i = start; i < end; i++) {
    uint64_t m = 1ull << (i % 64);
    if (!!(bits[i / 64] & m) != on) {
      bits[i / 64] ^= m;
      changed++;
    }
  }
  return changed;
}

bool
folio_block_uptodate (const struct cache *c, const struct folio *f,
                      uint32_t blk)
{
  (void) c;
  return bit_test (f->bits, blk);
}

bool
folio_block_dirty (const struct cache *c, const struct folio *f, uint32_t blk)
{
  return bit_test (f->bits, c->blocks_per_folio + blk);
}

void
folio_set_uptodate (struct cache *c, struct folio *f, uint32_t start,
                    uint32_t end)
{
  (void) c;
  f->nr_uptodate += bits_assign (f->bits, start, end, true);
}

void
folio_clear_uptodate (struct cache *c, struct folio *f, uint32_t start,
                      uint32_t end)
{
  (void) c;
  f->nr_uptodate -= bits_assign (f->bits, start, end, false);
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
  pthread_mutex_lock (&c->lock);
  fidx_set_mark (&c->index, f->index, marked);
  if (!marked)
    pthread_cond_broadcast (&c->space_cv);
  pthread_mutex_unlock (&c->lock);
}

void
folio_set_dirty (struct cache *c, struct folio *f, uint32_t start,
                 uint32_t end)
{
  uint32_t bpf = c->blocks_per_folio;
  bool was = folio_marked (f);
  uint32_t added = bits_assign (f->bits, bpf + start, bpf + end, true);

  if (added == 0)
    return;
  if (f->nr_dirty == 0)
    f->dirtied_ms = now_ms ();
  f->nr_dirty += added;
  STAT_ADD (c, dirty_bytes, (uint64_t) added << c->block_shift);
  folio_mark (c, f, was);
}

void
folio_clear_dirty (struct cache *c, struct folio *f, uint32_t start,
                   uint32_t end)
{
  uint32_t bpf = c->blocks_per_folio;
  bool was = folio_marked (f);
  uint32_t removed = bits_assign (f->bits, bpf + start, bpf + end, false);

  if (removed == 0)
    return;
  f->nr_dirty -= removed;
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
  uint32_t bpf = c->blocks_per_folio;
  bool was = folio_marked (f);
  uint32_t changed = bits_assign (f->bits, 2 * bpf + start, 2 * bpf + end,
                                  on);
  uint64_t bytes = (uint64_t) changed << c->block_shift;

  if (on) {
    f->nr_unstable += changed;
    STAT_ADD (c, unstable_bytes, bytes);
  } else {
    f->nr_unstable -= changed;
    atomic_fetch_sub (&c->st.unstable_bytes, bytes);
  }
  folio_mark (c, f, was);
}

void
folio_written (struct cache *c, struct folio *f, uint32_t start,
               uint32_t end, bool unstable)
{
  if (unstable)      /* first, so that the folio stays marked throughout */
    folio_assign_unstable (c, f, start, end, true);
  folio_clear_dirty (c, f, start, end);
}

void
folio_settle (struct cache *c, struct folio *f, bool lost)
{
  uint32_t bpf = c->blocks_per_folio;

  for (uint32_t i = 0; i < bpf && f->nr_unstable > 0; i++) {
    if (!bit_test (f->bits, 2 * bpf + i))
      continue;
    if (lost)
      folio_set_dirty (c, f, i, i + 1);
    folio_assign_unstable (c, f, i, i + 1, false);
  }
}

/* Forget all state: the slot is about to hold another folio. */
void
folio_reset (struct cache *c, struct folio *f)
{
  memset (f->bits, 0, c->store->bitmap_words * sizeof (uint64_t));
  f->nr_uptodate = f->nr_dirty = f->nr_unstable = 0;
  f->dirtied_ms = 0;
}
