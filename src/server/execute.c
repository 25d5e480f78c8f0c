/* Executing requests (on a worker thread) and building their replies.
 *
 * Everything here works on one struct req and the connection fields that
 * are fixed during transmission (exp, structured), so it runs on any
 * thread without locks.  The reply is left in r->iov, pointing into
 * r->hdr and r->buf, for conn.c to send.
 */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/cache.h"
#include "foliod/export.h"
#include "foliod/minmax.h"
#include "server/internal.h"
#include "server/wire.h"

/* Reads at least this long look for holes to send as OFFSET_HOLE. */
#define READ_HOLE_SCAN_MIN  (64u * 1024)
/* Holes shorter than this are sent as data (not worth a chunk). */
#define READ_HOLE_MIN       4096u
/* Cap of descriptors in one block status reply (spec: SHOULD <= 2^20). */
#define BS_MAX_EXTENTS      16384u
_Static_assert (REQ_BS_BUF_MAX >= NBD_META_CONTEXTS * (8 + 16 * BS_MAX_EXTENTS),
                "the buffer budget counts a block status reply");
_Static_assert (REQ_HDR_SLOT_LEN >= NBD_EXTENDED_HDR_LEN + 12,
                "a slot holds a chunk header and an OFFSET_HOLE payload");

/* errno to the error sent on the wire (the spec's short list). */
static int
wire_errno (int err)
{
  switch (err) {
  case 0:         return 0;
  case EPERM:
  case EROFS:     return NBD_EPERM;
  case ENOMEM:    return NBD_ENOMEM;
  case EINVAL:    return NBD_EINVAL;
  case ENOSPC:
  case EDQUOT:
  case EFBIG:     return NBD_ENOSPC;
  case EOVERFLOW: return NBD_EOVERFLOW;
  case ENOTSUP:   return NBD_ENOTSUP;
  case ESHUTDOWN: return NBD_ESHUTDOWN;
  default:        return NBD_EIO;
  }
}

static const char *
wire_strerror (int wire_err)
{
  switch (wire_err) {
  case NBD_EPERM:     return "operation not permitted";
  case NBD_EIO:       return "input/output error";
  case NBD_ENOMEM:    return "out of memory";
  case NBD_EINVAL:    return "invalid argument";
  case NBD_ENOSPC:    return "no space left on device";
  case NBD_EOVERFLOW: return "value too large";
  case NBD_ENOTSUP:   return "operation not supported";
  case NBD_ESHUTDOWN: return "server is shutting down";
  default:            return "error";
  }
}

/* ---- reply building ------------------------------------------------------ */

static uint8_t *
req_slot (struct req *r)
{
  assert (r->nhdr < REQ_HDR_SLOTS);
  return r->hdr[r->nhdr++];
}

static void
req_iov (struct req *r, const void *p, size_t n)
{
  assert (r->niov < REQ_IOV_MAX);
  r->iov[r->niov].iov_base = (void *) p;
  r->iov[r->niov].iov_len = n;
  r->niov++;
}

/* Length of a chunk header on r's connection: 20 bytes structured, 32
 * extended; a chunk's fixed payload bytes follow it in the same slot. */
static size_t
chunk_hlen (const struct req *r)
{
  return r->conn->extended ? NBD_EXTENDED_HDR_LEN : NBD_STRUCTURED_HDR_LEN;
}

/* Write a chunk header (the negotiated form) into a new slot; returns the
 * slot so the caller can append up to REQ_HDR_SLOT_LEN - chunk_hlen (r)
 * fixed payload bytes after the header.  An extended header echoes the
 * request's offset (spec) and has a 64-bit length. */
static uint8_t *
chunk_hdr (struct req *r, uint16_t flags, uint16_t type, uint32_t len)
{
  uint8_t *h = req_slot (r);

  put_be16 (h + 4, flags);
  put_be16 (h + 6, type);
  put_be64 (h + 8, r->cookie);
  if (r->conn->extended) {
    put_be32 (h, NBD_EXTENDED_REPLY_MAGIC);
    put_be64 (h + 16, r->offset);
    put_be64 (h + 24, len);
  }
  else {
    put_be32 (h, NBD_STRUCTURED_REPLY_MAGIC);
    put_be32 (h + 16, len);
  }
  return h;
}

static void
chunk_set_done (uint8_t *h)
{
  put_be16 (h + 4, NBD_REPLY_FLAG_DONE);
}

static void
reply_simple (struct req *r)
{
  uint8_t *h = req_slot (r);

  put_be32 (h, NBD_SIMPLE_REPLY_MAGIC);
  put_be32 (h + 4, r->error);
  put_be64 (h + 8, r->cookie);
  req_iov (r, h, NBD_SIMPLE_REPLY_LEN);
  if (r->type == NBD_CMD_READ && !r->error && r->count)
    req_iov (r, r->buf, r->count);
}

/* A final error chunk; with has_off, NBD_REPLY_TYPE_ERROR_OFFSET. */
static void
reply_error_chunk (struct req *r, bool has_off, uint64_t off)
{
  const char *msg = r->errmsg ? r->errmsg : wire_strerror (r->error);
  uint16_t mlen = strlen (msg);
  uint8_t *h = chunk_hdr (r, NBD_REPLY_FLAG_DONE,
                          has_off ? NBD_REPLY_TYPE_ERROR_OFFSET
                          : NBD_REPLY_TYPE_ERROR,
                          6 + mlen + (has_off ? 8 : 0));
  size_t hl = chunk_hlen (r);

  put_be32 (h + hl, r->error);
  put_be16 (h + hl + 4, mlen);
  req_iov (r, h, hl + 6);
  req_iov (r, msg, mlen);
  if (has_off) {
    uint8_t *o = req_slot (r);
    put_be64 (o, off);
    req_iov (r, o, 8);
  }
}

void
req_build_reply (struct req *r)
{
  if (r->niov > 0)
    return; /* built by the command itself (read, block status) */
  if (r->error && r->conn->structured)
    reply_error_chunk (r, false, 0);
  else if (r->conn->structured
           && (r->type == NBD_CMD_READ || r->conn->extended)) {
    /* Extended headers allow no simple reply, even without a payload. */
    uint8_t *h = chunk_hdr (r, NBD_REPLY_FLAG_DONE, NBD_REPLY_TYPE_NONE, 0);
    req_iov (r, h, chunk_hlen (r));
  }
  else
    reply_simple (r);
}

/* ---- READ ---------------------------------------------------------------- */

struct seg {
  uint64_t off;
  uint64_t len;
  bool hole;
};

struct seg_list {
  struct seg s[REQ_MAX_CHUNKS];
  unsigned n;
  uint64_t next, end;
};

static void
seg_add (struct seg_list *l, uint64_t off, uint64_t len, bool hole)
{
  if (l->n > 0 && l->s[l->n - 1].hole == hole)
    l->s[l->n - 1].len += len;
  else
    l->s[l->n++] = (struct seg) { off, len, hole };
  l->next = off + len;
}

static int
seg_extent_cb (void *opaque, uint64_t off, uint64_t len,
               enum backing_extent_type type)
{
  struct seg_list *l = opaque;
  uint64_t s = MAX (off, l->next);
  uint64_t e = MIN (off + len, l->end);
  bool hole = type != BACKING_DATA && e - s >= READ_HOLE_MIN;

  if (e <= s)
    return l->next >= l->end;
  if (s != l->next)
    return 1; /* a gap: give up on precision, rest is data */
  if (l->n == REQ_MAX_CHUNKS && l->s[l->n - 1].hole != hole)
    return 1; /* out of chunks: read_segments sends the rest as data */
  seg_add (l, s, e - s, hole);
  return l->next >= l->end;
}

/* Does the read ask the cache's block status (and so maybe the backing's
 * map) where the holes are? */
static bool
read_scans_holes (const struct req *r)
{
  return r->conn->structured && !(r->flags & NBD_CMD_FLAG_DF)
    && r->count >= READ_HOLE_SCAN_MIN;
}

/* Split [offset, offset+count) into data and hole segments from the
 * cache's block status (dirty or cached blocks are always data). */
static void
read_segments (struct req *r, struct seg_list *l)
{
  l->n = 0;
  l->next = r->offset;
  l->end = r->offset + r->count;
  if (read_scans_holes (r)
      && cache_block_status (r->conn->exp->cache, r->count, r->offset,
                             seg_extent_cb, l) < 0) {
    l->n = 0; /* no map: everything is data */
    l->next = r->offset;
  }
  if (l->next < l->end) {
    if (l->n == REQ_MAX_CHUNKS && l->s[l->n - 1].hole)
      l->s[l->n - 1].hole = false; /* no chunk left: send it as data */
    seg_add (l, l->next, l->end - l->next, false);
  }
}

/* Read one range of r into data: from what a parked miss fetched (the
 * whole request is one range then: req_fetch_start takes no read that
 * looks for holes), else from the cache. */
static int
read_range (struct req *r, uint8_t *data, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct cache *cache = r->conn->exp->cache;

  if (r->fetch == REQ_FETCHED && r->fetch_err == 0 && data == r->buf &&
      len == r->count)
    return cache_read_fetched (cache, data, len, off, &r->fetched, flags);
  return cache_read (cache, data, len, off, flags);
}

/* The read's reply, or under CACHE_NOWAIT (in flags) -1 if the cache
 * would have waited: then nothing is built.  Errors are replies. */
static int
exec_read_structured (struct req *r, unsigned flags)
{
  struct seg_list l;
  uint8_t *last = NULL;
  size_t hl = chunk_hlen (r);

  if (r->count == 0)
    return 0; /* req_build_reply sends a NONE chunk */
  read_segments (r, &l);
  for (unsigned i = 0; i < l.n; i++) {
    const struct seg *s = &l.s[i];
    uint8_t *data = r->buf + (s->off - r->offset);

    if (s->hole) {
      last = chunk_hdr (r, 0, NBD_REPLY_TYPE_OFFSET_HOLE, 12);
      put_be64 (last + hl, s->off);
      put_be32 (last + hl + 8, s->len);
      req_iov (r, last, hl + 12);
      continue;
    }
    if (read_range (r, data, s->len, s->off, flags) < 0) {
      if (flags & CACHE_NOWAIT) {
        r->niov = r->nhdr = 0;
        return -1;
      }
      r->error = wire_errno (errno);
      r->errmsg = NULL;
      /* Chunks already built stay valid; the error says where the
       * failure starts. */
      reply_error_chunk (r, true, s->off);
      return 0;
    }
    last = chunk_hdr (r, 0, NBD_REPLY_TYPE_OFFSET_DATA, 8 + s->len);
    put_be64 (last + hl, s->off);
    req_iov (r, last, hl + 8);
    req_iov (r, data, s->len);
  }
  assert (last);                /* count > 0 gave at least one chunk */
  chunk_set_done (last);
  return 0;
}

/* As exec_read_structured, for either kind of reply. */
static int
exec_read (struct req *r, unsigned flags)
{
  if (r->conn->structured)
    return exec_read_structured (r, flags);
  if (r->count && read_range (r, r->buf, r->count, r->offset, flags) < 0) {
    if (flags & CACHE_NOWAIT)
      return -1;
    r->error = wire_errno (errno);
  }
  reply_simple (r);
  return 0;
}

/* Make r->buf hold need bytes (its contents are not kept): 0 or -1.  The
 * budget charged at parse time stays (conn_req_put keeps what it said). */
static int
req_buf_room (struct req *r, size_t need)
{
  void *p;

  if (r->buf_cap >= need)
    return 0;
  if ((p = malloc (need)) == NULL)
    return -1;
  free (r->buf);
  r->buf = p;
  r->buf_cap = need;
  return 0;
}

/* ---- BLOCK_STATUS ---------------------------------------------------------- */

/* Descriptors of one context: 32-bit length and flags
 * (NBD_REPLY_TYPE_BLOCK_STATUS), or with extended headers 64-bit length
 * and status (NBD_REPLY_TYPE_BLOCK_STATUS_EXT), so that one extent of a
 * 64-bit request is one descriptor. */
struct bs_ctx {
  uint8_t *desc;       /* the first descriptor */
  unsigned n, max;
  uint64_t next, end;
  uint32_t last_flags;
  bool one;            /* NBD_CMD_FLAG_REQ_ONE */
  bool ext;            /* 16-byte descriptors */
};

/* Size of the head before the descriptors (context id; with extended
 * headers also their count) and of one descriptor. */
static size_t
bs_head_len (bool ext)
{
  return ext ? 8 : 4;
}

static size_t
bs_desc_len (bool ext)
{
  return ext ? 16 : 8;
}

static uint64_t
bs_desc_get_len (const struct bs_ctx *b, unsigned i)
{
  const uint8_t *d = b->desc + bs_desc_len (b->ext) * i;

  return b->ext ? get_be64 (d) : get_be32 (d);
}

/* Set descriptor i.  A compact descriptor's length fits: its request's
 * length was 32 bits, and extents are clipped to it. */
static void
bs_desc_set (struct bs_ctx *b, unsigned i, uint64_t len, uint32_t flags)
{
  uint8_t *d = b->desc + bs_desc_len (b->ext) * i;

  if (b->ext) {
    put_be64 (d, len);
    put_be64 (d + 8, flags); /* 32-bit states: the high half zero (spec) */
  }
  else {
    assert (len <= UINT32_MAX);
    put_be32 (d, len);
    put_be32 (d + 4, flags);
  }
}

static uint32_t
bs_flags (enum backing_extent_type t)
{
  switch (t) {
  case BACKING_HOLE: return NBD_STATE_HOLE | NBD_STATE_ZERO;
  case BACKING_ZERO: return NBD_STATE_ZERO;
  case BACKING_DATA: return 0;
  }
  abort (); /* a type the protocol cannot express */
}

/* Add [off, off+len) with flags to the descriptors; non-zero: stop. */
static int
bs_add (struct bs_ctx *b, uint64_t off, uint64_t len, uint32_t flags)
{
  uint64_t s = MAX (off, b->next);
  uint64_t e = MIN (off + len, b->end);

  if (e <= s)
    return b->next >= b->end;
  if (s != b->next)
    return 1; /* extents must be consecutive: stop at a gap */
  if (b->n > 0 && flags == b->last_flags)
    bs_desc_set (b, b->n - 1, bs_desc_get_len (b, b->n - 1) + (e - s),
                 flags);
  else {
    if (b->n == b->max)
      return 1;
    bs_desc_set (b, b->n, e - s, flags);
    b->n++;
    b->last_flags = flags;
  }
  b->next = e;
  return b->one || b->next >= b->end;
}

static int
bs_extent_cb (void *opaque, uint64_t off, uint64_t len,
              enum backing_extent_type type)
{
  return bs_add (opaque, off, len, bs_flags (type));
}

/* foliod:cache: the flags are the cache's CACHE_STATE_* bits as they are
 * (documented in foliod(8)). */
static int
bs_state_cb (void *opaque, uint64_t off, uint64_t len, uint32_t state)
{
  return bs_add (opaque, off, len, state);
}

/* One context's descriptors at buf (id, [count,] then length/flags
 * pairs) and the chunk carrying them; done on the last chunk of the
 * reply. */
static int
bs_context (struct req *r, uint8_t *buf, uint32_t id, bool done)
{
  bool ext = r->conn->extended;
  struct bs_ctx b = {
    .max = (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : BS_MAX_EXTENTS,
    .next = r->offset,
    .end = r->offset + r->count,
    .one = (r->flags & NBD_CMD_FLAG_REQ_ONE) != 0,
    .ext = ext,
    .desc = buf + bs_head_len (ext),
  };
  size_t len;
  struct cache *cache = r->conn->exp->cache;
  int rc = id == NBD_META_ID_FOLIOD_CACHE
    ? cache_state_status (cache, r->count, r->offset, bs_state_cb, &b)
    : cache_block_status (cache, r->count, r->offset, bs_extent_cb, &b);
  uint8_t *h;

  if (rc < 0)
    return -1;
  if (b.n == 0) { /* nothing said: "allocated, contents unknown" */
    bs_desc_set (&b, 0, r->count, 0);
    b.n = 1;
  }
  put_be32 (buf, id);
  if (ext)
    put_be32 (buf + 4, b.n);
  len = bs_head_len (ext) + bs_desc_len (ext) * b.n;
  h = chunk_hdr (r, done ? NBD_REPLY_FLAG_DONE : 0,
                 ext ? NBD_REPLY_TYPE_BLOCK_STATUS_EXT
                     : NBD_REPLY_TYPE_BLOCK_STATUS, len);
  req_iov (r, h, chunk_hlen (r));
  req_iov (r, buf, len);
  return 0;
}

/* One block status chunk per selected context (spec), base:allocation
 * first. */
static int
exec_block_status (struct req *r)
{
  size_t max = (r->flags & NBD_CMD_FLAG_REQ_ONE) ? 1 : BS_MAX_EXTENTS;
  bool ext = r->conn->extended;
  size_t one = bs_head_len (ext) + bs_desc_len (ext) * max;
  size_t need = NBD_META_CONTEXTS * one;
  bool alloc = r->bs_contexts & REQ_BS_ALLOC;
  bool cache = r->bs_contexts & REQ_BS_CACHE;

  if (req_buf_room (r, need) == -1)
    return -1;
  if (alloc && bs_context (r, r->buf, NBD_META_ID_BASE_ALLOCATION,
                           !cache) < 0)
    return -1;
  if (cache && bs_context (r, r->buf + one, NBD_META_ID_FOLIOD_CACHE,
                           true) < 0)
    return -1;
  return 0;
}

/* ---- WRITE ---------------------------------------------------------------- */

/* A write whose whole folios arrived in r->prep: the bytes around them
 * (in buf) go in first, then the folios.  Each of the three is all or
 * nothing; an edge written is noted in p->edges_done, so that after a
 * CACHE_NOWAIT try gave up half way the worker's retry goes on from
 * there: nothing is written or counted twice. */
static int
exec_write_prepared (struct req *r, unsigned flags)
{
  struct cache *cache = r->conn->exp->cache;
  struct cache_prep *p = &r->prep;
  uint64_t head = p->off - r->offset, tail_off = p->off + p->len;
  uint64_t tail = r->offset + r->count - tail_off;

  if (head && !(p->edges_done & CACHE_PREP_HEAD)) {
    if (cache_write (cache, r->buf, head, r->offset, flags) < 0)
      return -1;
    p->edges_done |= CACHE_PREP_HEAD;
  }
  if (tail && !(p->edges_done & CACHE_PREP_TAIL)) {
    if (cache_write (cache, r->buf + head, tail, tail_off, flags) < 0)
      return -1;
    p->edges_done |= CACHE_PREP_TAIL;
  }
  return cache_write_commit (cache, p, flags);
}

static int
exec_write (struct req *r, unsigned flags)
{
  if (r->prep.n > 0)
    return exec_write_prepared (r, flags);
  return cache_write (r->conn->exp->cache, r->buf, r->count, r->offset,
                      flags);
}

/* ---- dispatch -------------------------------------------------------------- */

/* The request on the cache: 0, or -1 with errno. */
static int
req_run (struct req *r, struct cache *cache)
{
  unsigned fua = (r->flags & NBD_CMD_FLAG_FUA) ? CACHE_FUA : 0;
  int rc = 0;

  switch (r->type) {
  case NBD_CMD_READ:
    exec_read (r, 0);
    break;
  case NBD_CMD_WRITE:
    if (r->count)
      rc = exec_write (r, fua);
    else if (fua)
      rc = cache_flush (cache);
    break;
  case NBD_CMD_FLUSH:
    rc = cache_flush (cache);
    export_flush_done (r->conn->exp, rc == -1, errno);
    break;
  case NBD_CMD_TRIM:
    if (r->count)
      rc = cache_trim (cache, r->count, r->offset, fua);
    break;
  case NBD_CMD_CACHE:
    if (r->count)
      rc = cache_prefetch (cache, r->count, r->offset);
    break;
  case NBD_CMD_WRITE_ZEROES: {
    unsigned f = fua;
    if (!(r->flags & NBD_CMD_FLAG_NO_HOLE))
      f |= CACHE_MAY_TRIM;
    if (r->flags & NBD_CMD_FLAG_FAST_ZERO)
      f |= CACHE_FAST_ZERO;
    if (r->count)
      rc = cache_zero (cache, r->count, r->offset, f);
    break;
  }
  case NBD_CMD_BLOCK_STATUS:
    rc = exec_block_status (r);
    break;
  default:
    abort (); /* req_check lets no other command through */
  }
  return rc;
}

/* Write, zero and trim pass the export's gate (export_write_begin): a
 * release refuses them, as a read-only export would. */
static bool
req_writes (const struct req *r)
{
  return r->type == NBD_CMD_WRITE || r->type == NBD_CMD_TRIM
    || r->type == NBD_CMD_WRITE_ZEROES;
}

void
req_execute (struct req *r)
{
  struct cache *cache = r->conn->exp->cache;
  int rc;

  /* Its connection was closed while it waited in the queue (a forced
   * shutdown, a send error): nobody is left to answer, and its client
   * never saw it acknowledged.  Skip it, so that a closed connection's
   * queue costs no backing time (issue 34: a shutdown bounded by
   * shutdown-timeout). */
  if (atomic_load_explicit (&r->conn->closed, memory_order_relaxed)) {
    cache_write_abort (cache, &r->prep);
    r->fetch = REQ_FETCH_NONE;
    r->niov = r->nhdr = 0;
    return;
  }
  if (req_writes (r) && export_write_begin (r->conn->exp) == -1)
    rc = -1;
  else if (req_writes (r)) {
    rc = req_run (r, cache);
    int err = errno;
    export_write_end (r->conn->exp);
    errno = err;
  } else
    rc = req_run (r, cache);
  if (rc < 0) {
    r->error = wire_errno (errno);
    r->errmsg = NULL;
    r->niov = r->nhdr = 0;
    cache_write_abort (cache, &r->prep); /* a failed edge: not committed */
  }
  r->fetch = REQ_FETCH_NONE;    /* what it fetched is used */
  req_build_reply (r);
}

/* Run-to-completion: may the parsing thread try r itself?  Reads and
 * writes the cache can answer from memory, up to REQ_INLINE_MAX bytes (a
 * larger copy would hold the loop from its other connections); not a
 * read that looks for holes (the backing's map) nor a FUA write. */
static bool
req_may_try (const struct req *r)
{
  if (r->count == 0 || r->count > REQ_INLINE_MAX)
    return false;
  if (r->type == NBD_CMD_READ)
    return !read_scans_holes (r);
  return r->type == NBD_CMD_WRITE && !(r->flags & NBD_CMD_FLAG_FUA);
}

bool
req_try_execute (struct req *r)
{
  if (!req_may_try (r))
    return false;
  if (r->type == NBD_CMD_READ) {
    if (exec_read (r, CACHE_NOWAIT) < 0)
      return false;
  }
  else {
    int rc;
    if (export_write_begin (r->conn->exp) == -1)
      return false;    /* a worker refuses it */
    rc = exec_write (r, CACHE_NOWAIT);
    export_write_end (r->conn->exp);
    if (rc < 0)
      return false;
  }
  req_build_reply (r);
  return true;
}

/* The backing's thread: the fetch is over; the loop that owns the
 * connection takes it from here (loop_take_done). */
static void
req_fetch_done (void *opaque, int err)
{
  struct req *r = opaque;

  r->fetch_err = err;
  r->fetch = REQ_FETCHED;
  loop_req_done (NULL, r);
}

bool
req_fetch_start (struct req *r)
{
  struct cache *cache = r->conn->exp->cache;

  if (r->type != NBD_CMD_READ || !req_may_try (r) ||
      req_buf_room (r, cache_fetch_room (cache, r->count, r->offset)) == -1)
    return false;
  r->fetch = REQ_FETCHING;
  r->fetch_err = 0;
  /* From here on r may be on the done list already (done runs inside
   * when the remote was that quick): touch nothing after. */
  if (cache_fetch (cache, r->buf, r->count, r->offset, &r->fetched,
                   req_fetch_done, r) == 0)
    return true;
  r->fetch = REQ_FETCH_NONE;
  return false;
}
