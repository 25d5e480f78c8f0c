/* A writeback pass, walked by several threads: the one that runs the pass
 * (holding wb_mutex: the writeback thread or a flush) and WB_HELPERS
 * helpers that join it.  Batches are formed one at a time under walk_lock
 * (so a dirty run is cut into batches exactly as by one thread) and
 * written side by side: one thread writing back at queue depth 1 could not
 * keep up with clients streaming through a cache smaller than the image.
 *
 * Everything the pass writes is written while its owner holds wb_mutex,
 * and the owner settles unstable blocks (wb_stabilize) only when no thread
 * of the walk is inside a batch: a settle must not clean a block that
 * reached the backing after the flush began.
 *
 * The background writeback thread (wb_thread_main) runs its passes here
 * too. */
#include <errno.h>
#include <stdlib.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

/* A pass under way; walk_lock. */
struct wb_walk {
  uint64_t start, fi;           /* where it began; the next folio to look at */
  bool all, wrapped;
  bool over;                    /* nothing left, or the backing is down */
  bool sync_wanted;             /* the owner is to flush the backing */
  uint64_t busy_from;           /* all: the first folio skipped as busy
                                 * (UINT64_MAX: none), to come back to */
  unsigned flags;               /* for every write: BACKING_FUA or 0 */
  unsigned active;              /* threads inside a batch, or waiting in
                                 * walk_next with walk_lock let go */
  int err;                      /* the first error */
  int written;                  /* folios */
};

/* Helpers join a flush's pass (a client waits for it) and a background
 * pass that writers wait on; a background pass nobody waits for goes at
 * one thread's pace and leaves the cores to the requests. */
#define WALK_POLL_MS 10

static bool
walk_wants_helpers (struct cache *c, const struct wb_walk *wk)
{
  return wk->all || atomic_load (&c->space_waiters) > 0;
}

static void
walk_wait (struct cache *c)
{
  if (pthread_cond_wait (&c->walk_cv, &c->walk_lock) != 0)
    abort ();                   /* only a bug makes it fail */
}

/* A pass that must write everything (a flush) comes back to the folios
 * it skipped as busy: another batch of the walk, a write-through or a
 * fill held them, or a batch was cut short of the rest of its last
 * folio.  Waits a little first (walk_lock let go: batches end meanwhile),
 * counted as active so that the pass does not end under it.  false if
 * there is nothing to come back to or the walk is over, or once a batch
 * failed: the flush fails anyway, and a cut folio's runs, still dirty,
 * would be written again (and fail again) for ever. */
static bool
walk_come_back (struct cache *c, struct wb_walk *wk)
{
  if (!wk->all || wk->err != 0 || wk->busy_from == UINT64_MAX)
    return false;
  wk->fi = wk->busy_from;
  wk->busy_from = UINT64_MAX;
  wk->active++;
  cond_wait_ms (&c->walk_cv, &c->walk_lock, 1);
  wk->active--;
  if (wk->active == 0)
    pthread_cond_broadcast (&c->walk_cv);
  return !wk->over;
}

/* A flush's pass is done with folio fi: written, or found clean. */
static void
walk_untag (struct cache *c, uint64_t fi)
{
  lock_or_die (&c->lock);
  fidx_mark (&c->index, fi, FIDX_TOWRITE, false);
  unlock_or_die (&c->lock);
}

/* The next batch of the walk into b (walk_lock held; its stripes are
 * taken by trylock only).  false when the walk is done. */
static bool
walk_next (struct cache *c, struct wb_walk *wk, struct wb_batch *b)
{
  for (;;) {
    lock_or_die (&c->lock);
    /* A flush's pass walks what it tagged at its start, nothing else. */
    struct folio *f = wk->all
        ? fidx_find_marked (&c->index, &wk->fi, c->nr_folios, FIDX_TOWRITE)
        : fidx_find (&c->index, &wk->fi,
                     wk->wrapped ? wk->start : c->nr_folios, true);
    unlock_or_die (&c->lock);
    if (f == NULL) {
      if (!wk->wrapped && wk->start != 0) {
        wk->wrapped = true;
        wk->fi = 0;
        continue;
      }
      if (walk_come_back (c, wk))
        continue;
      return false;
    }
    if (!wb_wanted (c, f, wk->all)) {
      wk->fi++;                  /* skipped without taking its stripe */
      continue;
    }
    enum wb_begin got = wb_batch_begin (c, b, wk->fi, wk->all);
    if (got == WB_SKIP && wk->all)
      walk_untag (c, wk->fi);    /* clean by now, or gone */
    if (got == WB_BUSY && wk->fi < wk->busy_from)
      wk->busy_from = wk->fi;
    if (got == WB_GOT && b->cut && b->w.end - 1 < wk->busy_from)
      wk->busy_from = b->w.end - 1;   /* the rest of its last folio */
    wk->fi = got == WB_GOT ? b->w.end : wk->fi + 1;
    c->wb_cursor = wk->fi >= c->nr_folios ? 0 : wk->fi;
    if (got == WB_GOT)
      return true;
  }
}

/* After a batch (walk_lock held): wake writers waiting for room or below
 * the dirty limit to see what the pass cleaned so far, rather than at its
 * end, so that they fill while writeback writes.  A background pass also
 * has its owner flush the backing once unstable blocks pin a tenth of the
 * cache (dirty_background), so that they become evictable.  Not a flush's
 * pass: cache_flush settles at its end, where it checks for lost writes
 * (a loss found here would leave blocks dirty behind its cursor). */
static void
walk_progress (struct cache *c, struct wb_walk *wk)
{
  if (atomic_load (&c->space_waiters) == 0)
    return;
  if (!wk->all && STAT_GET (c, unstable_bytes) >= c->dirty_background)
    wk->sync_wanted = true;
  lock_or_die (&c->lock);
  pthread_cond_broadcast (&c->space_cv);
  unlock_or_die (&c->lock);
  throttle_wake (c);
}

/* The owner's flush in the middle of its pass (walk_lock held): once no
 * batch is being written. */
static void
walk_sync (struct cache *c, struct wb_walk *wk)
{
  while (wk->active > 0)
    walk_wait (c);
  unlock_or_die (&c->walk_lock);
  (void) wb_stabilize (c);      /* a failure is kept in flush_failing */
  lock_counted (&c->walk_lock, &c->st.lock_waits_walk);
  wk->sync_wanted = false;
  pthread_cond_broadcast (&c->walk_cv);
}

/* After a batch: wake the threads on walk_cv?  Only the owner waits for
 * the last batch in flight, so a helper ending it wakes them; the owner
 * ending its own batch wakes them only when helpers are wanted (they poll
 * otherwise).  Waking three helpers after every batch of a background
 * pass, for them to find nothing to do, cost a futex call and a context
 * switch per batch each (randwrite_512: more than the loop thread). */
static bool
walk_batch_wakes (struct cache *c, const struct wb_walk *wk, bool owner)
{
  if (wk->active > 0)
    return false;
  return !owner || walk_wants_helpers (c, wk);
}

/* Write batches of the pass c->walk until it is over (walk_lock held on
 * entry and return).  A helper re-reads c->walk after every wait: the
 * owner's pass may have ended meanwhile. */
static void
walk_work (struct cache *c, bool owner)
{
  struct wb_walk *wk;
  struct wb_batch b;

  while ((wk = c->walk) != NULL && !wk->over) {
    if (!owner && !walk_wants_helpers (c, wk)) {
      /* Looked at again soon: the throttle cannot wake us (it holds
       * c->lock, which comes after walk_lock). */
      cond_wait_ms (&c->walk_cv, &c->walk_lock, WALK_POLL_MS);
      continue;
    }
    if (wk->sync_wanted) {
      if (owner)
        walk_sync (c, wk);
      else
        walk_wait (c);
      continue;
    }
    if (!walk_next (c, wk, &b)) {
      wk->over = true;
      break;
    }
    wk->active++;
    unlock_or_die (&c->walk_lock);
    int r = wb_batch_write (c, &b, wk->flags);
    int err = r == -1 ? errno : 0;
    lock_counted (&c->walk_lock, &c->st.lock_waits_walk);
    wk->active--;
    wk->written += (int) (b.w.end - b.w.start);
    if (err && wk->err == 0)
      wk->err = err;
    /* Retry the backing, not each run: a remote that is down has been
     * waited for once (its retry window); the next pass tries again. */
    if (backing_unreachable (err))
      wk->over = true;
    walk_progress (c, wk);
    if (walk_batch_wakes (c, wk, owner))
      pthread_cond_broadcast (&c->walk_cv);
  }
}

int
wb_pass (struct cache *c, bool all, unsigned flags, int *err)
{
  struct wb_walk wk = { .start = all ? 0 : c->wb_cursor, .all = all,
                        .wrapped = all, .flags = flags,
                        .busy_from = UINT64_MAX };

  wk.fi = wk.start;
  if (all) {
    /* The set a flush must write, taken at one instant (the kernel's
     * tag_pages_for_writeback): blocks dirtied later are the next
     * flush's, so that a writer cannot keep this pass going.  A folio
     * of that set dirtied again before its batch is written whole. */
    lock_or_die (&c->lock);
    fidx_tag (&c->index, FIDX_DIRTY, FIDX_TOWRITE);
    unlock_or_die (&c->lock);
  }
  lock_counted (&c->walk_lock, &c->st.lock_waits_walk);
  c->walk = &wk;
  pthread_cond_broadcast (&c->walk_cv);   /* helpers join */
  walk_work (c, true);
  while (wk.active > 0)
    walk_wait (c);
  c->walk = NULL;
  unlock_or_die (&c->walk_lock);
  *err = wk.err;
  return wk.written;
}

static void *
wb_helper_main (void *arg)
{
  struct cache *c = arg;

  lock_counted (&c->walk_lock, &c->st.lock_waits_walk);
  while (!c->walk_stop) {
    if (c->walk != NULL && !c->walk->over)
      walk_work (c, false);
    else
      walk_wait (c);
  }
  unlock_or_die (&c->walk_lock);
  return NULL;
}

int
wb_helpers_start (struct cache *c)
{
  c->walk_stop = false;
  while (c->nr_helpers < WB_HELPERS) {
    int r = thread_start (&c->wb_helpers[c->nr_helpers], wb_helper_main, c,
                          "wb-help/%u", c->nr_helpers);
    if (r != 0) {
      wb_helpers_stop (c);
      errno = r;
      return -1;
    }
    c->nr_helpers++;
  }
  return 0;
}

void
wb_helpers_stop (struct cache *c)
{
  lock_counted (&c->walk_lock, &c->st.lock_waits_walk);
  c->walk_stop = true;
  pthread_cond_broadcast (&c->walk_cv);
  unlock_or_die (&c->walk_lock);
  while (c->nr_helpers > 0)
    pthread_join (c->wb_helpers[--c->nr_helpers], NULL);
}

static void
wb_sleep (struct cache *c, unsigned ms)
{
  uint64_t end = now_ms () + ms, now;

  lock_or_die (&c->lock);
  while (!atomic_load (&c->wb_stop) && !c->wb_kick &&
         (now = now_ms ()) < end)
    if (cond_wait_ms (&c->wb_cv, &c->lock, end - now) == ETIMEDOUT)
      break;
  c->wb_kick = false;
  unlock_or_die (&c->lock);
}

/* The background writeback thread: wakes every writeback_interval_ms or
 * when kicked (dirty data over the background threshold, writers waiting
 * for room), writes back, and backs off while the backing fails. */
void *
wb_thread_main (void *arg)
{
  struct cache *c = arg;
  unsigned backoff_ms = 0;

  while (!atomic_load (&c->wb_stop)) {
    wb_sleep (c, backoff_ms ? backoff_ms : c->cfg.writeback_interval_ms);
    if (atomic_load (&c->wb_stop))
      break;
    if (STAT_GET (c, dirty_bytes) == 0 && STAT_GET (c, unstable_bytes) == 0) {
      if (c->space_waiters > 0 && cache_store_sync (c) == 0) {
        lock_or_die (&c->lock);   /* page store: cleaned slots reusable */
        pthread_cond_broadcast (&c->space_cv);
        unlock_or_die (&c->lock);
        throttle_wake (c);
      }
      continue;
    }
    int err;
    lock_or_die (&c->wb_mutex);
    wb_pass (c, false, 0, &err);
    /* Unstable blocks pin memory until the backing flushes them: flush
     * after every pass that left some, even one with failed writes, so
     * that what did reach the backing can be evicted and writers waiting
     * for room get it. */
    if (STAT_GET (c, unstable_bytes) > 0 && wb_stabilize (c) == -1 &&
        err == 0)
      err = errno;
    unlock_or_die (&c->wb_mutex);
    if (cache_store_sync (c) == -1 && err == 0)  /* page store: slots reusable */
      err = errno;
    lock_or_die (&c->lock);
    pthread_cond_broadcast (&c->space_cv);
    unlock_or_die (&c->lock);
    throttle_wake (c);
    if (err)
      backoff_ms = backoff_ms ? (backoff_ms * 2 > 5000 ? 5000 : backoff_ms * 2)
                              : 100;
    else
      backoff_ms = 0;
  }
  return NULL;
}
