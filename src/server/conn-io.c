/* A connection's bytes and its state: the primitives the protocol steps
 * (handshake.c, request.c) and the connection driver (conn.c) use.
 *
 * The state setter, which asserts and logs each transition; buffered
 * input (conn_read_exact and friends return IO_DONE / IO_AGAIN / IO_EOF /
 * IO_ERR so that a step can resume after a partial read); queued output
 * (handshake bytes appended to hsout, replies put on the send queue and
 * the connection marked for its loop's flush list).  Sending and the
 * socket watcher are the driver's (conn.c); nothing here calls up.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "server/internal.h"
#include "server/log.h"

/* ---- state ------------------------------------------------------------- */

static const char *const state_names[CONN_NSTATES] = {
  [CONN_HS_CLIENT_FLAGS] = "HS_CLIENT_FLAGS",
  [CONN_HS_OPT_HDR] = "HS_OPT_HDR",
  [CONN_HS_OPT_DATA] = "HS_OPT_DATA",
  [CONN_HS_OPT_SKIP] = "HS_OPT_SKIP",
  [CONN_TX_REQ_HDR] = "TX_REQ_HDR",
  [CONN_TX_REQ_PAYLOAD] = "TX_REQ_PAYLOAD",
  [CONN_TX_REQ_DISCARD] = "TX_REQ_DISCARD",
  [CONN_DRAINING] = "DRAINING",
  [CONN_DEAD] = "DEAD",
};

const char *
conn_state_name (enum conn_state st)
{
  return st < CONN_NSTATES ? state_names[st] : "?";
}

void
conn_set_state (struct conn *c, enum conn_state st)
{
  assert (st < CONN_NSTATES);
  assert (c->state != CONN_DEAD); /* nothing comes back from the dead */
  /* Header <-> payload happens for every write: too chatty to log. */
  if (!(conn_state_is_transmission (c->state)
        && conn_state_is_transmission (st)))
    log_debug ("conn %" PRIu64 ": %s -> %s", c->id,
               state_names[c->state], state_names[st]);
  /* Without idle_timeout_s the timer still watches a connection that
   * sends no request (conn_idle_timeout_cb). */
  if (conn_state_is_handshake (c->state) && st == CONN_TX_REQ_HDR) {
    c->last_active = ev_now (c->lp->loop);
    ev_timer_again (c->lp->loop, &c->idle_timer);
  }
  c->state = st;
}

/* Activity (input, a request done): the idle timeout starts again.  Only
 * the time is noted: re-arming the timer here, twice a request, cost a
 * heap update each (about 100 instructions of a 3,000-instruction cached
 * read); conn_idle_timeout_cb re-arms from last_active when it fires,
 * libev's own advice for timeouts that are mostly pushed back. */
void
conn_touch (struct conn *c)
{
  c->last_active = ev_now (c->lp->loop);
}

/* ---- input ------------------------------------------------------------- */

/* One recv into buf.  A short one from a transport where that means the
 * socket is empty ends this wake-up's reading: the EAGAIN the next recv
 * would return costs a system call per wake-up, and the level-triggered
 * watcher reports anything that arrives meanwhile. */
static ssize_t
conn_recv (struct conn *c, void *buf, size_t len)
{
  ssize_t n = c->tops->recv (c, buf, len);

  c->rdrained = c->tops->short_read_drains && n > 0 && (size_t) n < len;
  return n;
}

/* Fill dst up to need bytes, *have counting what is there already (so a
 * state can resume after a partial read).  Serves buffered bytes first;
 * remainders of at least direct_min bytes are read straight into dst, the
 * others through rbuf (which reads ahead).  Returns IO_DONE, IO_AGAIN
 * (also when this wake-up's read budget is spent), IO_EOF or IO_ERR. */
static enum io_res
conn_read_into (struct conn *c, uint8_t *d, size_t need, size_t *have,
                size_t direct_min)
{
  while (*have < need) {
    size_t want = need - *have;
    bool direct = want >= direct_min;
    ssize_t n;

    if (c->rpos < c->rlen) {
      n = c->rlen - c->rpos < want ? c->rlen - c->rpos : want;
      memcpy (d + *have, c->rbuf + c->rpos, n);
      c->rpos += n;
      *have += n;
      continue;
    }
    if (c->rdrained)
      return IO_AGAIN;          /* the socket watcher wakes us for more */
    if (c->recvs_left == 0) {
      c->yielded = true;
      return IO_AGAIN;
    }
    c->recvs_left--;
    if (direct)
      n = conn_recv (c, d + *have, want);
    else {
      n = conn_recv (c, c->rbuf, CONN_RBUF_SIZE);
      c->rpos = 0;
      c->rlen = n > 0 ? (size_t) n : 0;
    }
    if (n == 0) {
      c->eof = true;
      return IO_EOF;
    }
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return IO_AGAIN;
      log_debug ("conn %" PRIu64 ": recv: %m", c->id);
      c->eof = true;
      return IO_ERR;
    }
    conn_touch (c);
    if (direct)
      *have += n;
  }
  return IO_DONE;
}

enum io_res
conn_read_exact (struct conn *c, void *dst, size_t need, size_t *have)
{
  return conn_read_into (c, dst, need, have, CONN_RBUF_SIZE / 2);
}

/* As conn_read_exact, but never reads ahead past dst: for folio memory,
 * where read-ahead would put the next piece's bytes through rbuf and a
 * copy (and, once out of step, nearly all of them). */
enum io_res
conn_read_direct (struct conn *c, void *dst, size_t need, size_t *have)
{
  return conn_read_into (c, dst, need, have, 1);
}

/* Discard *left bytes of input.  Same returns as conn_read_exact. */
enum io_res
conn_skip (struct conn *c, uint64_t *left)
{
  while (*left > 0) {
    size_t got = 0;
    size_t take;
    enum io_res r;

    if (c->rpos < c->rlen) {
      take = c->rlen - c->rpos < *left ? c->rlen - c->rpos : *left;
      c->rpos += take;
      *left -= take;
      continue;
    }
    /* Pull one byte through the normal path to refill rbuf. */
    r = conn_read_exact (c, c->hdr, 1, &got);
    if (r != IO_DONE)
      return r;
    (*left)--;
  }
  return IO_DONE;
}

/* ---- output ------------------------------------------------------------ */

int
conn_out_append (struct conn *c, const void *p, size_t n)
{
  if (n == 0)
    return 0; /* p may be NULL */
  if (c->hsout_sent == c->hsout_len)
    c->hsout_sent = c->hsout_len = 0;
  if (c->hsout_len + n > c->hsout_cap) {
    size_t cap = c->hsout_cap ? c->hsout_cap : 4096;
    uint8_t *nb;

    while (cap < c->hsout_len + n)
      cap *= 2;
    nb = realloc (c->hsout, cap);
    if (!nb)
      return -1;
    c->hsout = nb;
    c->hsout_cap = cap;
  }
  memcpy (c->hsout + c->hsout_len, p, n);
  c->hsout_len += n;
  return 0;
}

void
conn_mark_flush (struct conn *c)
{
  if (!c->in_flush_list) {
    c->in_flush_list = true;
    c->flush_next = c->lp->flush_list;
    c->lp->flush_list = c;
  }
}

void
conn_queue_reply (struct conn *c, struct req *r)
{
  struct sloop *s = c->lp;

  assert (r->niov > 0);
  r->next = NULL;
  if (c->sendq_tail)
    c->sendq_tail->next = r;
  else
    c->sendq_head = r;
  c->sendq_tail = r;
  STAT_ADD (s, requests, 1);
  if (r->error)
    STAT_ADD (s, request_errors, 1);
  else if (r->type == NBD_CMD_READ)
    STAT_ADD (s, bytes_read, r->count);
  else if (r->type == NBD_CMD_WRITE)
    STAT_ADD (s, bytes_written, r->count);
  conn_mark_flush (c);
}
