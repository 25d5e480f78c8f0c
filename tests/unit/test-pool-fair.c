/* src/server/pool.c: workers are shared between the connections of one
 * export.  A client's request queued behind another client's many
 * requests starts after at most a bounded number of them (one turn per
 * connection queued, plus the workers' count), not after all of them.
 *
 * pool.c is compiled in here with req_execute stubbed: adversary
 * requests block on a gate, and every start is recorded in order.  The
 * gate opens only once the pool is at rest (every worker idle or inside
 * req_execute): a request the pool has handed to a worker counts as
 * started even if that worker has not run yet.  Opening it as soon as
 * the victim's request was queued measured the scheduler instead: the
 * worker handed the victim's request could be left off the CPU while
 * the freed adversary workers ran through up to 192 requests (5 runs
 * in 30 failed so, every time with the victim's request already taken).
 */
#include <unistd.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <inttypes.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <string.h>
#include <cmocka.h>

#include "server/pool.c"
#include "server/nbd-proto.h"

#define NADV     3
#define PER_ADV  64

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
static bool gate_open;
static unsigned adv_started;     /* adversary requests started so far */
static unsigned adv_at_submit;   /* ... when the victim's was queued */
static unsigned adv_at_victim;   /* ... when the victim's started */
static bool victim_ran;
static unsigned done_count;
static unsigned in_execute;      /* workers inside req_execute now */
static int victim_nice, adv_nice; /* the workers' as they ran (the first
                                     adversary request's) */

static void *
probe_nice (void *arg)
{
  int base = getpriority (PRIO_PROCESS, 0);
  pid_t tid = (pid_t) syscall (SYS_gettid);

  *(bool *) arg = base < 19 && setpriority (PRIO_PROCESS, tid, base + 1) == 0
    && setpriority (PRIO_PROCESS, tid, base) == 0;
  return NULL;
}

/* May a thread here lower its priority and raise it back (root, or
 * RLIMIT_NICE)?  The pool uses background priorities only then. */
static bool
nice_allowed (void)
{
  pthread_t t;
  bool ok = false;

  assert_int_equal (pthread_create (&t, NULL, probe_nice, &ok), 0);
  pthread_join (t, NULL);
  return ok;
}

/* The nice value a background request runs at. */
static int
bg_nice (const struct pool *p)
{
  if (!nice_allowed ())
    return p->nice_base;
  return p->nice_base + 10 < 19 ? p->nice_base + 10 : 19;
}

static struct conn victim_conn;
static unsigned nworkers;

/* What ran, in order, for test_cache_turns. */
struct ran {
  const struct conn *conn;
  uint64_t offset;
  uint32_t count;
  int nice;                     /* the worker's, as it ran */
};
static struct ran ran[256];
static unsigned nran;

void
req_execute (struct req *r)
{
  pthread_mutex_lock (&mu);
  if (nran < sizeof ran / sizeof ran[0])
    ran[nran++] = (struct ran) { r->conn, r->offset, r->count,
                                 getpriority (PRIO_PROCESS, 0) };
  in_execute++;
  if (r->conn == &victim_conn) {
    adv_at_victim = adv_started;
    victim_ran = true;
    victim_nice = getpriority (PRIO_PROCESS, 0);
  }
  else {
    if (adv_started++ == 0)
      adv_nice = getpriority (PRIO_PROCESS, 0);
    while (!gate_open)
      pthread_cond_wait (&cv, &mu);
  }
  in_execute--;
  pthread_mutex_unlock (&mu);
}

/* Wait until no worker is on its way anywhere: each is idle (on the
 * pool's idle stack), or inside req_execute (an adversary's, blocked at
 * the gate; the victim's returns, and its worker goes idle).  Both are
 * read under the pool's lock: a worker handed a request is off the stack
 * and not yet in req_execute, and is waited for.  With the gate shut,
 * nothing moves after that. */
static void
wait_at_rest (struct pool *p)
{
  for (;;) {
    unsigned nidle = 0, busy;

    lock_or_die (&p->lock);
    pthread_mutex_lock (&mu);
    for (struct pool_worker *w = p->idle; w; w = w->next_idle)
      nidle++;
    busy = in_execute;
    pthread_mutex_unlock (&mu);
    unlock_or_die (&p->lock);
    if (nidle + busy == nworkers)
      return;
    usleep (1000);
  }
}

static void
done (void *opaque, struct req *r)
{
  (void) opaque;
  (void) r;
  pthread_mutex_lock (&mu);
  done_count++;
  pthread_mutex_unlock (&mu);
}

/* A pool of n workers: 3 connections keep 64 requests each queued, and
 * then a fourth queues one. */
static void
victim_waits_bounded (unsigned n)
{
  struct export exp = { 0 };
  static struct conn adv[NADV];
  static struct req areq[NADV][PER_ADV], vreq;
  struct pool p;
  struct pool_batch b = { NULL, NULL };
  unsigned waited;
  bool ran_before_gate;

  nworkers = n;
  gate_open = victim_ran = false;
  adv_started = done_count = 0;
  memset (adv, 0, sizeof adv);
  memset (&victim_conn, 0, sizeof victim_conn);
  assert_int_equal (pool_start (&p, n, done, NULL), 0);
  for (unsigned i = 0; i < NADV; i++) {
    adv[i].exp = &exp;
    for (unsigned j = 0; j < PER_ADV; j++) {
      areq[i][j].conn = &adv[i];
      pool_submit (&b, &areq[i][j]);
    }
    pool_submit_flush (&p, &b);
  }
  /* The adversaries hold every worker their caps give them. */
  wait_at_rest (&p);
  victim_conn.exp = &exp;
  vreq.conn = &victim_conn;
  pthread_mutex_lock (&mu);
  adv_at_submit = adv_started;
  pthread_mutex_unlock (&mu);
  pool_submit (&b, &vreq);
  pool_submit_flush (&p, &b);
  wait_at_rest (&p);

  pthread_mutex_lock (&mu);
  ran_before_gate = victim_ran;
  gate_open = true;
  pthread_cond_broadcast (&cv);
  pthread_mutex_unlock (&mu);
  pool_stop (&p);

  /* Started while the adversaries' 192 requests were all still there. */
  assert_true (ran_before_gate);
  assert_true (victim_ran);
  assert_int_equal (done_count, NADV * PER_ADV + 1);
  assert_int_equal (exp.workers_busy, 0);
  /* The adversaries' requests (their connections have more queued) run
   * at a lower priority than the victim's, where the pool may. */
  assert_int_equal (p.nice_bg, nice_allowed ());
  assert_int_equal (adv_nice, bg_nice (&p));
  assert_int_equal (victim_nice, p.nice_base);
  waited = adv_at_victim - adv_at_submit;
  print_message ("adversary requests started while the victim's waited: "
                 "%u (bound %u, %u workers)\n", waited, NADV + n, n);
  /* One turn for each other connection queued, and the workers that
   * were busy: not the 3 x 64 queued before it. */
  assert_true (waited <= NADV + n);
}

/* The default pool: a quarter of the workers per connection, 6 of the
 * export's 8 for connections with more queued, 2 kept. */
static void
test_victim_waits_bounded_16 (void **state)
{
  (void) state;
  victim_waits_bounded (16);
}

static void
test_victim_waits_bounded_8 (void **state)
{
  (void) state;
  victim_waits_bounded (8);
}

/* --workers 4: the export's share is 2, and a quarter of it rounds to
 * nothing: one of them must still be kept, or the victim's 4 KiB read
 * waits for a whole CACHE of the adversaries' (0.4 s in bench/isolation
 * with --workers 4). */
static void
test_victim_waits_bounded_4 (void **state)
{
  (void) state;
  victim_waits_bounded (4);
}

/* A CACHE of 8 MiB runs a turn of 1 MiB at a time, and another
 * connection's request queued behind it runs after its first turn, not
 * after all 8 (one worker: the CACHE would hold it for the whole 8 MiB,
 * and a CACHE of 1 GiB for seconds).  One reply each. */
static void
test_cache_turns (void **state)
{
  struct export exp = { 0 };
  static struct conn a, b;
  static struct req cache, read;
  struct pool p;
  struct pool_batch bt = { NULL, NULL };
  uint64_t next = 0;

  (void) state;
  gate_open = true;
  nran = done_count = 0;
  memset (&a, 0, sizeof a);
  memset (&b, 0, sizeof b);
  a.exp = b.exp = &exp;
  cache = (struct req) { .conn = &a, .type = NBD_CMD_CACHE,
                         .offset = 0, .count = 8u << 20 };
  read = (struct req) { .conn = &b, .type = NBD_CMD_READ,
                        .offset = 0, .count = 4096 };
  assert_int_equal (pool_start (&p, 1, done, NULL), 0);
  pool_submit (&bt, &cache);
  pool_submit (&bt, &read);
  pool_submit_flush (&p, &bt);  /* both queued before the first turn */
  pool_stop (&p);

  assert_int_equal (done_count, 2);
  assert_int_equal (nran, 9);
  for (unsigned i = 0; i < nran; i++)
    print_message ("%u: %s %" PRIu64 "+%" PRIu32 "\n", i,
                   ran[i].conn == &a ? "cache" : "read", ran[i].offset,
                   ran[i].count);
  assert_ptr_equal (ran[1].conn, &b);
  /* The worker back at its own priority for the read, and at the
   * background one for the CACHE (a hint, never waited for). */
  assert_int_equal (ran[1].nice, p.nice_base);
  for (unsigned i = 0; i < nran; i++) {
    if (i == 1)
      continue;
    assert_int_equal (ran[i].nice, bg_nice (&p));
    assert_ptr_equal (ran[i].conn, &a);
    assert_int_equal (ran[i].offset, next);
    assert_int_equal (ran[i].count, 1u << 20);
    next += ran[i].count;
  }
  assert_int_equal (next, 8u << 20);
  assert_int_equal (a.pool_busy + b.pool_busy + exp.workers_busy, 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_victim_waits_bounded_16),
    cmocka_unit_test (test_victim_waits_bounded_8),
    cmocka_unit_test (test_victim_waits_bounded_4),
    cmocka_unit_test (test_cache_turns),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
