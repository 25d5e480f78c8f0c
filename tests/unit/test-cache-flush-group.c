/* Flush group commit (src/cache/flush-group.h): concurrent cache_flush
 * calls share one writeback pass and one backing flush, a flush is never
 * answered by a pass that began before it was called, and every flush of
 * a group gets the group's error.
 *
 * The backing double keeps two copies: what was written, and what is
 * durable (what was written when the last good flush began).  Its flush
 * can be held at a gate (flush number n waits until the test has released
 * n flushes) and made to fail as a file's fdatasync does (EIO: the writes
 * since the last good flush may be gone, which the cache's ledger alone
 * decides; no loss fact, as no backing counts a failed flush).  With
 * native FUA (gate_new (true)) a FUA write is durable when it returns, as
 * a remote's is: the cache's small flush passes write with FUA and need no
 * backing flush (cache_flush_pass). */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "foliod/backing.h"
#include "foliod/cache.h"
#include "lib/cachetest.h"

#define SIZE (1u << 20)
#define BS 4096u
#define GATE_MS 10000           /* a held flush gives up after this: a bug */

struct gate_backing {
  struct backing b;
  pthread_mutex_t lock;
  pthread_cond_t cv;
  unsigned char data[SIZE], durable[SIZE], snap[SIZE];
  bool gated;
  unsigned entered, released;   /* flushes begun; flushes let through */
  unsigned fail_at;             /* this flush (1-based) fails; 0: none */
  unsigned delay_us;            /* each flush takes this long */
  bool native_fua;
  unsigned fua_writes;
};

static struct gate_backing *
to_gate (struct backing *b)
{
  return (struct gate_backing *) b;
}

static int
gate_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  struct gate_backing *g = to_gate (b);
  pthread_mutex_lock (&g->lock);
  memcpy (buf, g->data + off, len);
  pthread_mutex_unlock (&g->lock);
  return 0;
}

static int gate_flush (struct backing *b);

/* Without native FUA (as a file) a FUA write is a write and a flush. */
static int
gate_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct gate_backing *g = to_gate (b);
  bool fua = flags & BACKING_FUA;
  pthread_mutex_lock (&g->lock);
  memcpy (g->data + off, buf, len);
  if (fua && g->native_fua) {
    memcpy (g->durable + off, buf, len);
    g->fua_writes++;
  }
  bool emulate = fua && !g->native_fua;
  pthread_mutex_unlock (&g->lock);
  return emulate ? gate_flush (b) : 0;
}

static int
gate_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  (void) b; (void) len; (void) off; (void) flags;
  errno = EOPNOTSUPP;
  return -1;
}

/* What was written when the flush began is durable when it returns. */
static int
gate_flush (struct backing *b)
{
  struct gate_backing *g = to_gate (b);
  int r = 0;

  pthread_mutex_lock (&g->lock);
  unsigned n = ++g->entered;
  memcpy (g->snap, g->data, SIZE);
  pthread_cond_broadcast (&g->cv);
  uint64_t end = ct_now_ms () + GATE_MS;
  while (g->gated && g->released < n && ct_now_ms () < end) {
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    ts.tv_nsec += 10 * 1000000;
    if (ts.tv_nsec >= 1000000000) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000;
    }
    pthread_cond_timedwait (&g->cv, &g->lock, &ts);
  }
  if (g->gated && g->released < n) {
    fprintf (stderr, "flush %u was never released\n", n);
    r = -1;
  }
  else if (n == g->fail_at)
    r = -1;                     /* as a failed fdatasync: writes lost */
  else
    memcpy (g->durable, g->snap, SIZE);
  pthread_mutex_unlock (&g->lock);
  if (g->delay_us)
    usleep (g->delay_us);
  if (r == -1)
    errno = EIO;
  return r;
}

static void
gate_close (struct backing *b)
{
  (void) b;                     /* the test frees it */
}

static const struct backing_ops gate_ops = {
  .name = "gate", .read = gate_read, .write = gate_write, .zero = gate_zero,
  .flush = gate_flush, .close = gate_close,
};

static struct gate_backing *
gate_new (bool native_fua)
{
  struct gate_backing *g = calloc (1, sizeof *g);
  assert_non_null (g);
  g->native_fua = native_fua;
  g->b.caps = BACKING_VOLATILE | (native_fua ? BACKING_CAN_FUA : 0);
  g->b.ops = &gate_ops;
  g->b.size = SIZE;
  g->b.io_align = 1;
  pthread_mutex_init (&g->lock, NULL);
  pthread_cond_init (&g->cv, NULL);
  return g;
}

static void
gate_release (struct gate_backing *g, unsigned n)
{
  pthread_mutex_lock (&g->lock);
  g->released = n;
  pthread_cond_broadcast (&g->cv);
  pthread_mutex_unlock (&g->lock);
}

static void
gate_set (struct gate_backing *g, bool gated, unsigned fail_at,
          unsigned delay_us)
{
  pthread_mutex_lock (&g->lock);
  g->gated = gated;
  g->fail_at = fail_at;
  g->delay_us = delay_us;
  pthread_cond_broadcast (&g->cv);
  pthread_mutex_unlock (&g->lock);
}

static unsigned
gate_entered (struct gate_backing *g)
{
  pthread_mutex_lock (&g->lock);
  unsigned n = g->entered;
  pthread_mutex_unlock (&g->lock);
  return n;
}

static bool
gate_durable_is (struct gate_backing *g, uint64_t blk, unsigned char v)
{
  pthread_mutex_lock (&g->lock);
  bool ok = true;
  for (unsigned i = 0; i < BS; i++)
    ok &= g->durable[blk * BS + i] == v;
  pthread_mutex_unlock (&g->lock);
  return ok;
}

static struct cache *
gate_cache (struct gate_backing *g)
{
  struct cache_config cfg;
  char err[256] = "";

  cache_config_default (&cfg);
  cfg.cache_size = 4u << 20;
  cfg.writeback_interval_ms = 60000; /* no background pass in the way */
  struct cache *c = cache_create (&g->b, NULL, &cfg, err, sizeof err);
  if (c == NULL)
    fail_msg ("cache_create: %s", err);
  return c;
}

static void
write_block (struct cache *c, uint64_t blk, unsigned char v)
{
  unsigned char buf[BS];
  memset (buf, v, BS);
  assert_int_equal (cache_write (c, buf, BS, blk * BS, 0), 0);
}

static uint64_t
flush_waiting (struct cache *c)
{
  struct cache_stats st;
  cache_get_stats (c, &st);
  return st.flush_waiting;
}

/* Poll (bounded) until the backing has begun n flushes. */
static void
wait_entered (struct gate_backing *g, unsigned n)
{
  uint64_t end = ct_now_ms () + GATE_MS;
  while (gate_entered (g) < n && ct_now_ms () < end)
    usleep (1000);
  assert_true (gate_entered (g) >= n);
}

static void
wait_queued (struct cache *c, uint64_t n)
{
  uint64_t end = ct_now_ms () + GATE_MS;
  while (flush_waiting (c) < n && ct_now_ms () < end)
    usleep (1000);
  assert_int_equal (flush_waiting (c), n);
}

struct flusher {
  pthread_t t;
  struct cache *c;
  int r, err;
  atomic_bool done;
};

static void *
flusher_main (void *arg)
{
  struct flusher *f = arg;
  f->r = cache_flush (f->c);
  f->err = f->r == -1 ? errno : 0;
  atomic_store (&f->done, true);
  return NULL;
}

static void
flusher_start (struct flusher *f, struct cache *c)
{
  f->c = c;
  atomic_store (&f->done, false);
  assert_int_equal (pthread_create (&f->t, NULL, flusher_main, f), 0);
}

static int
flusher_join (struct flusher *f)
{
  assert_int_equal (pthread_join (f->t, NULL), 0);
  errno = f->err;
  return f->r;
}

static void
gate_done (struct gate_backing *g, struct cache *c)
{
  gate_set (g, false, 0, 0);
  assert_int_equal (cache_destroy (c), 0);
  free (g);
}

/* A flush called while a pass runs, after a write that pass may have
 * missed, is answered by the next pass, and the write is durable then. */
static void
test_flush_waits_for_next_pass (void **state)
{
  (void) state;
  struct gate_backing *g = gate_new (false);
  struct cache *c = gate_cache (g);
  struct flusher a, b;

  gate_set (g, true, 0, 0);
  write_block (c, 0, 1);
  flusher_start (&a, c);
  wait_entered (g, 1);          /* a's pass is inside the backing flush */
  write_block (c, 1, 2);        /* acknowledged after that pass began */
  flusher_start (&b, c);
  wait_queued (c, 1);
  gate_release (g, 1);
  assert_int_equal (flusher_join (&a), 0);
  assert_true (gate_durable_is (g, 0, 1));
  wait_entered (g, 2);          /* b needs a pass of its own */
  assert_false (atomic_load (&b.done));
  gate_release (g, 2);
  assert_int_equal (flusher_join (&b), 0);
  assert_true (gate_durable_is (g, 1, 2));
  assert_int_equal (gate_entered (g), 2);
  gate_done (g, c);
}

/* Flushes queued behind a running pass share the next one, and its error
 * reaches each of them; the blocks the failed flush may have lost are
 * dirty again and the next flush makes them durable. */
#define NQ 4
static void
test_group_shares_pass_and_error (void **state)
{
  (void) state;
  struct gate_backing *g = gate_new (false);
  struct cache *c = gate_cache (g);
  struct flusher a, q[NQ];
  struct cache_stats st;

  gate_set (g, true, 2, 0);
  write_block (c, 0, 1);
  flusher_start (&a, c);
  wait_entered (g, 1);
  for (unsigned i = 0; i < NQ; i++) {
    write_block (c, 1 + i, (unsigned char) (10 + i));
    flusher_start (&q[i], c);
  }
  wait_queued (c, NQ);
  gate_release (g, 2);          /* a's flush succeeds, the group's fails */
  assert_int_equal (flusher_join (&a), 0);
  for (unsigned i = 0; i < NQ; i++) {
    assert_int_equal (flusher_join (&q[i]), -1);
    assert_int_equal (errno, EIO);
  }
  assert_int_equal (gate_entered (g), 2);
  cache_get_stats (c, &st);
  assert_int_equal (st.flush_ops, 1 + NQ);
  assert_int_equal (st.flush_passes, 2);
  assert_true (st.dirty_bytes >= NQ * BS);  /* lost: to be written again */
  gate_set (g, false, 0, 0);
  assert_int_equal (cache_flush (c), 0);
  for (unsigned i = 0; i < NQ; i++)
    assert_true (gate_durable_is (g, 1 + i, (unsigned char) (10 + i)));
  gate_done (g, c);
}

/* Eight clients that flush after every write (or write with FUA): far
 * fewer backing flushes than flushes, and each client's write is durable
 * when its flush (its FUA write) returns. */
#define NT 8
#define ROUNDS 40
struct client {
  pthread_t t;
  struct cache *c;
  struct gate_backing *g;
  unsigned id;
  bool fua;
  atomic_int bad;
};

static void *
client_main (void *arg)
{
  struct client *k = arg;
  unsigned char buf[BS];

  for (unsigned i = 1; i <= ROUNDS; i++) {
    memset (buf, (int) i, BS);
    if (cache_write (k->c, buf, BS, (uint64_t) k->id * BS,
                     k->fua ? CACHE_FUA : 0) == -1 ||
        (!k->fua && cache_flush (k->c) == -1) ||
        !gate_durable_is (k->g, k->id, (unsigned char) i))
      atomic_fetch_add (&k->bad, 1);
  }
  return NULL;
}

static void
concurrent_clients (bool fua, bool native_fua)
{
  struct gate_backing *g = gate_new (native_fua);
  struct cache *c = gate_cache (g);
  struct client k[NT];
  struct cache_stats st;

  gate_set (g, false, 0, 2000);  /* a flush takes 2 ms, as a disk's would */
  for (unsigned i = 0; i < NT; i++) {
    k[i] = (struct client) { .c = c, .g = g, .id = i, .fua = fua };
    assert_int_equal (pthread_create (&k[i].t, NULL, client_main, &k[i]), 0);
  }
  for (unsigned i = 0; i < NT; i++) {
    assert_int_equal (pthread_join (k[i].t, NULL), 0);
    assert_int_equal (atomic_load (&k[i].bad), 0);
  }
  cache_get_stats (c, &st);
  printf ("%u %s%s, %u backing flushes, %" PRIu64 " passes, %u native FUA"
          " writes\n", NT * ROUNDS, fua ? "FUA writes" : "flushes",
          native_fua ? " (native FUA)" : "", gate_entered (g),
          st.flush_passes, g->fua_writes);
  if (native_fua)
    assert_true (g->fua_writes > 0);
  /* Serialised one by one, nearly every flush found new writes and paid
   * its own backing flush. */
  assert_true (gate_entered (g) <= NT * ROUNDS / 2);
  assert_int_equal (st.flush_ops, NT * ROUNDS);
  gate_done (g, c);
}

static void
test_concurrent_flushes_share (void **state)
{
  (void) state;
  concurrent_clients (false, false);
}

/* On a backing with native FUA the small passes write with FUA instead of
 * flushing the backing after their writes: each client's write must still
 * be durable when its flush returns, whichever pass answers it. */
static void
test_concurrent_flushes_native_fua (void **state)
{
  (void) state;
  concurrent_clients (false, true);
}

static void
test_concurrent_fua_writes_share (void **state)
{
  (void) state;
  concurrent_clients (true, false);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_flush_waits_for_next_pass),
    cmocka_unit_test (test_group_shares_pass_and_error),
    cmocka_unit_test (test_concurrent_flushes_share),
    cmocka_unit_test (test_concurrent_fua_writes_share),
    cmocka_unit_test (test_concurrent_flushes_native_fua),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
