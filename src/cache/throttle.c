/* Dirty throttling and waits for room: writers wait (with no stripe held:
 * writeback needs them) while writeback cleans, as the kernel's
 * balance_dirty_pages, and give up when writeback is failing.
 *
 * Writers over the dirty limit queue in arrival order, each on its own
 * condition variable.  Writeback wakes the first one only when there is
 * room for it (throttle_wake_locked), and each one let through wakes the
 * next if room is left.  Waking them all after every batch of writeback
 * (as before) woke a herd that took the index lock one by one to find, all
 * but one, no room: 95% of the wake-ups at 16 writer threads, with new
 * writers passing the ones that waited, whose p99 grew to 100 ms. */
#include <errno.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

/* One writer waiting on the dirty limit; on its stack. */
struct throttle_waiter {
  struct throttle_waiter *next;
  pthread_cond_t cv;
  uint64_t len;
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
  int failing = wb_error (c);

  if (err != EAGAIN || failing) {
    errno = err != EAGAIN ? err : failing;
    return -1;
  }
  STAT_ADD (c, throttle_waits, 1);
  throttle_space_locked (c);
  return 0;
}

/* May a write of len bytes dirty the cache now, queue aside? */
static bool
dirty_room (struct cache *c, uint64_t len)
{
  uint64_t dirty = STAT_GET (c, dirty_bytes);

  return dirty == 0 || dirty + len <= c->dirty_limit;
}

bool
throttle_would_wait (struct cache *c, uint64_t len)
{
  return atomic_load (&c->throttle_queued) > 0 || !dirty_room (c, len);
}

/* Wake the first waiter if there is room for it besides the ahead bytes
 * that writers let through have not dirtied yet. */
static void
wake_first (struct cache *c, uint64_t ahead)
{
  struct throttle_waiter *w = c->throttle_head;

  if (w != NULL && (dirty_room (c, ahead + w->len) || wb_error (c)))
    pthread_cond_signal (&w->cv);
}

void
throttle_wake_locked (struct cache *c)
{
  wake_first (c, 0);
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

/* Take w out of the queue (anywhere in it: one that gives up on an error
 * need not be first), then pass the turn on: to the next one if there is
 * room for it too, w's write counted (it dirties the cache after we
 * return) when w goes through. */
static void
queue_remove (struct cache *c, struct throttle_waiter *w, bool through)
{
  struct throttle_waiter **p = &c->throttle_head, *prev = NULL;

  while (*p != w) {
    prev = *p;
    p = &(*p)->next;
  }
  *p = w->next;
  if (c->throttle_tail == w)
    c->throttle_tail = prev;
  atomic_fetch_sub (&c->throttle_queued, 1);
  wake_first (c, through ? w->len : 0);
}

int
throttle_dirty (struct cache *c, uint64_t len)
{
  struct throttle_waiter w = { .len = len };
  int failing = 0;
  bool woken = false;

  if (!throttle_would_wait (c, len))
    return 0;
  index_lock (c);
  if (c->throttle_head == NULL && dirty_room (c, len)) {
    unlock_or_die (&c->lock);
    return 0;
  }
  if (cond_init_monotonic (&w.cv) != 0)
    abort ();                   /* no resources: nothing to do but stop */
  STAT_ADD (c, throttle_waits, 1);
  queue_add (c, &w);
  while (c->throttle_head != &w || !dirty_room (c, len)) {
    if ((failing = wb_error (c)) != 0)
      break;
    if (woken)
      c->throttle_futile++;
    /* Up to 100 ms, then look again (and kick writeback again): every
     * wait bounded, whatever wake-up a path that frees room forgets. */
    c->space_waiters++;
    wb_kick_locked (c);
    woken = cond_wait_ms (&w.cv, &c->lock, 100) == 0;
    c->space_waiters--;
  }
  queue_remove (c, &w, failing == 0);
  unlock_or_die (&c->lock);
  pthread_cond_destroy (&w.cv);
  if (failing) {
    errno = failing;
    return -1;
  }
  return 0;
}
