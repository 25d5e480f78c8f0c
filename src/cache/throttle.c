/* Dirty throttling and waits for room: writers wait (with no stripe held:
 * writeback needs them) while writeback cleans, as the kernel's
 * balance_dirty_pages, and give up when writeback is failing. */
#include <errno.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

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

bool
throttle_would_wait (struct cache *c, uint64_t len)
{
  uint64_t dirty = STAT_GET (c, dirty_bytes);

  return dirty > 0 && dirty + len > c->dirty_limit;
}

int
throttle_dirty (struct cache *c, uint64_t len)
{
  bool waited = false;

  if (STAT_GET (c, dirty_bytes) + len <= c->dirty_limit)
    return 0;
  index_lock (c);
  while (STAT_GET (c, dirty_bytes) > 0 &&
         STAT_GET (c, dirty_bytes) + len > c->dirty_limit) {
    int failing = wb_error (c);
    if (failing) {
      unlock_or_die (&c->lock);
      errno = failing;
      return -1;
    }
    if (!waited)
      STAT_ADD (c, throttle_waits, 1);
    waited = true;
    throttle_space_locked (c);
  }
  unlock_or_die (&c->lock);
  return 0;
}
