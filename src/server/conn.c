/* The connection driver: life cycle, the input state machine, sending,
 * the socket watcher and the timers.
 *
 * Input is a resumable state machine: each state has one step function
 * (handshake.c, request.c) that pulls the bytes it needs with
 * conn_read_exact() (conn-io.c) and returns STEP_NEXT / STEP_BLOCK /
 * STEP_PAUSE / STEP_CLOSE.  Output drains independently: handshake bytes
 * from hsout, then replies from the send queue, gathered into one
 * sendmsg.  Which socket events we watch is computed in one place,
 * conn_update_events().
 *
 * A connection is only freed from conn_after_io() / conn_maybe_free(),
 * at the end of a callback, once its socket is closed and no worker holds
 * one of its requests: a client that goes away mid-request never frees
 * memory a worker still writes into.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "foliod/export.h"
#include "server/internal.h"
#include "server/log.h"

typedef enum step (*step_fn) (struct conn *c);

/* The input step of each state; NULL: the state takes no input. */
static const step_fn input_steps[CONN_NSTATES] = {
  [CONN_HS_CLIENT_FLAGS] = hs_step_client_flags,
  [CONN_HS_OPT_HDR] = hs_step_opt_hdr,
  [CONN_HS_OPT_DATA] = hs_step_opt_data,
  [CONN_HS_OPT_SKIP] = hs_step_opt_skip,
  [CONN_TX_REQ_HDR] = tx_step_req_hdr,
  [CONN_TX_REQ_PAYLOAD] = tx_step_req_payload,
  [CONN_TX_REQ_DISCARD] = tx_step_req_discard,
};

static bool
conn_output_pending (const struct conn *c)
{
  return c->hsout_sent < c->hsout_len || c->sendq_head != NULL;
}

static bool
conn_input_paused (const struct conn *c)
{
  if (c->hsout_len - c->hsout_sent > CONN_HSOUT_LIMIT)
    return true;
  if (c->state == CONN_TX_REQ_HDR
      && c->nactive >= c->srv->cfg.max_inflight)
    return true;
  /* A header read, its buffer over budget: wait for replies to go. */
  if (c->state == CONN_TX_REQ_HDR && c->hdr_have == conn_req_hdr_len (c)
      && !conn_budget_hdr_fits (c))
    return true;
  return false;
}

/* A connection an upgrade may hand over: plain, in transmission. */
static bool
conn_movable (const struct conn *c)
{
  return atomic_load_explicit (&c->srv->handing, memory_order_relaxed)
    && !c->tls_active && conn_state_is_transmission (c->state);
}

/* Handing over: a movable connection reads on only to finish the request
 * whose payload is arriving; at the next header it stops, and what the
 * client sent since stays for the new process (server_moved). */
static bool
conn_handover_stops_input (const struct conn *c)
{
  return conn_movable (c) && c->state == CONN_TX_REQ_HDR;
}

static bool
conn_wants_input (const struct conn *c)
{
  return input_steps[c->state] != NULL && !conn_input_paused (c)
    && !conn_handover_stops_input (c);
}

/* Drop the input side: the request being received is abandoned (it never
 * reached the cache) and no more input is read. */
static void
conn_stop_input (struct conn *c)
{
  if (c->cur) {
    conn_req_put (c, c->cur);
    c->cur = NULL;
  }
  c->rpos = c->rlen = 0;
  if (c->state != CONN_DRAINING)
    conn_set_state (c, CONN_DRAINING);
}

/* Let go of the socket: closed, or (keep_fd) left open for whoever has
 * it next.  The struct lives on until workers let go. */
static void
conn_release (struct conn *c, const char *why, bool keep_fd)
{
  struct req *r;

  if (c->state == CONN_DEAD)
    return;
  log_info ("conn %" PRIu64 " (%s): %s: %s", c->id, c->peer,
            keep_fd ? "handed over" : "closed", why);
  ev_io_stop (c->lp->loop, &c->io);
  ev_timer_stop (c->lp->loop, &c->hs_timer);
  ev_timer_stop (c->lp->loop, &c->idle_timer);
  conn_budget_drop (c);
  server_client_gone (c);
  c->io_events = 0;
  if (!keep_fd)
    c->tops->close (c);
  if (c->cur) {
    conn_req_put (c, c->cur);
    c->cur = NULL;
  }
  while ((r = c->sendq_head) != NULL) {
    c->sendq_head = r->next;
    conn_req_put (c, r);
  }
  c->sendq_tail = NULL;
  c->hsout_len = c->hsout_sent = 0;
  c->state = CONN_DEAD;
  atomic_store (&c->closed, true);
  atomic_fetch_sub (&c->srv->nconns, 1);
  STAT_SUB (c->lp, connections_now, 1);
}

static void
conn_close (struct conn *c, const char *why)
{
  conn_release (c, why, false);
}

/* Record c's negotiated state and unread input in a server_moved.  0 or
 * -1 (no memory). */
static int
conn_moved_fill (const struct conn *c, struct server_moved *m)
{
  memset (m, 0, sizeof *m);
  m->fd = c->fd;
  if (!(m->export_name = strdup (c->exp->name)))
    return -1;
  m->pending_len = (uint32_t) (c->rlen - c->rpos);
  if (m->pending_len && !(m->pending = malloc (m->pending_len))) {
    free (m->export_name);
    return -1;
  }
  if (m->pending_len)
    memcpy (m->pending, c->rbuf + c->rpos, m->pending_len);
  snprintf (m->peer, sizeof m->peer, "%s", c->peer);
  snprintf (m->key, sizeof m->key, "%s", c->client_key);
  m->client_flags = c->client_flags;
  m->tflags = c->tflags;
  m->flags = (c->structured ? SERVER_MOVED_STRUCTURED : 0)
    | (c->extended ? SERVER_MOVED_EXTENDED : 0)
    | (c->meta_alloc && c->meta_exp == c->exp ? SERVER_MOVED_META_ALLOC : 0)
    | (c->meta_cache && c->meta_exp == c->exp ? SERVER_MOVED_META_CACHE : 0)
    | (c->no_zeroes ? SERVER_MOVED_NO_ZEROES : 0)
    | (c->requested ? SERVER_MOVED_REQUESTED : 0);
  m->hdr_have = (uint32_t) c->hdr_have;
  memcpy (m->hdr, c->hdr, sizeof m->hdr);
  return 0;
}

/* Handing over, nothing in flight, everything sent: detach the socket
 * and queue its state for the new process (server_handover_take). */
static void
conn_hand_over (struct conn *c)
{
  struct server *s = c->srv;
  struct server_moved m;

  if (conn_moved_fill (c, &m) < 0) {
    conn_close (c, "out of memory handing over");
    return;
  }
  lock_or_die (&s->moved_lock);
  if (s->nmoved == s->moved_cap) {
    size_t cap = s->moved_cap ? 2 * s->moved_cap : 16;
    struct server_moved *p = realloc (s->moved, cap * sizeof *p);
    if (!p) {
      unlock_or_die (&s->moved_lock);
      server_moved_free (&m);
      conn_close (c, "out of memory handing over");
      return;
    }
    s->moved = p;
    s->moved_cap = cap;
  }
  s->moved[s->nmoved++] = m;
  unlock_or_die (&s->moved_lock);
  conn_release (c, "upgrade", true);
}

static void
conn_run_steps (struct conn *c)
{
  c->steps_left = CONN_STEPS_PER_WAKE;
  c->recvs_left = CONN_STEPS_PER_WAKE / 4;
  c->inline_left = CONN_INLINE_PER_WAKE;
  c->rdrained = false;
  while (conn_wants_input (c)) {
    enum step r;

    if (c->steps_left == 0) {
      c->yielded = true;
      return;
    }
    c->steps_left--;
    r = input_steps[c->state] (c);
    if (r == STEP_NEXT)
      continue;
    if (r == STEP_CLOSE) {
      if (c->eof && conn_state_is_transmission (c->state)) {
        /* The client went away (or half-closed): finish what it sent,
         * try to deliver the replies, then close. */
        log_debug ("conn %" PRIu64 ": end of input", c->id);
        conn_stop_input (c);
      }
      else {
        if (conn_state_is_handshake (c->state))
          STAT_ADD (c->lp, handshakes_failed, 1);
        conn_close (c, c->eof ? "client disconnected" : "protocol error");
      }
    }
    return;
  }
}

/* Run input steps, then hand what was parsed to the workers at once. */
static void
conn_run_input (struct conn *c)
{
  conn_run_steps (c);
  pool_submit_flush (&c->srv->pool, &c->lp->batch);
}

/* Gather up to CONN_SEND_IOV pieces of pending output.  Returns count. */
static int
conn_gather (struct conn *c, struct iovec *v)
{
  int n = 0;

  if (c->hsout_sent < c->hsout_len) {
    v[n].iov_base = c->hsout + c->hsout_sent;
    v[n].iov_len = c->hsout_len - c->hsout_sent;
    n++;
  }
  for (struct req *r = c->sendq_head; r && n < CONN_SEND_IOV; r = r->next)
    for (unsigned i = r->iov_next; i < r->niov && n < CONN_SEND_IOV; i++) {
      v[n] = r->iov[i];
      if (i == r->iov_next) {
        v[n].iov_base = (uint8_t *) v[n].iov_base + r->iov_off;
        v[n].iov_len -= r->iov_off;
      }
      n++;
    }
  return n;
}

/* Account for k bytes sent, releasing fully sent replies. */
static void
conn_consume (struct conn *c, size_t k)
{
  struct req *r;

  if (c->hsout_sent < c->hsout_len) {
    size_t take = c->hsout_len - c->hsout_sent < k
      ? c->hsout_len - c->hsout_sent : k;
    c->hsout_sent += take;
    k -= take;
  }
  while ((r = c->sendq_head) != NULL) {
    while (r->iov_next < r->niov) {
      size_t left = r->iov[r->iov_next].iov_len - r->iov_off;
      if (k < left) {
        r->iov_off += k;
        return;
      }
      k -= left;
      r->iov_next++;
      r->iov_off = 0;
    }
    c->sendq_head = r->next;
    if (!c->sendq_head)
      c->sendq_tail = NULL;
    conn_req_put (c, r);
  }
  assert (k == 0);
}

/* Send pending output until done, would block, or this wake-up's budget
 * is spent.  Closes the connection on a send error. */
static void
conn_send (struct conn *c)
{
  struct iovec v[CONN_SEND_IOV];

  for (int i = 0; i < CONN_SENDS_PER_WAKE; i++) {
    int n = conn_gather (c, v);
    ssize_t k;

    if (n == 0)
      return;
    k = c->tops->send (c, v, n);
    if (k < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) {
        c->send_blocked = true;
        return;
      }
      log_debug ("conn %" PRIu64 ": send: %m", c->id);
      /* A client that sent NBD_OPT_ABORT or NBD_CMD_DISC may well be gone
       * before our last bytes: that is a normal end. */
      conn_close (c, c->state == CONN_DRAINING ? "client disconnected"
                  : "send failed (client gone)");
      return;
    }
    conn_consume (c, k);
  }
  /* Budget spent: wait for EV_WRITE, which fires at once if there is room. */
  c->send_blocked = true;
}

/* ---- events ------------------------------------------------------------ */

static void
conn_update_events (struct conn *c)
{
  int ev = c->tport_want;

  if (conn_wants_input (c))
    ev |= EV_READ;
  if (conn_output_pending (c))
    ev |= EV_WRITE;
  if (ev == c->io_events)
    return;
  ev_io_stop (c->lp->loop, &c->io);
  ev_io_set (&c->io, c->fd, ev);
  if (ev)
    ev_io_start (c->lp->loop, &c->io);
  c->io_events = ev;
}

/* Free a dead connection once nothing points at it: no worker holds one
 * of its requests and it is not linked in the server's flush list (a
 * reply queued on the loop thread, such as a refused request, links it
 * there; conn_flush_pending frees it then). */
void
conn_maybe_free (struct conn *c)
{
  if (c->state == CONN_DEAD && c->nworker == 0 && !c->in_flush_list)
    conn_free (c);
}

/* The end of every callback that touched c: send what can be sent, close
 * a drained connection, recompute events, or free a dead one.  c may be
 * freed on return. */
void
conn_after_io (struct conn *c)
{
  if (c->state != CONN_DEAD && !c->send_blocked && conn_output_pending (c))
    conn_send (c);
  if (c->state == CONN_DRAINING && c->nactive == 0
      && !conn_output_pending (c))
    conn_close (c, c->eof ? "client disconnected" : "done");
  else if (conn_handover_stops_input (c) && !c->eof && c->nactive == 0
           && !conn_output_pending (c))
    conn_hand_over (c);
  else if (atomic_load_explicit (&c->srv->shutting_down,
                                 memory_order_relaxed)
           && conn_state_is_transmission (c->state)
           && c->nactive == 0 && !conn_output_pending (c))
    conn_close (c, "server shutting down");
  if (c->state == CONN_DEAD) {
    conn_maybe_free (c);
    return;
  }
  conn_update_events (c);
  /* Input already buffered (ours or the transport's) will not wake the
   * socket watcher: feed ourselves an event to go on next iteration. */
  if (conn_wants_input (c)
      && (c->yielded || c->rpos < c->rlen || c->tops->pending (c))) {
    c->yielded = false;
    ev_feed_event (c->lp->loop, &c->io, EV_READ);
  }
}

/* Flush the connections that got new replies from the workers. */
void
conn_flush_pending (struct sloop *lp)
{
  /* Until empty: a reply sent here releases buffer budget, which may
   * resume connections waiting for it (they join the list). */
  while (lp->flush_list) {
    struct conn *c = lp->flush_list, *next;

    lp->flush_list = NULL;
    for (; c; c = next) {
      next = c->flush_next;
      c->in_flush_list = false;
      conn_after_io (c);
    }
  }
}

static void
conn_io_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct conn *c = w->data;
  struct sloop *lp = c->lp;
  /* An event the transport waited for (TLS: a read that needs the socket
   * writable, or the reverse) retries both directions. */
  bool tport = (revents & c->tport_want) != 0;

  if ((revents & EV_WRITE) || tport) {
    c->send_blocked = false;
    conn_send (c);
  }
  if (((revents & EV_READ) || tport) && c->state != CONN_DEAD)
    conn_run_input (c);
  conn_after_io (c);
  conn_flush_pending (lp); /* replies queued on the loop, c's included */
}

static void
conn_hs_timeout_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct conn *c = w->data;

  log_warn ("conn %" PRIu64 " (%s): handshake timed out", c->id, c->peer);
  STAT_ADD (c->lp, handshakes_failed, 1);
  conn_close (c, "handshake timeout");
  conn_after_io (c);
}

/* Are the last slots (a quarter of max_connections, at least one) taken?
 * Any loop's thread: nconns is atomic. */
static bool
conn_slots_crowded (struct server *s)
{
  unsigned max = s->cfg.max_connections, reserve = max / 4 ? max / 4 : 1;

  return atomic_load (&s->nconns) + reserve > max;
}

/* No input for idle_timeout_s.  A connection with requests in flight or
 * replies to send is busy, not idle: it gets another period.
 *
 * Without idle_timeout_s (the default: kernel and qemu clients stay idle
 * for hours), the timer runs every handshake_timeout_s until the
 * connection sends its first request; one that has sent none by then
 * while the last slots are taken is closed, so that clients that connect
 * and idle cannot hold every slot against those that use theirs. */
/* The idle timer's period: idle-timeout, or without one the handshake
 * timeout (how long a connection may go without its first request while
 * the server is nearly full). */
static ev_tstamp
conn_idle_secs (const struct server *s)
{
  return s->cfg.idle_timeout_s ? s->cfg.idle_timeout_s
    : s->cfg.handshake_timeout_s;
}

static void
conn_idle_timeout_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct conn *c = w->data;
  struct sloop *lp = c->lp;
  struct server *s = c->srv;
  ev_tstamp left = c->last_active + conn_idle_secs (s) - ev_now (loop);

  if (!s->cfg.idle_timeout_s && c->requested) {
    ev_timer_stop (loop, w);
    return;
  }
  if (left > 0.) {
    /* Touched since the timer was armed: wait for what is left. */
    w->repeat = left;
    ev_timer_again (loop, w);
    w->repeat = conn_idle_secs (s);
    return;
  }
  if (c->nactive > 0 || conn_output_pending (c)
      || (!s->cfg.idle_timeout_s && !conn_slots_crowded (s))) {
    c->last_active = ev_now (loop);
    ev_timer_again (loop, w);
    return;
  }
  if (!s->cfg.idle_timeout_s) {
    log_warn ("conn %" PRIu64 " (%s): no request in %u s while the server "
              "is nearly full (%u of %u connections): closed for others",
              c->id, c->peer, s->cfg.handshake_timeout_s,
              atomic_load (&s->nconns), s->cfg.max_connections);
    conn_close (c, "idle without a request, server nearly full");
    conn_after_io (c);
    conn_flush_pending (lp);
    return;
  }
  log_info ("conn %" PRIu64 " (%s): idle for %u s", c->id, c->peer,
            s->cfg.idle_timeout_s);
  conn_close (c, "idle timeout");
  conn_after_io (c);
  conn_flush_pending (lp);
}

/* ---- life cycle -------------------------------------------------------- */

/* Take a global connection slot (max_connections): false when none
 * is left. */
static bool
conn_slot_take (struct server *s)
{
  unsigned n = atomic_load (&s->nconns);

  do
    if (n >= s->cfg.max_connections)
      return false;
  while (!atomic_compare_exchange_weak (&s->nconns, &n, n + 1));
  return true;
}

static void
conn_refuse (struct sloop *lp, int fd, const char *peer, const char *why)
{
  /* A storm of these (a client reconnecting in a loop) is rate-limited
   * by the logger, per call site. */
  log_warn ("refusing connection from %s: %s", peer, why);
  STAT_ADD (lp, connections_refused, 1);
  close (fd);
}

/* A connection handed over by an old process (upgrade): in transmission
 * on the same export with what was negotiated, and the bytes the old
 * process had read but not parsed.  0, or -1 (the export is gone). */
static int
conn_resume (struct conn *c, const struct server_moved *m)
{
  struct export *e = server_find_export (c->srv, m->export_name);

  if (!e || m->pending_len > CONN_RBUF_SIZE || m->hdr_have > sizeof c->hdr)
    return -1;
  c->exp = e;
  c->client_flags = m->client_flags;
  c->tflags = m->tflags;
  c->structured = (m->flags & SERVER_MOVED_STRUCTURED) != 0;
  c->extended = (m->flags & SERVER_MOVED_EXTENDED) != 0;
  c->meta_alloc = (m->flags & SERVER_MOVED_META_ALLOC) != 0;
  c->meta_cache = (m->flags & SERVER_MOVED_META_CACHE) != 0;
  c->meta_exp = e;
  c->no_zeroes = (m->flags & SERVER_MOVED_NO_ZEROES) != 0;
  c->requested = (m->flags & SERVER_MOVED_REQUESTED) != 0;
  if (m->pending_len > 0)       /* pending is NULL when there is none */
    memcpy (c->rbuf, m->pending, m->pending_len);
  c->rlen = m->pending_len;
  memcpy (c->hdr, m->hdr, sizeof c->hdr);
  ev_timer_stop (c->lp->loop, &c->hs_timer);
  c->state = CONN_HS_OPT_HDR;        /* so that the setter starts the
                                        transmission timers */
  conn_set_state (c, CONN_TX_REQ_HDR);
  c->hdr_have = m->hdr_have;
  log_info ("conn %" PRIu64 ": export '%s' (handed over by the old "
            "process, %u bytes unread)", c->id, e->name,
            (unsigned) (m->pending_len + m->hdr_have));
  return 0;
}

static void
conn_moved_drop (struct server_moved *moved)
{
  if (moved) {
    server_moved_free (moved);
    free (moved);
  }
}

/* Adopt fd on lp (its thread), within the server's limits; moved: a
 * connection handed over by an old process (taken, freed here). */
void
conn_new (struct sloop *lp, int fd, const char *peer, const char *client_key,
          struct server_moved *moved)
{
  struct server *s = lp->srv;
  struct conn *c;
  int admit;

  atomic_fetch_add (&lp->nconns, 1);    /* loop_conn_gone takes it back */
  if (atomic_load (&s->shutting_down)) {
    conn_refuse (lp, fd, peer, "shutting down");
    loop_conn_gone (lp);
    conn_moved_drop (moved);
    return;
  }
  if (!conn_slot_take (s)) {
    conn_refuse (lp, fd, peer, "connection limit reached");
    loop_conn_gone (lp);
    conn_moved_drop (moved);
    return;
  }
  c = calloc (1, sizeof *c);
  if (!c || !(c->rbuf = malloc (CONN_RBUF_SIZE))
      || (admit = server_client_admit (s, c, client_key)) < 0) {
    log_error ("refusing connection from %s: out of memory", peer);
    admit = -1;
  }
  else if (admit == 0)
    conn_refuse (lp, fd, peer, "connection limit per client reached");
  if (admit <= 0) {
    if (c)
      free (c->rbuf);
    free (c);
    if (admit < 0)
      close (fd);
    atomic_fetch_sub (&s->nconns, 1);
    loop_conn_gone (lp);
    conn_moved_drop (moved);
    return;
  }
  c->srv = s;
  c->lp = lp;
  c->id = atomic_fetch_add (&s->next_conn_id, 1) + 1;
  snprintf (c->peer, sizeof c->peer, "%s", peer);
  c->fd = fd;
  c->tops = &transport_plain;
  c->state = CONN_HS_CLIENT_FLAGS;
  ev_io_init (&c->io, conn_io_cb, fd, 0);
  c->io.data = c;
  ev_timer_init (&c->hs_timer, conn_hs_timeout_cb,
                 s->cfg.handshake_timeout_s, 0.);
  c->hs_timer.data = c;
  ev_timer_start (lp->loop, &c->hs_timer);
  ev_init (&c->idle_timer, conn_idle_timeout_cb);
  c->idle_timer.repeat = conn_idle_secs (s);
  c->idle_timer.data = c;

  c->next = lp->conns;
  if (lp->conns)
    lp->conns->prev = c;
  lp->conns = c;
  STAT_ADD (lp, connections_now, 1);
  STAT_ADD (lp, connections_total, 1);
  log_info ("conn %" PRIu64 ": new connection from %s (loop %u)", c->id,
            peer, lp->idx);

  if (!moved)
    hs_start (c);
  else if (conn_resume (c, moved) < 0)
    conn_close (c, "its export is not served after the upgrade");
  conn_moved_drop (moved);
  conn_after_io (c);
}

/* Server shutdown: a connection in handshake (or everything, when forced)
 * is closed at once.  One in transmission finishes the requests it has;
 * requests that arrive meanwhile are answered NBD_ESHUTDOWN (req_check),
 * and it closes as soon as nothing is in flight (conn_after_io).  Reading
 * on rather than stopping keeps unread requests from turning our close
 * into a reset that could swallow the last replies. */
void
conn_begin_shutdown (struct conn *c, bool force)
{
  if (c->state == CONN_DEAD)
    return;
  if (force || conn_state_is_handshake (c->state))
    conn_close (c, "server shutting down");
  conn_after_io (c);
}

void
conn_free (struct conn *c)
{
  struct sloop *lp = c->lp;
  struct req *r;

  assert (c->state == CONN_DEAD);
  assert (c->nworker == 0);
  assert (c->nactive == 0);
  assert (!c->in_flush_list);
  while ((r = c->free_reqs) != NULL) {
    c->free_reqs = r->next;
    free (r->buf);
    free (r);
  }
  lp->buf_kept -= c->kept_buf_bytes;
  if (c->prev)
    c->prev->next = c->next;
  else
    lp->conns = c->next;
  if (c->next)
    c->next->prev = c->prev;
  free (c->rbuf);
  free (c->optbuf);
  free (c->hsout);
  free (c);
  loop_conn_gone (lp);
}
