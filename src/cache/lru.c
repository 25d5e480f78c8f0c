/* The replacement policy: which clean folio goes when room is needed.
 *
 * The kernel's two lists (mm/swap.c folio_mark_accessed, mm/vmscan.c),
 * in small:
 *
 * - A hit only counts itself in its folio, up to 2 (folio_mark_accessed,
 *   in cache-int.h): no lock, and no store once the count is 2, so a hot
 *   folio's line is not written on every hit.  The looks of one burst (a
 *   thread reading or writing a folio a block at a time) count once.
 * - A new folio goes to the inactive list's tail, counted once if a
 *   request made it (that request's look; readahead's count when read).
 *   Eviction takes from the inactive list's head, under the index lock.
 *   A folio it meets there that was looked up twice (used again after
 *   the look that brought it in) goes to the active list instead (the
 *   kernel promotes at the second look; here the evictor does it when it
 *   meets the folio, so that a hit takes no lock).  So a stream of folios
 *   used once, read or written, passes through the inactive list without
 *   pushing out the hot set, which sits in the active list.
 * - The active list is kept to half the cached folios: past that, its
 *   head goes to the inactive tail counted once (one more look brings it
 *   back), unless it was looked up since the last look at it, then it
 *   goes to the active tail, its count cleared (CLOCK).
 * - Dirty folios, folios under writeback and slots the store may not
 *   reuse yet go to the inactive tail (writeback cleans them meanwhile);
 *   a folio whose stripe is taken (perhaps our own window) is passed.
 *   When the inactive folios looked at are all such, a request takes a
 *   clean folio from the active list rather than wait for writeback.
 *
 * Each eviction looks at a bounded number of folios.  Everything here is
 * under c->lock but the counts (see struct folio).
 */
#include "cache/cache-int.h"

static void
list_del (struct cache *c, struct folio *f)
{
  struct lru_list *l = &c->lru[f->lru];

  if (f->lru_prev) f->lru_prev->lru_next = f->lru_next;
  else l->head = f->lru_next;
  if (f->lru_next) f->lru_next->lru_prev = f->lru_prev;
  else l->tail = f->lru_prev;
  f->lru_prev = f->lru_next = NULL;
  l->n--;
}

static void
list_add_tail (struct cache *c, struct folio *f, enum lru_kind k)
{
  struct lru_list *l = &c->lru[k];

  f->lru = k;
  f->lru_prev = l->tail;
  f->lru_next = NULL;
  if (l->tail) l->tail->lru_next = f;
  else l->head = f;
  l->tail = f;
  l->n++;
}

static void
list_move_tail (struct cache *c, struct folio *f, enum lru_kind k)
{
  list_del (c, f);
  list_add_tail (c, f, k);
}

_Thread_local const struct folio *lru_last_seen;

static unsigned
refs_of (struct folio *f)
{
  return atomic_load_explicit (&f->refs, memory_order_relaxed);
}

/* Only the lock holder lowers a count: a hit meanwhile may be lost,
 * which costs a folio one look, never correctness. */
static void
refs_set (struct folio *f, unsigned n)
{
  atomic_store_explicit (&f->refs, (unsigned char) n, memory_order_relaxed);
}

void
lru_add_locked (struct cache *c, struct folio *f)
{
  refs_set (f, 0);
  list_add_tail (c, f, LRU_INACTIVE);
}

void
lru_del_locked (struct cache *c, struct folio *f)
{
  list_del (c, f);
}

/* Active folio f leaves the active list's head: to its tail if looked up
 * since, else to the inactive list, one more look from coming back. */
static void
active_age (struct cache *c, struct folio *f)
{
  if (refs_of (f) > 0) {
    refs_set (f, 0);
    list_move_tail (c, f, LRU_ACTIVE);
  } else {
    refs_set (f, 1);
    list_move_tail (c, f, LRU_INACTIVE);
  }
}

/* Keep the active list to half the cached folios, looking at a few. */
static void
lru_balance_locked (struct cache *c, unsigned budget)
{
  while (c->lru[LRU_ACTIVE].n >
         (c->lru[LRU_ACTIVE].n + c->lru[LRU_INACTIVE].n) / 2 &&
         budget-- > 0)
    active_age (c, c->lru[LRU_ACTIVE].head);
}

/* Take f out of the cache if it is clean, stable and its slot reusable,
 * its stripe free (trylock: never our own window, never a wait).  1 if
 * taken, 0 if it stays for now (to the tail), -1 if its stripe is busy or
 * it is unread readahead and ra is set (left in place). */
static int
try_evict_locked (struct cache *c, struct folio *f, bool ra)
{
  pthread_mutex_t *m = stripe_of (c, f->index);
  int r = 0;

  if (!trylock_or_die (m))
    return -1;
  if (ra && f->ra) {
    r = -1;
  } else if (f->nr_dirty == 0 && f->nr_unstable == 0 && !f->writeback &&
             store_may_reuse (c->store, f->slot)) {
    if (f->ra)
      ra_dropped (c, f);
    folio_uncache_locked (c, f);
    r = 1;
  }
  unlock_or_die (m);
  return r;
}

/* Look at up to *budget folios from the head of list k for one to evict
 * and evict it.  On the inactive list, folios looked up twice go active;
 * on the active list (the fallback), folios looked up since go to its
 * tail.  Folios that cannot go yet go to the inactive tail. */
static struct folio *
scan_locked (struct cache *c, enum lru_kind k, bool ra, unsigned *budget)
{
  struct folio *f = c->lru[k].head;

  for (; f != NULL && *budget > 0; (*budget)--) {
    struct folio *next = f->lru_next;
    if (k == LRU_INACTIVE && refs_of (f) >= 2) {
      refs_set (f, 0);
      list_move_tail (c, f, LRU_ACTIVE);
    } else if (k == LRU_ACTIVE && refs_of (f) > 0) {
      active_age (c, f);
    } else {
      int r = try_evict_locked (c, f, ra);
      if (r == 1) {
        OPSTAT_ADD (c, evictions, 1);
        return f;
      }
      if (r == 0)
        list_move_tail (c, f, LRU_INACTIVE);
    }
    f = next;
  }
  return NULL;
}

struct folio *
lru_evict_locked (struct cache *c, bool ra)
{
  unsigned budget = 2 * c->window + 16;
  struct folio *f;

  lru_balance_locked (c, budget);
  f = scan_locked (c, LRU_INACTIVE, ra, &budget);
  /* Nothing clean among the inactive folios looked at (dirty, say,
   * waiting for writeback): a request takes a clean active one rather
   * than wait while there are some.  Readahead does not. */
  if (f == NULL && !ra) {
    budget = 2 * c->window + 16;
    f = scan_locked (c, LRU_ACTIVE, ra, &budget);
  }
  return f;
}

void
folio_uncache_locked (struct cache *c, struct folio *f)
{
  lru_del_locked (c, f);
  bucket_del (c, f);
  fidx_remove (&c->index, f->index);
  f->cached = false;
  folio_reset (c, f);
  c->store->ops->set_index (c->store, f->slot, STORE_NO_FOLIO);
}
