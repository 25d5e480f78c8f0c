/* Connections of the nbd backing: libnbd handles driven with the aio API.
 *
 * Why aio: measured with 8 threads doing 4 KiB random reads against
 * nbdkit memory behind a 1 ms delay filter (2 busy cores, so rough), the
 * first version of this backing (a pool of handles, each used by one
 * thread at a time with the sync calls) gave 640 IOPS on a remote without
 * multi-conn (one connection) and 2200-2500 with 4 connections; this one
 * (commands in flight on every connection) gives 3000-4700 and 4300-4700.
 * A remote without multi-conn allows only one connection, so the
 * parallelism has to come from commands in flight on it.
 *
 * Each connection has a poller thread that polls the socket (and an
 * eventfd that issuers poke after queueing a command) and calls
 * nbd_aio_notify_read/write; completion callbacks run there and wake the
 * waiting thread.  The poller of a handle lives exactly as long as the
 * handle is installed in its nbdb_conn.
 *
 * Faults: a command whose connection died (libnbd completes it with
 * ENOTCONN and the handle turns dead; or the remote said ESHUTDOWN) is a
 * "lost" attempt: the first thread to see it replaces the handle, once no
 * other thread still waits on the old one (a live one gets up to
 * request_timeout_ms to answer them: conn_drain), and every lost request
 * is issued again.  An error the remote answered on a live connection is
 * returned.  A write whose connection was lost before its answer
 * (whoever ended it), or that foliod gave up on, is in doubt (nbd.c).
 *
 * A command the remote has not answered within request_timeout_ms (a
 * remote that is SIGSTOPped, a hung storage server) "hung": it fails with
 * ETIMEDOUT and is not issued again.  Why not retry it on a new
 * connection: the remote accepted it and then said nothing; a new
 * connection to a hung server hangs in its handshake, so a retry would
 * only multiply the wait, holding the worker.  Its connection's socket
 * is shut down, which makes libnbd complete every other command on it at
 * once (they are lost, and retried within the reconnect window), and the
 * backing counts as down (see nbd-private.h): requests then fail fast
 * while one probe at a time tries to reconnect.  A write that fails so
 * stays dirty in the cache.
 */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include "foliod/lock.h"
#include "foliod/log.h"
#include "backing/nbd-private.h"
#include "foliod/minmax.h"
#include "foliod/util.h"

#define NBD_BACKOFF_MIN_MS 50u
#define NBD_BACKOFF_MAX_MS 2000u

static void
sleep_ms (uint64_t ms)
{
  struct timespec ts = { .tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000 };

  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

/* When must a wait that starts now, and may last up to ms, end?  Never
 * after the shutdown deadline. */
static uint64_t
nbdb_wait_end (struct nbdb_backing *nb, uint64_t ms)
{
  uint64_t end = now_ms () + ms, d = atomic_load (&nb->deadline);

  return d && d < end ? d : end;
}

/* nbd_connect_uri with a deadline: a remote that accepts the connection
 * but never answers the handshake (one that is itself shutting down, or
 * hung) must not hang a reconnect, or foliod's shutdown, forever.  A
 * reconnect's handshake is a request like the others (requests wait
 * behind it): request_timeout_ms, at most 10 s.  The open's waits for
 * no request: 10 s, so that a short request-timeout (set to give up on
 * a hung write soon) does not fail the start on a remote slow to
 * negotiate (an nbdkit script plugin forks for each of a dozen
 * handshake questions: seconds on a loaded host). */
#define CONNECT_TIMEOUT_MS 10000u

uint64_t
nbdb_connect_end (struct nbdb_backing *nb)
{
  return nbdb_wait_end (nb, MIN (CONNECT_TIMEOUT_MS, nb->request_timeout_ms));
}

uint64_t
nbdb_open_end (struct nbdb_backing *nb)
{
  return nbdb_wait_end (nb, CONNECT_TIMEOUT_MS);
}

static int
connect_bounded (struct nbdb_backing *nb, struct nbd_handle *h,
                 uint64_t deadline, const char **why)
{
  *why = NULL;
  if (nbd_aio_connect_uri (h, nb->uri) == -1)
    return -1;
  while (nbd_aio_is_connecting (h) == 1) {
    uint64_t now = now_ms ();
    if (now >= deadline) {
      *why = "no answer to the NBD handshake in time";
      errno = ETIMEDOUT;
      return -1;
    }
    if (nbd_poll (h, (int) (deadline - now)) == -1)
      return -1;
  }
  if (nbd_aio_is_ready (h) != 1) {
    if (nbd_get_error () == NULL)
      *why = "the remote closed the connection during the handshake";
    errno = ECONNREFUSED;
    return -1;
  }
  return 0;
}

struct nbd_handle *
nbdb_conn_open (struct nbdb_backing *nb, uint64_t end, char *err,
                size_t errlen)
{
  struct nbd_handle *h = nbd_create ();
  const char *why = NULL;

  if (!h)
    goto fail;
  /* The spec comes from the administrator: let it name local files
   * (tls-certificates=, tls-psk-file= in the query). */
  if (nbd_set_uri_allow_local_file (h, true) == -1 ||
      nbd_set_full_info (h, true) == -1 ||
      nbd_add_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == -1)
    goto fail;
  if (nb->tls_certificates &&
      nbd_set_tls_certificates (h, nb->tls_certificates) == -1)
    goto fail;
  if (nb->tls_psk_file && nbd_set_tls_psk_file (h, nb->tls_psk_file) == -1)
    goto fail;
  if (nb->tls_username && nbd_set_tls_username (h, nb->tls_username) == -1)
    goto fail;
  if (connect_bounded (nb, h, end ? end : nbdb_connect_end (nb), &why) == -1)
    goto fail;
  return h;

 fail:
  if (err)
    snprintf (err, errlen, "%s: %s", nb->uri,
              why ? why : nbd_get_error () ? nbd_get_error ()
                                           : "cannot create handle");
  if (h)
    nbd_close (h);
  return NULL;
}

unsigned
nbdb_id_flags (struct nbd_handle *h)
{
  return (nbd_is_read_only (h) == 1) | (nbd_can_flush (h) == 1) << 1 |
         (nbd_can_fua (h) == 1) << 2 | (nbd_can_trim (h) == 1) << 3 |
         (nbd_can_zero (h) == 1) << 4 | (nbd_can_fast_zero (h) == 1) << 5 |
         (nbd_can_multi_conn (h) == 1) << 6 |
         (nbd_can_meta_context (h, LIBNBD_CONTEXT_BASE_ALLOCATION) == 1) << 7;
}

char *
nbdb_id_desc (struct nbd_handle *h)
{
  return nbd_get_export_description (h);   /* NULL: none given */
}

static bool
same_desc (const char *a, const char *b)
{
  return a == b || (a && b && strcmp (a, b) == 0);
}

/* Is h another export than the one opened (size, flags, description)?
 * The reason in why, or false. */
static bool
remote_changed (struct nbdb_backing *nb, struct nbd_handle *h, char *why,
                size_t len)
{
  int64_t size = nbd_get_size (h);
  unsigned flags = nbdb_id_flags (h);
  char *desc = nbdb_id_desc (h);
  bool changed = true;

  if (size != (int64_t) nb->b.size)
    snprintf (why, len, "size %lld, was %llu", (long long) size,
              (unsigned long long) nb->b.size);
  else if (flags != nb->id_flags)
    snprintf (why, len, "handshake flags 0x%x, were 0x%x (read-only, flush, "
              "FUA, trim, zero, fast zero, multi-conn, block status)", flags,
              nb->id_flags);
  else if (!same_desc (desc, nb->id_desc))
    snprintf (why, len, "description \"%s\", was \"%s\"",
              desc ? desc : "", nb->id_desc ? nb->id_desc : "");
  else
    changed = false;
  free (desc);
  return changed;
}

/* FNV-1a of s, never 0. */
static uint64_t
reason_hash (const char *s)
{
  uint64_t h = 14695981039346656037u;

  while (*s)
    h = (h ^ (unsigned char) *s++) * 1099511628211u;
  return h ? h : 1;
}

/* A new handle for a dropped one: the same export (remote_changed) with
 * the same content where it can be compared (nbdb_id_differs), or none.
 * Either is logged: a reconnect at info level, each new reason for a
 * refusal (not each probe's) at warning level; a content check that
 * could not read (the handle is dropped, the next probe tries again) at
 * debug level. */
static struct nbd_handle *
conn_reopen (struct nbdb_backing *nb)
{
  struct nbd_handle *h = nbdb_conn_open (nb, 0, NULL, 0);
  char why[256];
  int d = 0;

  if (h == NULL)
    return NULL;
  if (remote_changed (nb, h, why, sizeof why) ||
      (d = nbdb_id_differs (nb, h, nbdb_connect_end (nb), why,
                            sizeof why)) == 1) {
    uint64_t r = reason_hash (why);
    if (atomic_exchange (&nb->refusal_logged, r) != r)
      log_warn ("nbd %s: the remote came back as another export (%s): "
                "refused; requests fail until it serves the one foliod "
                "opened", nb->uri, why);
    nbd_close (h);
    return NULL;
  }
  if (d == -1) {                /* not checked: not used either */
    log_debug ("nbd %s: reconnect: %s", nb->uri, why);
    nbd_close (h);
    return NULL;
  }
  /* Also the extent cache's epoch: what the remote told before is
   * dropped at lookup (nbd.c). */
  uint64_t n = atomic_fetch_add (&nb->reconnects, 1) + 1;
  atomic_store (&nb->refusal_logged, 0);
  log_info ("nbd %s: reconnected (%llu reconnect%s)", nb->uri,
            (unsigned long long) n, n == 1 ? "" : "s");
  return h;
}

static void
conn_wake (struct nbdb_conn *c)
{
  uint64_t one = 1;

  while (write (c->efd, &one, sizeof one) == -1 && errno == EINTR)
    ;
}

/* After a command was queued on h: wake the poller only if libnbd now
 * waits to write (the request did not fit into the socket at once).
 * Otherwise the command went out from this thread (or, with a reply
 * half read, goes out from the poller's own notify when that reply is
 * complete), and the poller already polls for the reply: in a ready
 * state libnbd's direction always has READ.  Measured on 4 KiB remote
 * misses: one poller wake-up and one eventfd write per command less. */
static void
conn_wake_if_writing (struct nbdb_conn *c, struct nbd_handle *h)
{
  if (nbd_aio_get_direction (h) & LIBNBD_AIO_DIRECTION_WRITE)
    conn_wake (c);
}

struct nbdb_async {
  void (*done) (void *opaque, int err);
  void *opaque;
  struct nbdb_read_id rid;      /* rid.buf NULL: not a read to sample */
  struct nbdb_conn *c;
  uint64_t deadline;            /* now_ms() time */
  struct nbdb_async *prev, *next;  /* c->async_head, under async_lock */
};

/* Why foliod cut a connection (nbdb_conn.cut). */
enum {
  CUT_NONE = 0,
  CUT_DRAIN,                    /* not shut down: nothing new is issued on
                                 * it, the commands in flight may still be
                                 * answered (conn_drain) */
  CUT_DROP,                     /* replacing it (conn_drop) */
  CUT_HUNG,                     /* a request on it went unanswered for
                                 * request_timeout_ms: the remote hangs */
};

static void conn_cut (struct nbdb_conn *c, struct nbd_handle *h, int why);
static void conn_note_end (struct nbdb_conn *c);
static void nbdb_note_down (struct nbdb_backing *nb, int hung);

/* The earliest deadline of c's async commands (also the shutdown
 * deadline while any is in flight); 0: none in flight. */
static uint64_t
async_first_deadline (struct nbdb_conn *c)
{
  uint64_t first = 0, d = atomic_load (&c->nb->deadline);
  struct nbdb_async *a;

  lock_or_die (&c->async_lock);
  for (a = c->async_head; a; a = a->next)
    if (!first || a->deadline < first)
      first = a->deadline;
  unlock_or_die (&c->async_lock);
  return first && d && d < first ? d : first;
}

/* The poller's wait: -1 (for ever) or 100 ms as before, shortened to the
 * first async deadline; past it, the connection is cut (libnbd then
 * fails every command on it, which completes the async ones with an
 * error) and the backing counts as down, as for a sync request that
 * hung. */
static int
poller_timeout (struct nbdb_conn *c, struct nbd_handle *h, unsigned dir)
{
  int t = dir ? -1 : 100;
  uint64_t first = async_first_deadline (c), now;

  if (!first || atomic_load (&c->cut))
    return t;
  now = now_ms ();
  if (now >= first) {
    conn_cut (c, h, CUT_HUNG);
    nbdb_note_down (c->nb, 1);
    return t;
  }
  return t >= 0 && (uint64_t) t < first - now ? t : (int) MIN (first - now,
                                                                60000u);
}

static void *
poller_main (void *arg)
{
  struct nbdb_conn *c = arg;
  struct nbd_handle *h = c->h;  /* fixed while this thread lives */
  int fd = nbd_aio_get_fd (h);

  while (!atomic_load (&c->stop) && fd >= 0) {
    unsigned dir = nbd_aio_get_direction (h);
    struct pollfd p[2] = { { .fd = fd }, { .fd = c->efd, .events = POLLIN } };
    uint64_t v;

    if (nbd_aio_is_dead (h) || nbd_aio_is_closed (h))
      break;
    if (dir & LIBNBD_AIO_DIRECTION_READ)
      p[0].events |= POLLIN;
    if (dir & LIBNBD_AIO_DIRECTION_WRITE)
      p[0].events |= POLLOUT;
    if (dir == 0)               /* nothing to wait for on the socket */
      p[0].fd = -1;
    if (poll (p, 2, poller_timeout (c, h, dir)) == -1) {
      if (errno == EINTR)
        continue;
      break;
    }
    if (p[1].revents & POLLIN)
      (void) !read (c->efd, &v, sizeof v);
    /* Errors on the socket surface through notify: the handle dies and
     * libnbd completes every command in flight with an error. */
    if ((p[0].revents & (POLLIN | POLLHUP | POLLERR)) &&
        (dir & LIBNBD_AIO_DIRECTION_READ))
      nbd_aio_notify_read (h);
    else if (p[0].revents & (POLLOUT | POLLHUP | POLLERR))
      nbd_aio_notify_write (h);
  }
  return NULL;
}

/* Caller holds poller_lock, or owns c alone. */
static int
poller_start (struct nbdb_conn *c)
{
  atomic_store (&c->stop, 0);
  if (thread_start (&c->poller, poller_main, c, "nbd-poll/%u",
                    (unsigned) (c - c->nb->conns)) != 0)
    return -1;
  c->has_poller = 1;
  c->poller_pid = getpid ();
  return 0;
}

/* Caller holds poller_lock. */
static void
poller_stop (struct nbdb_conn *c)
{
  if (!c->has_poller)
    return;
  c->has_poller = 0;
  if (c->poller_pid != getpid ())
    return;                     /* it stayed in the parent */
  atomic_store (&c->stop, 1);
  conn_wake (c);
  pthread_join (c->poller, NULL);
}

/* Make sure c->h has its poller in this process.  Caller holds c->lock
 * (reading is enough: poller_lock orders the starters).  Returns 0 when
 * it was running, 1 when started now, -1 on failure. */
static int
poller_ensure (struct nbdb_conn *c)
{
  int r = 0;

  lock_or_die (&c->poller_lock);
  if (c->has_poller && c->poller_pid != getpid ())
    c->has_poller = 0;          /* forked: that thread is not ours */
  if (!c->has_poller)
    r = poller_start (c) == 0 ? 1 : -1;
  unlock_or_die (&c->poller_lock);
  return r;
}

/* Has the remote hung up on a handle nobody watched (no poller until
 * now)?  libnbd 1.14 reads freed memory when a command is sent into a
 * connection that is already gone, so such a handle is not used. */
static int
peer_gone (struct nbd_handle *h)
{
  struct pollfd p = { .fd = nbd_aio_get_fd (h), .events = POLLRDHUP };

  return p.fd < 0 || (poll (&p, 1, 0) == 1 &&
                      (p.revents & (POLLRDHUP | POLLHUP | POLLERR)));
}

/* Install h (may be NULL) as c's handle and start its poller now, not
 * on first use: the first use may be an async read from the event loop,
 * which must not start threads (nbdb_run_async says EAGAIN instead).  A
 * poller that failed to start, or is gone with a fork, is started by
 * the next sync request (poller_ensure).  Caller holds c->lock for
 * writing, or owns c alone. */
static void
conn_install (struct nbdb_conn *c, struct nbd_handle *h)
{
  c->h = h;
  atomic_store (&c->cut, 0);
  atomic_store (&c->ended, 0);
  atomic_store (&c->up, c->h != NULL);
  if (h) {
    lock_or_die (&c->poller_lock);
    if (!c->has_poller)
      (void) poller_start (c);
    unlock_or_die (&c->poller_lock);
  }
}

/* Shut down h's socket: libnbd then fails every command on it at once
 * (the poller sees the hang-up), so nobody keeps waiting on a remote that
 * stopped answering.  The fd stays libnbd's; only nbd_close closes it. */
static void
conn_cut (struct nbdb_conn *c, struct nbd_handle *h, int why)
{
  int fd = nbd_aio_get_fd (h);

  atomic_store (&c->cut, why);
  atomic_store (&c->up, 0);
  if (fd >= 0)
    shutdown (fd, SHUT_RDWR);
  conn_note_end (c);
  conn_wake (c);
}

/* c's handle ended (cut, or closed to be replaced): counted once, at the
 * first of these, for the cache's ledger (nb->ends).  A connection
 * foliod cut lost what it lost at the cut, not again when it is closed
 * and replaced later (issue 33 item 4b). */
static void
conn_note_end (struct nbdb_conn *c)
{
  if (atomic_exchange (&c->ended, 1) == 0)
    atomic_fetch_add (&c->nb->ends, 1);
}

/* Say goodbye (NBD_CMD_DISC) on a connection that still looks alive.
 * libnbd 1.14 touches freed memory when it sends the disconnect to a
 * remote that has already gone, so an idle connection with something to
 * read (the remote's EOF) is just closed.  libnbd then waits for the
 * remote to close its end; a hung remote never does, so that wait is
 * bounded (nbd_shutdown's is not). */
#define DISCONNECT_WAIT_MS 500

static void
conn_disconnect (struct nbd_handle *h)
{
  struct pollfd p = { .fd = nbd_aio_get_fd (h), .events = POLLIN };
  uint64_t end = now_ms () + DISCONNECT_WAIT_MS, now;

  if (p.fd < 0 || !nbd_aio_is_ready (h) || nbd_aio_in_flight (h) != 0 ||
      poll (&p, 1, 0) != 0 || nbd_aio_disconnect (h, 0) == -1)
    return;
  while (!nbd_aio_is_closed (h) && !nbd_aio_is_dead (h) &&
         (now = now_ms ()) < end)
    if (nbd_poll (h, (int) (end - now)) == -1)
      break;
}

/* Close c's handle (caller holds c->lock for writing). */
static void
conn_drop (struct nbdb_conn *c)
{
  if (c->h) {
    /* Commands on a dead handle were completed with errors already; on
     * a live one (ESHUTDOWN, or one that hung) cutting the socket ends
     * them (they are issued again elsewhere).  Their waiters still look
     * at the handle, so it stays until they are done. */
    if (atomic_load (&c->users) > 0)
      conn_cut (c, c->h, CUT_DROP);
    while (atomic_load (&c->users) > 0)
      sleep_ms (1);
    lock_or_die (&c->poller_lock);
    poller_stop (c);
    unlock_or_die (&c->poller_lock);
    /* The remote may have lost what it acknowledged on it and had not
     * flushed: a fact for the ledger, unless counted already. */
    conn_note_end (c);
    nbd_close (c->h);
    c->h = NULL;
    atomic_store (&c->up, 0);
  }
}

/* Before a replace: issue nothing more on c's handle (of generation gen)
 * and give the commands in flight on it time to be answered, up to
 * request_timeout_ms (the remote said ESHUTDOWN to one of them, and is
 * still there), so that conn_drop has none to cut: a write cut in flight
 * is in doubt (backing_ops.clear_doubt), one answered is not.  Ends at
 * once when the handle is dead (libnbd completed them all).  Caller owns
 * c->reopening, so c->h stays. */
static void
conn_drain (struct nbdb_backing *nb, struct nbdb_conn *c, uint64_t gen)
{
  uint64_t end = nbdb_wait_end (nb, nb->request_timeout_ms);
  struct nbd_handle *h;
  int zero = CUT_NONE;

  pthread_rwlock_rdlock (&c->lock);
  h = c->gen == gen ? c->h : NULL;
  if (h && atomic_compare_exchange_strong (&c->cut, &zero, CUT_DRAIN))
    atomic_store (&c->up, 0);
  pthread_rwlock_unlock (&c->lock);
  if (!h)
    return;
  while (atomic_load (&c->users) > 0 && now_ms () < end &&
         !nbd_aio_is_dead (h) && !nbd_aio_is_closed (h))
    sleep_ms (1);
}

/* Replace c's handle after a lost attempt made on generation gen.  The
 * connect runs without c->lock, by one thread at a time: the others find
 * no handle and do not wait behind a slow handshake.  Returns 0 when c
 * has a handle again (ours or another thread's), -1 when not (the remote
 * is still away, or another thread is still connecting). */
static int
conn_replace (struct nbdb_backing *nb, struct nbdb_conn *c, uint64_t gen)
{
  struct nbd_handle *h;

  if (atomic_exchange (&c->reopening, 1))
    return -1;
  conn_drain (nb, c, gen);
  pthread_rwlock_wrlock (&c->lock);
  if (c->gen != gen && c->h) {
    pthread_rwlock_unlock (&c->lock);   /* replaced meanwhile */
    atomic_store (&c->reopening, 0);
    return 0;
  }
  conn_drop (c);
  c->gen++;
  pthread_rwlock_unlock (&c->lock);

  h = conn_reopen (nb);

  pthread_rwlock_wrlock (&c->lock);
  conn_install (c, h);
  c->gen++;
  pthread_rwlock_unlock (&c->lock);
  atomic_store (&c->reopening, 0);
  return h ? 0 : -1;
}

/* Did this failure lose the connection (retry elsewhere), or is it the
 * remote's answer (return it)?  h must still be open. */
static int
conn_lost (struct nbd_handle *h, int e)
{
  if (nbd_aio_is_dead (h) || nbd_aio_is_closed (h))
    return 1;
  switch (e) {
  case ENOTCONN: case ESHUTDOWN: case ECONNRESET: case EPIPE:
  case ECONNABORTED:
    return 1;
  default:
    return 0;
  }
}

/* One command's completion, on the issuer's stack.  A semaphore, not a
 * mutex and condition variable: the poller's post does not hold a lock
 * that the woken issuer must take at once (measured on remote misses:
 * the issuer woke up only to sleep on the waiter's mutex again).  The
 * issuer may return, and its frame go, as soon as the post is seen;
 * sem_post is made for that (POSIX: destroying a semaphore nobody is
 * blocked on is allowed; glibc's post touches it only by the final
 * futex wake, which tolerates reuse of the memory). */
struct waiter {
  sem_t sem;
  int err;                      /* written before posted */
  const atomic_int *cutp;       /* &c->cut of the connection */
  int cut;                      /* foliod had cut it when it completed:
                                 * an error then is not the remote's */
  atomic_int posted;            /* release/acquire pair for err and the
                                 * read buffer (also where a sanitizer
                                 * does not know sem_clockwait) */
  int done;                     /* the issuer's: it saw the post */
};

static int
waiter_complete (void *user, int *error)
{
  struct waiter *w = user;

  w->err = *error;
  w->cut = atomic_load (w->cutp);
  atomic_store_explicit (&w->posted, 1, memory_order_release);
  sem_post (&w->sem);
  return 1;                     /* retire the command */
}

/* Wait for the post until the monotonic time end_ms; 0 or ETIMEDOUT. */
static int
waiter_sem_wait (struct waiter *w, uint64_t end_ms)
{
  struct timespec ts = { .tv_sec = (time_t) (end_ms / 1000),
                         .tv_nsec = (long) (end_ms % 1000) * 1000000 };

  while (sem_clockwait (&w->sem, CLOCK_MONOTONIC, &ts) == -1) {
    if (errno != EINTR)
      return errno;
  }
  w->done = atomic_load_explicit (&w->posted, memory_order_acquire);
  assert (w->done);
  return 0;
}

#define WAITER_HUNG (-2)

/* Wait for w until end (now_ms() time).  Give up early only if the handle
 * died and the command was not completed within a second after (libnbd
 * completes aborted commands, so this is a guard, not a path).  Returns
 * 0 done, -1 lost, WAITER_HUNG when end came first. */
static int
waiter_wait (struct waiter *w, struct nbd_handle *h, uint64_t end)
{
  int dead_rounds = 0;
  uint64_t now;

  while (!w->done) {
    if ((now = now_ms ()) >= end)
      return WAITER_HUNG;
    if (waiter_sem_wait (w, now + MIN (end - now, 1000u)) == ETIMEDOUT &&
        (nbd_aio_is_dead (h) || nbd_aio_is_closed (h)) &&
        ++dead_rounds >= 2)
      return -1;
  }
  return 0;
}

/* The remote did not answer w in time: cut the connection, which
 * completes w (w lives on our stack: it must be done before we return). */
static void
waiter_abandon (struct waiter *w, struct nbdb_conn *c, struct nbd_handle *h)
{
  conn_cut (c, h, CUT_HUNG);
  (void) waiter_wait (w, h, UINT64_MAX);
}

/* How an attempt failed. */
enum attempt {
  ATTEMPT_ANSWERED,             /* the remote said no: return its error */
  ATTEMPT_LOST,                 /* the connection failed: retry */
  ATTEMPT_HUNG,                 /* no answer in time: fail, ETIMEDOUT */
};

/* A write-class command was sent and then abandoned: it may still land
 * (see backing_ops.clear_doubt).  Whoever ended its connection: one
 * foliod cut may be busy with the command still, and so may a server
 * whose connection the network reset (nbdkit's workers finish a dead
 * connection's requests, qemu-nbd drains them), after foliod sent the
 * command again on a new connection and wrote newer data over it.  From
 * the client's side a reset and a remote that died look the same. */
static void
note_doubt (struct nbdb_backing *nb)
{
  atomic_fetch_add (&nb->in_doubt, 1);
}

/* One attempt on c.  0; or -1 with errno, *lost telling how it failed
 * (enum attempt), *gen the generation used.  write: a write-class
 * command, in doubt when abandoned. */
static int
conn_attempt (struct nbdb_backing *nb, struct nbdb_conn *c, nbdb_issue fn,
              void *arg, int write, uint64_t *gen, int *lost)
{
  struct waiter w = { .done = 0, .cutp = &c->cut };
  struct nbd_handle *h;
  int64_t cookie;
  int e, cut;

  pthread_rwlock_rdlock (&c->lock);
  h = c->h;
  *gen = c->gen;
  if (!h || atomic_load (&c->cut)) {
    pthread_rwlock_unlock (&c->lock);
    *lost = 1;
    errno = ENOTCONN;
    return -1;
  }
  switch (poller_ensure (c)) {
  case -1:
    pthread_rwlock_unlock (&c->lock);
    *lost = 0;
    errno = EAGAIN;
    return -1;
  case 1:
    if (peer_gone (h)) {
      pthread_rwlock_unlock (&c->lock);
      *lost = 1;
      errno = ENOTCONN;
      return -1;
    }
    break;
  }
  sem_init (&w.sem, 0, 0);
  atomic_store (&c->used, 1);
  atomic_fetch_add (&c->users, 1);
  cookie = fn (h, arg, (nbd_completion_callback) { .callback = waiter_complete,
                                                   .user_data = &w });
  if (cookie == -1) {
    e = nbd_get_errno ();
    e = e ? e : EIO;
    *lost = conn_lost (h, e);
  }
  else {
    conn_wake_if_writing (c, h);
    e = 0;
  }
  pthread_rwlock_unlock (&c->lock);

  if (cookie != -1) {
    switch (waiter_wait (&w, h, nbdb_wait_end (nb, nb->request_timeout_ms))) {
    case WAITER_HUNG:
      waiter_abandon (&w, c, h);
      if (w.done && w.err == 0)
        e = 0;                  /* answered at the last moment */
      else
        e = ETIMEDOUT, *lost = ATTEMPT_HUNG;
      break;
    case -1:
      e = ENOTCONN, *lost = ATTEMPT_LOST;
      break;
    default:
      if ((e = w.err) != 0)
        *lost = conn_lost (h, e);
    }
    cut = w.done ? w.cut : atomic_load (&c->cut);
    /* Cut because another request on it hung: the remote hangs, this one
     * fails at once too (ENOTCONN), no reconnect; the backing is down. */
    if (*lost == ATTEMPT_LOST && cut == CUT_HUNG)
      *lost = ATTEMPT_HUNG;
    /* In doubt: sent, and no answer came: not in time, or its connection
     * was lost (foliod cut it, the network reset it, the remote went
     * away); not ESHUTDOWN, the remote's answer. */
    if (write && e != 0 &&
        (*lost == ATTEMPT_HUNG ||
         (*lost == ATTEMPT_LOST && e != ESHUTDOWN)))
      note_doubt (nb);
  }
  atomic_fetch_sub (&c->users, 1);
  sem_destroy (&w.sem);
  if (e == 0)
    return 0;
  errno = e;
  return -1;
}

/* Round robin over connections that look up; prev (or any) when none
 * does. */
static struct nbdb_conn *
conn_pick (struct nbdb_backing *nb, struct nbdb_conn *prev)
{
  unsigned start = atomic_fetch_add (&nb->next_conn, 1), i;

  assert (nb->nconns > 0);      /* nbd_conns_start made them */
  for (i = 0; i < nb->nconns; i++) {
    struct nbdb_conn *c = &nb->conns[(start + i) % nb->nconns];
    if (atomic_load (&c->up))
      return c;
  }
  return prev ? prev : &nb->conns[start % nb->nconns];
}

/* Async commands all go to the first connection that is up: one poller
 * then takes in many replies per wake-up, where round robin wakes every
 * connection's poller for about one reply each (4 KiB remote misses at
 * QD 16, 4 connections: 2.2 context switches per miss; on one, 1.0, and
 * half the CPU).  The sync path keeps spreading over all of them. */
static struct nbdb_conn *
conn_pick_async (struct nbdb_backing *nb)
{
  for (unsigned i = 0; i < nb->nconns; i++)
    if (atomic_load (&nb->conns[i].up))
      return &nb->conns[i];
  return NULL;
}

static int
any_up (struct nbdb_backing *nb)
{
  unsigned i;

  for (i = 0; i < nb->nconns; i++)
    if (atomic_load (&nb->conns[i].up))
      return 1;
  return 0;
}

/* May a request try the remote now?  Yes while connections work or
 * within the reconnect window; once the backing is down, only one probe
 * per NBD_BACKOFF_MAX_MS.  No (errno set) otherwise, or after the
 * shutdown deadline. */
static int
nbdb_may_try (struct nbdb_backing *nb)
{
  uint64_t now = now_ms (), d = atomic_load (&nb->deadline);
  uint64_t down = atomic_load (&nb->down_since);
  uint64_t probe = atomic_load (&nb->next_probe);

  if (d && now >= d) {
    errno = ETIMEDOUT;
    return 0;
  }
  if (!down || now < down + nb->retry_timeout_ms)
    return 1;
  if (now >= probe && atomic_compare_exchange_strong (&nb->next_probe, &probe,
                                                      now + NBD_BACKOFF_MAX_MS))
    return 1;
  errno = ENOTCONN;
  return 0;
}

/* No connection could be made: start the reconnect window, unless one
 * runs.  hung: the remote held a request request_timeout_ms without an
 * answer; it is not restarting, so the window is closed at once and
 * requests fail fast.  The next probe only after a backoff: a probe of
 * a hung remote waits for its handshake (up to request_timeout_ms), and
 * the request that waited a timeout already, or its FLUSH, must not
 * wait a second one (foliod.conf(5): one bound per request). */
static void
nbdb_note_down (struct nbdb_backing *nb, int hung)
{
  uint64_t now = now_ms (), zero = 0;
  uint64_t since = hung ? now - MIN (now, nb->retry_timeout_ms) : now;

  if (hung) {
    atomic_store (&nb->down_since, since);
    atomic_store (&nb->next_probe, now + NBD_BACKOFF_MAX_MS);
  }
  else
    atomic_compare_exchange_strong (&nb->down_since, &zero, since);
}

/* Until when may a request that started at start keep reconnecting? */
static uint64_t
nbdb_retry_end (struct nbdb_backing *nb, uint64_t start)
{
  uint64_t down = atomic_load (&nb->down_since), d = atomic_load (&nb->deadline);
  uint64_t end = (down ? MIN (down, start) : start) + nb->retry_timeout_ms;

  return d && d < end ? d : end;
}

void
nbdb_conns_set_deadline (struct nbdb_backing *nb, uint64_t deadline_ms)
{
  /* Shutdown waits for a remote that is down once more (writeback would
   * otherwise give up on the first probe). */
  if (atomic_load (&nb->down_since)) {
    atomic_store (&nb->down_since, now_ms ());
    atomic_store (&nb->next_probe, 0);
  }
  atomic_store (&nb->deadline, deadline_ms);
  /* Pollers watching async commands take the deadline into account. */
  for (unsigned i = 0; i < nb->nconns; i++)
    conn_wake (&nb->conns[i]);
}

static int
run_req (struct nbdb_backing *nb, nbdb_issue fn, void *arg, int write)
{
  uint64_t start = now_ms (), backoff = NBD_BACKOFF_MIN_MS, gen, now, end;
  struct nbdb_conn *c = NULL;
  int losses = 0, lost = 0, e;

  for (;;) {
    if (!nbdb_may_try (nb)) {
      e = errno;
      break;
    }
    c = conn_pick (nb, c);
    if (losses > 0 && atomic_load (&c->up))
      atomic_fetch_add (&nb->retries, 1);
    if (conn_attempt (nb, c, fn, arg, write, &gen, &lost) == 0) {
      atomic_store (&nb->down_since, 0);
      return 0;
    }
    e = errno;
    if (lost == ATTEMPT_HUNG)
      nbdb_note_down (nb, 1);
    if (lost != ATTEMPT_LOST)
      break;
    losses++;
    if (conn_replace (nb, c, gen) == 0)
      atomic_store (&nb->down_since, 0);        /* reachable again */
    else {
      /* A failed reconnect may have waited a handshake timeout: the next
       * probe a backoff from now, not from when this one started. */
      atomic_store (&nb->next_probe, now_ms () + NBD_BACKOFF_MAX_MS);
      if (!any_up (nb))
        nbdb_note_down (nb, 0);
    }
    now = now_ms ();
    end = nbdb_retry_end (nb, start);
    if (now >= end) {
      e = atomic_load (&nb->deadline) && now >= atomic_load (&nb->deadline)
          ? ETIMEDOUT : ENOTCONN;
      break;
    }
    /* Another connection that looks up (reconnected, or not yet found
     * dead) is worth a try at once, a few times: enough to sweep the
     * stale ones, not a hot loop against a remote that keeps saying
     * ESHUTDOWN. */
    if (losses <= (int) nb->nconns && any_up (nb))
      continue;
    sleep_ms (MIN (backoff, end - now));
    backoff = MIN (backoff * 3 / 2, NBD_BACKOFF_MAX_MS);
  }
  atomic_fetch_add (&nb->errors, 1);
  errno = e;
  return -1;
}

int
nbdb_run (struct nbdb_backing *nb, nbdb_issue fn, void *arg)
{
  return run_req (nb, fn, arg, 0);
}

int
nbdb_run_write (struct nbdb_backing *nb, nbdb_issue fn, void *arg)
{
  return run_req (nb, fn, arg, 1);
}

/* ---- commands that hold no thread ---- */

/* The per-connection free list: a parked miss costs no malloc on the
 * loop thread, and at most NBD_ASYNC_MAX are in flight (more use the
 * sync path). */
static struct nbdb_async *
async_get (struct nbdb_conn *c)
{
  struct nbdb_async *a;

  lock_or_die (&c->async_lock);
  a = c->async_free;
  if (a)
    c->async_free = a->next;
  unlock_or_die (&c->async_lock);
  return a;
}

static void
async_put (struct nbdb_conn *c, struct nbdb_async *a)
{
  lock_or_die (&c->async_lock);
  a->next = c->async_free;
  c->async_free = a;
  unlock_or_die (&c->async_lock);
}

/* Does c's handle have its poller in this process?  Without waiting:
 * no when the lock is busy (a start or stop in progress). */
static int
poller_running (struct nbdb_conn *c)
{
  int r;

  if (pthread_mutex_trylock (&c->poller_lock) != 0)
    return 0;
  r = c->has_poller && c->poller_pid == getpid ();
  unlock_or_die (&c->poller_lock);
  return r;
}

static void
async_unlink (struct nbdb_async *a)
{
  struct nbdb_conn *c = a->c;

  lock_or_die (&c->async_lock);
  if (a->prev)
    a->prev->next = a->next;
  else
    c->async_head = a->next;
  if (a->next)
    a->next->prev = a->prev;
  unlock_or_die (&c->async_lock);
}

/* libnbd's completion, on the poller (or the issuer, inside fn). */
static int
async_complete (void *user, int *error)
{
  struct nbdb_async *a = user;
  struct nbdb_conn *c = a->c;
  int e = *error;

  async_unlink (a);
  if (e == 0 && a->rid.buf)
    nbdb_id_read_done (c->nb, a->rid.token, a->rid.buf, a->rid.len,
                       a->rid.off);
  a->done (a->opaque, e);
  async_put (c, a);
  atomic_fetch_sub (&c->users, 1);      /* h may be closed after this */
  return 1;
}

int
nbdb_run_async (struct nbdb_backing *nb, nbdb_issue fn, void *arg,
                void (*done) (void *opaque, int err), void *opaque,
                const struct nbdb_read_id *rid)
{
  struct nbdb_conn *c;
  struct nbdb_async *a;
  struct nbd_handle *h;
  int64_t cookie;
  bool first;

  /* Down, reconnecting, shutting down, busy: the sync path knows what to
   * do.  A trylock: the writer (conn_replace) holds c->lock across a
   * drain, a thread join and nbd_close. */
  if (atomic_load (&nb->down_since) || atomic_load (&nb->deadline) ||
      !(c = conn_pick_async (nb)))
    goto again;
  if (pthread_rwlock_tryrdlock (&c->lock) != 0)
    goto again;
  h = c->h;
  if (!h || atomic_load (&c->cut) || !poller_running (c) ||
      !(a = async_get (c))) {
    pthread_rwlock_unlock (&c->lock);
    goto again;
  }
  *a = (struct nbdb_async) { .done = done, .opaque = opaque, .c = c,
                             .deadline = now_ms () + nb->request_timeout_ms };
  if (rid)
    a->rid = *rid;
  lock_or_die (&c->async_lock);
  a->next = c->async_head;
  if (a->next)
    a->next->prev = a;
  c->async_head = a;
  /* The first one in flight: the poller may be polling without a
   * timeout; it must learn a deadline (later ones are never earlier
   * than the first, and the poller looks again after every reply). */
  first = a->next == NULL;
  unlock_or_die (&c->async_lock);
  atomic_store (&c->used, 1);
  atomic_fetch_add (&c->users, 1);
  /* a belongs to the completion from here on: done may run inside fn. */
  cookie = fn (h, arg, (nbd_completion_callback) { .callback = async_complete,
                                                   .user_data = a });
  if (cookie == -1) {
    async_unlink (a);
    atomic_fetch_sub (&c->users, 1);
    async_put (c, a);
    pthread_rwlock_unlock (&c->lock);
    goto again;
  }
  if (first)
    conn_wake (c);
  else
    conn_wake_if_writing (c, h);
  pthread_rwlock_unlock (&c->lock);
  return 0;

 again:
  errno = EAGAIN;
  return -1;
}

/* Fork safety.  A poller holds libnbd's handle lock for moments; a fork
 * at such a moment would leave the child a handle locked for ever.  So
 * around fork every poller is stopped, and restarted in the parent (the
 * child starts its own on first use).  This list of open nbd backings is
 * the only process-wide state of the backing layer; pthread_atfork gives
 * no context pointer.  Lock order: fork_lock, then poller_lock. */
static pthread_mutex_t fork_lock = PTHREAD_MUTEX_INITIALIZER;
static struct nbdb_backing *fork_list;   /* linked by fork_next */
static pthread_once_t fork_once = PTHREAD_ONCE_INIT;

static void
fork_prepare (void)
{
  struct nbdb_backing *nb;
  unsigned i;

  lock_or_die (&fork_lock);
  for (nb = fork_list; nb; nb = nb->fork_next)
    for (i = 0; i < nb->nconns; i++) {
      struct nbdb_conn *c = &nb->conns[i];
      lock_or_die (&c->poller_lock);
      /* Only where commands were issued: a backing opened and then
       * forked (nbdkit's .get_ready) is used by the child, and a poller
       * in the parent would take the child's replies off the socket. */
      c->restart = c->has_poller && c->poller_pid == getpid () &&
                   atomic_load (&c->used);
      poller_stop (c);
    }
}

static void
fork_release (int parent)
{
  struct nbdb_backing *nb;
  unsigned i;

  for (nb = fork_list; nb; nb = nb->fork_next)
    for (i = 0; i < nb->nconns; i++) {
      struct nbdb_conn *c = &nb->conns[i];
      /* Someone may be waiting on a command in flight: its poller. */
      if (parent && c->restart && c->h)
        poller_start (c);
      c->restart = 0;
      unlock_or_die (&c->poller_lock);
    }
  unlock_or_die (&fork_lock);
}

static void fork_parent (void) { fork_release (1); }
static void fork_child (void) { fork_release (0); }

static void
fork_register_once (void)
{
  pthread_atfork (fork_prepare, fork_parent, fork_child);
}

static void
fork_list_add (struct nbdb_backing *nb)
{
  pthread_once (&fork_once, fork_register_once);
  lock_or_die (&fork_lock);
  nb->fork_next = fork_list;
  fork_list = nb;
  unlock_or_die (&fork_lock);
}

static void
fork_list_remove (struct nbdb_backing *nb)
{
  struct nbdb_backing **pp;

  lock_or_die (&fork_lock);
  for (pp = &fork_list; *pp; pp = &(*pp)->fork_next)
    if (*pp == nb) {
      *pp = nb->fork_next;
      break;
    }
  unlock_or_die (&fork_lock);
}

/* The connections after the first are opened side by side, each in its
 * own short-lived thread, all by the same end: an open of 8 against a
 * remote that hangs its handshakes waits one bound, not 7 in a row. */
struct conn_opener {
  struct nbdb_backing *nb;
  uint64_t end;
  struct nbd_handle *h;         /* the result, or NULL */
  pthread_t th;
  int started;
};

static void *
conn_opener_main (void *arg)
{
  struct conn_opener *o = arg;

  o->h = nbdb_conn_open (o->nb, o->end, NULL, 0);
  return NULL;
}

/* Open o[0..n) by end; a thread that cannot start opens in this one. */
static void
conns_open_parallel (struct nbdb_backing *nb, struct conn_opener *o,
                     unsigned n, uint64_t end)
{
  unsigned i;

  for (i = 0; i < n; i++) {
    o[i] = (struct conn_opener) { .nb = nb, .end = end };
    o[i].started = thread_start (&o[i].th, conn_opener_main, &o[i],
                                 "nbd-open/%u", i + 1) == 0;
  }
  for (i = 0; i < n; i++) {
    if (o[i].started)
      pthread_join (o[i].th, NULL);
    else
      conn_opener_main (&o[i]);
  }
}

int
nbdb_conns_start (struct nbdb_backing *nb, struct nbd_handle *first,
                  unsigned n, uint64_t end, char *err, size_t errlen)
{
  struct conn_opener *o;
  unsigned i;

  nb->conns = calloc (n, sizeof *nb->conns);
  nb->async_pool = calloc ((size_t) n * NBD_ASYNC_MAX, sizeof *nb->async_pool);
  if (!nb->conns || !nb->async_pool) {
    snprintf (err, errlen, "%s: out of memory", nb->uri);
    nbd_close (first);
    return -1;
  }
  for (i = 0; i < n; i++) {
    struct nbdb_conn *c = &nb->conns[i];
    pthread_rwlock_init (&c->lock, NULL);
    pthread_mutex_init (&c->poller_lock, NULL);
    pthread_mutex_init (&c->async_lock, NULL);
    c->nb = nb;
    c->efd = eventfd (0, EFD_CLOEXEC | EFD_NONBLOCK);
    nb->nconns = i + 1;
    if (c->efd == -1) {
      snprintf (err, errlen, "%s: eventfd: %s", nb->uri, strerror (errno));
      if (i == 0)
        nbd_close (first);
      return -1;
    }
    for (unsigned k = 0; k < NBD_ASYNC_MAX; k++)
      async_put (c, &nb->async_pool[i * NBD_ASYNC_MAX + k]);
    if (i == 0)
      conn_install (c, first);
  }
  /* The others now, in parallel; one that fails is opened on first use
   * instead. */
  o = n > 1 ? calloc (n - 1, sizeof *o) : NULL;
  if (o) {
    conns_open_parallel (nb, o, n - 1, end);
    for (i = 1; i < n; i++)
      conn_install (&nb->conns[i], o[i - 1].h);
    free (o);
  }
  fork_list_add (nb);
  nb->forkable = 1;
  return 0;
}

void
nbdb_conns_stop (struct nbdb_backing *nb)
{
  unsigned i;

  if (nb->forkable)
    fork_list_remove (nb);
  for (i = 0; nb->conns && i < nb->nconns; i++) {
    struct nbdb_conn *c = &nb->conns[i];
    lock_or_die (&c->poller_lock);
    poller_stop (c);
    unlock_or_die (&c->poller_lock);
    if (c->h) {
      uint64_t d = atomic_load (&nb->deadline);
      if (!d || now_ms () < d)  /* past the deadline: no goodbyes */
        conn_disconnect (c->h);
      nbd_close (c->h);
    }
    if (c->efd >= 0)
      close (c->efd);
    pthread_rwlock_destroy (&c->lock);
    pthread_mutex_destroy (&c->poller_lock);
    pthread_mutex_destroy (&c->async_lock);
  }
  free (nb->conns);
  free (nb->async_pool);
  nb->async_pool = NULL;
  nb->conns = NULL;
  nb->nconns = 0;
}
