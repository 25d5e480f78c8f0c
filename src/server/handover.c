/* Upgrade in place, the server's half (server.h, "Upgrade in place").
 *
 * The old process: server_handover pauses the listeners (their sockets
 * stay open for the new process) and starts a shutdown in which plain
 * connections in transmission are not closed: each reads on only to the
 * end of the request whose payload is arriving, stops at the next header
 * (conn.c, conn_handover_stops_input), answers what it has, sends it,
 * and is detached (conn_hand_over): its socket is left open and its
 * negotiated state and unread bytes go on s->moved.  Handshakes and TLS
 * connections (whose session cannot move) end as in a shutdown: TLS
 * ones are answered NBD_ESHUTDOWN and closed once idle.  Once no
 * connection is left, done runs on the main loop.  The wait is bounded
 * (HANDOVER_WAIT_S): connections still busy then are closed.
 *
 * The new process (or the old one resuming after a failed start)
 * adopts each with server_adopt: a loop takes it straight into
 * transmission (conn.c, conn_resume).
 */
#include <stdlib.h>
#include <string.h>

#include "foliod/export.h"
#include "foliod/util.h"
#include "server/internal.h"
#include "server/log.h"

#define HANDOVER_WAIT_S 5.  /* then busy connections are closed */

static void
handover_idle_cb (struct ev_loop *loop, ev_idle *w, int revents)
{
  struct server *s = w->data;
  void (*done) (void *) = s->handover_done;

  ev_idle_stop (loop, w);
  ev_timer_stop (loop, &s->handover_timer);
  s->handover_done = NULL;
  if (done)
    done (s->handover_opaque);
}

static void
handover_timer_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct server *s = w->data;

  log_warn ("upgrade: connections still busy after %.0f s: closing them "
            "(their clients reconnect)", HANDOVER_WAIT_S);
  s->forced = true;
  for (unsigned i = 0; i < s->nloops; i++)
    loop_post (&s->loops[i], LOOP_CMD_SHUTDOWN);
}

void
handover_init (struct server *s)
{
  pthread_mutex_init (&s->moved_lock, NULL);
  ev_idle_init (&s->handover_idle, handover_idle_cb);
  s->handover_idle.data = s;
  ev_timer_init (&s->handover_timer, handover_timer_cb, HANDOVER_WAIT_S, 0.);
  s->handover_timer.data = s;
}

/* Main thread, whenever a loop may have emptied. */
void
handover_check (struct server *s)
{
  if (atomic_load (&s->handing) && s->handover_done && loops_all_gone (s))
    ev_idle_start (s->loop, &s->handover_idle);
}

void
handover_free (struct server *s)
{
  ev_idle_stop (s->loop, &s->handover_idle);
  ev_timer_stop (s->loop, &s->handover_timer);
  for (size_t i = 0; i < s->nmoved; i++)
    server_moved_free (&s->moved[i]);
  free (s->moved);
  s->moved = NULL;
  s->nmoved = s->moved_cap = 0;
  pthread_mutex_destroy (&s->moved_lock);
}

int
server_handover (struct server *s, void (*done) (void *), void *opaque)
{
  s->handover_done = done;
  s->handover_opaque = opaque;
  atomic_store (&s->handing, true);     /* before shutting_down: req_check */
  atomic_store (&s->shutting_down, true);
  listeners_pause (s, true);
  ev_timer_set (&s->handover_timer, HANDOVER_WAIT_S, 0.);
  ev_timer_start (s->loop, &s->handover_timer);
  log_info ("upgrade: handing over %u connection(s)",
            atomic_load (&s->nconns));
  for (unsigned i = 0; i < s->nloops; i++)
    loop_post (&s->loops[i], LOOP_CMD_SHUTDOWN);
  handover_check (s);   /* nobody connected: done on the next iteration */
  return 0;
}

struct server_moved *
server_handover_take (struct server *s, size_t *n)
{
  struct server_moved *m;

  lock_or_die (&s->moved_lock);
  m = s->moved;
  *n = s->nmoved;
  s->moved = NULL;
  s->nmoved = s->moved_cap = 0;
  unlock_or_die (&s->moved_lock);
  return m;
}

void
server_handover_abort (struct server *s)
{
  ev_timer_stop (s->loop, &s->handover_timer);
  ev_idle_stop (s->loop, &s->handover_idle);
  s->handover_done = NULL;
  s->forced = false;
  atomic_store (&s->shutting_down, false);
  atomic_store (&s->handing, false);
  listeners_pause (s, false);
}

int
server_adopt (struct server *s, struct server_moved *m)
{
  struct server_moved *own = malloc (sizeof *own);

  if (!own)
    return -1;
  *own = *m;
  m->export_name = NULL;
  m->pending = NULL;
  m->fd = -1;
  loop_hand_off_moved (s, own);
  return 0;
}

void
server_replace_export (struct server *s, struct export *old, struct export *e)
{
  for (size_t i = 0; i < s->nexports; i++)
    if (s->exports[i] == old)
      s->exports[i] = e;
}
