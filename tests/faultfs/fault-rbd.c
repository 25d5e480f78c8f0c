/* An LD_PRELOAD fault layer for librbd in a real process (issue 33): the
 * rbd backing's (src/backing/rbd.c) asynchronous librbd calls as a bad
 * day could answer them.  fault-preload.c does this for a file's system
 * calls; this does it one level up, at the C API the rbd backing uses
 * for its data: rbd_aio_create_completion, rbd_aio_read, rbd_aio_write,
 * rbd_aio_write_zeroes, rbd_aio_discard, rbd_aio_flush,
 * rbd_aio_get_return_value, rbd_aio_release, and rbd_close.
 *
 * foliod turns librbd's cache off, so on a healthy cluster a completed
 * write is on the OSDs; the rbd backing still calls its writes volatile
 * until a flush (BACKING_VOLATILE), and this layer holds it to that, as
 * the unit fault model's "rbd" rule does below a fake backing:
 *
 *   FAULT_RBD=1        on (unset: inert)
 *   FAULT_SEED=N       the random stream (default 0)
 *   FAULT_WRITE_ERR=M  per mille of writes, zeroes and discards that fail
 *                      with EIO, nothing sent (default 0)
 *   FAULT_SYNC_FAIL=M  per mille of flushes that fail with EIO when writes
 *                      are unflushed: every write since the last good
 *                      flush is undone (its pre-image put back, newest
 *                      first); the next flush succeeds (default 0)
 *   FAULT_LATE=M       per mille of writes, zeroes and discards held
 *                      FAULT_LATE_MS (default 3000) before they are sent:
 *                      past foliod's request-timeout, foliod abandons
 *                      them (writes in doubt) and they land later, over
 *                      whatever was written meanwhile (default 0)
 *   FAULT_POWER_AT=N   before the Nth write-class op or flush (counted
 *                      from 1): a power cut.  Each 512-byte sector of
 *                      each unflushed write keeps its new data or gets
 *                      its pre-image back, at random (newest first); held
 *                      writes are never sent; then the process SIGKILLs
 *                      itself
 *   FAULT_LOG=PATH     one line per injected fault, appended
 *   FAULT_LOG_ALL=1    also a line per write sent and flush (a trace)
 *
 * Every completion foliod sees is the layer's own ("struct comp"): a
 * request sent to librbd gets a real completion whose callback fills the
 * layer's in and calls foliod's; an injected failure is called back from
 * the layer's thread, never from inside the call that issued it.  The
 * undo journal reads each write's pre-image (rbd_read, synchronously,
 * before the write is sent).  Undoing waits until no write the layer
 * sent is in flight and holds new ones back meanwhile, so that an undo
 * never lands under a newer write.  A flush that succeeds retires the
 * writes that had completed when it was sent.  rbd_close first sends the
 * held writes and waits for them: the image handle dies with the close. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <fcntl.h>

#include <rbd/librbd.h>

#include "fault-common.h"

#define SECT        512
#define COMP_MAGIC  0x66726264u         /* "frbd" */
#define JOURNAL_MAX ((uint64_t) 1 << 30)
#define QUIESCE_MS  20000

enum kind { K_READ, K_WRITE, K_ZERO, K_DISCARD, K_FLUSH };
static const char *kind_names[] = { "read", "write", "zero", "discard",
                                    "flush" };

/* A completion as foliod sees it. */
struct comp {
  uint32_t magic;
  void *arg;
  rbd_callback_t cb;
  ssize_t ret;
  /* While sent: */
  enum kind kind;
  struct undo *u;               /* its journal entry (write class) */
  uint64_t flush_mark;          /* a flush: completions it covers */
};

/* A write sent, with what it wrote over. */
struct undo {
  struct undo *next;            /* journal: oldest first */
  rbd_image_t image;
  uint64_t off, len;
  uint64_t done;                /* completion clock when done, 0 in flight */
  char *pre;
};

/* Held for later: an injected failure to call back, or a late write. */
struct held {
  struct held *next;
  uint64_t due_ms;
  struct comp *c;
  int err;                      /* call back with -err; 0: send it */
  rbd_image_t image;
  enum kind kind;
  uint64_t off, len;
  char *buf;                    /* a write's data (copied) */
};

static struct {
  bool on, log_all;
  uint64_t rng;
  unsigned write_err, sync_fail, late, late_ms;
  uint64_t power_at, calls;
  bool failed_last;             /* the last flush was an injected failure */
  bool quiesced;                /* an undo runs: new sends wait */
  unsigned inflight;            /* write-class requests sent, not done */
  uint64_t clock;               /* completions of write-class requests */
  struct undo *head, *tail;
  uint64_t bytes;
  struct held *held;            /* by due time */
  unsigned held_n;
  int logfd;
  pthread_mutex_t lock;
  pthread_cond_t cond;          /* inflight, quiesced, held changed */
  pthread_t worker;
} F = { .logfd = -1, .lock = PTHREAD_MUTEX_INITIALIZER,
        .cond = PTHREAD_COND_INITIALIZER };

static int (*real_create) (void *, rbd_callback_t, rbd_completion_t *);
static int (*real_read) (rbd_image_t, uint64_t, size_t, char *,
                         rbd_completion_t);
static int (*real_write) (rbd_image_t, uint64_t, size_t, const char *,
                          rbd_completion_t);
static int (*real_zeroes) (rbd_image_t, uint64_t, size_t, rbd_completion_t,
                           int, int);
static int (*real_discard) (rbd_image_t, uint64_t, uint64_t,
                            rbd_completion_t);
static int (*real_flush) (rbd_image_t, rbd_completion_t);
static ssize_t (*real_ret) (rbd_completion_t);
static void (*real_release) (rbd_completion_t);
static int (*real_close) (rbd_image_t);
static ssize_t (*sync_read) (rbd_image_t, uint64_t, size_t, char *);
static ssize_t (*sync_write) (rbd_image_t, uint64_t, size_t, const char *);

static void *worker_main (void *);

static void *
real (const char *name)
{
  return fault_next ("fault-rbd", name);
}

__attribute__ ((constructor)) static void
fault_init (void)
{
  const char *log = getenv ("FAULT_LOG");

  /* Inert in a process without librbd (timeout, say, that starts it). */
  if (!fault_env_uint ("FAULT_RBD", 0) || !dlsym (RTLD_NEXT, "rbd_aio_write"))
    return;
  real_create = real ("rbd_aio_create_completion");
  real_read = real ("rbd_aio_read");
  real_write = real ("rbd_aio_write");
  real_zeroes = real ("rbd_aio_write_zeroes");
  real_discard = real ("rbd_aio_discard");
  real_flush = real ("rbd_aio_flush");
  real_ret = real ("rbd_aio_get_return_value");
  real_release = real ("rbd_aio_release");
  real_close = real ("rbd_close");
  sync_read = real ("rbd_read");
  sync_write = real ("rbd_write");
  F.rng = fault_rng_init (fault_env_uint ("FAULT_SEED", 0));
  F.write_err = fault_env_uint ("FAULT_WRITE_ERR", 0);
  F.sync_fail = fault_env_uint ("FAULT_SYNC_FAIL", 0);
  F.late = fault_env_uint ("FAULT_LATE", 0);
  F.late_ms = fault_env_uint ("FAULT_LATE_MS", 3000);
  F.power_at = fault_env_uint ("FAULT_POWER_AT", 0);
  F.log_all = fault_env_uint ("FAULT_LOG_ALL", 0) != 0;
  if (log && *log)
    F.logfd = open (log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  if (pthread_create (&F.worker, NULL, worker_main, NULL) != 0)
    abort ();
  pthread_detach (F.worker);
  F.on = true;
}

static uint64_t
rnd (void)
{
  return fault_rnd (&F.rng);
}

static bool
chance (unsigned per_mille)
{
  return fault_chance (&F.rng, per_mille);
}

static uint64_t
now_ms (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void __attribute__ ((format (printf, 1, 2)))
note (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  fault_note_v (F.logfd, write, "fault-rbd", fmt, ap);
  va_end (ap);
}

static void
lock (void)
{
  if (pthread_mutex_lock (&F.lock) != 0)
    abort ();
}

static void
unlock (void)
{
  if (pthread_mutex_unlock (&F.lock) != 0)
    abort ();
}

/* Wait on F.cond until ms from now at most; false when the time is up. */
static bool
wait_until (uint64_t end)
{
  uint64_t now = now_ms ();
  struct timespec ts;

  if (now >= end)
    return false;
  clock_gettime (CLOCK_REALTIME, &ts);
  ts.tv_sec += (end - now) / 1000;
  ts.tv_nsec += (long) ((end - now) % 1000) * 1000000;
  if (ts.tv_nsec >= 1000000000) {
    ts.tv_sec++;
    ts.tv_nsec -= 1000000000;
  }
  pthread_cond_timedwait (&F.cond, &F.lock, &ts);
  return true;
}

static struct comp *
comp_of (rbd_completion_t c)
{
  struct comp *p = c;

  if (!p || p->magic != COMP_MAGIC) {
    note ("a completion the layer did not make");
    abort ();
  }
  return p;
}

/* ---- the undo journal (under the lock, sends held back) ---- */

static void
put_back (rbd_image_t image, uint64_t off, const char *p, uint64_t len)
{
  ssize_t r = sync_write (image, off, len, p);

  if (r != (ssize_t) len) {
    note ("put back at %" PRIu64 " failed: %zd", off, r);
    abort ();
  }
}

/* Take the whole journal (under the lock): a flush that succeeds
 * meanwhile finds nothing to retire. */
static struct undo *
journal_take (void)
{
  struct undo *j = F.head;

  F.head = F.tail = NULL;
  F.bytes = 0;
  return j;
}

static size_t
journal_count (const struct undo *j)
{
  size_t n = 0;

  for (; j; j = j->next)
    n++;
  return n;
}

/* Undo a journal taken, newest first: all of it, or (torn) each 512-byte
 * sector with probability 1/2, then free it.  Returns sectors put back.
 * Called without the lock (librbd's callbacks take it), with no write in
 * flight and sends held back (F.quiesced). */
static uint64_t
undo (struct undo *j, bool torn)
{
  size_t n = journal_count (j), i = 0;
  struct undo **v;
  uint64_t sectors = 0;

  if (!n)
    return 0;
  if (!(v = malloc (n * sizeof *v)))
    abort ();
  for (struct undo *u = j; u; u = u->next)
    v[i++] = u;
  while (i-- > 0) {
    struct undo *u = v[i];
    uint64_t p = u->off, end = u->off + u->len;
    if (F.log_all)
      note ("undo %" PRIu64 "+%" PRIu64 "%s", u->off, u->len,
            torn ? " (torn)" : "");
    while (p < end) {
      uint64_t q = (p / SECT + 1) * SECT;
      if (q > end)
        q = end;
      if (!torn || rnd () & 1) {
        put_back (u->image, p, u->pre + (p - u->off), q - p);
        sectors++;
      }
      p = q;
    }
    free (u->pre);
    free (u);
  }
  free (v);
  return sectors;
}

/* Drop the entries done at clock mark or before. */
static void
journal_retire (uint64_t mark)
{
  struct undo **pp = &F.head, *u;

  F.tail = NULL;
  while ((u = *pp)) {
    if (u->done && u->done <= mark) {
      *pp = u->next;
      F.bytes -= u->len;
      free (u->pre);
      free (u);
    } else {
      F.tail = u;
      pp = &u->next;
    }
  }
}

/* Hold new sends back and wait until none is in flight.  False (nothing
 * held back) if that does not come within QUIESCE_MS. */
static bool
quiesce (void)
{
  uint64_t end = now_ms () + QUIESCE_MS;

  F.quiesced = true;
  while (F.inflight > 0)
    if (!wait_until (end)) {
      F.quiesced = false;
      pthread_cond_broadcast (&F.cond);
      note ("quiesce: %u writes still in flight after %d ms", F.inflight,
            QUIESCE_MS);
      return false;
    }
  return true;
}

static void
resume (void)
{
  F.quiesced = false;
  pthread_cond_broadcast (&F.cond);
}

/* Count one write-class op or flush; at FAULT_POWER_AT cut the power.
 * Under the lock. */
static void
tick (const char *what)
{
  struct undo *j;
  size_t writes;
  uint64_t sectors;
  unsigned held = F.held_n;

  if (++F.calls != F.power_at)
    return;
  quiesce ();
  j = journal_take ();
  writes = journal_count (j);
  unlock ();
  sectors = undo (j, true);
  note ("power-cut at call %" PRIu64 " (%s): %zu unflushed writes, "
        "%" PRIu64 " sectors put back, %u held writes never sent",
        F.calls, what, writes, sectors, held);
  kill (getpid (), SIGKILL);
  for (;;)
    pause ();
}

/* ---- held requests: the layer's thread ---- */

static void
hold (struct held *h)
{
  struct held **pp = &F.held;

  while (*pp && (*pp)->due_ms <= h->due_ms)
    pp = &(*pp)->next;
  h->next = *pp;
  *pp = h;
  F.held_n++;
  pthread_cond_broadcast (&F.cond);
}

/* Call foliod back with an injected failure, later, from the layer's
 * thread.  Under the lock. */
static void
fail_later (struct comp *c, int err)
{
  struct held *h = calloc (1, sizeof *h);

  if (!h)
    abort ();
  h->c = c;
  h->err = err;
  h->due_ms = now_ms ();
  hold (h);
}

static void real_callback (rbd_completion_t rc, void *arg);

/* Send a write-class request to librbd, journaled.  Called without the
 * lock; waits while an undo runs. */
static int
send_write (rbd_image_t image, struct comp *c, uint64_t off, uint64_t len,
            const char *buf)
{
  struct undo *u = calloc (1, sizeof *u);
  rbd_completion_t rc;
  ssize_t got;
  int r;

  if (!u || !(u->pre = malloc (len ? len : 1)))
    abort ();
  lock ();
  while (F.quiesced)
    pthread_cond_wait (&F.cond, &F.lock);
  F.inflight++;
  if ((F.bytes += len) > JOURNAL_MAX) {
    note ("journal over %" PRIu64 " bytes", JOURNAL_MAX);
    abort ();
  }
  unlock ();
  u->image = image;
  u->off = off;
  got = sync_read (image, off, len, u->pre);
  u->len = got > 0 ? (uint64_t) got : 0;     /* stops at the image's end */
  c->u = u;
  lock ();
  if (F.tail)
    F.tail->next = u;
  else
    F.head = u;
  F.tail = u;
  if (F.log_all)
    note ("%s %" PRIu64 "+%" PRIu64, kind_names[c->kind], off, len);
  unlock ();
  if ((r = real_create (c, real_callback, &rc)) < 0)
    goto not_sent;
  switch (c->kind) {
  case K_WRITE:
    r = real_write (image, off, len, buf, rc);
    break;
  case K_ZERO:
    r = real_zeroes (image, off, len, rc, 0, 0);
    break;
  default:
    r = real_discard (image, off, len, rc);
    break;
  }
  if (r >= 0)
    return 0;
  real_release (rc);
not_sent:
  lock ();
  u->done = ++F.clock;          /* nothing landed: its undo is harmless */
  c->u = NULL;
  F.inflight--;
  pthread_cond_broadcast (&F.cond);
  unlock ();
  return r;
}

static void *
worker_main (void *arg)
{
  lock ();
  for (;;) {
    struct held *h = F.held;
    if (!h || h->due_ms > now_ms ()) {
      if (h)
        wait_until (h->due_ms);
      else
        pthread_cond_wait (&F.cond, &F.lock);
      continue;
    }
    F.held = h->next;
    unlock ();
    if (h->err) {
      h->c->ret = -h->err;
      h->c->cb (h->c, h->c->arg);
    } else {
      note ("late-sent %s %" PRIu64 "+%" PRIu64 " now",
            kind_names[h->kind], h->off, h->len);
      int r = send_write (h->image, h->c, h->off, h->len, h->buf);
      if (r < 0) {
        h->c->ret = r;
        h->c->cb (h->c, h->c->arg);
      }
    }
    free (h->buf);
    free (h);
    lock ();
    F.held_n--;                 /* only now: rbd_close waits for it */
    pthread_cond_broadcast (&F.cond);
  }
  return NULL;
}

/* ---- the interposed API ---- */

int
rbd_aio_create_completion (void *cb_arg, rbd_callback_t complete_cb,
                           rbd_completion_t *out)
{
  struct comp *c;

  if (!F.on)
    return ((int (*) (void *, rbd_callback_t, rbd_completion_t *))
            real ("rbd_aio_create_completion")) (cb_arg, complete_cb, out);
  if (!(c = calloc (1, sizeof *c)))
    return -ENOMEM;
  c->magic = COMP_MAGIC;
  c->arg = cb_arg;
  c->cb = complete_cb;
  *out = c;
  return 0;
}

ssize_t
rbd_aio_get_return_value (rbd_completion_t rc)
{
  if (!F.on)
    return ((ssize_t (*) (rbd_completion_t))
            real ("rbd_aio_get_return_value")) (rc);
  return comp_of (rc)->ret;
}

void
rbd_aio_release (rbd_completion_t rc)
{
  struct comp *c;

  if (!F.on) {
    ((void (*) (rbd_completion_t)) real ("rbd_aio_release")) (rc);
    return;
  }
  c = comp_of (rc);
  c->magic = 0;
  free (c);
}

/* librbd called back: fill the layer's completion in, then foliod's. */
static void
real_callback (rbd_completion_t rc, void *arg)
{
  struct comp *c = arg;

  c->ret = real_ret (rc);
  real_release (rc);
  lock ();
  if (c->u) {
    c->u->done = ++F.clock;
    c->u = NULL;
    F.inflight--;
  } else if (c->kind == K_FLUSH && c->ret == 0) {
    if (F.log_all)
      note ("flush ok: writes done by %" PRIu64 " retired", c->flush_mark);
    journal_retire (c->flush_mark);
  }
  pthread_cond_broadcast (&F.cond);
  unlock ();
  c->cb (c, c->arg);
}

/* A write-class op: an injected failure, held for later, or sent. */
static int
write_class (rbd_image_t image, enum kind kind, uint64_t off, uint64_t len,
             const char *buf, rbd_completion_t rc)
{
  struct comp *c = comp_of (rc);
  struct held *h;

  c->kind = kind;
  lock ();
  while (F.quiesced)
    pthread_cond_wait (&F.cond, &F.lock);
  tick (kind_names[kind]);
  if (chance (F.write_err)) {
    note ("write-error %s %" PRIu64 "+%" PRIu64 ": EIO", kind_names[kind],
          off, len);
    fail_later (c, EIO);
    unlock ();
    return 0;
  }
  if (chance (F.late)) {
    if (!(h = calloc (1, sizeof *h)) ||
        (buf && !(h->buf = malloc (len ? len : 1))))
      abort ();
    if (buf)
      memcpy (h->buf, buf, len);
    h->c = c;
    h->image = image;
    h->kind = kind;
    h->off = off;
    h->len = len;
    h->due_ms = now_ms () + F.late_ms;
    note ("late-write %s %" PRIu64 "+%" PRIu64 " held %u ms",
          kind_names[kind], off, len, F.late_ms);
    hold (h);
    unlock ();
    return 0;
  }
  unlock ();
  return send_write (image, c, off, len, buf);
}

int
rbd_aio_write (rbd_image_t image, uint64_t off, size_t len, const char *buf,
               rbd_completion_t rc)
{
  if (!F.on)
    return ((int (*) (rbd_image_t, uint64_t, size_t, const char *,
                      rbd_completion_t)) real ("rbd_aio_write"))
             (image, off, len, buf, rc);
  return write_class (image, K_WRITE, off, len, buf, rc);
}

int
rbd_aio_write_zeroes (rbd_image_t image, uint64_t off, size_t len,
                      rbd_completion_t rc, int zero_flags, int op_flags)
{
  if (!F.on)
    return ((int (*) (rbd_image_t, uint64_t, size_t, rbd_completion_t, int,
                      int)) real ("rbd_aio_write_zeroes"))
             (image, off, len, rc, zero_flags, op_flags);
  return write_class (image, K_ZERO, off, len, NULL, rc);
}

int
rbd_aio_discard (rbd_image_t image, uint64_t off, uint64_t len,
                 rbd_completion_t rc)
{
  if (!F.on)
    return ((int (*) (rbd_image_t, uint64_t, uint64_t, rbd_completion_t))
            real ("rbd_aio_discard")) (image, off, len, rc);
  return write_class (image, K_DISCARD, off, len, NULL, rc);
}

int
rbd_aio_read (rbd_image_t image, uint64_t off, size_t len, char *buf,
              rbd_completion_t rc)
{
  struct comp *c;
  rbd_completion_t real_c;
  int r;

  if (!F.on)
    return ((int (*) (rbd_image_t, uint64_t, size_t, char *,
                      rbd_completion_t)) real ("rbd_aio_read"))
             (image, off, len, buf, rc);
  c = comp_of (rc);
  c->kind = K_READ;
  if ((r = real_create (c, real_callback, &real_c)) < 0)
    return r;
  if ((r = real_read (image, off, len, buf, real_c)) < 0)
    real_release (real_c);
  return r;
}

/* A flush: with writes unflushed, FAULT_SYNC_FAIL per mille of them fail
 * and undo every write since the last good flush. */
int
rbd_aio_flush (rbd_image_t image, rbd_completion_t rc)
{
  struct comp *c;
  rbd_completion_t real_c;
  int r;

  if (!F.on)
    return ((int (*) (rbd_image_t, rbd_completion_t))
            real ("rbd_aio_flush")) (image, rc);
  c = comp_of (rc);
  c->kind = K_FLUSH;
  lock ();
  while (F.quiesced)
    pthread_cond_wait (&F.cond, &F.lock);
  tick ("flush");
  if (F.head && !F.failed_last && chance (F.sync_fail) && quiesce ()) {
    struct undo *j = journal_take ();
    size_t writes = journal_count (j);
    uint64_t sectors;
    unlock ();
    sectors = undo (j, false);
    note ("sync-fail flush: %zu unflushed writes dropped (%" PRIu64
          " sectors)", writes, sectors);
    lock ();
    resume ();
    F.failed_last = true;
    fail_later (c, EIO);
    unlock ();
    return 0;
  }
  F.failed_last = false;
  c->flush_mark = F.clock;
  unlock ();
  if ((r = real_create (c, real_callback, &real_c)) < 0)
    return r;
  if ((r = real_flush (image, real_c)) < 0)
    real_release (real_c);
  return r;
}

/* The handle dies here: send the held writes now and call back the
 * injected failures, and wait for them. */
int
rbd_close (rbd_image_t image)
{
  if (!F.on)
    return ((int (*) (rbd_image_t)) real ("rbd_close")) (image);
  lock ();
  for (struct held *h = F.held; h; h = h->next)
    h->due_ms = 0;
  pthread_cond_broadcast (&F.cond);
  while (F.held_n || F.inflight)
    pthread_cond_wait (&F.cond, &F.lock);
  unlock ();
  return real_close (image);
}
