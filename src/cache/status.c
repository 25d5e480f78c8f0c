/* Block status: the backing's map, with every dirty block reported as
 * DATA (the backing may still call it a hole: the data is only here). */
#include <errno.h>

#include "cache/cache-int.h"
#include "cache/ops.h"

struct emitter {
  cache_extent_fn fn;
  void *opaque;
  uint64_t pos;             /* next offset to report */
  int stop;                 /* fn asked to stop */
};

static int
emit (struct emitter *e, uint64_t end, enum backing_extent_type type)
{
  if (e->stop || end <= e->pos)
    return e->stop;
  e->stop = e->fn (e->opaque, e->pos, end - e->pos, type);
  e->pos = end;
  return e->stop;
}

/* Report [e->pos, end), which the backing calls type (a hole or zero), as
 * DATA where dirty blocks lie. */
static int
emit_hole (struct cache *c, struct emitter *e, uint64_t end,
           enum backing_extent_type type)
{
  uint64_t fi = folio_of (c, e->pos), last = folio_of (c, end - 1);
  uint32_t bpf = c->blocks_per_folio;

  while (!e->stop && fi <= last) {
    pthread_mutex_lock (&c->lock);
    struct folio *f = fidx_find (&c->index, &fi, last, true);
    pthread_mutex_unlock (&c->lock);
    if (f == NULL)
      break;
    pthread_mutex_t *m = stripe_of (c, fi);
    pthread_mutex_lock (m);
    pthread_mutex_lock (&c->lock);
    f = fidx_get (&c->index, fi);
    pthread_mutex_unlock (&c->lock);
    for (uint32_t i = 0; f != NULL && i < bpf && !e->stop; i++) {
      uint64_t bs = folio_pos (c, fi) + block_pos (c, i);
      uint64_t be = bs + block_pos (c, 1);
      if (be <= e->pos || bs >= end || !folio_block_dirty (c, f, i))
        continue;
      emit (e, bs, type);
      emit (e, be < end ? be : end, BACKING_DATA);
    }
    pthread_mutex_unlock (m);
    fi++;
  }
  return emit (e, end, type);
}

int
cache_block_status (struct cache *c, uint64_t len, uint64_t off,
                    cache_extent_fn fn, void *opaque)
{
  struct emitter e = { .fn = fn, .opaque = opaque, .pos = off };
  uint64_t end = off + len;

  if (range_check (c, len, off) == -1)
    return -1;
  while (e.pos < end && !e.stop) {
    struct backing_extent ext = { e.pos, end - e.pos, BACKING_DATA };
    if ((c->b->caps & BACKING_CAN_MAP) && c->b->ops->map != NULL &&
        c->b->ops->map (c->b, e.pos, end - e.pos, &ext) == -1)
      return -1;
    uint64_t ext_end = ext.offset + ext.length;
    if (ext_end > end || ext.length == 0)
      ext_end = end;
    if (ext.type == BACKING_DATA)
      emit (&e, ext_end, BACKING_DATA);
    else
      emit_hole (c, &e, ext_end, ext.type);
  }
  return 0;
}
