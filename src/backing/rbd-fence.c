/* The rbd backing's fence (rbd-fence.h): one writer per image means this
 * foliod must notice at once when the image is no longer its own, and
 * then stop acknowledging what it can no longer keep.  What librbd 16.2
 * (Debian 12) reports, seen by experiment:
 *
 * - another client breaks our lock (rbd lock rm, or librbd on behalf of
 *   a client that found our watch expired, as after a stall):
 *   we are blocklisted; every request, rbd_is_exclusive_lock_owner and
 *   rbd_lock_get_owners fail with -EBLOCKLISTED (-ESHUTDOWN, 108), and
 *   the update watch fires when the client resumes;
 * - `rbd resize --allow-shrink` and `rbd feature disable ...
 *   exclusive-lock` from another client are forwarded to the lock owner
 *   (us) and carried out by our librbd, even with the lock taken by
 *   rbd_lock_acquire: nothing refuses them.  The update watch fires at
 *   once; rbd_get_size / rbd_get_features then show the change, and
 *   after the feature's removal rbd_is_exclusive_lock_owner says 0.
 *
 * So a thread checks the image every RBD_FENCE_TICK_MS and at once when
 * the update watch fires: its lock (rbd_is_exclusive_lock_owner pings the
 * OSD holding the header: a blocklisted client learns it there), its
 * size, its exclusive-lock feature.  A check that finds the image changed
 * or the lock gone fences the backing for good (its writes and flushes
 * fail; the ledger reads the fact through backing_ops.owner_lost).  A
 * check that passes confirms ownership as of its start: what a FLUSH
 * answered from a persistent store asks for (rbd_fence_confirm), within
 * RBD_FENCE_LEASE_MS, which a stall (SIGSTOP, a host frozen) outlasts. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>

#include "backing/rbd-fence.h"
#include "foliod/lock.h"
#include "foliod/log.h"
#include "foliod/util.h"

#define RBD_FENCE_TICK_MS  1000
#define RBD_FENCE_LEASE_MS 5000   /* well under the OSD's watch timeout */

struct rbd_fence {
  rbd_image_t image;
  const char *name;             /* "POOL/IMAGE" for messages */
  unsigned request_timeout_ms;
  uint64_t size, features;      /* as opened */
  uint64_t watch_handle;
  bool watching;                /* rbd_update_watch succeeded */
  _Atomic(const char *) lost;   /* why the image is not ours, or NULL */
  _Atomic bool released;        /* foliod release */
  _Atomic uint64_t confirmed_ms; /* now_ms() at the start of the last
                                  * check that passed */
  pthread_mutex_t lock;
  pthread_cond_t cond;          /* kick the thread; a check is done */
  bool kick, stop, done;        /* under lock */
  pthread_t thread;
};

static void
fence_set_lost (struct rbd_fence *f, const char *why)
{
  const char *none = NULL;

  if (atomic_compare_exchange_strong (&f->lost, &none, why))
    log_warn ("rbd:%s: this foliod no longer owns the image: %s; from "
              "now on its writes, reads and FLUSHes fail, and a persistent "
              "store keeps its dirty data marked fenced (foliod(8), "
              "Lost lock)", f->name, why);
}

/* One look at the image: 0 ours as opened, 1 not (lost set), -1 cannot
 * tell now (the cluster does not answer as it should). */
static int
fence_check (struct rbd_fence *f)
{
  uint64_t size, features;
  int owner = 0, r;

  if (rbd_get_features (f->image, &features) < 0 ||
      rbd_get_size (f->image, &size) < 0)
    return -1;
  if (!(features & RBD_FEATURE_EXCLUSIVE_LOCK)) {
    fence_set_lost (f, "another client disabled the image's exclusive-lock "
                    "feature (a second writer may now write it)");
    return 1;
  }
  if (size != f->size) {
    fence_set_lost (f, "another client resized the image (the cache "
                    "would disagree with it)");
    return 1;
  }
  r = rbd_is_exclusive_lock_owner (f->image, &owner);
  if (r == -ESHUTDOWN) {
    fence_set_lost (f, "another client broke its exclusive lock and the "
                    "cluster blocklisted this client");
    return 1;
  }
  if (r < 0)
    return -1;
  if (!owner) {
    fence_set_lost (f, "its exclusive lock is held by another client");
    return 1;
  }
  return 0;
}

static void *
fence_main (void *arg)
{
  struct rbd_fence *f = arg;

  lock_or_die (&f->lock);
  while (!f->stop) {
    if (!f->kick)
      cond_wait_ms (&f->cond, &f->lock, RBD_FENCE_TICK_MS);
    if (f->stop)
      break;
    f->kick = false;
    if (atomic_load (&f->lost) || atomic_load (&f->released))
      continue;
    unlock_or_die (&f->lock);
    uint64_t t0 = now_ms ();
    if (fence_check (f) == 0)
      atomic_store (&f->confirmed_ms, t0);
    lock_or_die (&f->lock);
    pthread_cond_broadcast (&f->cond);
  }
  f->done = true;
  pthread_cond_broadcast (&f->cond);
  unlock_or_die (&f->lock);
  return NULL;
}

static void
fence_kick (struct rbd_fence *f)
{
  lock_or_die (&f->lock);
  f->kick = true;
  pthread_cond_broadcast (&f->cond);
  unlock_or_die (&f->lock);
}

/* librbd's update watch, on its thread: the header changed (a resize, a
 * feature, the lock), or the watch came back after a break. */
static void
fence_updated (void *arg)
{
  fence_kick (arg);
}

struct rbd_fence *
rbd_fence_start (rbd_image_t image, const char *name,
                 unsigned request_timeout_ms)
{
  struct rbd_fence *f = calloc (1, sizeof *f);
  int r;

  if (!f)
    return NULL;
  f->image = image;
  f->name = name;
  f->request_timeout_ms = request_timeout_ms;
  if (rbd_get_size (image, &f->size) < 0 ||
      rbd_get_features (image, &f->features) < 0) {
    free (f);
    errno = EIO;
    return NULL;
  }
  pthread_mutex_init (&f->lock, NULL);
  if ((r = cond_init_monotonic (&f->cond)) != 0) {
    pthread_mutex_destroy (&f->lock);
    free (f);
    errno = r;
    return NULL;
  }
  atomic_store (&f->confirmed_ms, now_ms ());  /* open took the lock */
  f->watching = rbd_update_watch (image, &f->watch_handle, fence_updated,
                                  f) == 0;
  if ((r = thread_start (&f->thread, fence_main, f, "rbd-fence")) != 0) {
    if (f->watching)
      (void) rbd_update_unwatch (image, f->watch_handle);
    pthread_cond_destroy (&f->cond);
    pthread_mutex_destroy (&f->lock);
    free (f);
    errno = r;
    return NULL;
  }
  return f;
}

const char *
rbd_fence_lost (struct rbd_fence *f)
{
  return atomic_load (&f->lost);
}

int
rbd_fence_confirm (struct rbd_fence *f)
{
  uint64_t asked = now_ms (), end = asked + f->request_timeout_ms, now;
  int r = 0;

  if (atomic_load (&f->released))
    return 0;
  if (!atomic_load (&f->lost) &&
      asked < atomic_load (&f->confirmed_ms) + RBD_FENCE_LEASE_MS)
    return 0;
  lock_or_die (&f->lock);
  f->kick = true;
  pthread_cond_broadcast (&f->cond);
  while (!atomic_load (&f->lost) && !f->done &&
         atomic_load (&f->confirmed_ms) < asked && (now = now_ms ()) < end)
    cond_wait_ms (&f->cond, &f->lock, end - now);
  if (atomic_load (&f->lost))
    r = EIO;
  else if (atomic_load (&f->confirmed_ms) < asked)
    r = ETIMEDOUT;
  unlock_or_die (&f->lock);
  if (r) {
    errno = r;
    return -1;
  }
  return 0;
}

void
rbd_fence_note_error (struct rbd_fence *f, int err)
{
  if (err != ESHUTDOWN || atomic_load (&f->released))
    return;
  fence_set_lost (f, "the cluster blocklisted this client (another client "
                  "broke its exclusive lock)");
  fence_kick (f);
}

void
rbd_fence_released (struct rbd_fence *f, bool released)
{
  atomic_store (&f->released, released);
}

int
rbd_fence_stop (struct rbd_fence *f, uint64_t end_ms)
{
  uint64_t now;
  bool done;

  lock_or_die (&f->lock);
  f->stop = true;
  pthread_cond_broadcast (&f->cond);
  while (!f->done && (now = now_ms ()) < end_ms)
    cond_wait_ms (&f->cond, &f->lock, end_ms - now);
  done = f->done;
  unlock_or_die (&f->lock);
  if (!done) {
    pthread_detach (f->thread);
    return -1;
  }
  pthread_join (f->thread, NULL);
  if (f->watching)
    (void) rbd_update_unwatch (f->image, f->watch_handle);
  pthread_cond_destroy (&f->cond);
  pthread_mutex_destroy (&f->lock);
  free (f);
  return 0;
}
