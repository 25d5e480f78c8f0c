/* The worker pool: threads that run cache calls, which may block on the
 * backing.  Requests come in through per-connection queues under the
 * pool's lock; each executed request goes to the done callback the pool
 * was started with (the server's, which hands it back to the loop
 * thread).
 *
 * Fairness between exports: at most half of the workers (at least one)
 * run requests of one export at a time.  A remote that hangs holds each
 * of its requests' workers until request-timeout; without the cap, 16
 * requests to it would stall every other export, local files included.
 *
 * Fairness between connections: each connection queues its own requests,
 * and the connections with requests queued take turns (a ring: the one
 * served goes to the back).  One connection runs at most a quarter of
 * the workers (at least one) at a time, and the last quarter of an
 * export's share (at least one worker of a share of 2 or more) is kept
 * for its connections that hold no worker and have a single request
 * queued.  64 BLOCK_STATUS or CACHE
 * requests from each of a few clients no longer stand in one FIFO before
 * another client's 4 KiB read: a request queued waits for at most one
 * request of each other connection queued to start, plus the workers
 * busy when it came (tests/unit/test-pool-fair.c).  A request over a cap
 * waits in its queue; the other connections pass it.
 *
 * Turns of long requests: a CACHE runs POOL_TURN_BYTES (1 MiB) at a time;
 * after each turn it goes back to the head of its connection's queue and
 * its connection to the back of the ring, so that a CACHE of 1 GiB holds
 * a worker (and the cache's range locks: a window of up to 256 folios,
 * whose stripes a read elsewhere may share) for 1 MiB at a time, not for
 * seconds, and a connection whose queue is closed stops after the turn.
 * Its one reply goes out after the last turn (or the first that fails).
 *
 * Priorities: a request taken from a connection that has more queued or
 * running, and a CACHE (a hint nobody waits for), runs with the worker's
 * nice value raised by POOL_BG_NICE (10); any other at the workers' own.
 * On two loaded cores, six workers running the adversaries' requests at
 * the victim's priority made its worker wait 20-35 ms (p99) for a CPU
 * once handed its read, and its loop as long; at nice +10 they yield it
 * at once.  Only where a worker may raise its priority back (root,
 * CAP_SYS_NICE, or RLIMIT_NICE: systemd's LimitNICE=+0, which the shipped
 * units set), which pool_start probes on a thread of its own: elsewhere
 * every request runs at the workers' priority.  Linux: nice is per
 * thread.
 *
 * Wake-ups: an idle worker sleeps on its own semaphore, on a stack (the
 * one idle last is woken first: its cache lines are warm).  Whoever wakes
 * it takes the request for it first and hands it over, so a woken worker
 * always has work and no worker wakes for nothing.  Measured on remote
 * misses with 16 workers and one condition variable: two context switches
 * per request in the pool's wait (a signalled worker found the queue
 * already emptied by a worker that came back from its request, or slept
 * again on the pool's mutex held by the signaller), one now.
 */
#include <errno.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "foliod/export.h"
#include "foliod/util.h"
#include "server/internal.h"
#include "server/nbd-proto.h"

/* Added to the workers' nice value while they run a background request
 * (see the top). */
#define POOL_BG_NICE 10

/* The most of a CACHE request one worker runs in one turn. */
#ifndef POOL_TURN_BYTES
#define POOL_TURN_BYTES (1u << 20)
#endif

/* Workers one export may hold at once. */
static unsigned
pool_share (const struct pool *p)
{
  return p->nthreads > 1 ? p->nthreads / 2 : 1;
}

/* Workers one connection may hold at once. */
static unsigned
pool_conn_share (const struct pool *p)
{
  return p->nthreads >= 4 ? p->nthreads / 4 : 1;
}

/* Of an export's share, the workers kept for connections that hold none
 * and have one request queued: a quarter, and at least one as soon as
 * the share is 2 (--workers 4 to 7, where a quarter rounds to nothing
 * and a one-block read waited for a whole CACHE of 64 MiB).  A share of
 * 1 keeps none: the others would never run. */
static unsigned
pool_kept (unsigned share)
{
  if (share < 2)
    return 0;
  return share >= 8 ? share / 4 : 1;
}

/* Put c at the back of the ring (lock held). */
static void
pool_ring_append (struct pool *p, struct conn *c)
{
  c->pool_next = NULL;
  if (p->ring_tail)
    p->ring_tail->pool_next = c;
  else
    p->ring = c;
  p->ring_tail = c;
}

/* May c take one more worker?  Under its own share, and under its
 * export's; the last quarter of the export's share goes only to
 * connections that hold no worker and have one request queued, so that
 * a client reading one block at a time finds a worker at once however
 * many others keep deep queues. */
static bool
pool_may_run (const struct pool *p, const struct conn *c)
{
  unsigned cap = pool_share (p);

  if (c->pool_busy >= pool_conn_share (p))
    return false;
  if (c->exp == NULL)
    return true;
  if (c->pool_busy > 0 || c->pq_head->next)
    cap -= pool_kept (cap);
  return c->exp->workers_busy < cap;
}

/* Take the first request of the first connection in the ring that may
 * run one more (lock held); that connection goes to the back of the
 * ring.  NULL: none may run now. */
static struct req *
pool_take_locked (struct pool *p)
{
  struct conn *c, *prev = NULL;
  struct req *r;

  for (c = p->ring; c; prev = c, c = c->pool_next)
    if (pool_may_run (p, c))
      break;
  if (c == NULL)
    return NULL;
  if (prev)
    prev->pool_next = c->pool_next;
  else
    p->ring = c->pool_next;
  if (p->ring_tail == c)
    p->ring_tail = prev;
  r = c->pq_head;
  c->pq_head = r->next;
  if (c->pq_head)
    pool_ring_append (p, c);
  else {
    c->pq_tail = NULL;
    c->pool_next = NULL;
  }
  p->nqueued--;
  c->pool_busy++;
  r->pool_bg = c->pq_head != NULL || c->pool_busy > 1
    || r->type == NBD_CMD_CACHE;
  if (c->exp)
    c->exp->workers_busy++;
  return r;
}

/* Pop idle workers and hand each a request that may run now, as long as
 * both last (lock held).  Returns the list of those to wake (linked by
 * next_idle), which the caller posts after unlocking: a worker woken
 * while the lock is held would sleep again on it at once. */
static struct pool_worker *
pool_hand_locked (struct pool *p)
{
  struct pool_worker *wake = NULL;

  while (p->idle && p->nqueued) {
    struct req *r = pool_take_locked (p);
    struct pool_worker *w = p->idle;
    if (!r)
      break;
    p->idle = w->next_idle;
    w->handed = r;
    w->next_idle = wake;
    wake = w;
  }
  return wake;
}

/* Cut r to its first turn if it is a long CACHE (before it runs). */
static void
pool_turn_begin (struct req *r)
{
  if (r->type != NBD_CMD_CACHE || r->turn_rest || r->count <= POOL_TURN_BYTES)
    return;
  r->turn_rest = r->count - POOL_TURN_BYTES;
  r->count = POOL_TURN_BYTES;
}

/* After a turn of r: true if r goes on with its next turn, put back at
 * the head of its connection's queue, its connection at the back of the
 * ring if it was not in it (lock held).  Not after an error, nor for a
 * closed connection: its reply (built for the whole request: a CACHE
 * reply names no range) goes out now. */
static bool
pool_turn_next (struct pool *p, struct req *r)
{
  struct conn *c = r->conn;

  if (r->turn_rest == 0)
    return false;
  if (r->error || atomic_load_explicit (&c->closed, memory_order_relaxed)) {
    r->turn_rest = 0;
    return false;
  }
  r->niov = r->nhdr = 0;        /* the turn's reply: not sent */
  r->offset += r->count;
  r->count = r->turn_rest < POOL_TURN_BYTES ? r->turn_rest : POOL_TURN_BYTES;
  r->turn_rest -= r->count;
  r->next = c->pq_head;
  c->pq_head = r;
  if (!c->pq_tail) {
    c->pq_tail = r;
    pool_ring_append (p, c);
  }
  p->nqueued++;
  return true;
}

/* Set the calling thread's nice value (Linux: per thread).  0 or -1. */
static int
thread_set_nice (int nice)
{
  return setpriority (PRIO_PROCESS, (id_t) syscall (SYS_gettid), nice);
}

static int
pool_bg_nice (const struct pool *p)
{
  return p->nice_base + POOL_BG_NICE < 19 ? p->nice_base + POOL_BG_NICE : 19;
}

/* Run at the background priority for r if it is a background request,
 * else at the workers' own (a no-op unless pool_start found that a worker
 * may raise its priority back: CAP_SYS_NICE or RLIMIT_NICE). */
static void
pool_set_priority (const struct pool *p, struct pool_worker *w,
                   const struct req *r)
{
  int want = r->pool_bg ? pool_bg_nice (p) : p->nice_base;

  if (p->nice_bg && want != w->nice && thread_set_nice (want) == 0)
    w->nice = want;
}

/* On a thread of its own: may a worker lower its priority and raise it
 * back? */
static void *
pool_probe_nice (void *arg)
{
  struct pool *p = arg;

  p->nice_bg = pool_bg_nice (p) != p->nice_base
    && thread_set_nice (pool_bg_nice (p)) == 0
    && thread_set_nice (p->nice_base) == 0;
  return NULL;
}

static void
pool_wake (struct pool_worker *list)
{
  while (list) {
    struct pool_worker *w = list;
    list = w->next_idle;        /* read before the post: w runs then */
    sem_post (&w->wake);
  }
}

/* Wait until popped off the idle stack (lock held on entry and exit).
 * Returns the request handed over, NULL when woken to stop. */
static struct req *
pool_idle_wait (struct pool *p, struct pool_worker *w)
{
  w->handed = NULL;
  w->next_idle = p->idle;
  p->idle = w;
  unlock_or_die (&p->lock);
  while (sem_wait (&w->wake) == -1)
    if (errno != EINTR)
      abort ();
  lock_or_die (&p->lock);
  return w->handed;
}

static void *
pool_worker (void *arg)
{
  struct pool_worker *w = arg;
  struct pool *p = w->pool;
  struct req *r = NULL;

  for (;;) {
    lock_or_die (&p->lock);
    while (!r) {
      r = pool_take_locked (p);
      if (!r && p->stop && !p->nqueued) {
        /* Stopping and nothing left.  Workers that went idle again
         * after pool_stop's wake-up (over a share then) wait for nothing
         * now: wake them to leave too. */
        struct pool_worker *wake = p->idle;
        for (struct pool_worker *i = wake; i; i = i->next_idle)
          i->handed = NULL;
        p->idle = NULL;
        unlock_or_die (&p->lock);
        pool_wake (wake);
        return NULL;
      }
      if (!r)
        r = pool_idle_wait (p, w);
    }
    unlock_or_die (&p->lock);

    while (r) {
      /* The connection lives until its request is done (p->done hands
       * it back to its loop, which may free it then): its counts go
       * back before that. */
      struct conn *c = r->conn;
      struct req *next = NULL;
      struct pool_worker *wake;
      bool again;

      pool_turn_begin (r);
      pool_set_priority (p, w, r);
      req_execute (r);
      lock_or_die (&p->lock);
      c->pool_busy--;
      if (c->exp)
        c->exp->workers_busy--;
      again = pool_turn_next (p, r);
      /* A request of c or of its export may have waited for this
       * worker's share: this worker takes the next one itself; an idle
       * one gets what is left over. */
      if (p->nqueued) {
        next = pool_take_locked (p);
        wake = pool_hand_locked (p);
      }
      else
        wake = NULL;
      unlock_or_die (&p->lock);
      pool_wake (wake);
      if (!again)
        p->done (p->done_opaque, r);
      r = next;
    }
  }
}

int
pool_start (struct pool *p, unsigned nthreads,
            void (*done) (void *opaque, struct req *r), void *opaque)
{
  int err = 0;

  p->done = done;
  p->done_opaque = opaque;
  p->ring = p->ring_tail = NULL;
  p->nqueued = 0;
  p->stop = false;
  p->nthreads = 0;
  p->idle = NULL;
  p->nice_bg = false;
  errno = 0;
  p->nice_base = getpriority (PRIO_PROCESS, 0);   /* this thread's */
  if (p->nice_base == -1 && errno)
    p->nice_base = 0;
  else {
    pthread_t probe;
    if (thread_start (&probe, pool_probe_nice, p, "worker/probe") == 0)
      pthread_join (probe, NULL);
  }
  p->workers = calloc (nthreads, sizeof *p->workers);
  if (!p->workers)
    return -1;
  pthread_mutex_init (&p->lock, NULL);
  for (unsigned i = 0; i < nthreads; i++) {
    struct pool_worker *w = &p->workers[i];
    w->pool = p;
    w->nice = p->nice_base;     /* a thread starts with its creator's */
    sem_init (&w->wake, 0, 0);
    err = thread_start (&w->thread, pool_worker, w, "worker/%u", i);
    if (err) {
      sem_destroy (&w->wake);
      break;
    }
    /* Under the lock: running workers read it (pool_share). */
    pthread_mutex_lock (&p->lock);
    p->nthreads++;
    pthread_mutex_unlock (&p->lock);
  }
  if (err) {
    pool_stop (p);
    errno = err;
    return -1;
  }
  return 0;
}

/* Requests parsed during one wake-up are handed over together (one lock
 * round trip) by pool_submit_flush, which each loop calls at the end of
 * every input pass with its own batch. */
void
pool_submit (struct pool_batch *b, struct req *r)
{
  r->next = NULL;
  if (b->tail)
    b->tail->next = r;
  else
    b->head = r;
  b->tail = r;
}

void
pool_submit_flush (struct pool *p, struct pool_batch *b)
{
  struct pool_worker *wake;

  if (!b->head)
    return;
  lock_or_die (&p->lock);
  for (struct req *r = b->head, *nx; r; r = nx) {
    struct conn *c = r->conn;

    nx = r->next;
    r->next = NULL;
    if (c->pq_tail)
      c->pq_tail->next = r;
    else {
      c->pq_head = r;
      pool_ring_append (p, c);  /* it had nothing queued: join the turn */
    }
    c->pq_tail = r;
    p->nqueued++;
  }
  /* One wake-up per request, never the herd: what no idle worker gets, a
   * busy one takes itself when it is done with its own. */
  wake = pool_hand_locked (p);
  unlock_or_die (&p->lock);
  pool_wake (wake);
  b->head = b->tail = NULL;
}

/* Stop and join the workers (after they finish the queue). */
void
pool_stop (struct pool *p)
{
  struct pool_worker *wake;

  if (!p->workers)
    return;
  lock_or_die (&p->lock);
  p->stop = true;
  wake = p->idle;               /* each wakes with nothing handed */
  for (struct pool_worker *w = wake; w; w = w->next_idle)
    w->handed = NULL;
  p->idle = NULL;
  unlock_or_die (&p->lock);
  pool_wake (wake);
  for (unsigned i = 0; i < p->nthreads; i++) {
    pthread_join (p->workers[i].thread, NULL);
    sem_destroy (&p->workers[i].wake);
  }
  free (p->workers);
  p->workers = NULL;
  pthread_mutex_destroy (&p->lock);
}
