/* The rbd backing: a Ceph RBD image through librbd's asynchronous C API.
 *
 * Spec: rbd:POOL/IMAGE or rbd:POOL/IMAGE@SNAP (a snapshot: read-only).
 * The cluster comes from backing_opts.ceph_conf (else librados' default
 * search), the client name from ceph_id (default "admin"), the key from
 * the keyring the conf names or ceph_keyring.
 *
 * Requests: every op is one librbd aio request whose completion callback
 * (on librbd's own thread) finishes it; no thread per request.  A blocking
 * op issues and waits on its request; read_async hands the completion to
 * the caller.  librbd cannot cancel a request, so a request not finished
 * within request-timeout is finished by the reaper thread with ETIMEDOUT
 * and "abandoned": librbd still owns its memory (reads go into a buffer
 * of the request, never the caller's, for that reason) until its own
 * callback comes, which then only frees it.  An abandoned write-class
 * request may still land, over whatever was written since: it is a write
 * in doubt (backing_ops.clear_doubt, reported in stats) until librbd ends
 * it or the operator clears it, and meanwhile a flush (and so FUA, an
 * op and a flush) fails with EIO, the flush not sent.  Its end, once it
 * was issued, is the backing's one loss fact for the cache's ledger
 * (backing_ops.loss_epoch): it may have landed over blocks written back
 * since, so they are written again before a flush succeeds.
 *
 * Durability: foliod turns librbd's own cache off (rbd_cache=false: foliod
 * is the cache), so a completed write is on the OSDs; the backing still
 * says its writes are volatile until a flush (BACKING_VOLATILE), and a
 * flush, or the flush of a FUA op, that fails is only returned: the
 * cache's ledger alone decides it was a loss (its rule: writes were sent
 * since the last good flush) and writes those blocks again.
 *
 * Opening and closing wait for the cluster without a bound inside
 * librados: each runs on a thread of its own, waited for request-timeout
 * (opening: see struct rbd_opening) or the shutdown deadline (closing).
 *
 * One writer per image: a writable image is opened with its exclusive
 * lock taken (rbd_lock_acquire, which also makes librbd refuse to hand
 * the lock to another client that asks); an image whose lock another
 * client holds is refused.  The lock goes with close.
 *
 * Mapping: rbd_diff_iterate2 blocks (it waits behind requests in flight,
 * with no bound), so it runs once, at open, over the whole image (whole
 * objects; from the object map with the fast-diff feature): which
 * object-sized chunks of the image may hold data.  Every write marks its
 * chunks before it is issued; zero and trim leave them marked (data that
 * reads as zeroes is still honest).  A chunk never marked reads as zeroes:
 * a hole.  That stays true because foliod is the image's only writer (the
 * lock); a read-only export of an image someone else may write, and an
 * image without fast-diff, say "data" everywhere instead.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <rados/librados.h>
#include <rbd/librbd.h>

#include "backing/rbd-fence.h"
#include "foliod/backing.h"
#include "foliod/lock.h"
#include "foliod/log.h"
#include "foliod/minmax.h"
#include "foliod/util.h"

#define RBD_DEFAULT_REQUEST_MS 30000
#define RBD_REAPER_TICK_MS     100
#define RBD_PROBE_MS           2000     /* down: one request let through */
#define RBD_ABANDONED_MAX      (64ull << 20)  /* bytes librbd may keep */

enum rreq_kind { RREQ_READ, RREQ_WRITE, RREQ_ZERO, RREQ_TRIM, RREQ_FLUSH };

struct rbdb_backing;

/* Who waits for a request: a blocked caller (w) or read_async's done. */
struct rwait {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int finished;
  int err;                      /* 0 or an errno value */
};

/* One librbd request.  Owned by librbd once issued: its callback frees
 * it, always (a request is finished before that by the callback, or by
 * the reaper at its deadline, which then never touches it again). */
struct rreq {
  struct rbdb_backing *rb;
  rbd_completion_t c;
  enum rreq_kind kind;
  int claimed;                  /* finished; under rb->lock */
  uint64_t deadline;            /* now_ms() time; under rb->lock */
  uint64_t doubt_gen;           /* abandoned write: rb->doubt_gen then */
  struct rreq *prev, *next;     /* rb->inflight, under rb->lock */

  char *bounce;                 /* reads: librbd writes here */
  void *user_buf;
  uint64_t len;

  struct rwait *w;              /* a blocked caller, or: */
  void (*done) (void *opaque, int err);
  void *opaque;
};

struct rbdb_backing {
  struct backing b;
  char *name;                   /* "POOL/IMAGE[@SNAP]" for messages */
  rados_t cluster;
  rados_ioctx_t io;
  rbd_image_t image;
  int locked;                   /* we hold the exclusive lock */
  struct rbd_fence *fence;      /* is the image still ours? (locked) */
  _Atomic uint64_t *chunks;     /* may-hold-data bits, see Mapping */
  uint64_t chunk_size;          /* the image's object size */

  unsigned request_timeout_ms;
  _Atomic uint64_t deadline;    /* shutdown deadline, 0: none */

  pthread_mutex_t lock;         /* inflight list, stop */
  pthread_cond_t tick;
  struct rreq *inflight;
  int stop;
  int closed;                   /* closer_main is done */
  pthread_t reaper;
  int reaper_started;

  /* Abandoned write-class ops that ended after they were issued (see
   * doubt_end): backing_ops.loss_epoch. */
  atomic_uint_fast64_t loss_epoch;
  /* Abandoned write-class ops librbd still holds (they may land), and
   * those of them in doubt: all but the ones the operator cleared
   * (clear_doubt moves doubt_gen).  Changed under lock. */
  atomic_uint_fast64_t writes_out;
  atomic_uint_fast64_t in_doubt;
  uint64_t doubt_gen;
  atomic_uint_fast64_t abandoned;  /* abandoned ops of any kind still out */
  atomic_uint_fast64_t abandoned_bytes; /* what librbd keeps for them */
  atomic_uint_fast64_t abandoned_total; /* every op ever abandoned */
  atomic_uint_fast64_t errors;
  /* Down (see rbd_may_issue): now_ms() of the first request abandoned
   * since the cluster last answered, 0: up. */
  _Atomic uint64_t down_since;
  _Atomic uint64_t next_probe;
};

static inline struct rbdb_backing *
to_rbd (struct backing *b)
{
  return (struct rbdb_backing *) b;
}

/* ---- the allocation bitmap (see Mapping) ---- */

static int
chunk_test (struct rbdb_backing *rb, uint64_t i)
{
  return (atomic_load (&rb->chunks[i / 64]) >> (i % 64)) & 1;
}

/* Mark [off, off+len) as possibly holding data. */
static void
chunks_mark (struct rbdb_backing *rb, uint64_t off, uint64_t len)
{
  uint64_t i;

  if (!rb->chunks || len == 0)
    return;
  for (i = off / rb->chunk_size; i <= (off + len - 1) / rb->chunk_size; i++)
    if (!chunk_test (rb, i))
      atomic_fetch_or (&rb->chunks[i / 64], (uint64_t) 1 << (i % 64));
}

static int
diff_cb (uint64_t off, size_t len, int exists, void *arg)
{
  if (exists)
    chunks_mark (arg, off, len);
  return 0;
}

/* Build the bitmap from the image's allocation.  0, or -1: no map. */
static int
chunks_load (struct rbdb_backing *rb, uint64_t obj_size)
{
  uint64_t n;

  if (obj_size == 0)
    return -1;
  rb->chunk_size = obj_size;
  n = (rb->b.size + obj_size - 1) / obj_size;
  rb->chunks = calloc (n / 64 + 1, sizeof *rb->chunks);
  if (!rb->chunks)
    return -1;
  if (rbd_diff_iterate2 (rb->image, NULL, 0, rb->b.size, 1, 1, diff_cb,
                         rb) < 0) {
    free (rb->chunks);
    rb->chunks = NULL;
    return -1;
  }
  return 0;
}

static int
write_class (enum rreq_kind k)
{
  return k == RREQ_WRITE || k == RREQ_ZERO || k == RREQ_TRIM;
}

static void
rreq_free (struct rreq *q)
{
  free (q->bounce);
  free (q);
}

/* Under rb->lock. */
static void
list_add (struct rbdb_backing *rb, struct rreq *q)
{
  q->prev = NULL;
  q->next = rb->inflight;
  if (q->next)
    q->next->prev = q;
  rb->inflight = q;
}

/* Under rb->lock. */
static void
list_del (struct rbdb_backing *rb, struct rreq *q)
{
  if (q->prev)
    q->prev->next = q->next;
  else if (rb->inflight == q)
    rb->inflight = q->next;
  if (q->next)
    q->next->prev = q->prev;
  q->prev = q->next = NULL;
}

/* How to tell the waiter, copied out of the request (the reaper may not
 * touch the request once it lets go of rb->lock). */
struct rdeliver {
  struct rwait *w;
  void (*done) (void *opaque, int err);
  void *opaque;
};

/* Claim q for finishing; under rb->lock.  1 when it was not yet. */
static int
rreq_claim (struct rreq *q, struct rdeliver *d)
{
  if (q->claimed)
    return 0;
  q->claimed = 1;
  list_del (q->rb, q);
  *d = (struct rdeliver) { q->w, q->done, q->opaque };
  return 1;
}

static void
deliver (struct rbdb_backing *rb, const struct rdeliver *d, int err)
{
  if (err)
    atomic_fetch_add (&rb->errors, 1);
  if (d->done) {
    d->done (d->opaque, err);
    return;
  }
  lock_or_die (&d->w->lock);
  d->w->err = err;
  d->w->finished = 1;
  pthread_cond_signal (&d->w->cond);
  unlock_or_die (&d->w->lock);
}

/* The cluster answered (a request completed, even with an error): up. */
static void
rbd_note_answer (struct rbdb_backing *rb)
{
  if (atomic_load (&rb->down_since) && atomic_exchange (&rb->down_since, 0))
    log_info ("rbd %s: the cluster answers again", rb->name);
}

/* A request was abandoned at its deadline: down, unless already. */
static void
rbd_note_abandoned (struct rbdb_backing *rb, uint64_t now)
{
  uint64_t zero = 0;

  atomic_store (&rb->next_probe, now + RBD_PROBE_MS);
  if (atomic_compare_exchange_strong (&rb->down_since, &zero, now))
    log_warn ("rbd %s: no answer within request-timeout (%u ms): down; "
              "requests fail at once but one probe every %u ms, until "
              "the cluster answers", rb->name, rb->request_timeout_ms,
              RBD_PROBE_MS);
}

/* May a request of len bytes be issued now?  Not while the cluster is
 * down (a request abandoned, none answered since), but for one probe per
 * RBD_PROBE_MS: every request would otherwise wait the full timeout
 * through an outage (the nbd backing's down state does the same).  Not
 * when what librbd keeps for abandoned requests would pass
 * RBD_ABANDONED_MAX either: librbd cannot cancel, it holds each
 * abandoned request's buffer until the cluster returns. */
static int
rbd_may_issue (struct rbdb_backing *rb, uint64_t len)
{
  uint64_t held = atomic_load (&rb->abandoned_bytes);
  uint64_t now, probe;

  if (held > 0 && held + len > RBD_ABANDONED_MAX)
    return 0;
  if (!atomic_load (&rb->down_since))
    return 1;
  now = now_ms ();
  probe = atomic_load (&rb->next_probe);
  return now >= probe &&
    atomic_compare_exchange_strong (&rb->next_probe, &probe,
                                    now + RBD_PROBE_MS);
}

/* The image is no longer ours (see rbd-fence.c): nothing more may be
 * written to it, nor flushed as if what we wrote were kept. */
static int
rbd_fenced (struct rbdb_backing *rb)
{
  return rb->fence && rbd_fence_lost (rb->fence);
}

/* An abandoned write-class request: in doubt (under rb->lock). */
static void
doubt_add (struct rbdb_backing *rb, struct rreq *q)
{
  q->doubt_gen = rb->doubt_gen;
  atomic_fetch_add (&rb->writes_out, 1);
  atomic_fetch_add (&rb->in_doubt, 1);
}

enum doubt_ended { DOUBT_GOES_ON, DOUBT_OVER, DOUBT_AFTER_CLEAR };

/* An abandoned write-class request ended (under rb->lock): issued, it
 * may have landed over what was written since it was given up on, a
 * fact for the cache's ledger (loss_epoch), counted before the doubt
 * ends so that a flush that finds the doubt gone finds the fact too.  Not
 * in doubt any more, unless the operator cleared it already.  What to
 * log (doubt_log, without the lock). */
static enum doubt_ended
doubt_end (struct rbdb_backing *rb, struct rreq *q, int issued)
{
  if (issued)
    atomic_fetch_add (&rb->loss_epoch, 1);
  atomic_fetch_sub (&rb->writes_out, 1);
  if (q->doubt_gen == rb->doubt_gen)
    return atomic_fetch_sub (&rb->in_doubt, 1) == 1 ? DOUBT_OVER
                                                    : DOUBT_GOES_ON;
  return issued ? DOUBT_AFTER_CLEAR : DOUBT_GOES_ON;
}

static void
doubt_log (struct rbdb_backing *rb, enum doubt_ended e)
{
  if (e == DOUBT_OVER)
    log_info ("rbd %s: the abandoned writes have ended: no longer in "
              "doubt (what was written since is written again)", rb->name);
  else if (e == DOUBT_AFTER_CLEAR)
    log_warn ("rbd %s: a write abandoned at request-timeout ended after "
              "clear-doubt: it may have landed over data written since",
              rb->name);
}

/* librbd's completion callback, on its thread. */
static void
rreq_complete (rbd_completion_t c, void *arg)
{
  struct rreq *q = arg;
  struct rbdb_backing *rb = q->rb;
  struct rdeliver d;
  ssize_t r = rbd_aio_get_return_value (c);
  enum doubt_ended ended = DOUBT_GOES_ON;
  int err = 0, mine;

  if (r < 0)
    err = (int) -r;
  else if (q->kind == RREQ_READ && (uint64_t) r != q->len)
    err = EIO;                  /* a short read from librbd: never seen */
  if (r < 0 && rb->fence)
    rbd_fence_note_error (rb->fence, err);
  rbd_note_answer (rb);
  lock_or_die (&rb->lock);
  mine = rreq_claim (q, &d);
  if (!mine) {
    /* The reaper gave up on it before: it has ended now. */
    if (write_class (q->kind))
      ended = doubt_end (rb, q, 1);
    atomic_fetch_sub (&rb->abandoned_bytes, q->len);
    atomic_fetch_sub (&rb->abandoned, 1);
  }
  unlock_or_die (&rb->lock);
  doubt_log (rb, ended);
  if (mine) {
    if (q->kind == RREQ_READ && err == 0)
      memcpy (q->user_buf, q->bounce, q->len);
    deliver (rb, &d, err);
  }
  rbd_aio_release (c);
  rreq_free (q);
}

/* The request's deadline: request-timeout, or the shutdown deadline. */
static uint64_t
deadline_for (struct rbdb_backing *rb)
{
  uint64_t end = now_ms () + rb->request_timeout_ms;
  uint64_t d = atomic_load (&rb->deadline);

  return d && d < end ? d : end;
}

/* Finish every request past its deadline with ETIMEDOUT: "abandoned",
 * librbd keeps it (and its memory) until its callback. */
static void *
reaper_main (void *arg)
{
  struct rbdb_backing *rb = arg;

  lock_or_die (&rb->lock);
  while (!rb->stop) {
    uint64_t now = now_ms ();
    struct rreq *q;
    struct rdeliver d;
    int late = 0;

    for (q = rb->inflight; q; q = q->next)
      if (q->deadline <= now) {
        late = rreq_claim (q, &d);
        atomic_fetch_add (&rb->abandoned, 1);
        atomic_fetch_add (&rb->abandoned_total, 1);
        atomic_fetch_add (&rb->abandoned_bytes, q->len);
        if (write_class (q->kind))
          doubt_add (rb, q);
        /* At shutdown a request ends at the deadline, not for want of
         * an answer within request-timeout. */
        if (!atomic_load (&rb->deadline))
          rbd_note_abandoned (rb, now);
        break;
      }
    if (late) {
      unlock_or_die (&rb->lock);
      deliver (rb, &d, ETIMEDOUT);
      lock_or_die (&rb->lock);
      continue;
    }
    cond_wait_ms (&rb->tick, &rb->lock, RBD_REAPER_TICK_MS);
  }
  unlock_or_die (&rb->lock);
  return NULL;
}

static struct rreq *
rreq_new (struct rbdb_backing *rb, enum rreq_kind kind, void *buf,
          uint64_t len)
{
  struct rreq *q = calloc (1, sizeof *q);

  if (!q)
    return NULL;
  q->rb = rb;
  q->kind = kind;
  q->user_buf = buf;
  q->len = len;
  if (kind == RREQ_READ && !(q->bounce = malloc (len ? len : 1))) {
    free (q);
    return NULL;
  }
  return q;
}

/* Hand q to librbd.  0 when issued: q is then finished exactly once (its
 * waiter told) and freed by librbd's callback.  -1 with errno when not
 * (q freed, nobody told). */
static int
rreq_issue (struct rreq *q, uint64_t off, const void *wbuf)
{
  struct rbdb_backing *rb = q->rb;
  struct rdeliver d;
  enum doubt_ended ended = DOUBT_GOES_ON;
  int r, was_claimed;

  if (!rbd_may_issue (rb, q->len)) {
    rreq_free (q);
    errno = ETIMEDOUT;
    return -1;
  }
  if (q->kind != RREQ_READ && rbd_fenced (rb)) {
    rreq_free (q);
    errno = EIO;
    return -1;
  }
  if (rbd_aio_create_completion (q, rreq_complete, &q->c) < 0) {
    rreq_free (q);
    errno = ENOMEM;
    return -1;
  }
  if (q->kind == RREQ_WRITE)
    chunks_mark (rb, off, q->len);
  lock_or_die (&rb->lock);
  q->deadline = deadline_for (rb);
  list_add (rb, q);
  unlock_or_die (&rb->lock);

  switch (q->kind) {
  case RREQ_READ:
    r = rbd_aio_read (rb->image, off, q->len, q->bounce, q->c);
    break;
  case RREQ_WRITE:              /* librbd copies the data (zero copy off) */
    r = rbd_aio_write (rb->image, off, q->len, wbuf, q->c);
    break;
  case RREQ_ZERO:
    r = rbd_aio_write_zeroes (rb->image, off, q->len, q->c, 0, 0);
    break;
  case RREQ_TRIM:
    r = rbd_aio_discard (rb->image, off, q->len, q->c);
    break;
  default:
    r = rbd_aio_flush (rb->image, q->c);
    break;
  }
  if (r >= 0)
    return 0;
  /* Not issued: librbd will not call back.  Unless the reaper told the
   * waiter already (then this is a request that failed, reported). */
  lock_or_die (&rb->lock);
  was_claimed = !rreq_claim (q, &d);
  if (was_claimed) {
    atomic_fetch_sub (&rb->abandoned_bytes, q->len);
    atomic_fetch_sub (&rb->abandoned, 1);
    if (write_class (q->kind))
      ended = doubt_end (rb, q, 0);   /* never issued: it cannot land */
  }
  unlock_or_die (&rb->lock);
  doubt_log (rb, ended);
  rbd_aio_release (q->c);
  rreq_free (q);
  if (was_claimed)
    return 0;
  errno = -r;
  return -1;
}

/* Issue and wait.  The reaper finishes the request by its deadline; the
 * wait is in slices so that a lost wake-up cannot hold it forever. */
static int
rreq_run (struct rbdb_backing *rb, enum rreq_kind kind, void *buf,
          uint64_t len, uint64_t off)
{
  struct rwait w = { .finished = 0 };
  struct rreq *q = rreq_new (rb, kind, buf, len);
  int err;

  if (!q)
    return -1;
  pthread_mutex_init (&w.lock, NULL);
  if (cond_init_monotonic (&w.cond) != 0) {
    pthread_mutex_destroy (&w.lock);
    rreq_free (q);
    errno = ENOMEM;
    return -1;
  }
  q->w = &w;
  if (rreq_issue (q, off, buf) == -1)
    err = errno;
  else {
    lock_or_die (&w.lock);
    while (!w.finished)
      cond_wait_ms (&w.cond, &w.lock, RBD_REAPER_TICK_MS * 10);
    err = w.err;
    unlock_or_die (&w.lock);
  }
  pthread_mutex_destroy (&w.lock);
  pthread_cond_destroy (&w.cond);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* A write abandoned by the reaper may still land over data written
 * since: nothing is durable while one is in doubt. */
static int
rbd_doubt_check (struct rbdb_backing *rb)
{
  if (atomic_load (&rb->in_doubt) > 0) {
    errno = EIO;
    return -1;
  }
  return 0;
}

/* A failure is only returned: the cache's ledger decides whether it was
 * a loss (writes sent since its last good flush). */
static int
rbdb_flush (struct backing *b)
{
  struct rbdb_backing *rb = to_rbd (b);

  if ((b->caps & BACKING_READ_ONLY) || atomic_load (&b->released))
    return 0;     /* released: the release flushed what it wrote */
  /* Not even sent: librbd's flush would wait behind the abandoned write
   * (one more request abandoned at the timeout). */
  if (rbd_doubt_check (rb) == -1)
    return -1;
  if (rreq_run (rb, RREQ_FLUSH, NULL, 0, 0) == -1)
    return -1;
  /* A write abandoned (by the reaper) while this flush was out. */
  return rbd_doubt_check (rb);
}

/* A write-class op: FUA is op + flush (librbd has no FUA); a failed
 * flush fails the op, the ledger's rule for a failed FUA op. */
static int
write_done (struct rbdb_backing *rb, unsigned flags, int r)
{
  if (r == -1)
    return -1;
  if (flags & BACKING_FUA)
    return rbdb_flush (&rb->b);
  return 0;
}

static int
rbdb_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  if (backing_check_range (b, len, off, 0) == -1)
    return -1;
  if (len == 0)
    return 0;
  return rreq_run (to_rbd (b), RREQ_READ, buf, len, off);
}

static int
rbdb_read_async (struct backing *b, void *buf, uint64_t len, uint64_t off,
                 void (*done) (void *opaque, int err), void *opaque)
{
  struct rreq *q;

  if (backing_check_range (b, len, off, 0) == -1)
    return -1;
  if (len == 0) {
    errno = EINVAL;
    return -1;
  }
  q = rreq_new (to_rbd (b), RREQ_READ, buf, len);
  if (!q)
    return -1;
  q->done = done;
  q->opaque = opaque;
  return rreq_issue (q, off, NULL);
}

static int
rbdb_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct rbdb_backing *rb = to_rbd (b);

  if (backing_check_range (b, len, off, 1) == -1)
    return -1;
  if (len == 0)
    return 0;
  return write_done (rb, flags,
                     rreq_run (rb, RREQ_WRITE, (void *) buf, len, off));
}

static int
rbdb_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct rbdb_backing *rb = to_rbd (b);

  if (backing_check_range (b, len, off, 1) == -1)
    return -1;
  if (len == 0)
    return 0;
  /* write_zeroes sends no data (RADOS zero/truncate/delete ops): fast. */
  return write_done (rb, flags, rreq_run (rb, RREQ_ZERO, NULL, len, off));
}

static int
rbdb_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct rbdb_backing *rb = to_rbd (b);

  if (backing_check_range (b, len, off, 1) == -1)
    return -1;
  if (len == 0)
    return 0;
  return write_done (rb, flags, rreq_run (rb, RREQ_TRIM, NULL, len, off));
}

static int
rbdb_map (struct backing *b, uint64_t off, uint64_t len,
          struct backing_extent *ext)
{
  struct rbdb_backing *rb = to_rbd (b);
  uint64_t i, end;
  int state;

  if (len == 0 || backing_check_range (b, len, off, 0) == -1) {
    errno = EINVAL;
    return -1;
  }
  ext->offset = off;
  ext->length = len;
  ext->type = BACKING_DATA;
  if (!rb->chunks)
    return 0;
  /* The run of chunks in the same state as off's. */
  i = off / rb->chunk_size;
  state = chunk_test (rb, i);
  end = (i + 1) * rb->chunk_size;
  while (end < off + len && chunk_test (rb, end / rb->chunk_size) == state)
    end += rb->chunk_size;
  ext->length = MIN (end, off + len) - off;
  ext->type = state ? BACKING_DATA : BACKING_HOLE;
  return 0;
}

static uint64_t
rbdb_loss_epoch (struct backing *b)
{
  return atomic_load (&to_rbd (b)->loss_epoch);
}

static const char *
rbdb_owner_lost (struct backing *b)
{
  struct rbdb_backing *rb = to_rbd (b);

  return rb->fence ? rbd_fence_lost (rb->fence) : NULL;
}

static int
rbdb_owner_confirm (struct backing *b)
{
  struct rbdb_backing *rb = to_rbd (b);

  return rb->fence ? rbd_fence_confirm (rb->fence) : 0;
}

static void
rbdb_stats (struct backing *b, struct backing_stats *st)
{
  st->errors = atomic_load (&to_rbd (b)->errors);
  st->abandoned = atomic_load (&to_rbd (b)->abandoned_total);
  st->writes_in_doubt = atomic_load (&to_rbd (b)->in_doubt);
}

/* The operator says the cluster will not carry out the abandoned writes
 * librbd still holds (foliod(8)); the cache's ledger has moved its epoch
 * before (cache_clear_doubt).  librbd still ends them: such an end is
 * still a fact for the ledger, and release still waits for it. */
static uint64_t
rbdb_clear_doubt (struct backing *b)
{
  struct rbdb_backing *rb = to_rbd (b);
  uint64_t n;

  lock_or_die (&rb->lock);
  n = atomic_exchange (&rb->in_doubt, 0);
  rb->doubt_gen++;
  unlock_or_die (&rb->lock);
  return n;
}

static void
rbdb_set_deadline (struct backing *b, uint64_t deadline_ms)
{
  struct rbdb_backing *rb = to_rbd (b);
  struct rreq *q;

  atomic_store (&rb->deadline, deadline_ms);
  lock_or_die (&rb->lock);
  for (q = rb->inflight; q; q = q->next)
    if (q->deadline > deadline_ms)
      q->deadline = deadline_ms;
  pthread_cond_signal (&rb->tick);
  unlock_or_die (&rb->lock);
}

/* Release the lock, close the image, disconnect: all of it talks to the
 * cluster and can wait forever for one that went away. */
static void *
closer_main (void *arg)
{
  struct rbdb_backing *rb = arg;

  if (rb->image) {
    if (rb->locked)
      (void) rbd_lock_release (rb->image);
    rbd_close (rb->image);
  }
  if (rb->io)
    rados_ioctx_destroy (rb->io);
  if (rb->cluster)
    rados_shutdown (rb->cluster);
  lock_or_die (&rb->lock);
  rb->closed = 1;
  pthread_cond_broadcast (&rb->tick);
  unlock_or_die (&rb->lock);
  return NULL;
}

static void
rbdb_close (struct backing *b)
{
  struct rbdb_backing *rb = to_rbd (b);
  uint64_t end = deadline_for (rb), now;
  pthread_t t;
  int closed;

  if (rb->reaper_started) {
    lock_or_die (&rb->lock);
    rb->stop = 1;
    pthread_cond_signal (&rb->tick);
    unlock_or_die (&rb->lock);
    pthread_join (rb->reaper, NULL);
  }
  /* The fence's check uses the image: it must end first. */
  if (rb->fence && rbd_fence_stop (rb->fence, end) == -1) {
    log_warn ("rbd:%s: the cluster does not answer: image not closed "
              "cleanly (its lock frees when its watch expires)", rb->name);
    return;
  }
  rb->fence = NULL;
  /* rbd_close waits for every request librbd still holds: with one
   * abandoned (an OSD that does not answer) it could wait forever.  Then
   * the image, the cluster handle and the requests are left to the
   * process's exit; the OSDs drop our lock when the watch times out. */
  if (atomic_load (&rb->abandoned) > 0) {
    log_warn ("rbd:%s: %lu request(s) still unanswered at close: image "
              "not closed cleanly", rb->name,
              (unsigned long) atomic_load (&rb->abandoned));
    return;
  }
  /* The same for a cluster that is gone: wait for the close until the
   * shutdown deadline (else request-timeout), then leave it. */
  if (thread_start (&t, closer_main, rb, "rbd-close") != 0)
    closer_main (rb);
  else
    pthread_detach (t);
  lock_or_die (&rb->lock);
  while (!rb->closed && (now = now_ms ()) < end)
    cond_wait_ms (&rb->tick, &rb->lock, end - now);
  closed = rb->closed;
  unlock_or_die (&rb->lock);
  if (!closed) {
    log_warn ("rbd:%s: the cluster does not answer: image not closed "
              "cleanly (its lock frees when its watch expires)", rb->name);
    return;
  }
  pthread_mutex_destroy (&rb->lock);
  pthread_cond_destroy (&rb->tick);
  free (rb->chunks);
  free (rb->name);
  free (rb);
}

/* foliod release: the exclusive lock goes, so that the next host's
 * rbd_lock_acquire gets it at once (not after a watch expires); the
 * image stays open for reads.  Not while an abandoned write may still
 * land (it would land after the next host began).  rbd_lock_release
 * waits for the cluster without a bound of its own. */
static int
rbdb_release (struct backing *b)
{
  struct rbdb_backing *rb = to_rbd (b);
  int r;

  if (!rb->locked)
    return 0;
  if (atomic_load (&rb->writes_out) > 0) {  /* cleared or not */
    errno = EBUSY;
    return -1;
  }
  if (rb->fence)
    rbd_fence_released (rb->fence, true);
  r = rbd_lock_release (rb->image);
  if (r < 0) {
    if (rb->fence)
      rbd_fence_released (rb->fence, false);
    errno = -r;
    return -1;
  }
  rb->locked = 0;
  log_info ("rbd:%s: exclusive lock released", rb->name);
  return 0;
}

static const struct backing_ops rbdb_ops = {
  .name = "rbd",
  .read = rbdb_read,
  .read_async = rbdb_read_async,
  .write = rbdb_write,
  .zero = rbdb_zero,
  .trim = rbdb_trim,
  .flush = rbdb_flush,
  .map = rbdb_map,
  .loss_epoch = rbdb_loss_epoch,
  .owner_lost = rbdb_owner_lost,
  .owner_confirm = rbdb_owner_confirm,
  .clear_doubt = rbdb_clear_doubt,
  .stats = rbdb_stats,
  .set_deadline = rbdb_set_deadline,
  .release = rbdb_release,
  .close = rbdb_close,
};

/* "POOL/IMAGE[@SNAP]" -> its parts, in buf. */
static int
parse_spec (char *buf, char **pool, char **image, char **snap)
{
  char *slash = strchr (buf, '/'), *at;

  if (!slash || slash == buf || !slash[1])
    return -1;
  *slash = '\0';
  *pool = buf;
  *image = slash + 1;
  at = strchr (*image, '@');
  *snap = NULL;
  if (at) {
    *at = '\0';
    if (!at[1])
      return -1;
    *snap = at + 1;
  }
  return **image && !strchr (*image, '/') ? 0 : -1;
}

/* Opening talks to the cluster at every step: the monitors (connect),
 * then the OSDs (the image's header, its lock, its object map), and
 * librados waits for an OSD that does not answer without a bound.  So the
 * steps run on a thread of their own, which the opener waits for until
 * request-timeout: a cluster that is down is a clear error in that time,
 * not a foliod hanging at start.  The opener and the thread share this,
 * the last one to let go frees it; an opening given up on is finished by
 * its thread alone, which then closes what it got (rbdb_close: the
 * image's lock is not kept by a foliod that said it failed). */
struct rbd_opening {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int refs;                     /* the opener and the thread; under lock */
  int finished, given_up;       /* under lock */
  const char *stage;            /* what the thread waits for; under lock */
  struct rbdb_backing *rb;
  char *buf, *pool, *image, *snap;   /* the spec's parts, in buf */
  int read_only;
  char *ceph_conf, *ceph_id, *ceph_keyring;   /* copies of the options */
  int r;                        /* the steps' result: 0 or -1 with err */
  char err[512];
};

static void
opening_stage (struct rbd_opening *op, const char *stage)
{
  lock_or_die (&op->lock);
  op->stage = stage;
  unlock_or_die (&op->lock);
}

/* Let go of op; the last one frees it. */
static void
opening_put (struct rbd_opening *op)
{
  int last;

  lock_or_die (&op->lock);
  last = --op->refs == 0;
  unlock_or_die (&op->lock);
  if (!last)
    return;
  pthread_mutex_destroy (&op->lock);
  pthread_cond_destroy (&op->cond);
  free (op->buf);
  free (op->ceph_conf);
  free (op->ceph_id);
  free (op->ceph_keyring);
  free (op);
}

static int
connect_cluster (struct rbd_opening *op)
{
  struct rbdb_backing *rb = op->rb;
  const char *id = op->ceph_id ? op->ceph_id : "admin";
  char mount_timeout[16];
  int r;

  r = rados_create (&rb->cluster, id);
  if (r < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: rados_create: %s", rb->name,
              strerror (-r));
    return -1;
  }
  r = rados_conf_read_file (rb->cluster, op->ceph_conf);
  if (r < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: cannot read ceph config "
              "%s: %s", rb->name,
              op->ceph_conf ? op->ceph_conf : "(default search)",
              strerror (-r));
    return -1;
  }
  if (op->ceph_keyring &&
      (r = rados_conf_set (rb->cluster, "keyring", op->ceph_keyring)) < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: keyring %s: %s", rb->name,
              op->ceph_keyring, strerror (-r));
    return -1;
  }
  /* foliod is the cache: librbd's would hold a second copy of the data
   * and make completed writes volatile.  Writes are copied by librbd (a
   * request abandoned at its timeout must not read the caller's buffer
   * afterwards).  rados_connect gives up on the monitors by itself at
   * request-timeout too (so that a thread given up on ends). */
  snprintf (mount_timeout, sizeof mount_timeout, "%u",
            (rb->request_timeout_ms + 999) / 1000);
  if (rados_conf_set (rb->cluster, "rbd_cache", "false") < 0 ||
      rados_conf_set (rb->cluster, "rbd_disable_zero_copy_writes", "true") < 0 ||
      rados_conf_set (rb->cluster, "client_mount_timeout",
                      mount_timeout) < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: cannot set librbd options",
              rb->name);
    return -1;
  }
  r = rados_connect (rb->cluster);
  if (r < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: cannot connect to the "
              "cluster as client.%s (config %s): %s%s", rb->name, id,
              op->ceph_conf ? op->ceph_conf : "default", strerror (-r),
              r == -ETIMEDOUT ? " (no monitor answered within "
              "request-timeout)" : "");
    return -1;
  }
  return 0;
}

/* Does the client at addr still watch the image?  A client that died
 * (foliod killed, its host gone) keeps its lock, but its watch expires
 * (osd_client_watch_timeout, 30 s by default). */
static int
owner_alive (struct rbdb_backing *rb, const char *addr)
{
  rbd_image_watcher_t w[16];
  size_t n = 16, i;
  int alive = 0;

  if (rbd_watchers_list (rb->image, w, &n) < 0)
    return 1;                   /* cannot tell: assume it is */
  for (i = 0; i < n; i++)
    if (strcmp (w[i].addr, addr) == 0)
      alive = 1;
  rbd_watchers_list_cleanup (w, n);
  return alive;
}

/* One writer per image: take the exclusive lock, unless another live
 * client holds it (a dead holder's lock librbd breaks as it acquires,
 * blocklisting that client). */
static int
take_lock (struct rbdb_backing *rb, char *err, size_t errlen)
{
  rbd_lock_mode_t mode;
  char *owners[4];
  size_t n = 4;
  int r;

  r = rbd_lock_get_owners (rb->image, &mode, owners, &n);
  if (r == 0 && n > 0 && !owner_alive (rb, owners[0]))
    rbd_lock_get_owners_cleanup (owners, n);
  else if (r == 0 && n > 0) {
    snprintf (err, errlen, "rbd:%s: image is in use: client %s holds its "
              "exclusive lock (one writer per image; stop that client or "
              "open the image read-only; a client that died frees it when "
              "its watch expires, 30 s by default)", rb->name, owners[0]);
    rbd_lock_get_owners_cleanup (owners, n);
    return -1;
  }
  r = rbd_lock_acquire (rb->image, RBD_LOCK_MODE_EXCLUSIVE);
  if (r < 0) {
    snprintf (err, errlen, "rbd:%s: cannot take the image's exclusive "
              "lock: %s%s", rb->name, strerror (-r),
              r == -EINVAL ? " (the image lacks the exclusive-lock feature)"
              : r == -EROFS || r == -EBUSY ? " (another client holds it)"
              : "");
    return -1;
  }
  rb->locked = 1;
  return 0;
}

/* The steps of opening, on the opening's thread (see struct
 * rbd_opening): connect, open the image, take its lock, read its size
 * and allocation.  0, or -1 with op->err. */
static int
open_steps (struct rbd_opening *op)
{
  struct rbdb_backing *rb = op->rb;
  const char *spec = rb->name;
  uint64_t size, features = 0, flags = 0;
  rbd_image_info_t info;
  int r;

  if (connect_cluster (op) == -1)
    return -1;
  r = rados_ioctx_create (rb->cluster, op->pool, &rb->io);
  if (r < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: pool %s: %s", spec,
              op->pool, strerror (-r));
    return -1;
  }
  opening_stage (op, "opening the image");
  r = op->read_only
      ? rbd_open_read_only (rb->io, op->image, &rb->image, op->snap)
      : rbd_open (rb->io, op->image, &rb->image, NULL);
  if (r < 0) {
    rb->image = NULL;
    snprintf (op->err, sizeof op->err, "rbd:%s: cannot open image %s%s%s "
              "in pool %s: %s", spec, op->image, op->snap ? "@" : "",
              op->snap ? op->snap : "", op->pool, strerror (-r));
    return -1;
  }
  opening_stage (op, "taking the image's exclusive lock");
  if (!op->read_only && take_lock (rb, op->err, sizeof op->err) == -1)
    return -1;
  opening_stage (op, "reading the image's size and allocation");
  r = rbd_get_size (rb->image, &size);
  if (r < 0) {
    snprintf (op->err, sizeof op->err, "rbd:%s: size: %s", spec,
              strerror (-r));
    return -1;
  }
  rb->b.size = size;
  rb->b.io_align = 1;
  rb->b.caps = BACKING_REMOTE | BACKING_VOLATILE;
  if (op->read_only)
    rb->b.caps |= BACKING_READ_ONLY;
  else
    rb->b.caps |= BACKING_CAN_TRIM | BACKING_CAN_ZERO | BACKING_CAN_FAST_ZERO;
  /* The map needs fast-diff (else diff_iterate reads every object) and
   * an image nobody else writes (ours, locked, or a snapshot). */
  if ((rb->locked || op->snap) &&
      rbd_get_features (rb->image, &features) == 0 &&
      (features & RBD_FEATURE_FAST_DIFF) &&
      rbd_get_flags (rb->image, &flags) == 0 &&
      !(flags & (RBD_FLAG_OBJECT_MAP_INVALID | RBD_FLAG_FAST_DIFF_INVALID)) &&
      rbd_stat (rb->image, &info, sizeof info) == 0 &&
      chunks_load (rb, info.obj_size) == 0)
    rb->b.caps |= BACKING_CAN_MAP;
  return 0;
}

static void *
opening_main (void *arg)
{
  struct rbd_opening *op = arg;
  int r = open_steps (op), given_up;

  lock_or_die (&op->lock);
  op->r = r;
  op->finished = 1;
  given_up = op->given_up;
  pthread_cond_signal (&op->cond);
  unlock_or_die (&op->lock);
  if (given_up)
    rbdb_close (&op->rb->b);    /* nobody else will: see rbd_opening */
  opening_put (op);
  return NULL;
}

static char *
strdup_or_null (const char *s, int *failed)
{
  char *d = s ? strdup (s) : NULL;

  if (s && !d)
    *failed = 1;
  return d;
}

/* The opening's state, with copies of what its thread needs; NULL when
 * out of memory. */
static struct rbd_opening *
opening_new (struct rbdb_backing *rb, const char *spec,
             const struct backing_opts *o)
{
  struct rbd_opening *op = calloc (1, sizeof *op);
  int failed = 0;

  if (!op)
    return NULL;
  op->rb = rb;
  op->refs = 2;
  op->stage = "connecting to the monitors";
  op->buf = strdup_or_null (spec, &failed);
  op->ceph_conf = strdup_or_null (o->ceph_conf, &failed);
  op->ceph_id = strdup_or_null (o->ceph_id, &failed);
  op->ceph_keyring = strdup_or_null (o->ceph_keyring, &failed);
  pthread_mutex_init (&op->lock, NULL);
  if (failed || cond_init_monotonic (&op->cond) != 0) {
    pthread_mutex_destroy (&op->lock);
    free (op->buf);
    free (op->ceph_conf);
    free (op->ceph_id);
    free (op->ceph_keyring);
    free (op);
    return NULL;
  }
  return op;
}

struct backing *
backing_rbd_open (const char *spec, const struct backing_opts *o,
                  char *err, size_t errlen)
{
  static const struct backing_opts defaults;
  struct rbdb_backing *rb;
  struct rbd_opening *op = NULL;
  pthread_t t;
  uint64_t end, now;
  int finished;

  if (!o)
    o = &defaults;
  rb = calloc (1, sizeof *rb);
  if (!rb || !(rb->name = strdup (spec))) {
    snprintf (err, errlen, "rbd:%s: out of memory", spec);
    free (rb);
    return NULL;
  }
  rb->b.ops = &rbdb_ops;
  pthread_mutex_init (&rb->lock, NULL);
  if (cond_init_monotonic (&rb->tick) != 0) {
    snprintf (err, errlen, "rbd:%s: cannot make a condition variable", spec);
    pthread_mutex_destroy (&rb->lock);
    free (rb->name);
    free (rb);
    return NULL;
  }
  rb->request_timeout_ms = o->request_timeout_ms ? o->request_timeout_ms
                                                 : RBD_DEFAULT_REQUEST_MS;
  op = opening_new (rb, spec, o);
  if (!op) {
    snprintf (err, errlen, "rbd:%s: out of memory", spec);
    goto fail;
  }
  if (parse_spec (op->buf, &op->pool, &op->image, &op->snap) == -1) {
    snprintf (err, errlen, "bad rbd backing \"rbd:%s\" (use rbd:POOL/IMAGE "
              "or rbd:POOL/IMAGE@SNAPSHOT)", spec);
    goto fail;
  }
  op->read_only = o->read_only || op->snap != NULL;
  if (thread_start (&t, opening_main, op, "rbd-open") != 0) {
    snprintf (err, errlen, "rbd:%s: cannot start a thread", spec);
    goto fail;
  }
  pthread_detach (t);

  end = now_ms () + rb->request_timeout_ms;
  lock_or_die (&op->lock);
  while (!op->finished && (now = now_ms ()) < end)
    cond_wait_ms (&op->cond, &op->lock, end - now);
  finished = op->finished;
  if (!finished) {
    op->given_up = 1;           /* the thread closes rb when it ends */
    snprintf (err, errlen, "rbd:%s: the cluster did not answer within "
              "request-timeout (%u ms) while %s", spec,
              rb->request_timeout_ms, op->stage);
  }
  unlock_or_die (&op->lock);
  if (!finished) {
    opening_put (op);
    return NULL;
  }
  if (op->r == -1) {
    snprintf (err, errlen, "%s", op->err);
    goto fail;
  }
  opening_put (op);
  op = NULL;
  if (thread_start (&rb->reaper, reaper_main, rb, "rbd-reaper") != 0) {
    snprintf (err, errlen, "rbd:%s: cannot start a thread", spec);
    goto fail;
  }
  rb->reaper_started = 1;
  if (rb->locked && !(rb->fence = rbd_fence_start (rb->image, rb->name,
                                                   rb->request_timeout_ms))) {
    snprintf (err, errlen, "rbd:%s: cannot watch the image: %s", spec,
              strerror (errno));
    goto fail;
  }
  return &rb->b;

 fail:
  if (op) {
    lock_or_die (&op->lock);
    if (!op->finished)
      op->refs--;               /* no thread was started */
    unlock_or_die (&op->lock);
    opening_put (op);
  }
  rbdb_close (&rb->b);
  return NULL;
}
