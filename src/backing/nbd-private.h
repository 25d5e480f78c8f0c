/* The nbd backing's private state, shared by nbd.c (the ops, the extent
 * cache) and nbd-conn.c (connections, reconnect, request issue). */
#ifndef FOLIOD_BACKING_NBD_PRIVATE_H
#define FOLIOD_BACKING_NBD_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <libnbd.h>

#include "foliod/backing.h"

#define NBD_EXT_SLOTS   64  /* cached extents */
#define NBD_INVAL_LOG   16  /* recent invalidations remembered */
#define NBD_ASYNC_MAX   512 /* async commands in flight per connection */
#define NBD_ID_SAMPLES  8   /* blocks remembered to check a reconnect */
#define NBD_ID_BLOCK    4096 /* bytes of each */

/* One connection to the remote.  Any number of threads issue aio
 * commands on it at once; one poller thread per connection moves the
 * libnbd state machine and runs the completion callbacks.
 *
 * Lock order: conn.lock, then libnbd's own handle lock (taken inside
 * every nbd_* call).  ext_lock is a leaf, never held across libnbd.
 * Across layers: include/foliod/lock.h. */
struct nbdb_conn {
  pthread_rwlock_t lock;        /* read: issuing on h; write: replacing h */
  struct nbd_handle *h;         /* NULL: down */
  uint64_t gen;                 /* bumped each time h is replaced/retried */
  atomic_int users;             /* commands issued on h, waiter not done:
                                 * h is not closed while this is > 0 */
  atomic_int up;                /* h != NULL (cheap hint for picking) */
  atomic_int cut;               /* h's socket was shut down (a request on
                                 * it hung): issue nothing more on it */
  atomic_int used;              /* commands were issued (fork: restart) */
  atomic_int reopening;         /* a thread is connecting a new h, without
                                 * holding lock: the others do not wait */
  atomic_int ended;             /* h's end is counted in nb->ends */
  int efd;                      /* eventfd: wakes the poller */
  atomic_int stop;              /* tells the poller to exit */
  /* The poller starts when a handle is installed, and again on first
   * sync use in a child after fork (nbdkit forks after .get_ready;
   * threads do not survive it). */
  pthread_mutex_t poller_lock;  /* protects the three below */
  pthread_t poller;
  int has_poller;
  pid_t poller_pid;             /* process the poller runs in */
  int restart;                  /* fork: restart the poller in the parent */
  struct nbdb_backing *nb;      /* the backing this connection is of */
  /* Asynchronous commands in flight on h (nbdb_run_async): the poller
   * cuts the connection when the first of them is past its deadline. */
  pthread_mutex_t async_lock;   /* a leaf; protects the two below */
  struct nbdb_async *async_head;
  struct nbdb_async *async_free; /* unused, NBD_ASYNC_MAX of nb's
                                  * async_pool: no malloc on the loop */
};

struct ext_slot {
  uint64_t off, len;            /* len 0: free */
  enum backing_extent_type type;
  uint64_t epoch;               /* nb->reconnects when told; stale after */
};

struct inval {
  uint64_t off, end, gen;
};

/* A block the remote served (nbd-ident.c). */
struct id_sample {
  uint64_t off;                 /* NBD_ID_BLOCK bytes at off */
  uint64_t hash;                /* their FNV-1a */
  uint64_t wseq;                /* id_wseq when read: firm once flushed */
  bool used;
};

struct nbdb_backing {
  struct backing b;             /* first */
  char *uri;
  char *tls_certificates, *tls_psk_file, *tls_username;
  unsigned retry_timeout_ms;
  unsigned request_timeout_ms;
  int can_fua, can_flush, can_zero, can_fast_zero, can_trim, has_map;
  uint32_t max_io;              /* bytes per read/write request */
  void *zero_buf;               /* for remotes without WRITE_ZEROES */

  unsigned nconns;
  struct nbdb_conn *conns;
  struct nbdb_async *async_pool; /* NBD_ASYNC_MAX per connection */
  atomic_uint next_conn;        /* round robin */

  pthread_mutex_t ext_lock;     /* protects everything below */
  struct ext_slot ext[NBD_EXT_SLOTS];
  unsigned ext_hand;            /* next slot to replace */
  uint64_t gen;                 /* bumped by every invalidation */
  struct inval inval[NBD_INVAL_LOG]; /* the last ones, by gen % LOG */
  struct map_async *map_async;  /* a lookahead in flight (nbd.c) or NULL */

  /* reconnects also dates the extent cache: ext_slot.epoch */
  atomic_uint_fast64_t reconnects, retries, errors;
  /* The backing's reachability, shared by all requests so that a remote
   * that went away is waited for once, not once per request (now_ms()
   * times).  down_since: 0 while connections work; else when a reconnect
   * first failed.  Until down_since + retry_timeout_ms requests wait for
   * the remote (a restart); after it the backing is down: requests fail
   * at once with ENOTCONN, except one probe (a reconnect) per
   * NBD_BACKOFF_MAX_MS, at next_probe.  deadline: set at shutdown, no
   * request waits past it (0: none). */
  atomic_uint_fast64_t down_since, next_probe, deadline;
  /* Facts for the cache's durability ledger, which alone decides what
   * they cost (src/cache/ledger.c).  ends: connections that ended, each
   * counted once, at the first of: foliod cut it (conn_cut), or closed
   * it to replace it (conn_drop: one a reset or a remote that went away
   * ended is counted there, when a request finds it dead) -- the remote
   * may have dropped what it acknowledged on it and had not flushed
   * (backing_ops.loss_epoch).
   * in_doubt: write-class requests sent, then not answered in time or
   * lost with their connection (whoever ended it), so the remote may
   * still carry them out.  Flush and FUA fail with EIO while this is
   * not 0; only clear_doubt (the operator) resets it. */
  atomic_uint_fast64_t ends;
  atomic_uint_fast64_t in_doubt;

  /* What the remote said of its export at open, checked at every
   * reconnect besides the size (issue 33 item 8): the handshake flags
   * the backing relies on (nbdb_id_flags) and its description, if it
   * gives one (NULL).  NBD names no image: another one of the same size,
   * flags and description cannot be told apart.  refusal_logged: a hash
   * of the last refusal logged since the last good reconnect (0: none),
   * so that each new reason is logged once, not at every probe. */
  unsigned id_flags;
  char *id_desc;
  atomic_uint_fast64_t refusal_logged;
  /* ... and the content: blocks the remote served, compared again at
   * every reconnect (nbd-ident.c).  id_wseq moves at the start and the
   * end of every write, zero and trim (id_writing in flight); id_flushed
   * is the id_wseq a good flush covered.  id_lock (a leaf) protects id[]
   * and id_flushed. */
  pthread_mutex_t id_lock;
  struct id_sample id[NBD_ID_SAMPLES];
  atomic_uint id_mask;          /* bit i: id[i].used, read without id_lock
                                 * as a hint (a read takes no lock and
                                 * hashes nothing when its slot is full) */
  atomic_uint_fast64_t id_wseq, id_writing;
  uint64_t id_flushed;

  struct nbdb_backing *fork_next; /* list of open backings (nbd-conn.c) */
  int forkable;                 /* on that list */
};

/* Issue one aio command on h with completion callback cb.  Returns the
 * cookie, or -1 (libnbd error set; cb will not be called). */
typedef int64_t (*nbdb_issue) (struct nbd_handle *h, void *arg,
                               nbd_completion_callback cb);

/* Run one request: issue it on a connection and wait.  When the
 * connection is what failed, reconnect (backoff 50 ms .. 2 s, within the
 * backing's reconnect window, see down_since) and issue it again; ENOTCONN
 * when the remote stays away.  A request not answered within
 * request_timeout_ms fails with ETIMEDOUT.  0, or -1 with errno. */
int nbdb_run (struct nbdb_backing *nb, nbdb_issue fn, void *arg);
/* nbdb_run for a write-class command (write, zero, trim): one that was
 * sent and then abandoned (hung, or lost with its connection without an
 * answer; not one the remote answered ESHUTDOWN) counts in nb->in_doubt,
 * whether or not a retry succeeds. */
int nbdb_run_write (struct nbdb_backing *nb, nbdb_issue fn, void *arg);
/* A read whose answer may become a content sample (nbd-ident.c): its
 * buffer, range and nbdb_id_read_begin's token. */
struct nbdb_read_id {
  const void *buf;
  uint64_t len, off, token;
};

/* Issue fn once without waiting; done (opaque, 0 or errno) runs on the
 * poller (or this thread) when the remote answered, the connection
 * failed, or request_timeout_ms passed (then the connection is cut, and
 * the backing counts as down as for a hung sync request).  -1 (errno)
 * when not issued: the backing is down or reconnecting, no connection
 * is up, its lock is taken (a reconnect), it has no poller in this
 * process, or NBD_ASYNC_MAX are in flight; the caller then uses
 * nbdb_run.  No retries.  Never blocks: the daemon's event loop calls
 * it; it takes only leaf mutexes held for moments (async_lock,
 * poller_lock by trylock) and libnbd's handle lock, never c->lock's
 * writer, a thread start or malloc.  rid (or NULL): a read that
 * succeeded is offered to nbdb_id_read_done before done runs. */
int nbdb_run_async (struct nbdb_backing *nb, nbdb_issue fn, void *arg,
                    void (*done) (void *opaque, int err), void *opaque,
                    const struct nbdb_read_id *rid);

/* The handshake flags of h that the backing relies on: read-only, flush,
 * FUA, trim, zero, fast zero, multi-conn, base:allocation, one bit each. */
unsigned nbdb_id_flags (struct nbd_handle *h);
/* The export's description h got (NBD_INFO_DESCRIPTION), malloc'd, or
 * NULL when none. */
char *nbdb_id_desc (struct nbd_handle *h);

/* Content identity (nbd-ident.c).  A write, zero or trim of
 * [off, off+len) begins (its samples are dropped) / ended. */
void nbdb_id_write_begin (struct nbdb_backing *nb, uint64_t off,
                          uint64_t len);
void nbdb_id_write_end (struct nbdb_backing *nb);
/* A flush begins: the token for nbdb_id_flushed once it succeeded. */
uint64_t nbdb_id_flush_begin (struct nbdb_backing *nb);
void nbdb_id_flushed (struct nbdb_backing *nb, uint64_t token);
/* A read is issued: the token for nbdb_id_read_done, called when it
 * succeeded with the len bytes at off in buf (maybe a sample). */
uint64_t nbdb_id_read_begin (struct nbdb_backing *nb);
void nbdb_id_read_done (struct nbdb_backing *nb, uint64_t token,
                        const void *buf, uint64_t len, uint64_t off);
/* Does the new handle h (not yet installed) serve other content than the
 * remote served before?  Reads the firm samples from h by end (now_ms()
 * time).  0: no difference found; 1: one differs; -1: a read failed.
 * The reason in why for 1 and -1. */
int nbdb_id_differs (struct nbdb_backing *nb, struct nbd_handle *h,
                     uint64_t end, char *why, size_t len);

/* Shutdown deadline (backing op set_deadline). */
void nbdb_conns_set_deadline (struct nbdb_backing *nb, uint64_t deadline_ms);

/* When must a connect that starts now have finished its handshake
 * (request_timeout_ms, at most 10 s; never past the shutdown deadline)? */
uint64_t nbdb_connect_end (struct nbdb_backing *nb);
/* The open's bound: 10 s, whatever request-timeout says. */
uint64_t nbdb_open_end (struct nbdb_backing *nb);

/* Open a handle (TLS options, base:allocation requested), its handshake
 * done by end (now_ms() time; 0: nbdb_connect_end from now).  NULL with
 * a one-line reason in err (err may be NULL). */
struct nbd_handle *nbdb_conn_open (struct nbdb_backing *nb, uint64_t end,
                                   char *err, size_t errlen);

/* Set up nb->conns[0..n): the first on handle first, the others opened
 * now, in parallel and all by end (one bound for the whole open), or on
 * first use when that fails.  0, or -1 with err. */
int nbdb_conns_start (struct nbdb_backing *nb, struct nbd_handle *first,
                      unsigned n, uint64_t end, char *err, size_t errlen);

/* Stop every poller and close every handle.  No request in flight. */
void nbdb_conns_stop (struct nbdb_backing *nb);

#endif /* FOLIOD_BACKING_NBD_PRIVATE_H */
