/* The one rule for mutex calls across foliod: a lock call that fails is a
 * bug (a mutex taken twice by its holder or released by another thread,
 * which error-checking mutexes report; a destroyed mutex), not an error
 * to handle, so it aborts rather than run unlocked.  Only a trylock may
 * fail, with EBUSY: it then returns false.
 *
 * THE LOCK ORDER ACROSS LAYERS (the one place it is written; the layers'
 * own comments give the detail within a layer and point here).  A thread
 * holding a lock of one line may take a lock of a later line, never of
 * an earlier one:
 *
 *   1. server (src/server/internal.h), nothing held into the cache:
 *      pool.lock, sloop.lock (a loop's done list, new sockets, commands),
 *      clients_lock, tls_lock are leaves, released before any other call
 *      (tls_lock is held across SSL_new, which takes only OpenSSL's own
 *      locks).  The daemon (control, closers, metrics) likewise calls
 *      the cache with none of its state locked.  ublk (src/ublk/): the
 *      set's lock is held across a device's add and del (control
 *      commands, joining its threads, which never take it); a device's
 *      work_lock and a queue's done_lock are leaves, and the queue
 *      threads and workers call the cache with nothing held.
 *   2. cache writeback (src/cache/cache-int.h): wb_mutex, then walk_lock.
 *      walk_lock is held while a batch is cut, its stripes taken by
 *      trylock only: it never waits for a stripe.
 *   3. cache stripes, several only in ascending order (range_lock), a
 *      window's worth at most, otherwise by trylock.  Held across the
 *      backing I/O of fills, passthrough pieces and a write's own
 *      write-through, never across writeback (a batch marks its folios
 *      and drops their stripes): every lock of the backing (line 6) may
 *      be taken under a stripe.
 *   4. the cache's index lock (c->lock), never held across I/O nor a
 *      store sync (set_index and store_may_reuse never wait; store_sync
 *      runs with no cache lock held).  A page store's sync_lock is taken
 *      under a stripe or c->lock only by pmem_unclean, at the first
 *      change after a clean mark (a header write, no msync of data).
 *      throttle_lock (the dirty limit's queue, throttle.c) is a leaf:
 *      taken under a stripe or walk_lock, never under c->lock, by those
 *      who clean; the writers waiting in its queue hold nothing else.
 *   5. cache leaves: flush_group.lock, readahead's ra->lock, taken with
 *      no other cache lock held (flush-group.h, readahead.c).
 *   6. backing (src/backing/): nbd: a connection's rwlock (tried, never
 *      waited for, by a loop issuing a parked miss: cache_fetch holds no
 *      cache lock then), and under it, one at a time, poller_lock,
 *      async_lock and libnbd's own handle lock; fork_lock before poller_lock; ext_lock
 *      a leaf.  libnbd runs completion callbacks under its handle lock:
 *      a parked miss's completion then takes its loop's sloop.lock
 *      (line 1's leaves may be taken under anything).  file: rmw_lock[]
 *      (two at most, lower address first) and pool_lock, leaves.  rbd:
 *      the backing's lock (in-flight list) and a waiter's lock, leaves.
 *      The ssd store's mu (store-ssd.c) is a leaf, never held over I/O.
 *   7. log_lock (src/daemon/log.c): innermost; any thread may log under
 *      any of the above.
 *
 * A loop thread takes cache locks only through CACHE_NOWAIT calls
 * (stripes by trylock, then line 4), so it waits at most for c->lock,
 * which no thread holds across I/O; the nbd backing's async path takes
 * its rwlock and poller lock by trylock (busy: EAGAIN, a worker).
 */
#ifndef FOLIOD_LOCK_H
#define FOLIOD_LOCK_H

#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>

static inline bool
lock_check (int r, bool trylock)
{
  if (r != 0 && !(trylock && r == EBUSY))
    abort ();
  return r == 0;
}

static inline void
lock_or_die (pthread_mutex_t *m)
{
  lock_check (pthread_mutex_lock (m), false);
}

static inline void
unlock_or_die (pthread_mutex_t *m)
{
  lock_check (pthread_mutex_unlock (m), false);
}

/* true if taken, false if someone holds it (the caller too). */
static inline bool
trylock_or_die (pthread_mutex_t *m)
{
  return lock_check (pthread_mutex_trylock (m), true);
}

/* lock_or_die, counting in *waits when someone else held m (a contention
 * counter that costs a relaxed add on the contended path only). */
static inline void
lock_counted (pthread_mutex_t *m, _Atomic uint64_t *waits)
{
  if (!trylock_or_die (m)) {
    atomic_fetch_add_explicit (waits, 1, memory_order_relaxed);
    lock_or_die (m);
  }
}

#endif /* FOLIOD_LOCK_H */
