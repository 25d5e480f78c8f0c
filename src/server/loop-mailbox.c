/* A loop's mailbox: how other threads reach a connection loop, and how
 * a loop tells the main thread it is empty.
 *
 * Whatever reaches a loop from another thread comes one way: put on the
 * loop's lists under its lock (a leaf), then one ev_async_send.  Executed
 * requests from the workers and the backings (loop_req_done), the main
 * thread's commands (loop_post) and accepted sockets (loop_hand_off) are
 * posted here; the loop's wake-up callback (loops.c) takes them.  The
 * other way, a loop that lost a connection during a shutdown wakes the
 * main thread (loop_check_gone).  Only queues and counters here: nothing
 * calls up into the loops, the connections or the requests.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "foliod/util.h"
#include "server/internal.h"
#include "server/log.h"

/* Worker or backing thread (the pool's done callback, and a parked
 * miss's completion): hand an executed request back to the loop that
 * owns its connection. */
void
loop_req_done (void *opaque, struct req *r)
{
  struct sloop *lp = r->conn->lp;

  (void) opaque;
  r->next = NULL;
  lock_or_die (&lp->lock);
  if (lp->done_tail)
    lp->done_tail->next = r;
  else
    lp->done_head = r;
  lp->done_tail = r;
  unlock_or_die (&lp->lock);
  ev_async_send (lp->loop, &lp->wake);
}

/* Any thread: have lp run cmd (LOOP_CMD_*) on its next wake-up. */
void
loop_post (struct sloop *lp, unsigned cmd)
{
  lock_or_die (&lp->lock);
  lp->cmd |= cmd;
  unlock_or_die (&lp->lock);
  ev_async_send (lp->loop, &lp->wake);
}

/* Connections lp owns or is about to adopt. */
static unsigned
loop_load (struct sloop *lp)
{
  return atomic_load (&lp->nconns) + atomic_load (&lp->nqueued);
}

/* The loop that owns the fewest connections (ties: the next one round
 * the ring). */
static struct sloop *
loop_pick (struct server *s)
{
  struct sloop *best = &s->loops[s->next_loop++ % s->nloops];
  unsigned best_load = loop_load (best);

  for (unsigned k = 1; k < s->nloops; k++) {
    struct sloop *lp = &s->loops[(s->next_loop - 1 + k) % s->nloops];
    unsigned load = loop_load (lp);
    if (load < best_load) {
      best = lp;
      best_load = load;
    }
  }
  return best;
}

static void
loop_queue (struct sloop *best, struct handoff *h)
{
  atomic_fetch_add (&best->nqueued, 1);
  lock_or_die (&best->lock);
  if (best->in_tail)
    best->in_tail->next = h;
  else
    best->in_head = h;
  best->in_tail = h;
  unlock_or_die (&best->lock);
  ev_async_send (best->loop, &best->wake);
}

/* Main thread: give an accepted socket to the loop that owns the fewest
 * connections.  That loop checks the limits when it adopts it
 * (conn_new). */
void
loop_hand_off (struct server *s, int fd, const char *peer, const char *key)
{
  struct handoff *h;

  if (!(h = calloc (1, sizeof *h))) {
    log_error ("refusing connection from %s: out of memory", peer);
    close (fd);
    return;
  }
  h->fd = fd;
  snprintf (h->peer, sizeof h->peer, "%s", peer);
  snprintf (h->key, sizeof h->key, "%s", key);
  loop_queue (loop_pick (s), h);
}

void
server_moved_free (struct server_moved *m)
{
  free (m->export_name);
  free (m->pending);
  m->export_name = NULL;
  m->pending = NULL;
}

/* Main thread: the same for a connection an old process handed over
 * (upgrade); the loop adopts it in transmission.  Takes m. */
void
loop_hand_off_moved (struct server *s, struct server_moved *m)
{
  struct handoff *h;

  if (!(h = calloc (1, sizeof *h))) {
    log_error ("dropping connection from %s: out of memory", m->peer);
    close (m->fd);
    server_moved_free (m);
    free (m);
    return;
  }
  h->fd = m->fd;
  snprintf (h->peer, sizeof h->peer, "%s", m->peer);
  snprintf (h->key, sizeof h->key, "%s", m->key);
  h->moved = m;
  loop_queue (loop_pick (s), h);
}

/* The loop lost a connection, or refused one: during a shutdown, the
 * main thread checks whether every loop is empty now. */
void
loop_check_gone (struct sloop *lp)
{
  struct server *s = lp->srv;

  if (atomic_load (&s->shutting_down) && !lp->conns)
    ev_async_send (s->loop, &s->gone_async);
}

/* A connection struct of lp is gone (freed, or refused on adoption). */
void
loop_conn_gone (struct sloop *lp)
{
  atomic_fetch_sub (&lp->nconns, 1);
  loop_check_gone (lp);
}
