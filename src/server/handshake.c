/* Fixed newstyle handshake: greeting, client flags, option haggling.
 *
 * One step function per input state; each pulls the bytes it needs with
 * conn_read_exact() and so resumes wherever a short read left it.  Option
 * replies are appended to the connection's hsout buffer and drained by
 * conn.c.  Only fixed newstyle is spoken (no oldstyle).
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/cache.h"
#include "foliod/export.h"
#include "foliod/util.h"
#include "server/internal.h"
#include "server/log.h"
#include "server/tls.h"
#include "server/wire.h"

/* ---- replies ----------------------------------------------------------- */

/* Queue the header of an option reply of len payload bytes. */
static int
hs_reply_begin (struct conn *c, uint32_t type, uint32_t len)
{
  uint8_t h[NBD_OPT_REPLY_HDR_LEN];

  put_be64 (h, NBD_REP_MAGIC);
  put_be32 (h + 8, c->opt);
  put_be32 (h + 12, type);
  put_be32 (h + 16, len);
  return conn_out_append (c, h, sizeof h);
}

static int
hs_reply (struct conn *c, uint32_t type, const void *data, uint32_t len)
{
  if (hs_reply_begin (c, type, len) < 0)
    return -1;
  return len ? conn_out_append (c, data, len) : 0;
}

/* An error reply with a human-readable message. */
static int
hs_reply_err (struct conn *c, uint32_t type, const char *fmt, ...)
  __attribute__ ((format (printf, 3, 4)));

static int
hs_reply_err (struct conn *c, uint32_t type, const char *fmt, ...)
{
  char msg[256], esc[ESCAPED_MAX];
  va_list ap;
  int n;

  va_start (ap, fmt);
  n = vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  if (n < 0)
    n = 0;
  if ((size_t) n >= sizeof msg)
    n = sizeof msg - 1;
  /* msg may quote what the client sent (an export name). */
  log_debug ("conn %" PRIu64 ": option %" PRIu32 " refused: %s",
             c->id, c->opt, str_escape (esc, sizeof esc, msg, (size_t) n));
  return hs_reply (c, type, msg, n);
}

/* Result of an option handler: on a queueing failure (no memory) close. */
static enum step
hs_done (int rc)
{
  return rc < 0 ? STEP_CLOSE : STEP_NEXT;
}

/* ---- greeting and client flags ------------------------------------------ */

void
hs_start (struct conn *c)
{
  uint8_t g[NBD_GREETING_LEN];

  put_be64 (g, NBD_MAGIC);
  put_be64 (g + 8, NBD_IHAVEOPT);
  put_be16 (g + 16, NBD_FLAG_FIXED_NEWSTYLE | NBD_FLAG_NO_ZEROES);
  c->hdr_have = 0;
  if (conn_out_append (c, g, sizeof g) < 0)
    log_error ("conn %" PRIu64 ": out of memory", c->id);
}

enum step
hs_step_client_flags (struct conn *c)
{
  enum io_res r = conn_read_exact (c, c->hdr, 4, &c->hdr_have);
  uint32_t flags;

  if (r != IO_DONE)
    return io_step (r);
  c->hdr_have = 0;
  flags = get_be32 (c->hdr);
  if (flags & ~(NBD_FLAG_C_FIXED_NEWSTYLE | NBD_FLAG_C_NO_ZEROES)) {
    log_warn ("conn %" PRIu64 ": unknown client flags 0x%" PRIx32,
              c->id, flags);
    return STEP_CLOSE;
  }
  c->client_flags = flags;
  c->no_zeroes = (flags & NBD_FLAG_C_NO_ZEROES) != 0;
  conn_set_state (c, CONN_HS_OPT_HDR);
  return STEP_NEXT;
}

/* ---- option framing ----------------------------------------------------- */

enum step
hs_step_opt_hdr (struct conn *c)
{
  enum io_res r = conn_read_exact (c, c->hdr, NBD_OPT_HDR_LEN, &c->hdr_have);

  if (r != IO_DONE)
    return io_step (r);
  c->hdr_have = 0;
  if (get_be64 (c->hdr) != NBD_IHAVEOPT) {
    log_warn ("conn %" PRIu64 ": bad option magic", c->id);
    return STEP_CLOSE;
  }
  c->opt = get_be32 (c->hdr + 8);
  c->opt_len = get_be32 (c->hdr + 12);
  c->opt_have = 0;
  if (c->opt_len > HS_MAX_OPT_LEN) {
    if (c->opt == NBD_OPT_EXPORT_NAME) {
      log_warn ("conn %" PRIu64 ": export name too long", c->id);
      return STEP_CLOSE; /* no way to send an error */
    }
    c->skip_left = c->opt_len;
    conn_set_state (c, CONN_HS_OPT_SKIP);
    return STEP_NEXT;
  }
  if (!c->optbuf && !(c->optbuf = malloc (HS_MAX_OPT_LEN)))
    return STEP_CLOSE;
  conn_set_state (c, CONN_HS_OPT_DATA);
  return STEP_NEXT;
}

enum step
hs_step_opt_skip (struct conn *c)
{
  enum io_res r = conn_skip (c, &c->skip_left);

  if (r != IO_DONE)
    return io_step (r);
  conn_set_state (c, CONN_HS_OPT_HDR);
  return hs_done (hs_reply_err (c, NBD_REP_ERR_TOO_BIG,
                                "option data too long"));
}

/* ---- TLS policy ------------------------------------------------------------ */

/* Must this client start TLS before it may use export e (NULL: before
 * any option at all)?  Per export "tls = require" overrides the server's
 * mode, as the spec's SELECTIVETLS mode allows. */
static bool
hs_tls_required (const struct conn *c, const struct export *e)
{
  int req;

  if (c->tls_active)
    return false;
  req = e ? e->tls_require : -1;
  if (req == -1)
    req = c->srv->cfg.tls_mode == SERVER_TLS_REQUIRE;
  return req == 1;
}

/* ---- transmission entry ------------------------------------------------- */

/* The transmission flags of e for c.  e->read_only already says whether
 * the backing is read-only (export_open folds its caps in); a released
 * export (foliod release) is read-only from then on.  The block status
 * payload form only with extended headers and contexts selected for e
 * (spec: SHOULD NOT without). */
static uint16_t
hs_tflags (const struct conn *c, const struct export *e)
{
  /* The cache is shared by every connection to the export, so a flush on
   * one makes all completed writes durable: multi-conn is safe. */
  uint16_t f = NBD_FLAG_HAS_FLAGS | NBD_FLAG_SEND_FLUSH
    | NBD_FLAG_CAN_MULTI_CONN | NBD_FLAG_SEND_CACHE;

  if (c->structured)
    f |= NBD_FLAG_SEND_DF;
  if (c->extended && c->meta_exp == e && (c->meta_alloc || c->meta_cache))
    f |= NBD_FLAG_BLOCK_STATUS_PAYLOAD;
  if (e->read_only || export_release_state (e) >= EXPORT_RELEASED)
    f |= NBD_FLAG_READ_ONLY;
  else
    f |= NBD_FLAG_SEND_FUA | NBD_FLAG_SEND_TRIM | NBD_FLAG_SEND_WRITE_ZEROES
      | NBD_FLAG_SEND_FAST_ZERO;
  return f;
}

static void
hs_enter_transmission (struct conn *c, struct export *e)
{
  c->exp = e;
  c->tflags = hs_tflags (c, e);
  if (c->meta_exp != e) {
    c->meta_alloc = false; /* contexts were chosen for another export */
    c->meta_cache = false;
  }
  ev_timer_stop (c->lp->loop, &c->hs_timer);
  free (c->optbuf);
  c->optbuf = NULL;
  c->hdr_have = 0;
  log_info ("conn %" PRIu64 ": export '%s'%s%s%s", c->id, e->name,
            c->extended ? ", extended headers"
            : c->structured ? ", structured replies" : "",
            c->meta_alloc ? ", base:allocation" : "",
            c->meta_cache ? ", foliod:cache" : "");
  conn_set_state (c, CONN_TX_REQ_HDR);
}

/* Copy an on-the-wire string into a NUL-terminated buffer of HS_MAX_STRING
 * + 1 bytes.  Returns -1 if too long or if it contains a NUL. */
static int
hs_string (char *dst, const uint8_t *src, uint32_t len)
{
  if (len > HS_MAX_STRING || memchr (src, 0, len))
    return -1;
  memcpy (dst, src, len);
  dst[len] = '\0';
  return 0;
}

/* ---- options ------------------------------------------------------------ */

static enum step
opt_export_name (struct conn *c)
{
  char name[HS_MAX_STRING + 1];
  struct export *e;
  uint8_t reply[8 + 2 + 124] = { 0 };
  char esc[ESCAPED_MAX];

  if (c->extended) {
    /* The spec forbids it after extended headers: its reply has no room
     * to say which headers follow, and it cannot carry an error. */
    log_warn ("conn %" PRIu64 ": NBD_OPT_EXPORT_NAME after extended"
              " headers were negotiated: use NBD_OPT_GO", c->id);
    return STEP_CLOSE;
  }
  if (hs_string (name, c->optbuf, c->opt_len) < 0
      || !(e = server_find_export (c->srv, name))
      || hs_tls_required (c, e)) {
    /* NBD_OPT_EXPORT_NAME cannot carry an error: hard disconnect. */
    log_warn ("conn %" PRIu64 ": unknown export '%s'", c->id,
              str_escape (esc, sizeof esc, c->optbuf, c->opt_len));
    return STEP_CLOSE;
  }
  put_be64 (reply, e->size);
  put_be16 (reply + 8, hs_tflags (c, e));
  if (conn_out_append (c, reply, c->no_zeroes ? 10 : sizeof reply) < 0)
    return STEP_CLOSE;
  hs_enter_transmission (c, e);
  return STEP_NEXT;
}

static enum step
opt_abort (struct conn *c)
{
  int rc = hs_reply (c, NBD_REP_ACK, NULL, 0);

  /* Send the ACK, then close (DRAINING closes once output is out). */
  conn_set_state (c, CONN_DRAINING);
  return hs_done (rc);
}

static enum step
opt_list (struct conn *c)
{
  struct server *s = c->srv;

  if (c->opt_len != 0)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "NBD_OPT_LIST takes no data"));
  for (size_t i = 0; i < s->nexports; i++) {
    const struct export *e = s->exports[i];
    size_t nlen = strlen (e->name);

    if (hs_tls_required (c, e))
      continue; /* TLS-only exports are not shown in plaintext */
    if (export_release_state (e) == EXPORT_STOPPED)
      continue; /* released to another host */
    size_t dlen = e->description ? strlen (e->description) : 0;
    uint8_t len[4];

    put_be32 (len, nlen);
    if (hs_reply_begin (c, NBD_REP_SERVER, 4 + nlen + dlen) < 0
        || conn_out_append (c, len, 4) < 0
        || conn_out_append (c, e->name, nlen) < 0
        || conn_out_append (c, e->description, dlen) < 0)
      return STEP_CLOSE;
  }
  return hs_done (hs_reply (c, NBD_REP_ACK, NULL, 0));
}

static enum step
opt_starttls (struct conn *c)
{
  if (c->opt_len != 0)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "NBD_OPT_STARTTLS takes no data"));
  if (c->tls_active)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "TLS is already active"));
  if (!server_tls_on (c->srv) || !(c->client_flags & NBD_FLAG_C_FIXED_NEWSTYLE))
    return hs_done (hs_reply_err (c, NBD_REP_ERR_POLICY,
                                  "TLS is not enabled on this server"));
  if (c->rpos < c->rlen) {
    /* Bytes sent after STARTTLS, before our ACK, would be taken as if
     * they came through TLS: an injection attempt, not a client bug. */
    log_warn ("conn %" PRIu64 " (%s): data after NBD_OPT_STARTTLS",
              c->id, c->peer);
    return STEP_CLOSE;
  }
  /* The ACK goes out in clear, then everything is TLS.  Nothing agreed
   * before STARTTLS survives it (spec). */
  if (hs_reply (c, NBD_REP_ACK, NULL, 0) < 0
      || server_tls_start (c) < 0)
    return STEP_CLOSE;
  c->tls_active = true;
  c->structured = false;
  c->extended = false;
  c->meta_alloc = false;
  c->meta_cache = false;
  c->meta_exp = NULL;
  return STEP_NEXT;
}

static enum step
opt_structured_reply (struct conn *c)
{
  if (c->opt_len != 0)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "NBD_OPT_STRUCTURED_REPLY takes no data"));
  if (c->extended)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_EXT_HEADER_REQD,
                                  "extended headers already negotiated"));
  c->structured = true;
  return hs_done (hs_reply (c, NBD_REP_ACK, NULL, 0));
}

/* Extended headers take precedence over structured replies and imply
 * them (every reply a 32-byte chunk header), with or without an earlier
 * NBD_OPT_STRUCTURED_REPLY.  Metadata contexts already set stay set:
 * ours report 32-bit states, sent in either chunk type. */
static enum step
opt_extended_headers (struct conn *c)
{
  if (c->opt_len != 0)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "NBD_OPT_EXTENDED_HEADERS takes no data"));
  c->extended = true;
  c->structured = true;
  return hs_done (hs_reply (c, NBD_REP_ACK, NULL, 0));
}

/* One NBD_REP_INFO reply: 16-bit type then payload. */
static int
hs_info (struct conn *c, uint16_t type, const void *p, size_t n)
{
  uint8_t t[2];

  put_be16 (t, type);
  if (hs_reply_begin (c, NBD_REP_INFO, 2 + n) < 0
      || conn_out_append (c, t, 2) < 0)
    return -1;
  return n ? conn_out_append (c, p, n) : 0;
}

static int
hs_info_export (struct conn *c, const struct export *e, bool want_name,
                bool want_desc)
{
  uint8_t ex[10], bs[12];
  uint32_t pref = cache_get_config (e->cache)->block_size;

  put_be64 (ex, e->size);
  put_be16 (ex + 8, hs_tflags (c, e));
  /* Minimum 1: the cache takes any alignment.  Preferred: the cache's
   * block, below which writes read-modify-write. */
  put_be32 (bs, 1);
  put_be32 (bs + 4, pref);
  put_be32 (bs + 8, NBD_MAX_PAYLOAD);
  if (hs_info (c, NBD_INFO_EXPORT, ex, sizeof ex) < 0
      || hs_info (c, NBD_INFO_BLOCK_SIZE, bs, sizeof bs) < 0)
    return -1;
  if (want_name && hs_info (c, NBD_INFO_NAME, e->name, strlen (e->name)) < 0)
    return -1;
  if (want_desc && e->description
      && hs_info (c, NBD_INFO_DESCRIPTION, e->description,
                  strlen (e->description)) < 0)
    return -1;
  return 0;
}

static enum step
opt_info_go (struct conn *c)
{
  const uint8_t *p = c->optbuf;
  char name[HS_MAX_STRING + 1];
  bool want_name = false, want_desc = false;
  uint32_t namelen;
  uint16_t nreq;
  struct export *e;

  if (c->opt_len < 6 || (namelen = get_be32 (p)) > c->opt_len - 6)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "malformed NBD_OPT_INFO/GO"));
  nreq = get_be16 (p + 4 + namelen);
  if (4 + namelen + 2 + 2 * (uint32_t) nreq != c->opt_len)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "information request list length wrong"));
  if (hs_string (name, p + 4, namelen) < 0)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "export name too long or not a string"));
  for (uint16_t i = 0; i < nreq; i++) {
    uint16_t t = get_be16 (p + 4 + namelen + 2 + 2 * i);
    want_name |= t == NBD_INFO_NAME;
    want_desc |= t == NBD_INFO_DESCRIPTION;
  }
  e = server_find_export (c->srv, name);
  if (!e)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_UNKNOWN,
                                  "export '%s' not found", name));
  if (hs_tls_required (c, e))
    return hs_done (hs_reply_err (c, NBD_REP_ERR_TLS_REQD,
                                  "export '%s' requires TLS", name));
  if (hs_info_export (c, e, want_name, want_desc) < 0
      || hs_reply (c, NBD_REP_ACK, NULL, 0) < 0)
    return STEP_CLOSE;
  if (c->opt == NBD_OPT_GO)
    hs_enter_transmission (c, e);
  return STEP_NEXT;
}

/* Does query q (NUL-terminated) select context (e.g. "base:allocation")?
 * In LIST mode the bare namespace ("base:") is a wildcard; in SET mode it
 * selects nothing. */
static bool
meta_query_matches (const char *q, const char *context, bool list)
{
  size_t ns = strchr (context, ':') - context + 1;

  if (strcmp (q, context) == 0)
    return true;
  return list && strlen (q) == ns && strncmp (q, context, ns) == 0;
}

/* One NBD_REP_META_CONTEXT reply: id (0 when listing) and name. */
static int
meta_reply (struct conn *c, uint32_t idv, const char *name)
{
  uint8_t id[4];
  size_t n = strlen (name);

  put_be32 (id, idv);
  if (hs_reply_begin (c, NBD_REP_META_CONTEXT, 4 + n) < 0
      || conn_out_append (c, id, 4) < 0
      || conn_out_append (c, name, n) < 0)
    return -1;
  return 0;
}

static enum step
opt_meta_context (struct conn *c)
{
  bool list = c->opt == NBD_OPT_LIST_META_CONTEXT;
  const uint8_t *p = c->optbuf, *end = p + c->opt_len;
  char name[HS_MAX_STRING + 1], q[HS_MAX_STRING + 1];
  uint32_t namelen, nq;
  bool alloc = false, cache = false;
  struct export *e;

  if (!list) {
    /* SET replaces the selection, even when it fails. */
    c->meta_alloc = false;
    c->meta_cache = false;
    c->meta_exp = NULL;
    if (!c->structured)
      return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                    "structured replies not negotiated"));
  }
  if (c->opt_len < 8 || (namelen = get_be32 (p)) > c->opt_len - 8
      || hs_string (name, p + 4, namelen) < 0)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "malformed meta context option"));
  p += 4 + namelen;
  nq = get_be32 (p);
  p += 4;
  for (uint32_t i = 0; i < nq; i++) {
    uint32_t qlen;

    if (end - p < 4 || (qlen = get_be32 (p)) > (size_t) (end - p - 4))
      return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                    "meta context query overruns option"));
    if (hs_string (q, p + 4, qlen) < 0)
      return hs_done (hs_reply_err (c, NBD_REP_ERR_TOO_BIG,
                                    "meta context query too long"));
    alloc |= meta_query_matches (q, NBD_META_BASE_ALLOCATION, list);
    cache |= meta_query_matches (q, NBD_META_FOLIOD_CACHE, list);
    p += 4 + qlen;
  }
  if (p != end)
    return hs_done (hs_reply_err (c, NBD_REP_ERR_INVALID,
                                  "trailing bytes in meta context option"));
  if (!(e = server_find_export (c->srv, name)))
    return hs_done (hs_reply_err (c, NBD_REP_ERR_UNKNOWN,
                                  "export '%s' not found", name));
  if (hs_tls_required (c, e))
    return hs_done (hs_reply_err (c, NBD_REP_ERR_TLS_REQD,
                                  "export '%s' requires TLS", name));
  if (list && nq == 0)
    alloc = cache = true; /* no query: list everything */
  if ((alloc && meta_reply (c, list ? 0 : NBD_META_ID_BASE_ALLOCATION,
                            NBD_META_BASE_ALLOCATION) < 0)
      || (cache && meta_reply (c, list ? 0 : NBD_META_ID_FOLIOD_CACHE,
                               NBD_META_FOLIOD_CACHE) < 0))
    return STEP_CLOSE;
  if (!list) {
    c->meta_alloc = alloc;
    c->meta_cache = cache;
    c->meta_exp = e;
  }
  return hs_done (hs_reply (c, NBD_REP_ACK, NULL, 0));
}

static enum step
hs_handle_option (struct conn *c)
{
  /* Most options go back to reading the next option header; the few
   * that end the handshake change the state again. */
  conn_set_state (c, CONN_HS_OPT_HDR);
  if (hs_tls_required (c, NULL) && c->opt != NBD_OPT_STARTTLS
      && c->opt != NBD_OPT_ABORT) {
    if (c->opt == NBD_OPT_EXPORT_NAME)
      return STEP_CLOSE; /* cannot carry an error */
    return hs_done (hs_reply_err (c, NBD_REP_ERR_TLS_REQD,
                                  "TLS required: send NBD_OPT_STARTTLS"));
  }
  switch (c->opt) {
  case NBD_OPT_EXPORT_NAME:      return opt_export_name (c);
  case NBD_OPT_ABORT:            return opt_abort (c);
  case NBD_OPT_LIST:             return opt_list (c);
  case NBD_OPT_STARTTLS:         return opt_starttls (c);
  case NBD_OPT_INFO:
  case NBD_OPT_GO:               return opt_info_go (c);
  case NBD_OPT_STRUCTURED_REPLY: return opt_structured_reply (c);
  case NBD_OPT_EXTENDED_HEADERS: return opt_extended_headers (c);
  case NBD_OPT_LIST_META_CONTEXT:
  case NBD_OPT_SET_META_CONTEXT: return opt_meta_context (c);
  default:
    return hs_done (hs_reply_err (c, NBD_REP_ERR_UNSUP,
                                  "option %" PRIu32 " not supported", c->opt));
  }
}

enum step
hs_step_opt_data (struct conn *c)
{
  enum io_res r = conn_read_exact (c, c->optbuf, c->opt_len, &c->opt_have);

  if (r != IO_DONE)
    return io_step (r);
  return hs_handle_option (c);
}
