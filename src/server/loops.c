/* The connection loops: N threads, each with its own libev loop and its
 * own connections (internal.h, "Threading model").
 *
 * The main thread accepts (listen.c) and hands each socket to the loop
 * that owns the fewest connections (loop_hand_off).  That and everything
 * else that reaches a loop from another thread goes through the loop's
 * mailbox (loop-mailbox.c): its lists under its lock (a leaf), then one
 * ev_async_send.  The loop's one async watcher (loop_wake_cb, here) then
 * adopts the new sockets, answers the requests workers and backings
 * finished (the done list) and runs the main thread's commands
 * (shutdown, buffer budget released elsewhere, exit).
 *
 * Shutdown: server_shutdown (main thread) stops accepting and posts
 * LOOP_CMD_SHUTDOWN to every loop, which lets its connections finish
 * what they have (conn_begin_shutdown) and refuses sockets still in its
 * queue.  A loop that has lost its last connection tells the main
 * thread (gone_async); once every loop owns none (nconns + nqueued, so
 * a socket in transit is never missed), the done callback runs on the
 * main loop.  server_free then makes the loop threads leave ev_run
 * (LOOP_CMD_EXIT), joins them, and finishes the rest on its own thread.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <unistd.h>

#include "foliod/util.h"
#include "server/internal.h"

/* Queue one executed request's reply (or drop it if its connection is
 * gone). */
static void
loop_done_one (struct sloop *lp, struct req *r)
{
  struct server *s = lp->srv;
  struct conn *c = r->conn;

  /* A parked miss whose data came: answer it from them here if the
   * cache lets us without waiting, else on a worker (which also reads
   * again after a failed fetch, with the backing's retries). */
  if (r->fetch == REQ_FETCHED && c->state != CONN_DEAD &&
      !(r->fetch_err == 0 && req_try_execute (r))) {
    if (s->pool.workers) {
      pool_submit (&lp->batch, r);
      return;
    }
    r->error = NBD_EIO;       /* server_free: no workers any more */
    r->errmsg = NULL;
    req_build_reply (r);
  }
  if (r->fetch == REQ_FETCHED && c->state != CONN_DEAD)
    STAT_ADD (lp, requests_parked, 1);
  r->fetch = REQ_FETCH_NONE;
  assert (c->nworker > 0);
  c->nworker--;
  if (c->state == CONN_DEAD) {
    conn_req_put (c, r);
    conn_maybe_free (c);
  }
  else
    conn_queue_reply (c, r);
}

/* Take every executed request and queue its reply, then send.  On the
 * loop's thread, or by server_free once the thread is gone. */
void
loop_take_done (struct sloop *lp)
{
  struct req *r, *next;

  lock_or_die (&lp->lock);
  r = lp->done_head;
  lp->done_head = lp->done_tail = NULL;
  unlock_or_die (&lp->lock);
  for (; r; r = next) {
    next = r->next;
    loop_done_one (lp, r);
  }
  pool_submit_flush (&lp->srv->pool, &lp->batch);
  conn_flush_pending (lp);
}

static void
loop_shutdown_conns (struct sloop *lp, bool force)
{
  struct conn *c, *next;

  for (c = lp->conns; c; c = next) {
    next = c->next;
    conn_begin_shutdown (c, force);
  }
}

static void
loop_wake_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct sloop *lp = w->data;
  struct handoff *h, *hn;
  unsigned cmd;

  lock_or_die (&lp->lock);
  h = lp->in_head;
  lp->in_head = lp->in_tail = NULL;
  cmd = lp->cmd;
  lp->cmd = 0;
  unlock_or_die (&lp->lock);

  for (; h; h = hn) {
    hn = h->next;
    conn_new (lp, h->fd, h->peer, h->key, h->moved); /* counts itself
                                                         in nconns */
    atomic_fetch_sub (&lp->nqueued, 1);    /* ... before this: never 0+0
                                              with a socket in between */
    free (h);
  }
  if (cmd & LOOP_CMD_SHUTDOWN)
    loop_shutdown_conns (lp, lp->srv->forced);
  if (cmd & LOOP_CMD_BUDGET)
    conn_budget_wake (lp);
  loop_take_done (lp);
  loop_check_gone (lp);
  if (cmd & LOOP_CMD_EXIT)
    ev_break (loop, EVBREAK_ALL);
}

bool
loops_all_gone (struct server *s)
{
  for (unsigned i = 0; i < s->nloops; i++)
    if (atomic_load (&s->loops[i].nconns) || atomic_load (&s->loops[i].nqueued))
      return false;
  return true;
}

static void *
loop_main (void *arg)
{
  struct sloop *lp = arg;

  ev_run (lp->loop, 0);
  return NULL;
}

static int
loop_init (struct server *s, struct sloop *lp, unsigned idx)
{
  lp->srv = s;
  lp->idx = idx;
  if (s->cfg.loops_inline)
    lp->loop = s->loop;
  else if (!(lp->loop = ev_loop_new (EVFLAG_AUTO))) {
    errno = ENOMEM;
    return -1;
  }
  pthread_mutex_init (&lp->lock, NULL);
  ev_async_init (&lp->wake, loop_wake_cb);
  lp->wake.data = lp;
  ev_async_start (lp->loop, &lp->wake);
  return 0;
}

/* Create the loops and start their threads (none with loops_inline: the
 * one loop is the caller's). */
int
loops_start (struct server *s)
{
  s->nloops = s->cfg.loops_inline ? 1 : s->cfg.loops;
  if (!(s->loops = calloc (s->nloops, sizeof *s->loops)))
    return -1;
  for (unsigned i = 0; i < s->nloops; i++) {
    struct sloop *lp = &s->loops[i];
    int err;

    if (loop_init (s, lp, i) < 0)
      return -1;
    if (s->cfg.loops_inline)
      continue;
    err = thread_start (&lp->thread, loop_main, lp, "foliod-loop/%u", i);
    if (err) {
      errno = err;
      return -1;
    }
    lp->threaded = true;
  }
  return 0;
}

/* Make every loop thread leave ev_run and join it.  Their connections
 * stay for server_free to close, on this thread. */
void
loops_stop (struct server *s)
{
  for (unsigned i = 0; i < s->nloops; i++)
    if (s->loops[i].threaded)
      loop_post (&s->loops[i], LOOP_CMD_EXIT);
  for (unsigned i = 0; i < s->nloops; i++)
    if (s->loops[i].threaded) {
      pthread_join (s->loops[i].thread, NULL);
      s->loops[i].threaded = false;
    }
}

/* After loops_stop and once every connection is freed. */
void
loops_free (struct server *s)
{
  for (unsigned i = 0; i < s->nloops; i++) {
    struct sloop *lp = &s->loops[i];
    struct handoff *h;

    if (!lp->loop)
      continue;
    while ((h = lp->in_head) != NULL) {   /* handed over, never adopted */
      lp->in_head = h->next;
      close (h->fd);
      if (h->moved) {
        server_moved_free (h->moved);
        free (h->moved);
      }
      free (h);
    }
    ev_async_stop (lp->loop, &lp->wake);
    pthread_mutex_destroy (&lp->lock);
    if (lp->loop != s->loop)
      ev_loop_destroy (lp->loop);
  }
  free (s->loops);
  s->loops = NULL;
  s->nloops = 0;
}
