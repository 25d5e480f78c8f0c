/* The worker pool: threads that run cache calls, which may block on the
 * backing.  Requests come in through a locked FIFO; each executed request
 * goes to the done callback the pool was started with (the server's,
 * which hands it back to the loop thread).
 *
 * Fairness between exports: at most half of the workers (at least one)
 * run requests of one export at a time.  A remote that hangs holds each
 * of its requests' workers until request-timeout; without the cap, 16
 * requests to it would stall every other export, local files included.
 * A request over the cap waits in the FIFO; the others pass it.
 */
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "foliod/export.h"
#include "server/internal.h"

/* Workers one export may hold at once. */
static unsigned
pool_share (const struct pool *p)
{
  return p->nthreads > 1 ? p->nthreads / 2 : 1;
}

/* Take the first queued request whose export is under its share of the
 * workers (lock held).  NULL: none may run now. */
static struct req *
pool_take_locked (struct pool *p)
{
  unsigned cap = pool_share (p);
  struct req *r, *prev = NULL;

  for (r = p->head; r; prev = r, r = r->next)
    if (r->conn->exp == NULL || r->conn->exp->workers_busy < cap)
      break;
  if (r == NULL)
    return NULL;
  if (prev)
    prev->next = r->next;
  else
    p->head = r->next;
  if (p->tail == r)
    p->tail = prev;
  if (r->conn->exp)
    r->conn->exp->workers_busy++;
  return r;
}

static void *
pool_worker (void *arg)
{
  struct pool *p = arg;

  lock_or_die (&p->lock);
  for (;;) {
    struct req *r;

    while (!(r = pool_take_locked (p)) && !(p->stop && !p->head)) {
      p->nidle++;
      if (pthread_cond_wait (&p->cond, &p->lock) != 0)
        abort ();
      p->nidle--;
    }
    if (!r)
      break; /* stopping and nothing left */
    unlock_or_die (&p->lock);

    struct export *e = r->conn->exp;
    req_execute (r);
    p->done (p->done_opaque, r);

    lock_or_die (&p->lock);
    /* A request of e may have waited for this worker's share. */
    if (e && e->workers_busy-- == pool_share (p) && p->head)
      pthread_cond_signal (&p->cond);
  }
  unlock_or_die (&p->lock);
  return NULL;
}

int
pool_start (struct pool *p, unsigned nthreads,
            void (*done) (void *opaque, struct req *r), void *opaque)
{
  sigset_t all, old;
  int err = 0;

  p->done = done;
  p->done_opaque = opaque;
  p->head = p->tail = NULL;
  p->sub_head = p->sub_tail = NULL;
  p->sub_n = 0;
  p->stop = false;
  p->nthreads = 0;
  p->nidle = 0;
  p->threads = calloc (nthreads, sizeof *p->threads);
  if (!p->threads)
    return -1;
  pthread_mutex_init (&p->lock, NULL);
  pthread_cond_init (&p->cond, NULL);
  /* Workers inherit a full signal mask: signals belong to the loop. */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  for (unsigned i = 0; i < nthreads; i++) {
    err = pthread_create (&p->threads[i], NULL, pool_worker, p);
    if (err)
      break;
    /* Under the lock: running workers read it (pool_share). */
    pthread_mutex_lock (&p->lock);
    p->nthreads++;
    pthread_mutex_unlock (&p->lock);
  }
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (err) {
    pool_stop (p);
    errno = err;
    return -1;
  }
  return 0;
}

/* Requests parsed during one wake-up are handed over together (one lock
 * round trip, one wake-up call) by pool_submit_flush, which the loop
 * calls at the end of every input pass. */
void
pool_submit (struct pool *p, struct req *r)
{
  r->next = NULL;
  if (p->sub_tail)
    p->sub_tail->next = r;
  else
    p->sub_head = r;
  p->sub_tail = r;
  p->sub_n++;
}

void
pool_submit_flush (struct pool *p)
{
  if (!p->sub_head)
    return;
  lock_or_die (&p->lock);
  if (p->tail)
    p->tail->next = p->sub_head;
  else
    p->head = p->sub_head;
  p->tail = p->sub_tail;
  /* One wake-up per request, never the herd: a worker that is awake
   * takes the next request itself when it is done with its own. */
  for (unsigned i = 0; i < p->sub_n && i < p->nidle; i++)
    pthread_cond_signal (&p->cond);
  unlock_or_die (&p->lock);
  p->sub_head = p->sub_tail = NULL;
  p->sub_n = 0;
}

/* Stop and join the workers (after they finish the queue). */
void
pool_stop (struct pool *p)
{
  if (!p->threads)
    return;
  lock_or_die (&p->lock);
  p->stop = true;
  pthread_cond_broadcast (&p->cond);
  unlock_or_die (&p->lock);
  for (unsigned i = 0; i < p->nthreads; i++)
    pthread_join (p->threads[i], NULL);
  free (p->threads);
  p->threads = NULL;
  pthread_cond_destroy (&p->cond);
  pthread_mutex_destroy (&p->lock);
}
