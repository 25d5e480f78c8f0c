/* Server internals shared by the files of src/server/.
 *
 * Threading model.
 *
 *   main thread (the daemon's libev loop, server->loop)
 *                              listeners and accept, signals, shutdown,
 *                              the status timer: it hands each accepted
 *                              socket to the least loaded connection
 *                              loop (loop_hand_off, loop-mailbox.c) and
 *                              never touches a connection.
 *   connection loops (--loops, one thread and libev loop each, named
 *                              foliod-loop/N) each own their
 *                              connections and every struct conn field
 *                              except those noted "worker": handshake,
 *                              TLS, request parsing, reply sending,
 *                              timers, budgets.  A connection stays on
 *                              the loop that adopted it for its life.
 *   worker threads (--workers, 16 by default, shared by all loops)
 *                              run the cache calls that may block; an
 *                              executed request goes back to the done
 *                              list of its connection's loop.
 *   the cache's writeback thread and its helpers, and its readahead
 *                              threads (src/cache/readahead.c): a read
 *                              a loop answers may queue a readahead
 *                              window (a short leaf lock), never wait
 *                              for it.
 *
 * What the loops share: the worker pool, the exports (their caches are
 * thread-safe), the counters of connections (max-connections, per
 * client: atomics and clients_lock), the total buffer budget
 * (buf_charged: the shared half, beyond each connection's slice,
 * reserved by compare-and-swap so that the loops together never admit
 * past max-buffer-total; conn-budget.c), the TLS credentials (tls_lock) and
 * shutting_down.  Counters (struct server_counters) and retained buffers
 * are per loop; server_get_stats adds them up.
 *
 * Why one acceptor and not a listener per loop with SO_REUSEPORT: the
 * kernel spreads SO_REUSEPORT by a hash of the peer's address and port,
 * not by load, and only for TCP sockets this process bound itself; Unix
 * sockets, sockets inherited from systemd and a listener that closes
 * with one loop would all need the hand-off anyway.  An accept is rare
 * next to the requests, so one thread doing it costs nothing measurable,
 * and "least loaded" (connections owned, counted when handed over) is
 * exact.
 *
 * Run-to-completion: once a request is parsed and checked, the loop tries
 * it itself (req_try_execute: cache_read / cache_write with CACHE_NOWAIT,
 * which completes from memory or gives up at once, having changed nothing,
 * where it would wait: a miss, a partial block to read, a folio whose
 * stripe is held by backing I/O or writeback, no free room, the dirty
 * limit).  A request it answers is queued for sending at once: no thread
 * hand-off.  Everything else goes to a worker: misses, FUA and
 * write-through writes, direct I/O, FLUSH, TRIM, WRITE_ZEROES, CACHE,
 * BLOCK_STATUS (the backing's map), reads that look for holes, requests
 * over REQ_INLINE_MAX.  The workers are many because a request that
 * waits for a remote (a write-through, a flush, a miss that could not be
 * parked, see below) holds its worker for a round trip; they run no
 * CPU-bound hit, so their number no longer costs cached requests, and
 * each queued request wakes exactly one of them, handed its request
 * (pool.c: no herd, no wake-up that finds nothing).  Inline work per callback is capped
 * (CONN_INLINE_PER_WAKE, then the connection yields) on top of the step
 * and send budgets.  Replies carry the client's cookie, so an inline reply
 * may overtake an earlier request still on a worker, as two workers'
 * replies may; a FLUSH sees every write answered before it arrived (those
 * answered inline are in the cache, dirty, by then).
 *
 * One connection is served by one loop: its requests are parsed in
 * order from one socket, which a second thread could not share (about
 * 2 us of loop CPU per cached 4 KiB read, three system calls per wake-up
 * of 8-12 requests: epoll_wait, one recv, one sendmsg).  Several
 * connections use several loops.  A plain socket's short recv ends a wake-up's reading
 * (conn_recv): the socket is empty and the level-triggered watcher
 * reports what comes next.
 *
 * Parked misses: a read that missed on a backing with asynchronous reads
 * (the nbd backing) is not given to a worker: req_fetch_start has the
 * backing read its range into the request's buffer, and the backing's
 * poller thread puts it on the done list when the remote answered (or
 * failed, or request-timeout passed: the poller cuts the connection).
 * The loop then answers it from those bytes through the cache
 * (cache_read_fetched with CACHE_NOWAIT), or hands it to a worker (a
 * stripe busy, a failed fetch: read again with the backing's retries).
 * So a remote miss holds no thread while it waits, and costs two wake-ups
 * (poller, loop) instead of five.  It counts in conn->nworker like a
 * request on a worker.
 *
 * A write's whole folios are received straight into folio memory: at its
 * header the loop asks the cache for free folios outside the index
 * (cache_write_prepare, no lock kept), reads the payload into them (and
 * the edges into buf), and the commit (inline, or on a worker when it
 * would wait) swaps them in.  No lock is held while the network is
 * waited for, no reader sees a folio before its payload is complete, and
 * a request that never completes gives them back (conn_req_put).
 *
 * Worker threads only ever touch the struct req they were handed (and
 * read the connection fields that are fixed during transmission: exp,
 * structured, extended).  A request travels:
 *
 *   conn free list -> receiving (conn->cur) -> [worker queue -> done list]
 *   -> conn send queue -> conn free list
 *
 * (a parked miss: receiving -> [backing -> done list (-> worker queue ->
 * done list)] -> conn send queue)
 *
 * (the bracketed part only when it could not complete on the loop) and is
 * linked into exactly one of those lists at a time by req->next.
 *
 * Lock order: see include/foliod/lock.h (the one place it is written).
 * Here: pool.lock, sloop.lock, clients_lock and tls_lock are leaves,
 * never nested.  A loop takes cache locks only through CACHE_NOWAIT
 * calls: stripes by trylock, then the cache's index lock.
 * A parked miss reaches the nbd backing (cache_fetch -> read_async):
 * there the connection's rwlock by trylock (its writer, a reconnect,
 * waits for I/O), the poller's mutex by trylock, two leaf mutexes held
 * for moments (the connection's async list and free list) and libnbd's
 * handle lock; no thread start, no malloc.  Anything busy there means
 * EAGAIN, and the request goes to a worker.
 */
#ifndef FOLIOD_SERVER_INTERNAL_H
#define FOLIOD_SERVER_INTERNAL_H

#include <pthread.h>
#include <semaphore.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/uio.h>

#include <ev.h>

#include "foliod/cache.h"
#include "foliod/stat.h"
#include "foliod/lock.h"
#include "server/server.h"
#include "server/transport.h"
#include "server/nbd-proto.h"
#include "server/wire.h"

struct export;

#define NBD_MAX_PAYLOAD     (64u * 1024 * 1024) /* advertised maximum, as
                                                  nbdkit; larger: EINVAL */
#define HS_MAX_OPT_LEN      (64u * 1024)        /* bigger options: TOO_BIG */
#define HS_MAX_STRING       4096                /* spec limit for strings */
#define CONN_RBUF_SIZE      (64u * 1024)
#define CONN_HSOUT_LIMIT    (64u * 1024)  /* stop reading options above */
#define CONN_STEPS_PER_WAKE 64            /* input steps per callback */
#define CONN_SENDS_PER_WAKE 8             /* writev calls per callback */
#define CONN_SEND_IOV       64
#define REQ_MAX_CHUNKS      16            /* content chunks of one read */
#define REQ_HDR_SLOTS       (REQ_MAX_CHUNKS + 2)
#define REQ_IOV_MAX         (2 * REQ_MAX_CHUNKS + 4)
#define REQ_KEEP_BUF_MAX    (4u * 1024 * 1024)  /* larger buffers freed */
#define REQ_INLINE_MAX      (1u * 1024 * 1024)  /* larger: always a worker */
#define CONN_INLINE_PER_WAKE (4u * 1024 * 1024) /* bytes run on the loop per
                                                  callback, then yield */
#define CONN_KEEP_BUF_TOTAL (64u * 1024 * 1024) /* per-connection retained */
#define SERVER_KEEP_DIV     8   /* all retained <= max_buffer_total / this */
/* Buffer a block status reply may need (execute.c allocates it): one
 * descriptor list per metadata context, in the larger of its two forms
 * (NBD_REPLY_TYPE_BLOCK_STATUS_EXT: an 8-byte head, 16-byte
 * descriptors). */
#define REQ_BS_BUF_MAX      (NBD_META_CONTEXTS * (8 + 16 * 16384u))
/* Metadata contexts, as bits of req.bs_contexts. */
#define REQ_BS_ALLOC        1u  /* base:allocation */
#define REQ_BS_CACHE        2u  /* foliod:cache */
/* A reply chunk's header and the fixed part of its payload fit in one
 * slot: 32 bytes of extended header, then up to 12 (OFFSET_HOLE). */
#define REQ_HDR_SLOT_LEN    48

/* One NBD request and, once executed, its reply. */
struct req {
  struct req *next;          /* link in whichever list holds it */
  struct conn *conn;

  /* The request as decoded from the wire. */
  uint16_t flags;
  uint16_t type;
  uint64_t cookie;
  uint64_t offset;
  uint64_t count;            /* length: compact requests 32 bits; with
                                extended headers a 64-bit effect length,
                                or the payload length (a write, <=
                                NBD_MAX_PAYLOAD) */

  uint8_t *buf;              /* write payload, read data, block status */
  size_t buf_cap;
  size_t payload_have;       /* write payload bytes received so far */
  /* A write's whole folios, received straight into folio memory that the
   * cache handed out (cache_write_prepare); buf holds the bytes before
   * and after them.  prep.n == 0: all of the payload is in buf. */
  struct cache_prep prep;
  size_t charged;            /* buffer bytes counted in the budgets */

  unsigned bs_contexts;      /* block status: the contexts to answer
                                (REQ_BS_*): all selected, or those a
                                payload names */
  int error;                 /* NBD error (NBD_E*) or 0; set by checks or
                                by the worker */
  const char *errmsg;        /* static text for the structured error */

  /* The reply, ready to send: iov[iov_next..niov) with iov_off bytes of
   * iov[iov_next] already sent.  iov entries point into hdr[] and buf. */
  struct iovec iov[REQ_IOV_MAX];
  unsigned niov;
  unsigned iov_next;
  size_t iov_off;
  uint8_t hdr[REQ_HDR_SLOTS][REQ_HDR_SLOT_LEN];
  unsigned nhdr;

  /* A read miss parked on an asynchronous backing read (req_fetch_start):
   * the backing's thread sets fetch_err and REQ_FETCHED and puts the
   * request on the done list; the loop then answers it from the fetched
   * data, or hands it to a worker. */
  enum { REQ_FETCH_NONE = 0, REQ_FETCHING, REQ_FETCHED } fetch;
  int fetch_err;
  struct cache_fetched fetched;

  /* A CACHE longer than POOL_TURN_BYTES runs a turn at a time (pool.c):
   * offset and count are the turn's, turn_rest what follows it. */
  uint64_t turn_rest;
  /* Taken from a connection with more queued or running, or a CACHE:
   * runs at the pool's background priority (pool.c). */
  bool pool_bg;
};

/* Connection states.  Input is driven by the state; output (handshake
 * bytes in hsout, replies in the send queue) drains independently. */
enum conn_state {
  CONN_HS_CLIENT_FLAGS = 0, /* reading the client's 32-bit flags */
  CONN_HS_OPT_HDR,          /* reading an option header */
  CONN_HS_OPT_DATA,         /* reading option data into optbuf */
  CONN_HS_OPT_SKIP,         /* discarding an oversized option's data */
  CONN_TX_REQ_HDR,          /* transmission: reading a request header */
  CONN_TX_REQ_PAYLOAD,      /* reading a write payload into cur->buf */
  CONN_TX_REQ_DISCARD,      /* discarding the payload of a refused write */
  CONN_DRAINING,            /* no more input: finish in-flight requests,
                               send what is queued, then close */
  CONN_DEAD,                /* socket closed; freed when no worker holds
                               one of its requests */
  CONN_NSTATES
};

/* Input step results. */
enum step {
  STEP_NEXT = 0,  /* progress made; run the (possibly new) state again */
  STEP_BLOCK,     /* needs more bytes from the socket */
  STEP_PAUSE,     /* cannot take input now (backpressure) */
  STEP_CLOSE,     /* protocol violation or EOF: close the connection */
};

/* Results of the byte-level I/O helpers. */
enum io_res { IO_DONE = 0, IO_AGAIN, IO_EOF, IO_ERR };

struct conn {
  struct server *srv;
  struct sloop *lp;              /* the loop that owns it, for life */
  struct conn *prev, *next;      /* server's list of connections */
  uint64_t id;
  char peer[80];                 /* for log lines */
  int fd;
  const struct transport_ops *tops;
  void *tport;                   /* transport private state (TLS) */
  int tport_want;                /* EV_READ/EV_WRITE the transport needs */
  enum conn_state state;
  atomic_bool closed;            /* conn_close ran: a worker skips its
                                    queued requests (nobody to answer) */

  ev_io io;
  int io_events;                 /* events io is currently started with */
  ev_timer hs_timer;             /* handshake timeout */
  ev_timer idle_timer;           /* idle timeout in transmission */
  ev_tstamp last_active;         /* loop time of the last activity: the
                                    timer re-arms from it when it fires */
  bool client_key_set;           /* counted in srv->clients under ... */
  char client_key[64];           /* ... this source (address or pid) */
  bool in_flush_list;            /* linked in lp->flush_list */
  struct conn *flush_next;

  /* Input. */
  uint8_t *rbuf;                 /* CONN_RBUF_SIZE bytes read ahead */
  size_t rpos, rlen;             /* unread bytes are rbuf[rpos..rlen) */
  uint8_t hdr[32];               /* fixed-size header being received */
  size_t hdr_have;
  unsigned steps_left;           /* input steps left in this wake-up */
  unsigned recvs_left;           /* socket reads left in this wake-up */
  size_t inline_left;            /* bytes to run inline this wake-up */
  bool rdrained;                 /* this wake-up's last recv was short:
                                    the socket is empty (plain) */
  bool eof;                      /* peer closed or reset the socket */
  bool send_blocked;             /* last send hit EAGAIN: wait for EV_WRITE */
  bool yielded;                  /* budget ran out with input pending */

  /* Handshake. */
  uint32_t client_flags;
  uint32_t opt;                  /* option being received */
  uint32_t opt_len;
  uint8_t *optbuf;               /* option data (HS_MAX_OPT_LEN max) */
  size_t opt_have;
  uint64_t skip_left;            /* bytes to discard (option or payload) */
  uint8_t *hsout;                /* handshake replies waiting to be sent */
  size_t hsout_len, hsout_sent, hsout_cap;
  bool tls_active;               /* STARTTLS done (TLS transport in tops) */
  bool structured;               /* NBD_OPT_STRUCTURED_REPLY or
                                    NBD_OPT_EXTENDED_HEADERS acked */
  bool extended;                 /* NBD_OPT_EXTENDED_HEADERS acked: 32-byte
                                    requests and replies, no simple
                                    reply (implies structured) */
  bool meta_alloc;               /* base:allocation selected ... */
  bool meta_cache;               /* foliod:cache selected ... */
  struct export *meta_exp;       /* ... for this export */

  /* Transmission. */
  struct export *exp;            /* chosen export; fixed from GO on */
  uint16_t tflags;               /* transmission flags sent */
  bool requested;                /* has sent a request header */
  bool no_zeroes;
  struct req *cur;               /* request whose payload is arriving */
  struct req *free_reqs;         /* reusable requests */
  size_t kept_buf_bytes;         /* buffer bytes held by free_reqs */
  unsigned nactive;              /* requests out of the free list */
  unsigned nworker;              /* of which held by workers */
  struct req *sendq_head, *sendq_tail; /* replies ready to send */
  size_t charged;                /* buffer bytes of active requests */
  size_t reserved;               /* of the shared half of the total,
                                    admitted by conn_budget_hdr_ready,
                                    not yet charged to a request */
  bool budget_waiting;           /* linked in lp->budget_waiters */
  struct conn *budget_next;

  /* In the worker pool (pool.c), under pool.lock. */
  struct req *pq_head, *pq_tail; /* its requests queued for workers */
  struct conn *pool_next;        /* in pool.ring while pq_head is set */
  unsigned pool_busy;            /* workers on its requests */
};

/* Connections open per source (conn.client_key), for
 * max_connections_per_client. */
struct client_count {
  struct client_count *next;
  unsigned n;
  char key[64];
};

/* The worker pool. */
/* A worker's own wake-up: the loop hands it a request directly. */
struct pool_worker {
  struct pool *pool;
  pthread_t thread;
  sem_t wake;
  struct req *handed;            /* set by whoever popped it off idle */
  struct pool_worker *next_idle;
  int nice;                      /* this thread's nice value now */
};

struct pool {
  pthread_mutex_t lock;
  struct conn *ring, *ring_tail; /* connections with queued requests, in
                                    turn (round-robin) */
  unsigned nqueued;              /* requests queued, all connections */
  bool stop;
  unsigned nthreads;
  struct pool_worker *idle;      /* waiting workers, the last idle first */
  struct pool_worker *workers;
  int nice_base;                 /* the workers' nice value at start */
  bool nice_bg;                  /* they may lower their priority for
                                    background requests and raise it again
                                    (probed by pool_start) */
  void (*done) (void *opaque, struct req *r); /* on the worker, after */
  void *done_opaque;
};

/* A loop's requests parsed this wake-up, not yet queued to the pool. */
struct pool_batch {
  struct req *head, *tail;
};

/* What server_get_stats reports, as counters (foliod/stat.h). */
struct server_counters {
  _Atomic uint64_t connections_now, connections_total, connections_refused;
  _Atomic uint64_t handshakes_failed, requests, request_errors;
  _Atomic uint64_t requests_inline, requests_parked;
  _Atomic uint64_t bytes_read, bytes_written;
};

struct listener {
  struct listener *next;
  struct server *srv;
  int fd;
  ev_io io;
  ev_timer backoff;              /* restarts io after EMFILE and the like */
  ev_tstamp warned_at;           /* last backoff log line; 0: never */
  char *unix_path;               /* removed on free; NULL for TCP */
  char name[96];
};

/* A socket accepted on the main thread, on its way to a loop. */
struct handoff {
  struct handoff *next;
  int fd;
  char peer[80];
  char key[64];
};

/* Commands to a loop (sloop.cmd bits, set by the main thread). */
#define LOOP_CMD_SHUTDOWN 1u  /* server_shutdown: begin, or force */
#define LOOP_CMD_BUDGET   2u  /* another loop released buffer budget */
#define LOOP_CMD_EXIT     4u  /* server_free: leave ev_run */

/* One connection loop (loops.c): a thread running its own libev loop,
 * or, for an in-process driver (cfg.loops_inline), the caller's loop. */
struct sloop {
  struct server *srv;
  unsigned idx;
  struct ev_loop *loop;
  pthread_t thread;
  bool threaded;                 /* thread started: join it */

  /* Owned by the loop's thread. */
  struct conn *conns;            /* its connections, live or dead */
  struct conn *flush_list;       /* connections with new replies */
  size_t buf_kept;               /* of free lists, its conns; at most
                                    its share of the total / KEEP_DIV */
  struct conn *budget_waiters;   /* paused on the total buffer budget */
  struct pool_batch batch;       /* for the worker pool */

  /* Filled by other threads, under lock (a leaf); wake tells the loop. */
  ev_async wake;
  pthread_mutex_t lock;
  struct req *done_head, *done_tail; /* executed, back from workers */
  struct handoff *in_head, *in_tail; /* accepted sockets to adopt */
  unsigned cmd;                  /* LOOP_CMD_* */

  _Atomic unsigned nconns;       /* connection structs alive (open or
                                    waiting for workers) */
  _Atomic unsigned nqueued;      /* sockets handed over, not adopted */
  _Atomic bool budget_waiting;   /* budget_waiters is not empty */
  struct server_counters st;     /* STAT_ADD on the loop, read anywhere */
};

struct server {
  struct ev_loop *loop;          /* the main thread's: accept, shutdown */
  struct server_config cfg;

  struct export **exports;
  size_t nexports;
  int no_default;                /* the empty name finds no export */

  struct listener *listeners;
  struct sloop *loops;           /* nloops connection loops */
  unsigned nloops;
  unsigned next_loop;            /* main thread: where the next hand-off
                                    starts looking (ties go round) */
  _Atomic unsigned nconns;       /* with an open socket, all loops */
  _Atomic uint64_t next_conn_id;
  _Atomic size_t buf_charged;    /* request buffers in use beyond each
                                    connection's slice, all conns */
  _Atomic unsigned budget_waiting_loops; /* loops with budget waiters */
  pthread_mutex_t clients_lock;  /* a leaf: clients */
  struct client_count *clients;  /* open connections per source */

  struct pool pool;

  _Atomic bool shutting_down;
  bool forced;
  void (*shutdown_done) (void *opaque);
  void *shutdown_opaque;
  ev_timer shutdown_timer;       /* grace period, then force */
  ev_async gone_async;           /* a loop lost its last connection */
  ev_idle done_idle;             /* calls shutdown_done from the loop */

  pthread_mutex_t tls_lock;      /* a leaf: tls_ctx */
  struct ssl_ctx_st *tls_ctx;    /* TLS for new connections (tls.h);
                                    NULL: STARTTLS refused */
};

/* Map a byte-level I/O result to an input step result. */
static inline enum step
io_step (enum io_res r)
{
  switch (r) {
  case IO_DONE:  return STEP_NEXT;
  case IO_AGAIN: return STEP_BLOCK;
  default:       return STEP_CLOSE;
  }
}

/* Length of a request header on c (known from the negotiation). */
static inline size_t
conn_req_hdr_len (const struct conn *c)
{
  return c->extended ? NBD_EXTENDED_REQUEST_LEN : NBD_REQUEST_LEN;
}

/* The length field of the request header in c->hdr: 32 bits compact,
 * 64 bits extended (the same offset in both). */
static inline uint64_t
conn_hdr_length (const struct conn *c)
{
  return c->extended ? get_be64 (c->hdr + 24) : get_be32 (c->hdr + 24);
}

static inline bool
conn_state_is_handshake (enum conn_state st)
{
  return st <= CONN_HS_OPT_SKIP;
}

static inline bool
conn_state_is_transmission (enum conn_state st)
{
  return st >= CONN_TX_REQ_HDR && st <= CONN_TX_REQ_DISCARD;
}

/* The files of src/server, lowest floor first: each calls only files
 * below it (make check-layout; docs/internals.md, "src/server floors"). */

/* loop-mailbox.c: other threads reach a loop (and a loop the main
 * thread) through these; queues and counters only */
void loop_req_done (void *opaque, struct req *r);
void loop_post (struct sloop *lp, unsigned cmd);
void loop_hand_off (struct server *s, int fd, const char *peer,
                    const char *key);
void loop_conn_gone (struct sloop *lp);
void loop_check_gone (struct sloop *lp);

/* admit.c: the export list and connections per client */
struct export *server_find_export (struct server *s, const char *name);
int server_client_admit (struct server *s, struct conn *c, const char *key);
void server_client_gone (struct conn *c);

/* conn-io.c: a connection's state, buffered input and queued output */
void conn_set_state (struct conn *c, enum conn_state st);
const char *conn_state_name (enum conn_state st);
void conn_touch (struct conn *c);
enum io_res conn_read_exact (struct conn *c, void *dst, size_t need,
                             size_t *have);
enum io_res conn_read_direct (struct conn *c, void *dst, size_t need,
                              size_t *have);
enum io_res conn_skip (struct conn *c, uint64_t *left);
int conn_out_append (struct conn *c, const void *p, size_t n);
void conn_mark_flush (struct conn *c);
void conn_queue_reply (struct conn *c, struct req *r);

/* conn-budget.c: a connection's requests and their buffer budget */
struct req *conn_req_get (struct conn *c);
void conn_req_put (struct conn *c, struct req *r);
bool conn_budget_hdr_fits (const struct conn *c);
bool conn_budget_hdr_ready (struct conn *c);
void conn_budget_charge (struct conn *c, struct req *r, size_t need);
void conn_budget_wake (struct sloop *lp);
void conn_budget_drop (struct conn *c);

/* execute.c: run on a worker (or on the loop for refused requests) */
void req_execute (struct req *r);
/* On the loop: execute r if the cache can without waiting (true, reply
 * built), else false with r untouched, for a worker. */
bool req_try_execute (struct req *r);
/* Park a read that missed on an asynchronous backing read: true when
 * issued (the request is then off the loop, as on a worker, until it
 * comes back on the done list as REQ_FETCHED); false: run it on a
 * worker. */
bool req_fetch_start (struct req *r);
void req_build_reply (struct req *r);

/* pool.c: the workers, which run req_execute; done runs on the worker
 * for each executed request */
int pool_start (struct pool *p, unsigned nthreads,
                void (*done) (void *opaque, struct req *r), void *opaque);
void pool_submit (struct pool_batch *b, struct req *r);
void pool_submit_flush (struct pool *p, struct pool_batch *b);
void pool_stop (struct pool *p);

/* handshake.c: input steps of the handshake states */
void hs_start (struct conn *c);
enum step hs_step_client_flags (struct conn *c);
enum step hs_step_opt_hdr (struct conn *c);
enum step hs_step_opt_data (struct conn *c);
enum step hs_step_opt_skip (struct conn *c);

/* request.c: input steps of the transmission states */
enum step tx_step_req_hdr (struct conn *c);
enum step tx_step_req_payload (struct conn *c);
enum step tx_step_req_discard (struct conn *c);

/* conn.c: the connection driver (life cycle, input steps, sending) */
void conn_new (struct sloop *lp, int fd, const char *peer,
               const char *client_key);
void conn_after_io (struct conn *c);
void conn_flush_pending (struct sloop *lp);
void conn_begin_shutdown (struct conn *c, bool force);
void conn_maybe_free (struct conn *c);
void conn_free (struct conn *c);

/* loops.c: the connection loops (threads, wake-up, the done list) */
int loops_start (struct server *s);
void loops_stop (struct server *s);
void loops_free (struct server *s);
void loop_take_done (struct sloop *lp);
bool loops_all_gone (struct server *s);

#endif /* FOLIOD_SERVER_INTERNAL_H */
