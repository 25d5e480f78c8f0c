/* Transmission phase, input side: read request headers and write
 * payloads, check them, answer bad ones at once, run the ones the cache
 * can answer from memory here (run-to-completion), and hand the rest to
 * the worker pool.
 *
 * A request is checked completely before it reaches the cache, so the
 * cache only ever sees ranges inside the export.  A refused write still
 * has its payload read (and dropped) to keep the stream in step.
 *
 * Two header forms, fixed by the negotiation: compact (28 bytes, 32-bit
 * length, only a write has a payload) and extended (32 bytes, 64-bit
 * length; NBD_CMD_FLAG_PAYLOAD_LEN says the length is a payload that
 * follows, else it is the effect length: 64-bit zero, trim, cache and
 * block status; a write's is its payload either way).  An extended payload over NBD_MAX_PAYLOAD ends the
 * connection (the spec's hard disconnect: reading it would cost what the
 * limit is there to bound); any other payload a command does not take
 * is read and dropped, and the command refused with EINVAL.
 */
#include <assert.h>
#include <inttypes.h>
#include <stdlib.h>

#include "foliod/export.h"
#include "server/internal.h"
#include "server/log.h"
#include "server/wire.h"

/* Make r->buf hold at least n bytes (contents not kept).  0 or -1. */
static int
req_reserve (struct req *r, size_t n)
{
  void *p;

  if (r->buf_cap >= n)
    return 0;
  p = malloc (n ? n : 1);
  if (!p)
    return -1;
  free (r->buf);
  r->buf = p;
  r->buf_cap = n;
  return 0;
}

/* Record why r is refused; returns the NBD error for req_check. */
static int
req_refuse (struct req *r, int err, const char *msg)
{
  r->errmsg = msg;
  return err;
}

/* Flags each command accepts, given what was negotiated. */
static uint16_t
req_allowed_flags (const struct conn *c, uint16_t type)
{
  uint16_t fua = (c->tflags & NBD_FLAG_SEND_FUA) ? NBD_CMD_FLAG_FUA : 0;

  switch (type) {
  case NBD_CMD_WRITE:
    return fua | (c->extended ? NBD_CMD_FLAG_PAYLOAD_LEN : 0);
  case NBD_CMD_READ:
    return fua | ((c->tflags & NBD_FLAG_SEND_DF) ? NBD_CMD_FLAG_DF : 0);
  case NBD_CMD_WRITE_ZEROES:
    return fua | NBD_CMD_FLAG_NO_HOLE | NBD_CMD_FLAG_FAST_ZERO;
  case NBD_CMD_BLOCK_STATUS:
    return fua | NBD_CMD_FLAG_REQ_ONE
      | ((c->tflags & NBD_FLAG_BLOCK_STATUS_PAYLOAD)
         ? NBD_CMD_FLAG_PAYLOAD_LEN : 0);
  default:
    return fua;
  }
}

/* Check r against the export and the negotiation.  Returns 0 or the NBD
 * error to answer with (r->errmsg then says why). */
static int
req_check (struct conn *c, struct req *r)
{
  const struct export *e = c->exp;
  bool writes = r->type == NBD_CMD_WRITE || r->type == NBD_CMD_TRIM
    || r->type == NBD_CMD_WRITE_ZEROES;
  bool beyond = r->offset > e->size || r->count > e->size - r->offset;

  if (atomic_load_explicit (&c->srv->shutting_down, memory_order_relaxed))
    return req_refuse (r, NBD_ESHUTDOWN, "server is shutting down");
  if (export_release_state (e) == EXPORT_STOPPED)
    return req_refuse (r, NBD_ESHUTDOWN, "export released to another host");
  if (r->type > NBD_CMD_BLOCK_STATUS)
    return req_refuse (r, NBD_EINVAL, "unknown command");
  if (r->flags & ~req_allowed_flags (c, r->type))
    return req_refuse (r, NBD_EINVAL, "flag not valid for this command");
  if (writes && (c->tflags & NBD_FLAG_READ_ONLY))
    return req_refuse (r, NBD_EPERM, "export is read-only");
  /* A read's effect length may be 64 bits with extended headers; its
   * reply is bounded as a write's payload is (spec: EOVERFLOW, the
   * client may retry smaller).  Compact requests keep their EINVAL. */
  if (r->type == NBD_CMD_READ && r->count > NBD_MAX_PAYLOAD && c->extended)
    return req_refuse (r, NBD_EOVERFLOW,
                       "read larger than the maximum payload");
  if ((r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
      && r->count > NBD_MAX_PAYLOAD)
    return req_refuse (r, NBD_EINVAL, "request larger than maximum payload");
  if (r->type == NBD_CMD_FLUSH)
    return 0; /* offset and length are reserved: ignored */
  if (beyond && (r->type == NBD_CMD_WRITE
                 || r->type == NBD_CMD_WRITE_ZEROES))
    return req_refuse (r, NBD_ENOSPC, "write beyond the end of the export");
  if (beyond)
    return req_refuse (r, NBD_EINVAL, "range beyond the end of the export");
  if (r->type == NBD_CMD_BLOCK_STATUS) {
    if (!c->meta_alloc && !c->meta_cache)
      return req_refuse (r, NBD_EINVAL, "no metadata context selected");
    if (r->count == 0)
      return req_refuse (r, NBD_EINVAL, "block status of zero length");
  }
  return 0;
}

/* The contexts a block status answers: those selected, unless its
 * payload names some. */
static unsigned
req_bs_selected (const struct conn *c)
{
  return (c->meta_alloc ? REQ_BS_ALLOC : 0)
    | (c->meta_cache ? REQ_BS_CACHE : 0);
}

/* Block status payload form (NBD_FLAG_BLOCK_STATUS_PAYLOAD): 64-bit
 * effect length, then 32-bit context ids, at least one.  Each id must be
 * selected and named once, so no valid payload is longer than one id per
 * context: anything else is refused (after reading it, as any payload). */
#define BS_PAYLOAD_MAX (8 + 4 * NBD_META_CONTEXTS)

static bool
req_bs_payload_len_ok (uint64_t len)
{
  return len >= 12 && len <= BS_PAYLOAD_MAX && (len - 8) % 4 == 0;
}

/* The payload in r->buf is complete: take its effect length and the
 * contexts it names, and check the request again with that length.
 * Returns 0 or the NBD error. */
static int
req_bs_payload (struct conn *c, struct req *r)
{
  unsigned sel = req_bs_selected (c), want = 0;

  for (size_t i = 8; i < r->count; i += 4) {
    uint32_t id = get_be32 (r->buf + i);
    unsigned bit = id == NBD_META_ID_BASE_ALLOCATION ? REQ_BS_ALLOC
                 : id == NBD_META_ID_FOLIOD_CACHE ? REQ_BS_CACHE : 0;

    if (!(bit & sel))
      return req_refuse (r, NBD_EINVAL, "block status payload names a"
                         " context not selected");
    if (want & bit)
      return req_refuse (r, NBD_EINVAL, "block status payload names a"
                         " context twice");
    want |= bit;
  }
  r->count = get_be64 (r->buf);
  r->bs_contexts = want;
  return req_check (c, r);
}

/* Bytes r->buf must hold once its header is checked: a read's data, a
 * write's payload, a block status payload (its reply's room comes at
 * execution). */
static size_t
req_buf_need (const struct req *r)
{
  if (r->type == NBD_CMD_READ || r->type == NBD_CMD_WRITE)
    return r->count;           /* <= NBD_MAX_PAYLOAD: req_check */
  if (r->type == NBD_CMD_BLOCK_STATUS
      && (r->flags & NBD_CMD_FLAG_PAYLOAD_LEN))
    return r->count;           /* <= BS_PAYLOAD_MAX */
  return 0;
}

/* A complete request: reply at once if refused or if the cache answers
 * it without waiting (the work it did counts against this wake-up's
 * budget), else run it on a worker. */
static void
req_submit (struct conn *c, struct req *r)
{
  r->fetch = REQ_FETCH_NONE;
  if (r->error) {
    req_build_reply (r);
    conn_queue_reply (c, r);
    return;
  }
  if (c->inline_left > 0 && req_try_execute (r)) {
    c->inline_left -= r->count < c->inline_left ? r->count : c->inline_left;
    if (c->inline_left == 0)
      c->steps_left = 0; /* yield: other connections' turn */
    STAT_ADD (c->lp, requests_inline, 1);
    conn_queue_reply (c, r);
    return;
  }
  c->nworker++;
  /* A read miss on a remote waits parked, without a worker. */
  if (req_fetch_start (r))
    return;
  pool_submit (&c->lp->batch, r);
}

/* Is a payload following the header with these flags and type?  With
 * extended headers, when NBD_CMD_FLAG_PAYLOAD_LEN says so -- and always
 * for a write: the spec says a write MUST set the flag, but qemu 10's
 * client sends its writes' payloads without it, and a write's length
 * cannot mean anything else. */
static bool
req_has_payload (const struct conn *c, uint16_t flags, uint16_t type)
{
  if (c->extended && (flags & NBD_CMD_FLAG_PAYLOAD_LEN))
    return true;
  return type == NBD_CMD_WRITE;
}

/* May the connection go on past the header in c->hdr?  Not with a magic
 * other than the negotiated form's, nor with an extended payload over
 * the maximum (the spec's hard disconnect: a compact write's is read
 * and dropped, as before extended headers). */
static bool
req_hdr_acceptable (const struct conn *c)
{
  uint32_t magic = get_be32 (c->hdr);
  uint32_t want = c->extended ? NBD_EXTENDED_REQUEST_MAGIC
                              : NBD_REQUEST_MAGIC;
  uint64_t len = conn_hdr_length (c);
  uint16_t flags = get_be16 (c->hdr + 4), type = get_be16 (c->hdr + 6);

  if (magic != want) {
    log_warn ("conn %" PRIu64 ": bad request magic 0x%08" PRIx32 " (%s"
              " headers negotiated)", c->id, magic,
              c->extended ? "extended" : "compact");
    return false;
  }
  if (c->extended && req_has_payload (c, flags, type)
      && len > NBD_MAX_PAYLOAD) {
    log_warn ("conn %" PRIu64 ": request payload of %" PRIu64 " bytes over"
              " the maximum %u: disconnecting", c->id, len,
              NBD_MAX_PAYLOAD);
    return false;
  }
  return true;
}

enum step
tx_step_req_hdr (struct conn *c)
{
  enum io_res res = conn_read_exact (c, c->hdr, conn_req_hdr_len (c),
                                     &c->hdr_have);
  struct req *r;

  if (res != IO_DONE)
    return io_step (res);
  if (!req_hdr_acceptable (c))
    return STEP_CLOSE;
  c->requested = true;
  /* Over the buffer budget: read nothing more until replies are sent
   * (the header stays in c->hdr for then). */
  if (!conn_budget_hdr_ready (c))
    return STEP_PAUSE;
  c->hdr_have = 0;
  if (!(r = conn_req_get (c)))
    return STEP_CLOSE;
  r->flags = get_be16 (c->hdr + 4);
  r->type = get_be16 (c->hdr + 6);
  r->cookie = get_be64 (c->hdr + 8);
  r->offset = get_be64 (c->hdr + 16);
  r->count = conn_hdr_length (c);
  r->bs_contexts = req_bs_selected (c);

  if (r->type == NBD_CMD_DISC) {
    log_debug ("conn %" PRIu64 ": NBD_CMD_DISC", c->id);
    conn_req_put (c, r);
    conn_set_state (c, CONN_DRAINING);
    return STEP_NEXT;
  }
  r->error = req_check (c, r);
  if (!r->error && r->type == NBD_CMD_BLOCK_STATUS
      && (r->flags & NBD_CMD_FLAG_PAYLOAD_LEN)
      && !req_bs_payload_len_ok (r->count))
    r->error = req_refuse (r, NBD_EINVAL, "block status payload of a"
                           " wrong length");
  if (!r->error && req_reserve (r, req_buf_need (r)) < 0)
    r->error = req_refuse (r, NBD_ENOMEM, "out of memory");
  conn_budget_charge (c, r, r->type == NBD_CMD_BLOCK_STATUS && !r->error
                      ? REQ_BS_BUF_MAX : 0);
  if (req_has_payload (c, r->flags, r->type)) {
    c->cur = r;
    /* Only a write and a block status (its payload form) take a
     * payload: req_check refused the rest. */
    assert (r->error || r->type == NBD_CMD_WRITE
            || r->type == NBD_CMD_BLOCK_STATUS);
    if (!r->error && r->type == NBD_CMD_WRITE
        && !(r->flags & NBD_CMD_FLAG_FUA))
      (void) cache_write_prepare (c->exp->cache, r->count, r->offset,
                                  &r->prep);   /* else all into buf */
    if (r->error) {
      c->skip_left = r->count;
      conn_set_state (c, CONN_TX_REQ_DISCARD);
    }
    else
      conn_set_state (c, CONN_TX_REQ_PAYLOAD);
    return STEP_NEXT;
  }
  req_submit (c, r);
  return STEP_NEXT;
}

/* Where payload byte pos goes: into buf before the prepared folios (all
 * of it without them), into one of them, or into buf after them.  Sets
 * the piece's first payload byte and its length. */
static uint8_t *
payload_piece (struct req *r, size_t pos, size_t *start, size_t *len)
{
  const struct cache_prep *p = &r->prep;
  size_t head = p->n ? p->off - r->offset : r->count;
  size_t body = p->n ? p->len : 0;

  if (pos < head) {
    *start = 0;
    *len = head;
    return r->buf;
  }
  if (pos < head + body) {
    size_t i = (pos - head) / p->folio_size;
    *start = head + i * p->folio_size;
    *len = p->folio_size;
    return p->data[i];
  }
  *start = head + body;
  *len = r->count - *start;
  return r->buf + head;
}

enum step
tx_step_req_payload (struct conn *c)
{
  struct req *r = c->cur;

  while (r->payload_have < r->count) {
    size_t start, len, have;
    uint8_t *dst = payload_piece (r, r->payload_have, &start, &len);
    enum io_res res;

    have = r->payload_have - start;
    /* Into folios: no read-ahead, that would pass bytes through rbuf. */
    res = r->prep.n > 0 ? conn_read_direct (c, dst, len, &have)
                        : conn_read_exact (c, dst, len, &have);
    r->payload_have = start + have;
    if (res != IO_DONE)
      return io_step (res);
  }
  c->cur = NULL;
  conn_set_state (c, CONN_TX_REQ_HDR);
  if (r->type == NBD_CMD_BLOCK_STATUS)
    r->error = req_bs_payload (c, r);
  req_submit (c, r);
  return STEP_NEXT;
}

enum step
tx_step_req_discard (struct conn *c)
{
  struct req *r = c->cur;
  enum io_res res = conn_skip (c, &c->skip_left);

  if (res != IO_DONE)
    return io_step (res);
  c->cur = NULL;
  conn_set_state (c, CONN_TX_REQ_HDR);
  req_submit (c, r);
  return STEP_NEXT;
}
