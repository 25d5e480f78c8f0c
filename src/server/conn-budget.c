/* A connection's requests and their buffer budget.
 *
 * Requests come from the connection's free list (conn_req_get) and go
 * back to it once their reply is sent or they are dropped (conn_req_put),
 * keeping their buffers for reuse within bounds.  Their buffers (a
 * write's payload, a read's or a block status's reply, reserved before
 * the request runs and held until its reply is sent) count against two
 * budgets, the connection's (max_conn_buffer) and the total of all loops
 * (max_buffer_total): a request header is admitted when its buffer fits
 * (conn_budget_hdr_ready), else the connection waits on its loop's
 * budget_waiters until memory is released here or, through
 * LOOP_CMD_BUDGET, on another loop.
 *
 * The total is kept whatever the clients do: each of the max_connections
 * connections has a slice of it of its own (conn_budget_slice: the half
 * of the total, split), and what a connection holds beyond its slice
 * comes from the other half, shared (srv->buf_charged counts that part).
 * A client that never reads its replies holds its slice and what it took
 * of the shared half, and no more; a client with nothing in flight starts
 * any request that fits its slice (4 MiB by default) even when the
 * shared half is spent, so such clients cannot lock the others out.
 */
#include <assert.h>
#include <stdlib.h>

#include "foliod/export.h"
#include "foliod/minmax.h"
#include "server/internal.h"
#include "server/wire.h"

/* ---- the total's slices ------------------------------------------------- */

/* Bytes of the total each connection may hold whatever the others
 * hold. */
static size_t
conn_budget_slice (const struct server *s)
{
  return s->cfg.max_buffer_total / 2 / s->cfg.max_connections;
}

/* Bytes of the shared half of the total, all connections together. */
static size_t
conn_budget_shared_max (const struct server *s)
{
  return s->cfg.max_buffer_total
    - (size_t) s->cfg.max_connections * conn_budget_slice (s);
}

/* Of charged bytes of c, those beyond its slice. */
static size_t
conn_budget_shared (const struct conn *c, size_t charged)
{
  size_t slice = conn_budget_slice (c->srv);

  return charged > slice ? charged - slice : 0;
}

/* ---- requests ---------------------------------------------------------- */

struct req *
conn_req_get (struct conn *c)
{
  struct req *r = c->free_reqs;

  if (r) {
    c->free_reqs = r->next;
    c->kept_buf_bytes -= r->buf_cap;
    c->lp->buf_kept -= r->buf_cap;
  }
  else {
    r = calloc (1, sizeof *r);
    if (!r)
      return NULL;
  }
  r->next = NULL;
  r->conn = c;
  r->error = 0;
  r->errmsg = NULL;
  r->payload_have = 0;
  r->prep.n = 0;
  r->niov = r->iov_next = r->nhdr = 0;
  r->iov_off = 0;
  c->nactive++;
  return r;
}

/* Memory was released on lp: resume the waiters that fit now, on lp and
 * on the other loops.  A loop that misses this (it began to wait just
 * after) loses no wake-up for good: its waiters have requests in flight
 * (conn_budget_admit lets a connection with none through), whose replies
 * release memory on their own loop. */
static void
conn_budget_released (struct sloop *lp)
{
  struct server *s = lp->srv;

  if (lp->budget_waiters)
    conn_budget_wake (lp);
  /* Sequentially consistent, as the release before it: a loop that
   * registers its waiter and then retries (conn_budget_hdr_ready) either
   * sees the release or is seen here. */
  if (atomic_load (&s->budget_waiting_loops))
    for (unsigned i = 0; i < s->nloops; i++)
      if (&s->loops[i] != lp && atomic_load (&s->loops[i].budget_waiting))
        loop_post (&s->loops[i], LOOP_CMD_BUDGET);
}

void
conn_req_put (struct conn *c, struct req *r)
{
  struct sloop *lp = c->lp;
  size_t released = r->charged;
  /* Each loop keeps its share of the total's retained buffers. */
  size_t keep_max = lp->srv->cfg.max_buffer_total / SERVER_KEEP_DIV
                    / lp->srv->nloops;

  assert (c->nactive > 0);
  if (r->prep.n > 0)            /* never committed: a refused or abandoned write */
    cache_write_abort (c->exp->cache, &r->prep);
  c->nactive--;
  if (released) {
    size_t shared = conn_budget_shared (c, c->charged);

    c->charged -= released;
    shared -= conn_budget_shared (c, c->charged);
    if (shared)
      atomic_fetch_sub (&lp->srv->buf_charged, shared);
  }
  r->charged = 0;
  /* Keep buffers for reuse (no malloc per request), but not huge ones
   * and not without bound, per connection and in all. */
  if (r->buf_cap > REQ_KEEP_BUF_MAX
      || c->kept_buf_bytes + r->buf_cap > CONN_KEEP_BUF_TOTAL
      || lp->buf_kept + r->buf_cap > keep_max) {
    free (r->buf);
    r->buf = NULL;
    r->buf_cap = 0;
  }
  c->kept_buf_bytes += r->buf_cap;
  lp->buf_kept += r->buf_cap;
  r->next = c->free_reqs;
  c->free_reqs = r;
  conn_touch (c);
  /* Memory released, or c itself may now start its one request. */
  if (released)
    conn_budget_released (lp);
  else if (c->nactive == 0 && lp->budget_waiters)
    conn_budget_wake (lp);
}

/* ---- buffer budget ----------------------------------------------------- */

/* Bytes of buffer the request whose header is in c->hdr needs. */
static size_t
conn_hdr_need (const struct conn *c)
{
  uint16_t type = get_be16 (c->hdr + 6);
  uint64_t count = conn_hdr_length (c);

  if (type == NBD_CMD_BLOCK_STATUS)
    return REQ_BS_BUF_MAX;
  if ((type == NBD_CMD_READ || type == NBD_CMD_WRITE)
      && count <= NBD_MAX_PAYLOAD)
    return count;
  return 0; /* no buffer, or refused: a refused write's payload is
               skipped, not stored */
}

/* May c take a request needing need more bytes of buffer?  Within the
 * connection's budget (a connection with nothing in flight may start a
 * request larger than max_conn_buffer) and within its slice of the total
 * or the shared half's room.  A request that could never fit the shared
 * half (max_buffer_total below twice the largest request) still runs
 * when the shared half is all free. */
static bool
conn_budget_admit (const struct conn *c, size_t need)
{
  const struct server *s = c->srv;
  size_t add, cur;

  if (need == 0)
    return true;
  if (c->nactive > 0 && c->charged + need > s->cfg.max_conn_buffer)
    return false;
  add = conn_budget_shared (c, c->charged + need)
        - conn_budget_shared (c, c->charged);
  cur = atomic_load (&s->buf_charged);
  return add == 0 || cur + add <= conn_budget_shared_max (s) || cur == 0;
}

/* Would the request whose header is in c->hdr be admitted now? */
bool
conn_budget_hdr_fits (const struct conn *c)
{
  return conn_budget_admit (c, conn_hdr_need (c));
}

/* As conn_budget_admit, and if admitted, take what the request needs of
 * the shared half at once (c->reserved): the loops admit concurrently,
 * and a check and a later add would let two of them pass the total
 * together. */
static bool
conn_budget_reserve (struct conn *c, size_t need)
{
  struct server *s = c->srv;
  size_t cur = atomic_load (&s->buf_charged);
  size_t add, max = conn_budget_shared_max (s);

  assert (c->reserved == 0);
  if (need == 0)
    return true;
  if (c->nactive > 0 && c->charged + need > s->cfg.max_conn_buffer)
    return false;
  add = conn_budget_shared (c, c->charged + need)
        - conn_budget_shared (c, c->charged);
  if (add == 0)
    return true;
  do
    if (cur + add > max && cur != 0)
      return false;
  while (!atomic_compare_exchange_weak (&s->buf_charged, &cur, cur + add));
  c->reserved = add;
  return true;
}

/* Give back a reservation no request took (the connection closed
 * between header and request). */
static void
conn_budget_unreserve (struct conn *c)
{
  if (c->reserved) {
    atomic_fetch_sub (&c->srv->buf_charged, c->reserved);
    c->reserved = 0;
  }
}

/* Count r's buffer (at least need bytes: block status allocates later)
 * until conn_req_put, in place of what conn_budget_hdr_ready
 * reserved. */
void
conn_budget_charge (struct conn *c, struct req *r, size_t need)
{
  size_t n = MAX (r->buf_cap, need);
  size_t add = conn_budget_shared (c, c->charged + n)
               - conn_budget_shared (c, c->charged);

  if (add > c->reserved)
    atomic_fetch_add (&c->srv->buf_charged, add - c->reserved);
  else if (add < c->reserved)
    atomic_fetch_sub (&c->srv->buf_charged, c->reserved - add);
  c->reserved = 0;
  r->charged = n;
  c->charged += n;
}

/* Whether lp has budget waiters, for the other loops (which post it
 * LOOP_CMD_BUDGET when they release memory). */
static void
conn_budget_waiters_changed (struct sloop *lp)
{
  bool now = lp->budget_waiters != NULL;

  if (atomic_load (&lp->budget_waiting) == now)
    return;
  atomic_store (&lp->budget_waiting, now);
  if (now)
    atomic_fetch_add (&lp->srv->budget_waiting_loops, 1);
  else
    atomic_fetch_sub (&lp->srv->budget_waiting_loops, 1);
}

/* A request header in c->hdr waits for buffer budget: remember c so that
 * memory released by any connection retries it. */
static void
conn_budget_wait (struct conn *c)
{
  c->yielded = true; /* the header is read: feed an event when resumed */
  if (c->budget_waiting)
    return;
  c->budget_waiting = true;
  c->budget_next = c->lp->budget_waiters;
  c->lp->budget_waiters = c;
  conn_budget_waiters_changed (c->lp);
}

static void
conn_budget_unwait (struct conn *c)
{
  struct conn **p = &c->lp->budget_waiters;

  if (!c->budget_waiting)
    return;
  while (*p != c)
    p = &(*p)->budget_next;
  *p = c->budget_next;
  c->budget_waiting = false;
  conn_budget_waiters_changed (c->lp);
}

/* The connection closes: it waits for budget no more, and what it
 * reserved for a request it will not read goes back. */
void
conn_budget_drop (struct conn *c)
{
  conn_budget_unwait (c);
  conn_budget_unreserve (c);
}

/* Memory was released: resume lp's waiters that fit now (conn_after_io
 * feeds them an input event).  They stay waiters until their request is
 * admitted (conn_budget_hdr_ready): another loop may take the room before
 * they run, and a waiter with nothing in flight would then wait for a
 * wake-up that no release of its own brings. */
void
conn_budget_wake (struct sloop *lp)
{
  for (struct conn *c = lp->budget_waiters; c; c = c->budget_next)
    if (conn_budget_hdr_fits (c))
      conn_mark_flush (c);
}

/* The header in c->hdr is complete: true if its request may go on now
 * (its buffer reserved), else c waits for budget (the header stays in
 * c->hdr). */
bool
conn_budget_hdr_ready (struct conn *c)
{
  size_t need = conn_hdr_need (c);
  bool yielded = c->yielded;

  if (conn_budget_reserve (c, need)) {
    conn_budget_unwait (c);
    return true;
  }
  conn_budget_wait (c);
  /* Memory released on another loop between the try and the wait would
   * have found no waiter here, and c may have nothing in flight to
   * release it again: try once more, now that c is seen waiting. */
  if (conn_budget_reserve (c, need)) {
    conn_budget_unwait (c);
    c->yielded = yielded;
    return true;
  }
  return false;
}
