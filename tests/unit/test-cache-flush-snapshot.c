/* A FLUSH writes the set that was dirty when it began (the kernel's
 * PAGECACHE_TAG_TOWRITE), not whatever a writer dirties while it runs: a
 * client streaming writes at full speed cannot keep another client's FLUSH
 * running.  Counted in folios the flush wrote, never in seconds. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "foliod/cache.h"
#include "lib/cachetest.h"
#include "lib/fake_backing.h"

#define BS      4096u
#define FOLIO   (64u << 10)
#define BPF     (FOLIO / BS)
#define SIZE    (64u << 20)
#define NFOLIOS (SIZE / FOLIO)
#define TAGGED  32u               /* folios dirty when the FLUSH begins */
#define STRIDE  (NFOLIOS / 2 / TAGGED) /* in the first half */
/* The writer stops by itself after this many writes, so that a flush that
 * chases it (the bug) still ends and the test reports it. */
#define WRITER_MAX 400000u

/* The flush's backing writes wait (bounded) until the writer has dirtied
 * WRITER_AHEAD blocks: those come after the flush began, so a flush that
 * writes its snapshot never writes them; one that chases them does. */
#define WRITER_AHEAD 5000u
static int (*real_write) (struct backing *, const void *, uint64_t, uint64_t,
                          unsigned);
static atomic_bool gate_armed, gate_entered, gate_open;

static int
gated_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
             unsigned flags)
{
  if (atomic_load (&gate_armed)) {  /* every batch of the pass waits */
    atomic_store (&gate_entered, true);
    for (uint64_t end = ct_now_ms () + 20000;
         !atomic_load (&gate_open) && ct_now_ms () < end;)
      usleep (1000);
  }
  return real_write (b, buf, len, off, flags);
}

struct writer {
  pthread_t t;
  struct cache *c;
  atomic_bool stop;
  uint64_t writes;
};

/* Blocks 1..BPF-1 of random folios of the second half: never a folio the
 * flush holds under writeback (the writer would wait for the gate). */
static void *
writer_main (void *arg)
{
  struct writer *w = arg;
  unsigned char buf[BS];
  uint64_t x = 0x9e3779b97f4a7c15ull;

  memset (buf, 0x77, BS);
  while (!atomic_load (&gate_entered))
    usleep (100);
  while (!atomic_load (&w->stop) && w->writes < WRITER_MAX) {
    if (w->writes == WRITER_AHEAD)
      atomic_store (&gate_open, true);
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    uint64_t fi = NFOLIOS / 2 + x % (NFOLIOS / 2), blk = 1 + (x >> 32) % (BPF - 1);
    if (cache_write (w->c, buf, BS, fi * FOLIO + blk * BS, 0) == -1)
      break;
    w->writes++;
  }
  return NULL;
}

static void
test_flush_writes_its_snapshot (void **state)
{
  (void) state;
  struct fake_backing *fb = fake_backing_new (SIZE);
  struct cache_config cfg;
  unsigned char buf[BS];

  assert_non_null (fb);
  cache_config_default (&cfg);
  cfg.cache_size = SIZE;           /* no eviction: only the flush writes */
  cfg.folio_size = FOLIO;
  cfg.block_size = BS;
  cfg.writeback_interval_ms = 60000;  /* no background pass in the way */
  cfg.dirty_expire_ms = 600000;
  cfg.dirty_auto = false;
  cfg.dirty_background_pct = 90;
  cfg.dirty_limit_pct = 95;
  struct backing *b = fake_backing_base (fb);
  static struct backing_ops gated;
  gated = *b->ops;
  real_write = gated.write;
  gated.write = gated_write;
  b->ops = &gated;
  struct cache *c = ct_cache (fb, &cfg);
  assert_non_null (c);

  memset (buf, 0x11, BS);
  for (uint64_t i = 0; i < TAGGED; i++)
    assert_int_equal (cache_write (c, buf, BS, i * STRIDE * FOLIO, 0), 0);
  fake_reset_log (fb);

  struct writer w = { .c = c };
  atomic_store (&w.stop, false);
  atomic_store (&gate_armed, true);
  assert_int_equal (pthread_create (&w.t, NULL, writer_main, &w), 0);
  size_t from = fake_log_len (fb);
  assert_int_equal (cache_flush (c), 0);
  size_t n = fake_log_len (fb);
  atomic_store (&w.stop, true);
  assert_int_equal (pthread_join (w.t, NULL), 0);

  /* The folios the flush wrote: the tagged ones, plus at most the folio
   * after each, where a dirty run crossing the boundary goes out whole. */
  static bool touched[NFOLIOS];
  unsigned folios = 0;
  for (size_t i = from; i < n; i++) {
    struct fake_req r;
    assert_int_equal (fake_log_get (fb, i, &r), 0);
    if (r.op != FAKE_WRITE)
      continue;
    for (uint64_t fi = r.off / FOLIO; fi <= (r.off + r.len - 1) / FOLIO; fi++)
      if (!touched[fi]) {
        touched[fi] = true;
        folios++;
      }
  }
  print_message ("flush wrote %u folios (%u dirty when it began) while a "
                 "writer made %llu writes\n", folios, TAGGED,
                 (unsigned long long) w.writes);
  assert_true (atomic_load (&gate_open)); /* the writer did run meanwhile */
  assert_true (folios <= 2 * TAGGED);

  /* And what was dirty when it began is on the backing. */
  for (uint64_t i = 0; i < TAGGED; i++) {
    fake_peek (fb, buf, BS, i * STRIDE * FOLIO);
    for (unsigned k = 0; k < BS; k++)
      assert_int_equal (buf[k], 0x11);
  }
  assert_int_equal (cache_flush (c), 0);  /* the writer's blocks too */
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_flush_writes_its_snapshot),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
