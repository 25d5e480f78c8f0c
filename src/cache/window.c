/* Windows: folios looked up and allocated under their range lock (the
 * stripes and the lookup are in fmap.c).  See the lock order in
 * cache-int.h; the waits for room are in throttle.c, which folio to evict
 * in lru.c. */
#include <assert.h>
#include <errno.h>

#include "cache/cache-int.h"

int
folio_adopt (struct cache *c, struct folio *f, uint64_t fi)
{
  if (fidx_insert (&c->index, fi, f) == -1)
    return -1;
  f->index = fi;
  f->cached = true;
  bucket_add (c, f);
  if (f->nr_dirty || f->nr_unstable)
    fidx_set_mark (&c->index, fi, true);
  lru_add_locked (c, f);
  return 0;
}

/* A free slot, else an evicted one.  A free slot may always be reused:
 * slots go free at start (after recovery's sync), by a failed insert
 * (taken free or evictable) and by folio_replace (only on a store
 * without STORE_REUSE_SYNC). */
static struct folio *
slot_take_locked (struct cache *c)
{
  if (c->nr_free > 0)
    return &c->folios[c->free_slots[--c->nr_free]];
  return lru_evict_locked (c, false);
}

/* Put a new folio for number fi in the index (lock held). */
static int
folio_insert_locked (struct cache *c, struct folio *f, uint64_t fi)
{
  if (fidx_insert (&c->index, fi, f) == -1) {
    c->free_slots[c->nr_free++] = f->slot;
    return -1;
  }
  f->index = fi;
  f->cached = true;
  bucket_add (c, f);
  c->store->ops->set_index (c->store, f->slot, fi);
  lru_add_locked (c, f);
  return 0;
}

/* Create the window's folios that window_lookup_fast did not find (lock
 * held).  Returns 0, or -1 with errno EAGAIN when memory must be cleaned
 * first. */
static int
window_create_locked (struct cache *c, struct window *w)
{
  for (uint64_t fi = w->start; fi < w->end; fi++) {
    struct folio *f = w->f[fi - w->start];
    if (f == NULL) {
      f = slot_take_locked (c);
      if (f == NULL) {
        errno = EAGAIN;
        return -1;
      }
      if (folio_insert_locked (c, f, fi) == -1)
        return -1;
      folio_mark_accessed (f);     /* this request's look */
    }
    w->f[fi - w->start] = f;
  }
  return 0;
}

/* The hit path: look the window's folios up under its stripes alone (w->f
 * filled), marking them accessed (the replacement policy's only news of a
 * hit).  true if that is all there is to do: every folio is cached, or
 * need not be (!alloc); else window_create_locked finishes under the
 * index lock. */
static bool
window_lookup_fast (struct cache *c, struct window *w, bool alloc)
{
  bool done = true;

  for (uint64_t fi = w->start; fi < w->end; fi++) {
    struct folio *f = folio_lookup (c, fi);
    w->f[fi - w->start] = f;
    if (f != NULL)
      folio_mark_accessed (f);
    else if (alloc)
      done = false;
  }
  return done;
}

int
window_begin (struct cache *c, struct window *w, uint64_t start,
              uint64_t end, bool alloc)
{
  assert (start < end && end - start <= WINDOW_MAX);
  w->start = start;
  w->end = end;
  for (;;) {
    range_lock (c, start, end);
    if (window_lookup_fast (c, w, alloc))
      return 0;
    index_lock (c);
    if (window_create_locked (c, w) == 0) {
      unlock_or_die (&c->lock);
      return 0;
    }
    int err = errno;
    /* Never wait holding stripes: writeback needs them. */
    range_unlock (c, start, end);
    int r = throttle_room_locked (c, err);
    unlock_or_die (&c->lock);
    if (r == -1)
      return -1;
  }
}

/* Take the stripes of folios [start, end) if all are free.  In folio
 * order, not stripe order: a trylock never waits, so it cannot deadlock
 * against range_lock. */
static bool
range_trylock (struct cache *c, uint64_t start, uint64_t end)
{
  for (uint64_t fi = start; fi < end; fi++)
    if (!trylock_or_die (stripe_of (c, fi))) {
      range_unlock (c, start, fi);
      return false;
    }
  return true;
}

int
window_try_begin (struct cache *c, struct window *w, uint64_t start,
                  uint64_t end, bool alloc)
{
  int r;

  assert (start < end && end - start <= WINDOW_MAX);
  w->start = start;
  w->end = end;
  if (!range_trylock (c, start, end)) {
    errno = EAGAIN;
    return -1;
  }
  if (window_lookup_fast (c, w, alloc))
    return 0;
  index_lock (c);
  r = window_create_locked (c, w);
  unlock_or_die (&c->lock);
  if (r == -1) {
    int err = errno;
    range_unlock (c, start, end);
    errno = err;
  }
  return r;
}

int
window_alloc_free (struct cache *c, struct window *w)
{
  uint64_t missing = 0;

  for (uint64_t fi = w->start; fi < w->end; fi++)
    missing += w->f[fi - w->start] == NULL;
  if (missing == 0)
    return 0;
  index_lock (c);
  if (c->nr_free < missing) {
    unlock_or_die (&c->lock);
    errno = EAGAIN;
    return -1;
  }
  for (uint64_t fi = w->start; fi < w->end; fi++) {
    struct folio *f;
    if (w->f[fi - w->start] != NULL)
      continue;
    f = &c->folios[c->free_slots[--c->nr_free]];
    if (folio_insert_locked (c, f, fi) == -1) {
      unlock_or_die (&c->lock);
      errno = ENOMEM;
      return -1;
    }
    folio_mark_accessed (f);
    w->f[fi - w->start] = f;
  }
  unlock_or_die (&c->lock);
  return 0;
}

/* Readahead takes a free slot, else what the replacement policy gives up
 * from its inactive list but another stream's unread readahead. */
static struct folio *
ra_slot_take_locked (struct cache *c)
{
  if (c->nr_free > 0)
    return &c->folios[c->free_slots[--c->nr_free]];
  return lru_evict_locked (c, true);
}

int
window_ra_begin (struct cache *c, struct window *w, uint64_t start,
                 uint64_t end)
{
  uint64_t fi;

  assert (start < end && end - start <= WINDOW_MAX);
  range_lock (c, start, end);
  index_lock (c);
  for (fi = start; fi < end; fi++) {
    struct folio *f = folio_lookup (c, fi);
    if (f == NULL) {                /* a cached one keeps its LRU place */
      f = ra_slot_take_locked (c);
      if (f == NULL || folio_insert_locked (c, f, fi) == -1)
        break;
    }
    w->f[fi - start] = f;
  }
  unlock_or_die (&c->lock);
  if (fi < end)
    range_unlock (c, fi, end);
  if (fi == start) {
    errno = EAGAIN;
    return -1;
  }
  w->start = start;
  w->end = fi;
  return 0;
}

void
window_end (struct cache *c, struct window *w)
{
  range_unlock (c, w->start, w->end);
}

struct folio *
cached_folio_next (struct cache *c, uint64_t *fi, uint64_t end)
{
  index_lock (c);
  struct folio *f = fidx_find (&c->index, fi, end, false);
  unlock_or_die (&c->lock);
  return f;
}

/* ---- folios handed out before they are in the index (wprep.c) ---- */

bool
slots_take_free (struct cache *c, uint32_t n, uint32_t reserve,
                 uint32_t *slots)
{
  bool ok;

  index_lock (c);
  ok = c->nr_free >= n + reserve;
  for (uint32_t i = 0; ok && i < n; i++)
    slots[i] = c->free_slots[--c->nr_free];
  unlock_or_die (&c->lock);
  return ok;
}

/* Last first: the next take gets them back in the order they were taken
 * (a stream's folios stay side by side in memory for writeback). */
void
slots_give_back (struct cache *c, uint32_t n, const uint32_t *slots)
{
  index_lock (c);
  while (n > 0)
    c->free_slots[c->nr_free++] = slots[--n];
  pthread_cond_broadcast (&c->space_cv);
  unlock_or_die (&c->lock);
}

int
folio_replace (struct cache *c, struct folio *old, struct folio *nf,
               uint64_t fi)
{
  int r = 0;

  /* old's slot goes free without store_may_reuse: wprep.c never
   * replaces a folio on a store that needs a sync first. */
  assert (old == NULL || !store_has (c->store, STORE_REUSE_SYNC));
  index_lock (c);
  if (old != NULL) {
    lru_del_locked (c, old);
    bucket_del (c, old);
    fidx_replace (&c->index, fi, nf);
    old->cached = false;
    folio_reset (c, old);
    c->store->ops->set_index (c->store, old->slot, STORE_NO_FOLIO);
    c->free_slots[c->nr_free++] = old->slot;
  } else if (fidx_insert (&c->index, fi, nf) == -1) {
    r = -1;
  }
  if (r == 0) {
    nf->index = fi;
    nf->cached = true;
    bucket_add (c, nf);
    c->store->ops->set_index (c->store, nf->slot, fi);
    lru_add_locked (c, nf);
    folio_mark_accessed (nf);    /* a request's write */
  }
  unlock_or_die (&c->lock);
  return r;
}
