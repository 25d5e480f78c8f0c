/* The cache over a page-granular pmem store (persist() records, sync()
 * msyncs), over simulated memory: what a client sees of the store's syncs.
 *
 *  - Slot reuse never syncs under the cache's index lock (issue 23 item
 *    10): a folio written, written back and synced, then read again (a
 *    fill persists its bits), is evicted for another folio while a
 *    NOWAIT hit, as the server's loop thread makes, must not wait for an
 *    msync.  The simulated msync stalls until the test lets it go; the
 *    hit must come back while it stalls.
 *  - A failed store sync fails requests, never hangs them (issue 23 item
 *    10): after an msync fails, FLUSH fails, and a write that needs a slot
 *    when every slot was cleaned after the failure fails with EIO instead
 *    of waiting for room for ever.
 * Every wait of the test is bounded (WAIT_S): a hang fails the test. */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "foliod/cache.h"
#include "foliod/store.h"
#include "store/pmem-layout.h"
#include "lib/fake_backing.h"
#include "lib/pmem-sim.h"

#define FOLIO 16384
#define BLOCK 4096
#define SLOTS 4
#define NF 16
#define SIZE ((uint64_t) NF * FOLIO)
#define WAIT_S 20

static struct pmem_layout lay;
static void *mem;
static char err[512];

static void sim_commit (const void *p, size_t len) { }

static const struct store_config scfg = {
  .path = "(simulated)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = SIZE,
  .backing_spec = "fake", .backing_size = SIZE,
};

static struct store *
sim_open (void)
{
  struct pmem_geometry g = { FOLIO, BLOCK, SLOTS, SIZE };
  struct pmem_map m;

  assert_int_equal (pmem_layout_compute (&lay, &g, err, sizeof err), 0);
  mem = aligned_alloc (4096, lay.total_size);
  assert_non_null (mem);
  memset (mem, 0, lay.total_size);
  pmem_sim_map (&m, mem, lay.total_size, PMEM2_GRANULARITY_PAGE, sim_commit);
  struct store *s = store_pmem_open_map (&m, &scfg, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  return s;
}

static struct cache *
cache_open (struct fake_backing *fb, struct store *s)
{
  struct cache_config cfg;
  struct cache *c;

  cache_config_default (&cfg);
  cfg.cache_size = (uint64_t) SLOTS * FOLIO;
  cfg.folio_size = FOLIO;
  cfg.block_size = BLOCK;
  cfg.dirty_background_pct = cfg.dirty_limit_pct = 100;
  cfg.writeback_interval_ms = 3600000;
  cfg.readahead_bytes = 0;
  c = cache_create (fake_backing_base (fb), s, &cfg, err, sizeof err);
  if (c == NULL)
    fail_msg ("cache_create: %s", err);
  return c;
}

/* sem_wait for at most WAIT_S seconds: 0, or -1 (timed out). */
static int
sem_wait_bounded (sem_t *s)
{
  struct timespec ts;

  clock_gettime (CLOCK_REALTIME, &ts);
  ts.tv_sec += WAIT_S;
  while (sem_timedwait (s, &ts) == -1)
    if (errno != EINTR)
      return -1;
  return 0;
}

/* --- an msync that stalls until released --- */

static sem_t progress;   /* an msync began, or the evicting read ended */
static sem_t release;    /* lets a stalled msync go on */
static int syncs;        /* msyncs begun (atomic) */

static int
stall_sync (const void *p, size_t len)
{
  __atomic_add_fetch (&syncs, 1, __ATOMIC_SEQ_CST);
  sem_post (&progress);
  (void) sem_wait_bounded (&release);
  return 0;
}

struct req {
  struct cache *c;
  uint64_t off;
  unsigned flags;
  bool write;
  int r, err;
  sem_t done;
};

static void *
req_main (void *arg)
{
  struct req *q = arg;
  unsigned char buf[BLOCK];

  memset (buf, 0x5a, sizeof buf);
  q->r = q->write ? cache_write (q->c, buf, BLOCK, q->off, q->flags)
                  : cache_read (q->c, buf, BLOCK, q->off, q->flags);
  q->err = errno;
  sem_post (&q->done);
  sem_post (&progress);
  return NULL;
}

static void
req_start (struct req *q, pthread_t *t, struct cache *c, bool write,
           uint64_t off, unsigned flags)
{
  *q = (struct req) { .c = c, .off = off, .flags = flags, .write = write };
  sem_init (&q->done, 0, 0);
  assert_int_equal (pthread_create (t, NULL, req_main, q), 0);
}

static void
test_reuse_never_syncs_under_lock (void **state)
{
  struct fake_backing *fb = fake_backing_new (SIZE);
  struct store *s = sim_open ();
  struct cache *c = cache_open (fb, s);
  unsigned char buf[BLOCK];
  struct req evict, hit;
  pthread_t te, th;

  cache_stop_writeback (c);   /* no background sync: one thread decides */
  sem_init (&progress, 0, 0);
  sem_init (&release, 0, 0);
  memset (buf, 7, sizeof buf);
  /* Folio 0: written, written back and synced; then a read fills another
   * of its blocks (and persists its bits); folios 1-3 fill the others. */
  assert_int_equal (cache_write (c, buf, BLOCK, 0, 0), 0);
  assert_int_equal (cache_write_back (c), 0);
  assert_int_equal (cache_read (c, buf, BLOCK, BLOCK, 0), 0);
  for (uint64_t fi = 1; fi < SLOTS; fi++)
    assert_int_equal (cache_read (c, buf, BLOCK, fi * FOLIO, 0), 0);

  /* Folio 4 takes the oldest slot, folio 0's; msyncs stall meanwhile. */
  pmem_sim_on_sync (stall_sync);
  req_start (&evict, &te, c, false, SLOTS * FOLIO, 0);
  assert_int_equal (sem_wait_bounded (&progress), 0);
  /* A NOWAIT hit on folio 1, as the loop thread tries it. */
  req_start (&hit, &th, c, false, FOLIO, CACHE_NOWAIT);
  int hit_waited = sem_wait_bounded (&hit.done);
  int stalled = __atomic_load_n (&syncs, __ATOMIC_SEQ_CST);

  for (int i = 0; i < 4; i++)
    sem_post (&release);
  pmem_sim_on_sync (NULL);
  pthread_join (te, NULL);
  pthread_join (th, NULL);
  if (hit_waited == -1)
    fail_msg ("a NOWAIT hit waited %d s for an msync (slot reuse synced "
              "under the cache's lock)", WAIT_S);
  assert_int_equal (hit.r, 0);
  assert_int_equal (evict.r, 0);
  /* The slot's clear was synced before the read: reusing it needs no
   * sync at all. */
  assert_int_equal (stalled, 0);

  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  fake_free (fb);
  free (mem);
}

/* --- an msync that fails --- */

static int
fail_sync (const void *p, size_t len)
{
  errno = EIO;
  return -1;
}

static void
test_sync_error_fails_not_hangs (void **state)
{
  struct fake_backing *fb = fake_backing_new (SIZE);
  struct store *s = sim_open ();
  struct cache *c = cache_open (fb, s);
  unsigned char buf[BLOCK];
  struct req w;
  pthread_t tw;

  sem_init (&progress, 0, 0);
  memset (buf, 9, sizeof buf);
  for (uint64_t fi = 0; fi < SLOTS; fi++)
    assert_int_equal (cache_write (c, buf, BLOCK, fi * FOLIO, 0), 0);
  /* The store's msync fails from now on: every slot is cleaned by the
   * writeback, but its clean bits never reach the media. */
  pmem_sim_on_sync (fail_sync);
  assert_int_equal (cache_write_back (c), -1);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);

  /* A write that needs a slot: an error, within the bound. */
  req_start (&w, &tw, c, true, SLOTS * FOLIO, 0);
  if (sem_wait_bounded (&w.done) == -1)
    fail_msg ("a write needing a slot hung for %d s after a failed store "
              "sync", WAIT_S);
  pthread_join (tw, NULL);
  assert_int_equal (w.r, -1);
  assert_int_equal (w.err, EIO);
  /* So does a read miss, and FLUSH still fails. */
  req_start (&w, &tw, c, false, (SLOTS + 1) * FOLIO, 0);
  if (sem_wait_bounded (&w.done) == -1)
    fail_msg ("a read miss hung for %d s after a failed store sync", WAIT_S);
  pthread_join (tw, NULL);
  assert_int_equal (w.r, -1);
  assert_int_equal (w.err, EIO);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);

  pmem_sim_on_sync (NULL);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  fake_free (fb);
  free (mem);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_reuse_never_syncs_under_lock),
    cmocka_unit_test (test_sync_error_fails_not_hangs),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
