/* Dirty throttling and waits for room: writers wait (with no stripe held:
 * writeback needs them) while writeback cleans, as the kernel's
 * balance_dirty_pages, and give up when writeback is failing.
 *
 * Writers over the dirty limit queue in arrival order, each on its own
 * condition variable.  When writeback has cleaned some (every batch,
 * throttle_wake), the queue's first ones are let through, as many
 * as there is room for, each woken with its turn granted: none wakes to
 * find no room, none waits behind a later one, and they wake side by
 * side rather than one after the other.  Waking them all after every
 * batch (as before) woke a herd that took the index lock one by one to
 * find, all but one, no room: 95% of the wake-ups at 16 writer threads,
 * with new writers passing the ones that waited, whose p99 grew to
 * 100 ms. */
#include <errno.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

/* One writer waiting on the dirty limit; on its stack. */
struct throttle_waiter {
  struct throttle_waiter *next;
  pthread_cond_t cv;
  uint64_t len;
  bool granted;                 /* let through (out of the queue) */
  int err;                      /* writeback failing when let through */
};

void
wb_kick_locked (struct cache *c)
{
  c->wb_kick = true;
  pthread_cond_signal (&c->wb_cv);
}

/* Wait up to 100 ms for writeback to free room (lock held). */
static void
throttle_space_locked (struct cache *c)
{
  c->space_waiters++;
  wb_kick_locked (c);
  cond_wait_ms (&c->space_cv, &c->lock, 100);
  c->space_waiters--;
}

int
throttle_room_locked (struct cache *c, int err)
{
  int failing = ledger_wb_error (c);

  if (err != EAGAIN || failing) {
    errno = err != EAGAIN ? err : failing;
    return -1;
  }
  STAT_ADD (c, throttle_waits, 1);
  throttle_space_locked (c);
  return 0;
}

/* Is there room for len more bytes of dirty data after ahead bytes that
 * writers let through have not dirtied yet?  A writer always may when
 * nothing is dirty (a write larger than the limit). */
static bool
dirty_room (struct cache *c, uint64_t ahead, uint64_t len)
{
  uint64_t dirty = STAT_GET (c, dirty_bytes);

  return (dirty == 0 && ahead == 0) || dirty + ahead + len <= c->dirty_limit;
}

bool
throttle_would_wait (struct cache *c, uint64_t len)
{
  return atomic_load (&c->throttle_queued) > 0 || !dirty_room (c, 0, len);
}

static void
wb_kick (struct cache *c)
{
  lock_or_die (&c->lock);
  wb_kick_locked (c);
  unlock_or_die (&c->lock);
}

/* Let the queue's first writers through, in order, as many as there is
 * room for together (all of them when writeback is failing: they return
 * its error).  throttle_lock held. */
static void
grant_fitting (struct cache *c)
{
  int failing = ledger_wb_error (c);
  uint64_t ahead = 0;
  struct throttle_waiter *w;

  while ((w = c->throttle_head) != NULL &&
         (failing || dirty_room (c, ahead, w->len))) {
    ahead += w->len;
    c->throttle_head = w->next;
    if (c->throttle_head == NULL)
      c->throttle_tail = NULL;
    atomic_fetch_sub (&c->throttle_queued, 1);
    w->granted = true;
    w->err = failing;
    pthread_cond_signal (&w->cv);
  }
}

void
throttle_wake (struct cache *c)
{
  if (atomic_load (&c->throttle_queued) == 0)
    return;                     /* one that comes now looks for itself */
  lock_or_die (&c->throttle_lock);
  grant_fitting (c);
  unlock_or_die (&c->throttle_lock);
}

static void
queue_add (struct cache *c, struct throttle_waiter *w)
{
  w->next = NULL;
  if (c->throttle_tail)
    c->throttle_tail->next = w;
  else
    c->throttle_head = w;
  c->throttle_tail = w;
  atomic_fetch_add (&c->throttle_queued, 1);
}

int
throttle_dirty (struct cache *c, uint64_t len)
{
  struct throttle_waiter w = { .len = len };

  if (!throttle_would_wait (c, len))
    return 0;
  if (atomic_load (&c->space_waiters) == 0)
    wb_kick (c);                /* else a writer waiting has kicked it */
  if (cond_init_monotonic (&w.cv) != 0)
    abort ();                   /* no resources: nothing to do but stop */
  lock_or_die (&c->throttle_lock);
  queue_add (c, &w);
  grant_fitting (c);            /* room now, none ahead: through at once */
  if (!w.granted) {
    STAT_ADD (c, throttle_waits, 1);
    c->space_waiters++;
    while (!w.granted) {
      /* Up to 100 ms, then kick writeback again (not under throttle_lock:
       * c->lock comes first) and look for ourselves: every wait bounded,
       * whatever wake-up a path that cleans forgets. */
      bool woken = cond_wait_ms (&w.cv, &c->throttle_lock, 100) == 0;
      if (w.granted)
        break;
      if (woken)
        c->throttle_futile++;
      else {
        unlock_or_die (&c->throttle_lock);
        wb_kick (c);
        lock_or_die (&c->throttle_lock);
        grant_fitting (c);
      }
    }
    c->space_waiters--;
  }
  unlock_or_die (&c->throttle_lock);
  pthread_cond_destroy (&w.cv);
  if (w.err) {
    errno = w.err;
    return -1;
  }
  return 0;
}
