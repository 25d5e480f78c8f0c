/* The cache over the pmem store, under simulated crashes: the cache's
 * side of the ordering contract of store-pmem.c (data persisted before
 * the dirty bits, the bits before the reply, writeback's unstable bits,
 * slot reuse after eviction).
 *
 * The store runs over simulated memory at cache-line granularity, as in
 * test-store-pmem-crash.c: "live" is what the CPU sees, "media" what a
 * persist made durable; the power goes at a random persist, and each word
 * written but not persisted is then old or new at random.  A workload of
 * unaligned writes (some FUA), zeroes, FLUSHes (flush=store or backing)
 * and writebacks runs on a cache of 8 slots over 32 folios (eviction and
 * slot reuse all the time) until the power goes; the cache is then thrown
 * away unwritten, the store reopened and recovered into a new cache, and
 * every byte of the export is checked: what was acknowledged before the
 * crash reads back; the request in flight reads old or new; nothing else
 * appears.  Then a writeback brings the backing to the same content.
 * Every other round runs a page store, where only what a sync (FLUSH, FUA,
 * writeback) covered must come back and each unsynced 512-byte sector is
 * old or new: there a block not written since the last sync reads back
 * exactly (slot reuse before a sync would break that); one written since
 * may come back with other data (store-pmem.c: msync writes pages in any
 * order, the bits may land before the data).
 * The backing keeps what it was sent (the store's own test covers a
 * backing that loses unflushed writes).  CACHE_PMEM_CRASHES=N (default
 * 400). */
#include <errno.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
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
#define SLOTS 8
#define NF 32
#define SIZE ((uint64_t) NF * FOLIO)

static struct pmem_layout lay;
static struct pmem_sim_media sim;  /* the store's memory (pmem-sim.h) */
static unsigned seed;
static char err[512];

static void
sim_commit (const void *p, size_t len)
{
  pmem_sim_media_commit (&sim, p, len);
}

static const struct store_config scfg = {
  .path = "(simulated)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = SIZE,
  .backing_spec = "fake", .backing_size = SIZE,
};

static struct store *
sim_open (void)
{
  struct pmem_map m;

  pmem_sim_map (&m, sim.live, lay.total_size,
                sim.page_mode ? PMEM2_GRANULARITY_PAGE
                              : PMEM2_GRANULARITY_CACHE_LINE, sim_commit);
  struct store *s = store_pmem_open_map (&m, &scfg, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  return s;
}

/* The cache.  Until the crash its writeback thread is stopped (own_wb):
 * the test writes back itself, so that everything runs in one thread, in
 * a replayable order.  A page store keeps it: a slot whose cleaned bits
 * are not synced yet is reused after the thread's sync (it runs only
 * while a writer waits for room).  The recovered cache keeps it too: all
 * its slots may come back dirty, and reading the rest of the export needs
 * room that only writeback makes (nothing is replayed after a crash). */
static struct cache *
cache_open (struct fake_backing *fb, struct store *s,
            enum cache_flush_mode flush, bool own_wb)
{
  struct cache_config cfg;
  struct cache *c;

  cache_config_default (&cfg);
  cfg.cache_size = (uint64_t) SLOTS * FOLIO;
  cfg.folio_size = FOLIO;
  cfg.block_size = BLOCK;
  cfg.dirty_background_pct = cfg.dirty_limit_pct = 100;
  cfg.writeback_interval_ms = 3600000;
  cfg.flush = flush;
  c = cache_create (fake_backing_base (fb), s, &cfg, err, sizeof err);
  if (c == NULL)
    fail_msg ("cache_create: %s", err);
  if (own_wb && !sim.page_mode)
    cache_stop_writeback (c);
  return c;
}

static unsigned char model[SIZE];    /* acknowledged content */
static unsigned char inflight[SIZE]; /* the request the power cut */
static uint64_t in_off, in_len;
static unsigned char buf[SIZE];
static bool loose[SIZE];  /* page store: written since the last sync */

/* One request at random; 0 acknowledged, 1 when the power went during it
 * (inflight holds what it would have written). */
static int
one_op (struct cache *c, unsigned *stamp)
{
  unsigned r = (unsigned) rand_r (&seed) % 100;
  uint64_t len = 1 + (uint64_t) rand_r (&seed) % (2 * FOLIO);
  uint64_t off = (uint64_t) rand_r (&seed) % (SIZE - len + 1);
  struct cache_stats st;
  bool data = false;
  int rc;

  cache_get_stats (c, &st);
  bool sync = r < 16 || (r >= 24 && r < 40);  /* write back, FLUSH, FUA */
  if (r < 8 || st.dirty_bytes > FOLIO) {  /* never wait for room: at most 4 dirty folios */
    rc = cache_write_back (c);
    sync = true;
  } else if (r < 16)
    rc = cache_flush (c);
  else if (r < 24) {
    in_off = off;
    in_len = len;
    memset (inflight + off, 0, len);
    data = true;
    rc = cache_zero (c, len, off, 0);
  } else {
    in_off = off;
    in_len = len;
    memset (inflight + off, (int) (++*stamp % 255) + 1, len);
    data = true;
    rc = cache_write (c, inflight + off, len, off, r < 40 ? CACHE_FUA : 0);
  }
  if (data) {   /* the store's unit: a block written since the last sync */
    uint64_t b0 = off / BLOCK * BLOCK, b1 = (off + len + BLOCK - 1) / BLOCK * BLOCK;
    memset (loose + b0, 1, b1 - b0);
  }
  if (rc != 0)
    fail_msg ("request failed: %s", strerror (errno));
  if (sim.power_off)
    return 1;
  if (data)
    memcpy (model + in_off, inflight + in_off, in_len);
  if (sync)
    memset (loose, 0, sizeof loose);
  in_len = 0;
  return 0;
}

/* Every byte is the acknowledged one, or the in-flight request's. */
static void
check_content (const unsigned char *got, const char *what, int round)
{
  for (uint64_t i = 0; i < SIZE; i++) {
    bool flying = i >= in_off && i < in_off + in_len;
    if (got[i] == model[i] || (flying && got[i] == inflight[i]) ||
        (sim.page_mode && loose[i]))
      continue;
    fail_msg ("round %d (seed %u): %s byte %llu is %u, acknowledged %u%s",
              round, seed, what, (unsigned long long) i, got[i], model[i],
              flying ? " (in flight)" : "");
  }
}

static void
one_round (int round)
{
  struct fake_backing *fb = fake_backing_new (SIZE);
  enum cache_flush_mode fm = round % 3 == 2 ? CACHE_FLUSH_BACKING
                                            : CACHE_FLUSH_STORE;
  unsigned stamp = 0;

  memset (sim.live, 0, lay.total_size);
  memset (sim.media, 0, lay.total_size);
  memset (model, 0, sizeof model);
  memset (loose, 0, sizeof loose);
  in_len = 0;
  fake_set_log (fb, 0);
  sim.persists_left = -1;
  struct store *s = sim_open ();
  struct cache *c = cache_open (fb, s, fm, true);
  sim.persists_left = 1 + rand_r (&seed) % (sim.page_mode ? 80 : 3000);
  for (int op = 0; op < 400 && !sim.power_off; op++)
    if (one_op (c, &stamp))
      break;
  /* The power goes (if it has not): nothing written back, nothing more
   * persisted; each word (page store: 512-byte sector) written since its
   * last persist comes back old or new at random. */
  pmem_sim_media_power_off (&sim);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  pmem_sim_media_crash (&sim, false);

  s = sim_open ();
  c = cache_open (fb, s, fm, false);
  assert_int_equal (cache_read (c, buf, SIZE, 0, 0), 0);
  check_content (buf, "recovered", round);
  /* What was read is now the truth (the in-flight bytes settled). */
  memcpy (model, buf, SIZE);
  memset (loose, 0, sizeof loose);
  in_len = 0;
  assert_int_equal (cache_write_back (c), 0);
  fake_peek (fb, buf, SIZE, 0);
  check_content (buf, "backing after writeback", round);
  assert_int_equal (store_mark_clean (s), 0);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  fake_free (fb);
}

static void
test_cache_pmem_crashes (void **state)
{
  struct pmem_geometry g = { FOLIO, BLOCK, SLOTS, SIZE };
  const char *n = getenv ("CACHE_PMEM_CRASHES");
  int rounds = n ? atoi (n) : 400;
  const char *sd = getenv ("SEED");

  seed = sd ? (unsigned) atoi (sd) : (unsigned) time (NULL);
  printf ("seed %u (SEED= replays), %d crashes\n", seed, rounds);
  assert_int_equal (pmem_layout_compute (&lay, &g, err, sizeof err), 0);
  assert_int_equal (pmem_sim_media_init (&sim, lay.total_size, &seed), 0);
  for (int r = 0; r < rounds; r++) {
    sim.page_mode = r % 2;
    one_round (r);
  }
  pmem_sim_media_free (&sim);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_cache_pmem_crashes),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
