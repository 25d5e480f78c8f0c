/* The nbd backing: a remote NBD export through libnbd.
 *
 * Connections (nbd-conn.c): several when the remote advertises multi-conn
 * (then a flush on any of them covers writes done on all), else one; each
 * carries many commands in flight (libnbd aio, one poller thread per
 * connection).  A dropped connection is reconnected with backoff and the
 * requests on it are issued again; an error the remote answers (EIO,
 * ENOSPC, ...) is returned at once; a request not answered within
 * request-timeout fails (ETIMEDOUT), and while the remote stays away
 * requests fail fast (ENOTCONN), see nbd-conn.c.
 *
 * Writes in doubt: a write-class request that timed out, or lost its
 * connection before its answer (cut by foliod, reset by the network, a
 * remote that went away), may still be carried out by the remote later (NBD has
 * no cancel and orders nothing across connections), over data written
 * since.  Such writes are counted (nb->in_doubt) and, until the operator
 * clears them (clear_doubt), flush and FUA fail with EIO: the cache keeps
 * what was written since unstable, and writes it again after the clear.
 * Why not keep the connection open to learn the answer: libnbd sends a
 * write from the caller's buffer, which the cache reuses once the
 * request returned, and a reconnect loses the answer anyway.
 *
 * Mapping: base:allocation block status, asked for more than the caller
 * needs (lookahead) and kept in a small extent cache.  Writes, zeroes and
 * trims cut their range out of the cache when they complete; an answer
 * that raced with such a change is used but not cached.  A reconnect
 * makes everything cached before it stale (dropped at lookup).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/lock.h"
#include "backing/nbd-private.h"
#include "foliod/minmax.h"

#define NBD_DEFAULT_CONNS      4
#define NBD_MAX_CONNS          64u
#define NBD_DEFAULT_RETRY_MS   30000
#define NBD_DEFAULT_REQUEST_MS 30000
#define NBD_MAX_IO             (32u << 20) /* read/write request cap */
#define NBD_MAX_ZERO           (1u << 30)  /* zero/trim request cap */
#define NBD_MAP_LOOKAHEAD      (1u << 30)  /* block status asks this much */
#define NBD_ZERO_BUF           (1u << 20)

static inline struct nbdb_backing *
to_nbd (struct backing *b)
{
  return (struct nbdb_backing *) b;
}

/* ---- the extent cache ---- */

static int
overlaps (uint64_t a, uint64_t ae, uint64_t b, uint64_t be)
{
  return a < be && b < ae;
}

/* epoch: nb->reconnects when the remote was asked. */
static void
ext_store (struct nbdb_backing *nb, uint64_t off, uint64_t len,
           enum backing_extent_type type, uint64_t epoch)
{
  struct ext_slot *s = &nb->ext[nb->ext_hand];

  nb->ext_hand = (nb->ext_hand + 1) % NBD_EXT_SLOTS;
  s->off = off;
  s->len = len;
  s->type = type;
  s->epoch = epoch;
}

/* Cut [off, off+len) out of every cached extent and log the change. */
static void
ext_invalidate (struct nbdb_backing *nb, uint64_t off, uint64_t len)
{
  uint64_t end = off + len;
  unsigned i;

  lock_or_die (&nb->ext_lock);
  for (i = 0; i < NBD_EXT_SLOTS; i++) {
    struct ext_slot *s = &nb->ext[i];
    uint64_t se = s->off + s->len;
    if (!s->len || !overlaps (s->off, se, off, end))
      continue;
    if (s->off < off) {
      s->len = off - s->off;           /* keep the left part here */
      if (se > end) {
        if (nb->ext_hand == i)         /* do not overwrite it */
          nb->ext_hand = (i + 1) % NBD_EXT_SLOTS;
        ext_store (nb, end, se - end, s->type, s->epoch);
      }
    }
    else if (se > end) {
      s->len = se - end;
      s->off = end;
    }
    else
      s->len = 0;
  }
  nb->gen++;
  nb->inval[nb->gen % NBD_INVAL_LOG] = (struct inval) { off, end, nb->gen };
  unlock_or_die (&nb->ext_lock);
}

/* An extent told before the latest reconnect is dropped here: the remote
 * may have restarted with other contents (or been written by someone
 * else meanwhile).  The connection layer only counts reconnects. */
static int
ext_lookup (struct nbdb_backing *nb, uint64_t off, uint64_t len,
            struct backing_extent *ext)
{
  uint64_t epoch = atomic_load (&nb->reconnects);
  unsigned i;
  int found = 0;

  lock_or_die (&nb->ext_lock);
  for (i = 0; i < NBD_EXT_SLOTS; i++) {
    struct ext_slot *s = &nb->ext[i];
    if (s->len && s->epoch != epoch)
      s->len = 0;
    if (s->len && s->off <= off && off < s->off + s->len) {
      ext->offset = off;
      ext->length = MIN (len, s->off + s->len - off);
      ext->type = s->type;
      found = 1;
      break;
    }
  }
  unlock_or_die (&nb->ext_lock);
  return found;
}

/* May an answer about [off, end) asked at generation gen be cached? */
static int
ext_still_valid (struct nbdb_backing *nb, uint64_t gen, uint64_t off,
                 uint64_t end)
{
  uint64_t g;

  if (nb->gen - gen >= NBD_INVAL_LOG)
    return 0;
  for (g = gen + 1; g <= nb->gen; g++) {
    struct inval *iv = &nb->inval[g % NBD_INVAL_LOG];
    if (overlaps (iv->off, iv->end, off, end))
      return 0;
  }
  return 1;
}

/* ---- requests ---- */

struct io_req {
  void *buf;
  uint64_t len, off;
  uint32_t flags;
};

static int64_t
call_pread (struct nbd_handle *h, void *arg, nbd_completion_callback cb)
{
  struct io_req *r = arg;
  return nbd_aio_pread (h, r->buf, r->len, r->off, cb, 0);
}

static int64_t
call_pwrite (struct nbd_handle *h, void *arg, nbd_completion_callback cb)
{
  struct io_req *r = arg;
  return nbd_aio_pwrite (h, r->buf, r->len, r->off, cb, r->flags);
}

static int64_t
call_zero (struct nbd_handle *h, void *arg, nbd_completion_callback cb)
{
  struct io_req *r = arg;
  return nbd_aio_zero (h, r->len, r->off, cb, r->flags);
}

static int64_t
call_trim (struct nbd_handle *h, void *arg, nbd_completion_callback cb)
{
  struct io_req *r = arg;
  return nbd_aio_trim (h, r->len, r->off, cb, r->flags);
}

static int64_t
call_flush (struct nbd_handle *h, void *arg, nbd_completion_callback cb)
{
  (void) arg;
  return nbd_aio_flush (h, cb, 0);
}

/* Split [off, off+len) into requests of at most chunk bytes. */
static int
nbdb_chunked (struct nbdb_backing *nb, nbdb_issue fn, char *buf, uint64_t len,
              uint64_t off, uint32_t flags, uint64_t chunk)
{
  int write = fn != call_pread;

  while (len > 0) {
    struct io_req r = { buf, MIN (len, chunk), off, flags };
    uint64_t t = write ? 0 : nbdb_id_read_begin (nb);
    if ((write ? nbdb_run_write (nb, fn, &r) : nbdb_run (nb, fn, &r)) == -1)
      return -1;
    if (!write)
      nbdb_id_read_done (nb, t, buf, r.len, off);
    if (buf)
      buf += r.len;
    off += r.len;
    len -= r.len;
  }
  return 0;
}

/* A write foliod abandoned may still land over anything written since:
 * nothing is durable until the operator clears the doubt. */
static int
doubt_check (struct nbdb_backing *nb)
{
  if (atomic_load (&nb->in_doubt) > 0) {
    errno = EIO;
    return -1;
  }
  return 0;
}

/* A flush that fails is a fact the cache's ledger weighs (a remote's
 * failed fdatasync drops what it had not flushed, and its next flush
 * succeeds): nothing is decided here. */
static int
nbdb_flush (struct backing *b)
{
  struct nbdb_backing *nb = to_nbd (b);

  if (b->caps & BACKING_READ_ONLY)
    return 0;
  if (doubt_check (nb) == -1)
    return -1;
  if (!nb->can_flush)
    return 0;
  uint64_t t = nbdb_id_flush_begin (nb);
  if (nbdb_run (nb, call_flush, NULL) == -1)
    return -1;
  nbdb_id_flushed (nb, t);
  return 0;
}

/* Connections that ended (nb->ends): the backing's loss facts for the
 * ledger (backing_ops.loss_epoch).  A failed flush or FUA op is none:
 * the ledger sees it and its own rule decides. */
static uint64_t
nbdb_loss_epoch (struct backing *b)
{
  return atomic_load (&to_nbd (b)->ends);
}

/* The operator says the remote is done with the abandoned writes.  The
 * cache's ledger has moved its epoch before (cache_clear_doubt), so what
 * was written since is written again before the next flush succeeds. */
static uint64_t
nbdb_clear_doubt (struct backing *b)
{
  return atomic_exchange (&to_nbd (b)->in_doubt, 0);
}

/* A write-class op with FUA: refused at once while a write is in doubt
 * (it could not be reported durable). */
static int
fua_doubt_check (struct nbdb_backing *nb, unsigned flags)
{
  return (flags & BACKING_FUA) ? doubt_check (nb) : 0;
}

static uint32_t
fua_flag (struct nbdb_backing *nb, unsigned flags)
{
  return (flags & BACKING_FUA) && nb->can_fua ? LIBNBD_CMD_FLAG_FUA : 0;
}

static int
nbdb_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  struct nbdb_backing *nb = to_nbd (b);

  if (backing_check_range (b, len, off, 0) == -1)
    return -1;
  return nbdb_chunked (nb, call_pread, buf, len, off, 0, nb->max_io);
}

/* One request, no thread held (a cache miss waits for it parked). */
static int
nbdb_read_async (struct backing *b, void *buf, uint64_t len, uint64_t off,
                 void (*done) (void *opaque, int err), void *opaque)
{
  struct nbdb_backing *nb = to_nbd (b);
  struct io_req r = { buf, len, off, 0 };
  struct nbdb_read_id rid = { buf, len, off, nbdb_id_read_begin (nb) };

  if (backing_check_range (b, len, off, 0) == -1)
    return -1;
  if (len == 0 || len > nb->max_io) {
    errno = EINVAL;
    return -1;
  }
  return nbdb_run_async (nb, call_pread, &r, done, opaque, &rid);
}

/* A write-class op as sent: fn NULL writes zeroes from zero_buf (a
 * remote without WRITE_ZEROES). */
struct wop {
  nbdb_issue fn;
  char *buf;
  uint64_t len, off, chunk;
  uint32_t f;                   /* libnbd flags */
};

static int
write_zeroes (struct nbdb_backing *nb, uint64_t len, uint64_t off,
              uint32_t flags)
{
  while (len > 0) {
    struct io_req r = { nb->zero_buf, MIN (len, NBD_ZERO_BUF), off, flags };
    if (nbdb_run_write (nb, call_pwrite, &r) == -1)
      return -1;
    off += r.len;
    len -= r.len;
  }
  return 0;
}

static int
wop_send (struct nbdb_backing *nb, const struct wop *w)
{
  int r = w->fn ? nbdb_chunked (nb, w->fn, w->buf, w->len, w->off, w->f,
                                w->chunk)
                : write_zeroes (nb, w->len, w->off, w->f);
  int e = errno;

  ext_invalidate (nb, w->off, w->len);
  errno = e;
  return r;
}

/* Connection events after which a flush may reach another remote (a
 * restarted one) than the writes before it: ends and reconnects. */
static uint64_t
conn_events (struct nbdb_backing *nb)
{
  return atomic_load (&nb->ends) + atomic_load (&nb->reconnects);
}

#define FUA_TRIES 3

/* Send w; with BACKING_FUA on a remote without native FUA, flush after
 * it.  That flush covers the op only on the remote that acknowledged
 * it: if a connection ended or was made between the op and the flush's
 * answer, the remote may have restarted in between, lost the op and
 * answered the flush from the new process (issue 33 item 2: the op was
 * never counted unflushed anywhere, so nothing would write it again).
 * Then both go again, a few times, and the op fails (EIO) if the remote
 * keeps changing. */
static int
wop_run (struct nbdb_backing *nb, unsigned flags, const struct wop *w)
{
  int r, tries = 0, e;

  nbdb_id_write_begin (nb, w->off, w->len);
  for (;;) {
    uint64_t ev = conn_events (nb);
    r = wop_send (nb, w);
    if (r == -1 || !(flags & BACKING_FUA) || nb->can_fua)
      break;
    r = nbdb_flush (&nb->b);
    if (r == -1 || conn_events (nb) == ev)
      break;
    if (++tries == FUA_TRIES) {
      errno = EIO;
      r = -1;
      break;
    }
  }
  e = errno;
  nbdb_id_write_end (nb);
  errno = e;
  return r;
}

static int
nbdb_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct nbdb_backing *nb = to_nbd (b);
  struct wop w = { call_pwrite, (char *) buf, len, off, nb->max_io,
                   fua_flag (nb, flags) };

  if (backing_check_range (b, len, off, 1) == -1 || fua_doubt_check (nb, flags) == -1)
    return -1;
  return wop_run (nb, flags, &w);
}

static int
nbdb_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct nbdb_backing *nb = to_nbd (b);
  struct wop w = { NULL, NULL, len, off, NBD_MAX_ZERO, fua_flag (nb, flags) };

  if (backing_check_range (b, len, off, 1) == -1 || fua_doubt_check (nb, flags) == -1)
    return -1;
  if ((flags & BACKING_FAST_ZERO) && !nb->can_fast_zero) {
    errno = ENOTSUP;
    return -1;
  }
  if (len == 0)
    return 0;
  if (nb->can_zero) {
    w.fn = call_zero;
    if (!(flags & BACKING_MAY_TRIM))
      w.f |= LIBNBD_CMD_FLAG_NO_HOLE;
    if (flags & BACKING_FAST_ZERO)
      w.f |= LIBNBD_CMD_FLAG_FAST_ZERO;
  }
  return wop_run (nb, flags, &w);
}

static int
nbdb_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct nbdb_backing *nb = to_nbd (b);
  struct wop w = { call_trim, NULL, len, off, NBD_MAX_ZERO,
                   fua_flag (nb, flags) };

  if (backing_check_range (b, len, off, 1) == -1 || fua_doubt_check (nb, flags) == -1)
    return -1;
  if (!nb->can_trim || len == 0)
    return 0;                   /* advisory */
  return wop_run (nb, flags, &w);
}

/* base:allocation -> our types.  HOLE without ZERO reads as undefined
 * (NBD spec), so only HOLE|ZERO is a HOLE. */
static enum backing_extent_type
ext_type (uint32_t flags)
{
  if ((flags & (LIBNBD_STATE_HOLE | LIBNBD_STATE_ZERO)) ==
      (LIBNBD_STATE_HOLE | LIBNBD_STATE_ZERO))
    return BACKING_HOLE;
  if (flags & LIBNBD_STATE_ZERO)
    return BACKING_ZERO;
  return BACKING_DATA;
}

#define MAP_MAX_EXTENTS NBD_EXT_SLOTS

struct map_req {
  uint64_t off, count;
  unsigned n;                   /* extents collected */
  struct ext_slot e[MAP_MAX_EXTENTS];
};

static int
map_extent_cb (void *user, const char *metacontext, uint64_t offset,
               uint32_t *entries, size_t nr, int *error)
{
  struct map_req *m = user;
  uint64_t pos = offset, end = m->off + m->count;
  size_t i;

  if (strcmp (metacontext, LIBNBD_CONTEXT_BASE_ALLOCATION) != 0 || *error)
    return 0;
  for (i = 0; i + 1 < nr && m->n < MAP_MAX_EXTENTS && pos < end; i += 2) {
    uint64_t l = MIN ((uint64_t) entries[i], end - pos);
    enum backing_extent_type t = ext_type (entries[i + 1]);
    if (l == 0)
      break;
    if (m->n > 0 && m->e[m->n - 1].type == t &&
        m->e[m->n - 1].off + m->e[m->n - 1].len == pos)
      m->e[m->n - 1].len += l;
    else
      m->e[m->n++] = (struct ext_slot) { .off = pos, .len = l, .type = t };
    pos += l;
  }
  return 0;
}

static int64_t
call_block_status (struct nbd_handle *h, void *arg, nbd_completion_callback cb)
{
  struct map_req *m = arg;

  m->n = 0;
  return nbd_aio_block_status (h, m->count, m->off,
                               (nbd_extent_callback) {
                                 .callback = map_extent_cb, .user_data = m },
                               cb, 0);
}

static int
nbdb_map (struct backing *b, uint64_t off, uint64_t len,
          struct backing_extent *ext)
{
  struct nbdb_backing *nb = to_nbd (b);
  struct map_req *m;
  uint64_t gen, epoch;
  unsigned i;

  if (len == 0 || backing_check_range (b, len, off, 0) == -1) {
    errno = EINVAL;
    return -1;
  }
  ext->offset = off;
  ext->length = len;
  ext->type = BACKING_DATA;
  if (!nb->has_map || ext_lookup (nb, off, len, ext))
    return 0;

  m = malloc (sizeof *m);       /* a miss costs a round trip anyway */
  if (!m)
    return -1;
  m->off = off;
  /* One round trip answers for a lot more than this call needs. */
  m->count = MIN (b->size - off, (uint64_t) NBD_MAP_LOOKAHEAD);
  epoch = atomic_load (&nb->reconnects);
  lock_or_die (&nb->ext_lock);
  gen = nb->gen;
  unlock_or_die (&nb->ext_lock);
  if (nbdb_run (nb, call_block_status, m) == -1) {
    free (m);
    return -1;
  }
  if (m->n == 0 || m->e[0].off != off) {
    free (m);                   /* nothing usable: say DATA */
    return 0;
  }
  ext->length = MIN (len, m->e[0].len);
  ext->type = m->e[0].type;

  lock_or_die (&nb->ext_lock);
  if (ext_still_valid (nb, gen, off, off + m->count))
    for (i = 0; i < m->n; i++)
      ext_store (nb, m->e[i].off, m->e[i].len, m->e[i].type, epoch);
  unlock_or_die (&nb->ext_lock);
  free (m);
  return 0;
}

/* A lookahead asked for without waiting (nbdb_map_cached's miss): its
 * answer goes into the extent cache, as nbdb_map's does.  One at a time. */
struct map_async {
  struct nbdb_backing *nb;
  uint64_t gen, epoch;
  struct map_req m;
};

/* On the poller (or inside nbdb_run_async). */
static void
map_async_done (void *opaque, int err)
{
  struct map_async *x = opaque;
  struct nbdb_backing *nb = x->nb;

  lock_or_die (&nb->ext_lock);
  if (err == 0 && ext_still_valid (nb, x->gen, x->m.off, x->m.off + x->m.count))
    for (unsigned i = 0; i < x->m.n; i++)
      ext_store (nb, x->m.e[i].off, x->m.e[i].len, x->m.e[i].type, x->epoch);
  nb->map_async = NULL;
  unlock_or_die (&nb->ext_lock);
  free (x);
}

static void
map_async_start (struct nbdb_backing *nb, uint64_t off)
{
  struct map_async *x = malloc (sizeof *x);

  if (x == NULL)
    return;
  lock_or_die (&nb->ext_lock);
  if (nb->map_async != NULL) {
    unlock_or_die (&nb->ext_lock);
    free (x);
    return;
  }
  nb->map_async = x;
  x->gen = nb->gen;
  unlock_or_die (&nb->ext_lock);
  x->nb = nb;
  x->epoch = atomic_load (&nb->reconnects);
  x->m.off = off;
  x->m.count = MIN (nb->b.size - off, (uint64_t) NBD_MAP_LOOKAHEAD);
  /* From here on x is the completion's (it may have run already). */
  if (nbdb_run_async (nb, call_block_status, &x->m, map_async_done, x,
                      NULL) == 0)
    return;
  lock_or_die (&nb->ext_lock);
  nb->map_async = NULL;
  unlock_or_die (&nb->ext_lock);
  free (x);
}

/* Only the extent cache: a loop thread may ask.  A miss asks the remote
 * in the background, for the next time. */
static int
nbdb_map_cached (struct backing *b, uint64_t off, uint64_t len,
                 struct backing_extent *ext)
{
  struct nbdb_backing *nb = to_nbd (b);

  if (len == 0 || backing_check_range (b, len, off, 0) == -1) {
    errno = EINVAL;
    return -1;
  }
  *ext = (struct backing_extent) { off, len, BACKING_DATA };
  if (!nb->has_map || ext_lookup (nb, off, len, ext))
    return 0;
  map_async_start (nb, off);
  errno = EAGAIN;
  return -1;
}

static void
nbdb_stats (struct backing *b, struct backing_stats *st)
{
  struct nbdb_backing *nb = to_nbd (b);

  st->reconnects = atomic_load (&nb->reconnects);
  st->retries = atomic_load (&nb->retries);
  st->errors = atomic_load (&nb->errors);
  st->writes_in_doubt = atomic_load (&nb->in_doubt);
}

static void
nbdb_set_deadline (struct backing *b, uint64_t deadline_ms)
{
  nbdb_conns_set_deadline (to_nbd (b), deadline_ms);
}

static void
nbdb_close (struct backing *b)
{
  struct nbdb_backing *nb = to_nbd (b);

  nbdb_conns_stop (nb);
  free (nb->map_async);         /* a lookahead closing left unanswered */
  free (nb->zero_buf);
  free (nb->uri);
  free (nb->tls_certificates);
  free (nb->tls_psk_file);
  free (nb->tls_username);
  free (nb->id_desc);
  pthread_mutex_destroy (&nb->ext_lock);
  pthread_mutex_destroy (&nb->id_lock);
  free (nb);
}

static const struct backing_ops nbdb_ops = {
  .name = "nbd",
  .read = nbdb_read,
  .read_async = nbdb_read_async,
  .write = nbdb_write,
  .zero = nbdb_zero,
  .trim = nbdb_trim,
  .flush = nbdb_flush,
  .map = nbdb_map,
  .map_cached = nbdb_map_cached,
  .loss_epoch = nbdb_loss_epoch,
  .clear_doubt = nbdb_clear_doubt,
  .stats = nbdb_stats,
  .set_deadline = nbdb_set_deadline,
  .close = nbdb_close,
};

static char *
dup_opt (const char *s, int *oom)
{
  char *d;

  if (!s)
    return NULL;
  d = strdup (s);
  if (!d)
    *oom = 1;
  return d;
}

/* Fill size and caps from the first connection. */
static int
read_caps (struct nbdb_backing *nb, struct nbd_handle *h,
           const struct backing_opts *o, char *err, size_t errlen)
{
  int64_t size = nbd_get_size (h), maxb;

  if (size < 0) {
    snprintf (err, errlen, "%s: %s", nb->uri, nbd_get_error ());
    return -1;
  }
  nb->b.size = size;
  nb->b.io_align = 1;
  /* Volatile: the remote may keep acknowledged writes in a cache of its
   * own until a flush, and lose them if it restarts. */
  nb->b.caps |= BACKING_REMOTE | BACKING_VOLATILE;
  nb->can_fua = nbd_can_fua (h) == 1;
  nb->can_flush = nbd_can_flush (h) == 1;
  nb->can_trim = nbd_can_trim (h) == 1;
  nb->can_zero = nbd_can_zero (h) == 1;
  nb->can_fast_zero = nbd_can_fast_zero (h) == 1;
  nb->has_map = nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1;
  maxb = nbd_get_block_size (h, LIBNBD_SIZE_MAXIMUM);
  nb->max_io = maxb > 0 ? MIN ((uint64_t) maxb, NBD_MAX_IO) : NBD_MAX_IO;

  if (o->read_only || nbd_is_read_only (h) == 1)
    nb->b.caps |= BACKING_READ_ONLY;
  else {
    if (nb->can_trim)
      nb->b.caps |= BACKING_CAN_TRIM;
    if (nb->can_zero)
      nb->b.caps |= BACKING_CAN_ZERO;
    if (nb->can_fast_zero)
      nb->b.caps |= BACKING_CAN_FAST_ZERO;
    if (nb->can_fua)
      nb->b.caps |= BACKING_CAN_FUA;
  }
  if (nb->has_map)
    nb->b.caps |= BACKING_CAN_MAP;
  if (nbd_can_multi_conn (h) == 1)
    nb->b.caps |= BACKING_CAN_MULTI_CONN;
  nb->id_flags = nbdb_id_flags (h);
  nb->id_desc = nbdb_id_desc (h);
  return 0;
}

struct backing *
backing_nbd_open (const char *uri, const struct backing_opts *o,
                  char *err, size_t errlen)
{
  static const struct backing_opts defaults;
  struct nbdb_backing *nb;
  struct nbd_handle *h;
  int oom = 0;
  unsigned want;
  uint64_t end;

  if (!o)
    o = &defaults;
  nb = calloc (1, sizeof *nb);
  if (!nb) {
    snprintf (err, errlen, "%s: out of memory", uri);
    return NULL;
  }
  nb->b.ops = &nbdb_ops;
  pthread_mutex_init (&nb->ext_lock, NULL);
  pthread_mutex_init (&nb->id_lock, NULL);
  nb->uri = dup_opt (uri, &oom);
  nb->tls_certificates = dup_opt (o->tls_certificates, &oom);
  nb->tls_psk_file = dup_opt (o->tls_psk_file, &oom);
  nb->tls_username = dup_opt (o->tls_username, &oom);
  nb->retry_timeout_ms = o->retry_timeout_ms ? o->retry_timeout_ms
                                             : NBD_DEFAULT_RETRY_MS;
  nb->request_timeout_ms = o->request_timeout_ms ? o->request_timeout_ms
                                                 : NBD_DEFAULT_REQUEST_MS;
  if (oom) {
    snprintf (err, errlen, "%s: out of memory", uri);
    goto fail;
  }

  /* One bound for the whole open: the first connection's handshake and
   * then the others', side by side. */
  end = nbdb_open_end (nb);
  h = nbdb_conn_open (nb, end, err, errlen);
  if (!h)
    goto fail;
  if (read_caps (nb, h, o, err, errlen) == -1) {
    nbd_close (h);
    goto fail;
  }
  want = o->connections ? MIN (o->connections, NBD_MAX_CONNS)
                        : NBD_DEFAULT_CONNS;
  if (!(nb->b.caps & BACKING_CAN_MULTI_CONN))
    want = 1;
  if (nbdb_conns_start (nb, h, want, end, err, errlen) == -1)
    goto fail;

  if (!nb->can_zero && !(nb->b.caps & BACKING_READ_ONLY)) {
    nb->zero_buf = calloc (1, NBD_ZERO_BUF);
    if (!nb->zero_buf) {
      snprintf (err, errlen, "%s: out of memory", uri);
      goto fail;
    }
  }
  return &nb->b;

 fail:
  nbdb_close (&nb->b);
  return NULL;
}
