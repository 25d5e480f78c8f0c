/* The one rule for mutex calls across foliod: a lock call that fails is a
 * bug (a mutex taken twice by its holder or released by another thread,
 * which error-checking mutexes report; a destroyed mutex), not an error
 * to handle, so it aborts rather than run unlocked.  Only a trylock may
 * fail, with EBUSY: it then returns false.
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
