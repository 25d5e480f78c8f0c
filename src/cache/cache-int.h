/* Internals of the folio cache, shared by the files of src/cache/.
 *
 * Locks, in the order they are taken (the order across layers is in
 * include/foliod/lock.h):
 *   1. wb_mutex        serialises writeback passes (flush, background);
 *   1b. walk_lock      the pass under way, shared with the writeback
 *                      helpers (wb-walk.c); held while a batch is cut
 *                      (its stripes taken by trylock only), never across
 *                      its backing I/O nor while waiting on a stripe;
 *   2. stripe locks    c->stripes[i % NSTRIPES] guards the state and data
 *                      of folio number i, *whether or not the folio is
 *                      cached*: holding it means no one else reads the
 *                      backing for that range into the cache or passes I/O
 *                      through it.  Several stripes are taken in ascending
 *                      stripe order only (range_lock), a window's worth at
 *                      most; anything else uses trylock.
 *   3. lock            the index, the replacement policy's lists (lru.c),
 *                      the free slots, marks, waits.  Taken by misses,
 *                      evictions (which take stripes by trylock only), a
 *                      folio's clean<->dirty change (its mark) and the
 *                      writeback's lookups; never by a read hit nor a
 *                      write to dirty blocks: those hold their window's
 *                      stripes only, look the folios up in the
 *                      stripe-guarded buckets and count themselves in each
 *                      folio (f->refs, a relaxed atomic the evictor reads
 *                      and lowers under lock).
 * flush_group.lock is a leaf apart from them (flush-group.h): no other lock
 * is held while it is, and it is not held across a flush's pass.  So is
 * readahead's lock (readahead.c): a client read notes itself there, with
 * no other lock held, and the readahead threads take stripes without it.
 * Counters take no lock: those a request bumps are per-thread shards
 * (c->opst, foliod/stat.h), the gauges single atomics (c->st).
 *
 * Writeback does not hold a stripe across its backing write (the kernel's
 * folio_start_writeback, then folio_unlock): the batch's dirty runs are
 * cut and its folios marked f->writeback under their stripes, which are
 * then dropped.  Readers and fills of other blocks proceed meanwhile;
 * whatever would change a block in flight (a write, a passthrough write,
 * zero or trim, a prepared folio's swap) waits on its stripe's wb_done, with no
 * stripe held, until the mark is gone (wb_wait_folio: the kernel's
 * folio_wait_stable); eviction and other batches skip marked folios.  The
 * data written is thus the blocks as they were when the batch was cut,
 * and a write that comes during the I/O leaves its block dirty after.
 * A stripe is still held across the backing I/O of fills, passthrough
 * pieces and a write's own write-through (like the kernel's folio lock
 * during read); the index lock never is.  Nor across a store sync (an
 * msync): store_sync runs with no cache lock held, and set_index and
 * store_may_reuse, called under the index lock, never wait for one
 * (store.h).
 */
#ifndef FOLIOD_CACHE_INT_H
#define FOLIOD_CACHE_INT_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

#include "foliod/backing.h"
#include "foliod/cache.h"
#include "foliod/lock.h"
#include "foliod/stat.h"
#include "cache/ledger.h"
#include "foliod/store.h"
#include "cache/fidx.h"
#include "cache/flush-group.h"

/* Ranges.  Inside the cache every range is half-open, [start, end): of
 * bytes, blocks (global numbers, or numbers inside one folio) or folios.
 * Its length is end - start; an empty range has start == end.  Only the
 * calls that mirror the public and backing APIs (cache_*, io_read,
 * io_write) take a length and an offset. */

#define NSTRIPES 1024u
#ifndef WINDOW_MAX
#define WINDOW_MAX 256u   /* folios handled under one range lock */
#endif
#define WLOG_SIZE 64u     /* backing writes a parked fetch can look past */
#define WB_HELPERS 3u     /* threads that join a writeback pass's owner */
/* range_lock takes each stripe of a window once only because a window
 * has fewer folios than there are stripes. */
_Static_assert (WINDOW_MAX < NSTRIPES, "a window must not wrap the stripes");

/* A range lock's stripe (see the lock order above), on lines of its own:
 * threads working on neighbouring folios (a stripe a folio) must not
 * write each other's lines when they take their own stripes.  The cache
 * is allocated aligned for it (cache_create). */
struct stripe {
  _Alignas (64) pthread_mutex_t lock;
  /* Under lock: the writeback of a folio of this stripe ended. */
  pthread_cond_t wb_done;
};

/* Every mutex call of the cache goes through foliod/lock.h (the
 * mutexes are error-checking, see cache_init_locks). */

/* Per-folio state (iomap's iomap_folio_state).  The bitmap lives in the
 * store: a plane of blocks_per_folio bits per enum folio_plane (store.h):
 * uptodate, dirty, and unstable (written back, but the backing has not
 * flushed them yet and could lose them: see BACKING_VOLATILE).  A
 * folio is marked in the index while it has dirty or unstable blocks; it
 * is evictable only when it has neither. */
struct folio {
  uint64_t index;           /* folio number in the export; lock */
  uint32_t slot;            /* store slot, fixed */
  uint32_t nr_uptodate;     /* uptodate blocks; stripe */
  uint32_t nr_dirty;        /* dirty blocks; stripe */
  uint32_t nr_unstable;     /* unstable blocks; stripe */
  /* When it went from clean to dirty; written under the stripe, read
   * without it by the writeback scan (a hint, rechecked under the stripe). */
  _Atomic uint64_t dirtied_ms;
  struct folio *lru_prev, *lru_next; /* on c->lru[lru]; lock */
  struct folio *hnext;      /* the next in its bucket (folio_lookup); stripe */
  bool cached;              /* in the index; lock */
  unsigned char *data;      /* folio_size bytes from the store */
  uint64_t *bits;           /* state bitmap from the store */
  /* Requests that looked it up since the replacement policy last looked
   * (lru.c), 0 to 2: raised by hits without the index lock
   * (folio_mark_accessed), read and lowered under it. */
  _Atomic unsigned char refs;
  unsigned char lru;        /* enum lru_kind: the list it is on; lock */
  bool ra;                  /* filled by readahead, not read by a client
                               since (counted in c->ra_unread); stripe */
  bool writeback;           /* a batch is writing its dirty blocks back
                               (see the top of this file); stripe */
};

/* The replacement policy's lists (lru.c), oldest first. */
enum lru_kind { LRU_INACTIVE, LRU_ACTIVE };
struct lru_list {
  struct folio *head, *tail;
  uint32_t n;
};

/* Counters (foliod/stat.h).  Those a request bumps are sharded
 * (c->opst, OPSTAT_ADD): threads serving requests count without sharing
 * a line. */
struct cache_op_counters {
  _Atomic uint64_t read_ops, read_hits, read_misses;
  _Atomic uint64_t client_read_bytes, client_write_bytes;
  _Atomic uint64_t client_zero_bytes, client_trim_bytes;
  _Atomic uint64_t backing_read_ops, backing_read_bytes;
  _Atomic uint64_t backing_write_ops, backing_write_bytes;
  _Atomic uint64_t backing_zero_ops, backing_zero_bytes;
  _Atomic uint64_t backing_trim_ops;
  _Atomic uint64_t direct_read_ops, direct_read_bytes;
  _Atomic uint64_t direct_write_ops, direct_write_bytes;
  _Atomic uint64_t evictions, read_errors;
  _Atomic uint64_t lock_waits_index, lock_waits_stripe;
  _Atomic uint64_t readahead_bytes, readahead_hits, readahead_wasted;
  _Atomic uint64_t readahead_notes;
  _Atomic uint64_t backing_write_ns;
};

/* The gauges the throttle and writeback decide by, and events off the
 * request path: one relaxed atomic each (c->st, STAT_ADD).  The gauges
 * change when a block goes from clean to dirty or back, not on every
 * write (a write to a dirty block leaves them alone). */
struct cache_counters {
  _Atomic uint64_t dirty_bytes, unstable_bytes;
  _Atomic uint64_t backing_flush_ops, writeback_errors, throttle_waits;
  _Atomic uint64_t lock_waits_walk, readahead_windows;
  _Atomic uint64_t backing_flush_ns, flush_ns;
};

struct cache {
  struct backing *b;
  struct store *store;
  struct store *own_store;  /* the ram store we created, if any */
  bool ram_kept;            /* cache_keep_ram: handed over, not lost */
  struct cache_config cfg;
  uint64_t size;            /* export bytes */
  unsigned folio_shift, block_shift;
  uint32_t blocks_per_folio;
  uint64_t nr_folios;       /* folio numbers are [0, nr_folios) */
  uint32_t window;          /* folios per range lock, <= WINDOW_MAX */
  uint64_t dirty_limit, dirty_background; /* bytes */

  struct stripe stripes[NSTRIPES];

  pthread_mutex_t lock;
  uint64_t lock_taken;      /* index_lock calls (stats); lock */
  pthread_cond_t space_cv;  /* slots freed or data cleaned */
  struct fidx index;
  /* The same map for lookups under a stripe, without lock: chains of
   * folios hashed so that a bucket's folios share a stripe, which guards
   * the bucket (nr_buckets_per_stripe a power of two). */
  struct folio **buckets;
  uint64_t buckets_per_stripe;
  struct folio *folios;     /* nslots, one per store slot */
  uint32_t *free_slots;     /* stack of free slot numbers */
  uint32_t nr_free;
  struct lru_list lru[2];   /* cached folios by enum lru_kind; lock */
  _Atomic unsigned space_waiters; /* threads waiting for room */
  /* Writers waiting on the dirty limit, first come first served
   * (throttle.c): woken only when there is room for them.  Under
   * throttle_lock, a leaf, taken with no other cache lock held (the
   * writers stay off c->lock: they were half its acquisitions at 16
   * writer threads).  throttle_queued is their
   * number, read without the lock by writers that would pass them. */
  pthread_mutex_t throttle_lock;
  struct throttle_waiter *throttle_head, *throttle_tail;
  _Atomic unsigned throttle_queued;
  /* Of them, wake-ups by a signal that found no room (throttle_lock). */
  uint64_t throttle_futile;

  /* Writeback. */
  pthread_mutex_t walk_lock;
  pthread_cond_t walk_cv;   /* under walk_lock: a pass began, a batch or a
                             * mid-pass flush ended, stop */
  struct wb_walk *walk;     /* the pass under way, or NULL; walk_lock */
  bool walk_stop;           /* walk_lock */
  pthread_t wb_helpers[WB_HELPERS];
  unsigned nr_helpers;
  struct flush_group flush_group; /* concurrent cache_flush share passes */
  bool flush_group_ok;
  pthread_mutex_t wb_mutex;
  pthread_t wb_thread;
  bool wb_running, wb_kick;
  _Atomic bool wb_stop;     /* set under lock, read without it too */
  pthread_cond_t wb_cv;     /* under lock: wakes the writeback thread */
  uint64_t wb_cursor;       /* background pass resumes here; wb_mutex */
  struct ledger led;        /* what is durable: ledger.c alone */
  /* The ranges of the latest backing writes, zeroes and trims (io.c;
   * fetch.c asks it whether what a parked read fetched is still the
   * backing's content): entry g % WLOG_SIZE is the g-th, wlog_gen the
   * latest.  wlog_lock. */
  pthread_mutex_t wlog_lock;
  uint64_t wlog_gen;
  struct { uint64_t off, end; } wlog[WLOG_SIZE];

  pthread_key_t bounce_key; /* per-thread bounce buffer, max_io_bytes */
  bool bounce_key_ok;
  unsigned char *zero_block;/* block_size zero bytes */

  /* The store: what it can do is in its caps (store_has), never which
   * it is.  A durable one (STORE_DURABLE) gets persist() and sync() in
   * the order of the protocol in store.h, and a slot takes a new folio
   * only when store_may_reuse says so. */
  struct cache_store_info sinfo;

  struct cache_counters st;
  STAT_SHARDED (struct cache_op_counters) *opst;
  struct readahead *ra;     /* NULL: no readahead (readahead.c) */
  _Atomic uint64_t ra_unread; /* folios with f->ra set (folio.c) */
};

/* --- the store's persistence (persist.c); no-ops on the ram store --- */
/* Blocks [start, end) of f's data, then f's bits. */
void folio_persist_data (struct cache *c, struct folio *f, uint32_t start,
                         uint32_t end);
void folio_persist_bits_slow (struct cache *c, struct folio *f);
static inline void
folio_persist_bits (struct cache *c, struct folio *f)
{
  if (store_has (c->store, STORE_DURABLE))
    folio_persist_bits_slow (c, f);
}
/* Make what was persisted durable (FLUSH, FUA; after writeback, so that
 * cleaned slots may be reused).  0, or -1/errno, which sticks
 * (ledger_store_sync_failed). */
int cache_store_sync (struct cache *c);

/* A window: consecutive folios [start, end) under one range lock. */
struct window {
  uint64_t start, end;
  struct folio *f[WINDOW_MAX]; /* f[fi - start]; NULL where not cached */
};
/* The folio of window w holding global block blk. */
static inline struct folio *
window_folio (const struct cache *c, const struct window *w, uint64_t blk)
{
  return w->f[blk / c->blocks_per_folio - w->start];
}

/* --- geometry --- */
static inline uint64_t folio_of (const struct cache *c, uint64_t off)
{ return off >> c->folio_shift; }
static inline uint64_t folio_pos (const struct cache *c, uint64_t fi)
{ return fi << c->folio_shift; }
static inline uint64_t block_of (const struct cache *c, uint64_t off)
{ return off >> c->block_shift; }
static inline uint64_t block_pos (const struct cache *c, uint64_t blk)
{ return blk << c->block_shift; }

/* --- folio state (folio.c); caller holds the folio's stripe --- */
bool folio_test (const struct cache *c, const struct folio *f,
                 enum folio_plane p, uint32_t blk);
/* The first block in [start, end) whose bit in plane p is set (on) or
 * clear; end if none.  A word at a time. */
uint32_t folio_next (const struct cache *c, const struct folio *f,
                     enum folio_plane p, bool on, uint32_t start,
                     uint32_t end);
/* The same over global blocks [start, end) of a window's folios (caller
 * holds the window); a folio that is not cached has no bit set. */
uint64_t window_next (const struct cache *c, const struct window *w,
                      enum folio_plane p, bool on, uint64_t start,
                      uint64_t end);
bool folio_block_uptodate (const struct cache *c, const struct folio *f,
                           uint32_t blk);
bool folio_block_dirty (const struct cache *c, const struct folio *f,
                        uint32_t blk);
/* Block ranges [start, end) inside the folio. */
void folio_set_uptodate (struct cache *c, struct folio *f, uint32_t start,
                         uint32_t end);
void folio_clear_uptodate (struct cache *c, struct folio *f, uint32_t start,
                           uint32_t end);
/* Set or clear dirty bits; keeps nr_dirty, dirty_bytes and the index mark
 * (taking c->lock on a clean<->dirty transition). */
void folio_set_dirty (struct cache *c, struct folio *f, uint32_t start,
                      uint32_t end);
void folio_clear_dirty (struct cache *c, struct folio *f, uint32_t start,
                        uint32_t end);
/* Forget blocks [start, end) altogether, dirty and unstable too: a trim
 * leaves the backing free to read as anything there. */
void folio_drop (struct cache *c, struct folio *f, uint32_t start,
                 uint32_t end);
/* Forget all state, the readahead flag too (who drops a folio with f->ra
 * set calls ra_dropped first). */
void folio_reset (struct cache *c, struct folio *f);
/* Folio f (stripe held) was filled by readahead (ra_filled), read by a
 * client (ra_read), or dropped with f->ra set, evicted or replaced
 * (ra_dropped): f->ra and c->ra_unread, and the counters. */
void ra_filled (struct cache *c, struct folio *f);
void ra_read (struct cache *c, struct folio *f);
void ra_dropped (struct cache *c, struct folio *f);
/* Dirty blocks [start, end) reached the backing: clean them, or make them
 * unstable when the backing could still lose them. */
void folio_written (struct cache *c, struct folio *f, uint32_t start,
                    uint32_t end, bool unstable);
/* Unstable blocks become clean (the backing flushed them) or dirty again
 * (the backing may have lost them). */
void folio_settle (struct cache *c, struct folio *f, bool lost);

/* The index lock (c->lock) where requests take it, counted (lock_taken,
 * on the line the lock holder owns anyway) and when contended
 * (lock_waits_index). */
static inline void
index_lock (struct cache *c)
{
  lock_counted (&c->lock, OPSTAT_PTR (c, lock_waits_index));
  c->lock_taken++;
}

/* --- the replacement policy (lru.c; its rules are at the top there) --- */
/* A request looked f up (its stripe held, the index lock not needed):
 * the kernel's folio_mark_accessed.  The looks of one burst count once:
 * those of a thread that looked at f last (a stream reading or writing
 * it a block at a time) only bring f's count to 1.  Loads first and
 * stores only a new count, so that hits on a hot folio write nothing
 * another core must fetch again. */
extern _Thread_local const struct folio *lru_last_seen;
static inline void
folio_mark_accessed (struct folio *f)
{
  unsigned r = atomic_load_explicit (&f->refs, memory_order_relaxed);
  unsigned want = f == lru_last_seen ? 1 : r + 1;

  if (want > r && r < 2)
    atomic_store_explicit (&f->refs, (unsigned char) want,
                           memory_order_relaxed);
  lru_last_seen = f;
}
/* A folio put in the index goes on the inactive list, one taken out goes
 * off its list (c->lock held). */
void lru_add_locked (struct cache *c, struct folio *f);
void lru_del_locked (struct cache *c, struct folio *f);
/* Evict a clean folio (c->lock held; takes its stripe by trylock, so
 * never one of the caller's window) and return it, its slot free for
 * reuse; NULL if none was found among the few looked at.  ra: for
 * readahead, which leaves unread readahead folios alone. */
struct folio *lru_evict_locked (struct cache *c, bool ra);
/* Take f, clean and stable, out of the index, its list and its bucket,
 * its state reset and its slot told (c->lock and f's stripe held). */
void folio_uncache_locked (struct cache *c, struct folio *f);

/* --- the folio map (fmap.c): stripes, lookup, the writeback mark --- */
/* Lock or unlock the stripes of folios [start, end). */
void range_lock (struct cache *c, uint64_t start, uint64_t end);
void range_unlock (struct cache *c, uint64_t start, uint64_t end);
pthread_mutex_t *stripe_of (struct cache *c, uint64_t fi);
/* Folio fi if cached, else NULL; the caller holds fi's stripe (not the
 * index lock: this is the hit path's lookup). */
struct folio *folio_lookup (struct cache *c, uint64_t fi);
/* f (its index set) goes into or out of its bucket; its stripe held. */
void bucket_add (struct cache *c, struct folio *f);
void bucket_del (struct cache *c, struct folio *f);
/* Folio fi is under writeback: wait (holding no stripe) until it is not. */
void wb_wait_folio (struct cache *c, uint64_t fi);
/* The first folio of the locked window w under writeback, or UINT64_MAX. */
uint64_t wb_window_busy (struct cache *c, const struct window *w);

/* --- windows (window.c) --- */
/* Lock folios [start, end) and look them up; with alloc, create the
 * missing ones (evicting clean folios, waiting for writeback if needed).
 * Returns 0 with the range locked, or -1/errno with nothing held. */
int window_begin (struct cache *c, struct window *w, uint64_t start,
                  uint64_t end, bool alloc);
/* The same without waiting: -1/EAGAIN at once, nothing held, when a
 * stripe is taken (its holder may be doing backing I/O) or room is short. */
int window_try_begin (struct cache *c, struct window *w, uint64_t start,
                      uint64_t end, bool alloc);
/* Readahead's window: the folios of [start, end) that are cached or fit
 * in free room or in a clean folio the replacement policy gives up
 * (lru_evict_locked: never one of the active list, nor another stream's
 * unread readahead); never waits for room.  The window ends before the first folio that does not fit:
 * 0 with w->end <= end, or -1/EAGAIN with nothing held if none fits. */
int window_ra_begin (struct cache *c, struct window *w, uint64_t start,
                     uint64_t end);
void window_end (struct cache *c, struct window *w);
/* Create the held window's folios that are not cached, from free slots
 * only and all or none: 0, or -1/EAGAIN with nothing changed (the
 * stripes held keep anyone else from creating them meanwhile).  What a
 * CACHE_NOWAIT write uses once it knows it can finish: it never evicts. */
int window_alloc_free (struct cache *c, struct window *w);
/* Take n free slots if more than reserve would stay free; true if so. */
bool slots_take_free (struct cache *c, uint32_t n, uint32_t reserve,
                      uint32_t *slots);
void slots_give_back (struct cache *c, uint32_t n, const uint32_t *slots);
/* Put nf (state set, not in the index) in the index as folio fi in place
 * of old (NULL: none; else dropped: clean and stable, its stripe held),
 * whose slot goes free.  0, or -1 (ENOMEM, only without old). */
int folio_replace (struct cache *c, struct folio *old, struct folio *nf,
                   uint64_t fi);
/* Put folio f, already holding folio fi's state (a recovered store slot),
 * into the index and the LRU, marked if dirty.  No locks needed: only
 * cache_create calls it.  0 or -1/ENOMEM. */
int folio_adopt (struct cache *c, struct folio *f, uint64_t fi);
/* The first cached folio with a number in [*fi, end), *fi set to its
 * number; NULL if none.  The caller holds the stripes of [*fi, end), so
 * the folio stays cached. */
struct folio *cached_folio_next (struct cache *c, uint64_t *fi,
                                 uint64_t end);

/* --- the request iterator (iter.c), iomap_iter's shape ---
 *
 *   struct cache_iter it;
 *   cache_iter_init (&it, c, off, len, CI_ALLOC);
 *   while ((r = cache_iter_next (&it)) > 0)
 *     it.done = step (&it, ...);
 *
 * Each step gets one window: the folios under bytes [it.pos, it.step_end)
 * of the request, locked and looked up (with CI_ALLOC created, waiting for
 * room if need be).  With CI_THROTTLE the first call waits for dirty data
 * to fall below the limit.  A step sets it.done to the bytes it did (> 0)
 * or -1 with errno.  cache_iter_next releases the window and returns 1
 * for the next step, 0 when the range is done, or -1 with errno when a
 * step or a window failed.  After 0 or -1 nothing is held, and the caller
 * must not return to the loop body. */
#define CI_ALLOC    (1u << 0)   /* create the folios that are not cached */
#define CI_THROTTLE (1u << 1)   /* throttle_dirty before the first step */
#define CI_NOWAIT   (1u << 2)   /* CACHE_NOWAIT: fail with EAGAIN where the
                                   iteration or a step would wait */
#define CI_READAHEAD (1u << 3)  /* a readahead fetch: windows of what fits
                                   (window_ra_begin), never waiting for room */
#define CI_STABLE   (1u << 4)   /* the steps change blocks: wait until no
                                   folio of the window is under writeback */

/* What a parked miss fetched (fetch.c), as a source for io_fill: bytes
 * [off, end) of the backing, whole blocks, at buf + (x - base), as the
 * backing had them after its write log stood at gen. */
struct fetch_src {
  const unsigned char *buf;
  uint64_t base, off, end, gen;
};

struct cache_iter {
  struct cache *c;
  uint64_t start, end;      /* the request's bytes */
  unsigned flags;
  uint64_t pos, step_end;   /* this step's bytes */
  int64_t done;             /* set by the step */
  struct window w;          /* this step's folios, held */
  bool held, over;
  /* The backing's extent asked for by the last miss of this step (valid
   * while mapped): the window's stripes keep anyone else from writing the
   * backing under it, so further misses in the window can use it. */
  struct backing_extent map;
  bool mapped;
  /* io_fill takes the blocks it holds from here rather than the backing
   * (cache_read_fetched); NULL otherwise.  Under CI_NOWAIT io_fill then
   * fills holes the backing's map knows and the fetched blocks, and gives
   * up (EAGAIN) on anything else. */
  const struct fetch_src *src;
};

void cache_iter_init (struct cache_iter *it, struct cache *c, uint64_t off,
                      uint64_t len, unsigned flags);
int cache_iter_next (struct cache_iter *it);

/* --- throttling (throttle.c) --- */
/* Wait (no locks held) until dirty data is below the limit.  0 or -1. */
int throttle_dirty (struct cache *c, uint64_t len);
/* Would throttle_dirty (c, len) wait now?  Also while others wait. */
bool throttle_would_wait (struct cache *c, uint64_t len);
/* Dirty data went down: let through the writers waiting on the dirty
 * limit that there is room for now (all if writeback is failing).  Takes
 * throttle_lock; call it after letting c->lock go (it signals them). */
void throttle_wake (struct cache *c);
/* A window could not be looked up (errno err; c->lock held, no stripe):
 * when it lacked room (EAGAIN), wait up to 100 ms for writeback to make
 * some and return 0 (try again), else -1 with errno (also when writeback
 * is failing: waiting would not help). */
int throttle_room_locked (struct cache *c, int err);
/* Wake the writeback thread (c->lock held). */
void wb_kick_locked (struct cache *c);

/* --- backing I/O (io.c): clamp at the export end, count, per-thread
 * bounce buffer. */
int io_read (struct cache *c, void *buf, uint64_t len, uint64_t off);
int io_write (struct cache *c, const void *buf, uint64_t len, uint64_t off,
              unsigned flags);
unsigned char *io_bounce (struct cache *c);
/* Bring blocks [start, end) (global numbers) of the step's folios
 * uptodate: holes are zero-filled, data runs read with one request each. */
int io_fill (struct cache_iter *it, uint64_t start, uint64_t end);
/* The one place that asks the backing for a mapping: the extent at byte
 * start, clipped to [start, end) and to the export (a backing without map
 * has one data extent; so has an empty answer: data is always safe). */
int cache_map (struct cache *c, uint64_t start, uint64_t end,
               struct backing_extent *ext);
/* The same from what the backing knows without I/O
 * (backing_ops.map_cached); data where it would have to ask. */
int cache_map_cached (struct cache *c, uint64_t start, uint64_t end,
                      struct backing_extent *ext);

/* Classify the blocks from start on: *hole says whether they read as
 * zeroes, *run_end (> start, <= end) where that answer ends (io.c). */
int io_extent_blocks (struct cache_iter *it, uint64_t start, uint64_t end,
                      uint64_t *run_end, bool *hole);
/* The backing's extent holding byte off of the step's window: asked for
 * on a miss only (a hit needs no mapping), clipped to the window. */
int cache_iter_map (struct cache_iter *it, uint64_t off,
                    struct backing_extent *ext);
/* A step's fills (io.c).  step_fill: bring blocks [start, end) of the
 * step uptodate, or under CI_NOWAIT give up (EAGAIN) before anything
 * changed, but for a parked miss's fill.  fill_range: every block of the
 * step, one fill per run of missing blocks; *missed set if any was.
 * step_folios: the step's folios are it->w.f[*first .. *last]. */
int step_fill (struct cache_iter *it, uint64_t start, uint64_t end);
int fill_range (struct cache_iter *it, bool *missed);
void step_folios (const struct cache_iter *it, uint64_t *first,
                  uint64_t *last);
/* The log of backing writes (io.c).  The backing was written (write,
 * zero, trim) at [off, off+len), or may have been (the op failed). */
void backing_written (struct cache *c, uint64_t off, uint64_t len);
/* The log's generation now (a fetch starts). */
uint64_t wlog_now (struct cache *c);
/* May io_fill take blocks [start, end) (global numbers, within src) from
 * src?  Only if no backing write touched src's range since the fetch
 * began.  Asked with the blocks' stripes held: a backing write under them
 * (writeback, direct I/O) is logged before its stripes are released. */
bool fetch_src_fresh (struct cache *c, const struct fetch_src *src);

/* --- fetch.c --- */
/* src for io_fill from what cache_fetch fetched into buf. */
void fetch_src_init (struct fetch_src *src, const void *buf,
                     const struct cache_fetched *fx);

/* --- writeback (writeback.c) --- */
/* Write back dirty blocks in global blocks [start, end) of a locked
 * window, merging runs across folios.  0 or -1/errno (blocks stay dirty). */
int wb_window (struct cache *c, struct window *w, uint64_t start,
               uint64_t end, unsigned backing_flags);
/* Is folio f worth writing in this pass (a hint without its stripe)? */
bool wb_wanted (struct cache *c, const struct folio *f, bool all);
/* A batch of the writeback walk: folios [w.start, w.end), marked under
 * writeback, and the dirty runs cut from them (global blocks), which go
 * to the backing without any stripe held. */
#define WB_RUNS_MAX 64u
struct wb_batch {
  struct window w;
  unsigned nr_runs;
  bool cut;                 /* runs left in the last folio for later */
  struct { uint64_t start, end; } run[WB_RUNS_MAX];
};
enum wb_begin { WB_GOT, WB_SKIP, WB_BUSY };
/* Start a batch at the dirty folio fi and the folios its dirty run goes
 * on into.  WB_SKIP if fi is no longer worth writing, WB_BUSY if its
 * stripe is taken or it is under writeback already (come back later). */
enum wb_begin wb_batch_begin (struct cache *c, struct wb_batch *b,
                              uint64_t fi, bool all);
/* Write the batch's runs, then mark what reached the backing written
 * and end the folios' writeback.  0 or -1/errno (first error; the blocks
 * of a failed run stay dirty). */
int wb_batch_write (struct cache *c, struct wb_batch *b, unsigned flags);
/* Flush the backing and settle unstable blocks (wb_mutex held).  0, 1 when
 * the backing lost writes (they are dirty again: write back and retry), or
 * -1/errno (when the failed flush lost writes, they are dirty again too). */
int wb_stabilize (struct cache *c);
/* Forget every clean cached block (wb_mutex held). */
void wb_invalidate_clean (struct cache *c);

/* --- the writeback walk and thread (wb-walk.c) --- */
/* One pass over the dirty folios (caller holds wb_mutex), walked with the
 * helpers.  all: write everything (flush); else only what the background
 * policy wants, starting at the cursor.  flags go with every write
 * (BACKING_FUA: see cache_flush_pass).  Returns folios written; *err gets
 * the first error. */
int wb_pass (struct cache *c, bool all, unsigned flags, int *err);
int wb_helpers_start (struct cache *c);
void wb_helpers_stop (struct cache *c);
/* The background writeback thread (cache_start_writeback). */
void *wb_thread_main (void *arg);

/* --- readahead (readahead.c; the windows in ra-window.h) ---
 * Its lock is a leaf: no other lock is taken while it is held. */
/* Set c->ra up from the configuration (NULL when off).  0 or -1/ENOMEM. */
int ra_create (struct cache *c);
void ra_destroy (struct cache *c);
/* Start/stop the readahead threads (with the writeback thread). */
int ra_start (struct cache *c);
void ra_stop (struct cache *c);
/* A client read of [off, off + len) went through the cache: queue the
 * window it calls for, if any.  Never waits (but for the leaf lock).
 * Called for misses (they may start a stream) and for the reads
 * ra_follows says may continue one; not for other hits, so that a random
 * hit takes no lock of readahead's (the kernel consults readahead on
 * misses and on its marked pages only). */
void ra_note (struct cache *c, uint64_t off, uint64_t len);
/* May a read at off continue a stream?  No lock, so a hint: false when
 * readahead is off; may be true for a read ra_note then finds continues
 * nothing, or false for one a note made at the same moment would match
 * (that read is then noted only if it misses: readahead is advisory). */
bool ra_follows (struct cache *c, uint64_t off);
/* Fetch [off, off + len) into the cache as far as room allows (a
 * readahead thread, readahead.c).  0 or -1/errno. */
int cache_readahead_fill (struct cache *c, uint64_t len, uint64_t off);

#endif /* FOLIOD_CACHE_INT_H */
