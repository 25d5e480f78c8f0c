/* Block status: the backing's map, with every dirty block reported as
 * DATA (the backing may still call it a hole: the data is only here).
 *
 * Race with writeback: a map answer of "hole" goes stale if writeback
 * writes a dirty block after map() and clears its bit before we look.  So
 * ranges are first checked for dirty folios: a range with none is mapped
 * without locks (every completed write there is already in the backing);
 * a dirty folio is mapped and checked under its stripe lock, which
 * writeback needs too. */
#include <errno.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

struct emitter {
  cache_extent_fn fn;
  void *opaque;
  uint64_t start, end;      /* pending extent, merged with like neighbours */
  enum backing_extent_type type;
  int stop;                 /* fn asked to stop */
};

static void
emit_pending (struct emitter *e)
{
  if (!e->stop && e->end > e->start)
    e->stop = e->fn (e->opaque, e->start, e->end - e->start, e->type);
  e->start = e->end;
}

/* Report [e->end, end) as type. */
static void
emit (struct emitter *e, uint64_t end, enum backing_extent_type type)
{
  if (end <= e->end)
    return;
  if (type != e->type) {
    emit_pending (e);
    e->type = type;
  }
  e->end = end;
}

/* [e->end, end) has no dirty block: the backing's answer stands. */
static int
emit_clean (struct cache *c, struct emitter *e, uint64_t end)
{
  struct backing_extent x;

  while (e->end < end && !e->stop) {
    if (cache_map (c, e->end, end, &x) == -1)
      return -1;
    emit (e, x.offset + x.length, x.type);
  }
  return 0;
}

/* [e->end, end) lies in cached folio f, whose stripe we hold. */
static int
emit_folio (struct cache *c, struct emitter *e, struct folio *f, uint64_t end)
{
  struct backing_extent x;
  uint64_t fstart = folio_pos (c, f->index);

  while (e->end < end && !e->stop) {
    if (cache_map (c, e->end, end, &x) == -1)
      return -1;
    uint64_t xend = x.offset + x.length;
    if (x.type == BACKING_DATA) {
      emit (e, xend, BACKING_DATA);
      continue;
    }
    /* A hole per the backing: dirty blocks in it are data. */
    while (e->end < xend) {
      uint32_t i = (uint32_t) ((e->end - fstart) >> c->block_shift);
      uint64_t bend = fstart + block_pos (c, i + 1);
      emit (e, bend < xend ? bend : xend,
            folio_block_dirty (c, f, i) ? BACKING_DATA : x.type);
    }
  }
  return 0;
}

int
cache_block_status (struct cache *c, uint64_t len, uint64_t off,
                    cache_extent_fn fn, void *opaque)
{
  struct emitter e = { .fn = fn, .opaque = opaque, .start = off, .end = off };
  uint64_t end = off + len;
  int r = 0;

  if (range_check (c, len, off) == -1)
    return -1;
  while (e.end < end && !e.stop && r == 0) {
    uint64_t fi = folio_of (c, e.end);
    lock_or_die (&c->lock);
    struct folio *f = fidx_find (&c->index, &fi, folio_of (c, end - 1) + 1,
                                 true);
    unlock_or_die (&c->lock);
    uint64_t clean_end = f ? folio_pos (c, fi) : end;
    if (e.end < clean_end) {
      r = emit_clean (c, &e, clean_end);
      continue;
    }
    uint64_t fend = folio_pos (c, fi + 1) < end ? folio_pos (c, fi + 1) : end;
    pthread_mutex_t *m = stripe_of (c, fi);
    lock_or_die (m);
    f = folio_lookup (c, fi);
    r = f ? emit_folio (c, &e, f, fend) : emit_clean (c, &e, fend);
    unlock_or_die (m);
  }
  emit_pending (&e);
  return r;
}
