/* The worker pool: threads that run cache calls, which may block on the
 * backing.  Requests come in through a locked FIFO; executed requests go
 * back to the loop thread through the server's done list and an ev_async.
 *
 * Fairness between exports: at most half of the workers (at least one)
 * run requests of one export at a time.  A remote that hangs holds each
 * of its requests' workers until request-timeout; without the cap, 16
 * requests to it would stall every other export, local files included.
 * A request over the cap waits in the FIFO; the others pass it.
 */
#include <assert.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>

#include "foliod/export.h"
#include "server/internal.h"
#include "server/log.h"

/* Hand an executed request back to the loop thread. */
static void
server_req_done (struct server *s, struct req *r)
{
  r->next = NULL;
  lock_or_die (&s->done_lock);
  if (s->done_tail)
    s->done_tail->next = r;
  else
    s->done_head = r;
  s->done_tail = r;
  unlock_or_die (&s->done_lock);
  ev_async_send (s->loop, &s->done_async);
}

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

    while (!(r = pool_take_locked (p)) && !(p->stop && !p->head))
      if (pthread_cond_wait (&p->cond, &p->lock) != 0)
        abort ();
    if (!r)
      break; /* stopping and nothing left */
    unlock_or_die (&p->lock);

    struct export *e = r->conn->exp;
    req_execute (r);
    server_req_done (p->srv, r);

    lock_or_die (&p->lock);
    /* A request of e may have waited for this worker's share. */
    if (e && e->workers_busy-- == pool_share (p) && p->head)
      pthread_cond_signal (&p->cond);
  }
  unlock_or_die (&p->lock);
  return NULL;
}

int
pool_start (struct pool *p, struct server *s, unsigned nthreads)
{
  sigset_t all, old;
  int err = 0;

  p->srv = s;
  p->head = p->tail = NULL;
  p->stop = false;
  p->nthreads = 0;
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
    p->nthreads++;
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
pool_submit (struct server *s, struct req *r)
{
  r->next = NULL;
  if (s->sub_tail)
    s->sub_tail->next = r;
  else
    s->sub_head = r;
  s->sub_tail = r;
  s->sub_n++;
}

void
pool_submit_flush (struct server *s)
{
  struct pool *p = &s->pool;

  if (!s->sub_head)
    return;
  lock_or_die (&p->lock);
  if (p->tail)
    p->tail->next = s->sub_head;
  else
    p->head = s->sub_head;
  p->tail = s->sub_tail;
  if (s->sub_n > 1)
    pthread_cond_broadcast (&p->cond);
  else
    pthread_cond_signal (&p->cond);
  unlock_or_die (&p->lock);
  s->sub_head = s->sub_tail = NULL;
  s->sub_n = 0;
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

/* Loop side: take every executed request and queue its reply (or drop it
 * if its connection is gone), then send. */
void
server_done_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct server *s = w->data;
  struct req *r, *next;

  lock_or_die (&s->done_lock);
  r = s->done_head;
  s->done_head = s->done_tail = NULL;
  unlock_or_die (&s->done_lock);

  for (; r; r = next) {
    struct conn *c = r->conn;

    next = r->next;
    assert (c->nworker > 0);
    c->nworker--;
    if (c->state == CONN_DEAD) {
      conn_req_put (c, r);
      conn_maybe_free (c);
    }
    else
      conn_queue_reply (c, r);
  }
  conn_flush_pending (s);
}
