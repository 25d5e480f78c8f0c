/* Readahead in the cache (src/cache/readahead.c) over a fake backing that
 * says it is remote (BACKING_REMOTE) and answers each request after a
 * delay:
 *   - a sequential read brings the data ahead of the reader (counters),
 *     the reader reads those folios, and the data is right;
 *   - readahead=auto is off on a backing that is not remote, and
 *     readahead=0 turns it off;
 *   - random reads fetch nothing beyond what they ask;
 *   - random hits cost readahead nothing (it looks at misses and at the
 *     reads that may continue a stream only), and a stream that begins
 *     on cached data still gets its windows once it reaches the rest;
 *   - a stream through a small cache does not evict another reader's
 *     working set (read again between the stream's reads: no misses);
 *   - readahead never touches dirty data: streams read through a small
 *     cache while a thread writes, flushes at the end; every write reads
 *     back and reached the backing (also a run for ThreadSanitizer);
 *   - a folio readahead brought that a write received into folio memory
 *     replaces unread counts as wasted, and the slot it leaves brings no
 *     readahead hit to the folio that takes it next.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "cache/cache-int.h"     /* cache_readahead_fill */
#include "lib/cachetest.h"

#define K 1024ull
#define M (1024ull * 1024)
#define SIZE (64 * M)
#define SALT 7

static struct cache_stats
stats (struct cache *c)
{
  struct cache_stats st;
  cache_get_stats (c, &st);
  return st;
}

static struct fake_backing *
remote (bool is_remote)
{
  struct fake_backing *fb = fake_backing_new (SIZE);
  assert_non_null (fb);
  fake_fill_pattern (fb, SIZE, 0, SALT);
  if (is_remote)
    fake_set_caps (fb, FAKE_DEFAULT_CAPS | BACKING_REMOTE);
  fake_set_delay_us (fb, 300);
  fake_set_log (fb, 0);
  return fb;
}

static struct cache_config
config (uint64_t cache_size, uint32_t readahead)
{
  struct cache_config cfg;
  cache_config_default (&cfg);
  cfg.cache_size = cache_size;
  cfg.readahead_bytes = readahead;
  return cfg;
}

/* Read [off, off + len) in bs reads; check every byte. */
static void
read_check (struct cache *c, uint64_t off, uint64_t len, uint64_t bs)
{
  unsigned char buf[64 * 1024];        /* one per reader thread */

  assert_true (bs <= sizeof buf);
  for (uint64_t o = off; o < off + len; o += bs) {
    assert_int_equal (cache_read (c, buf, bs, o, 0), 0);
    for (uint64_t i = 0; i < bs; i += 512)
      if (buf[i] != fake_pattern_byte (o + i, SALT))
        fail_msg ("wrong byte at %llu", (unsigned long long) (o + i));
  }
}

static void
test_sequential (void **state)
{
  struct fake_backing *fb = remote (true);
  struct cache_config cfg = config (32 * M, CACHE_READAHEAD_AUTO);
  struct cache *c = ct_cache (fb, &cfg);

  assert_non_null (c);
  read_check (c, 0, 16 * M, 64 * K);
  struct cache_stats st = stats (c);
  printf ("16M sequential: readahead %llu bytes in %llu windows, %llu "
          "folios read, %llu hits %llu misses\n",
          (unsigned long long) st.readahead_bytes,
          (unsigned long long) st.readahead_windows,
          (unsigned long long) st.readahead_hits,
          (unsigned long long) st.read_hits,
          (unsigned long long) st.read_misses);
  assert_true (st.readahead_bytes >= 8 * M);
  assert_true (st.readahead_hits >= 128);       /* of 256 folios */
  assert_true (st.readahead_windows >= 4);
  assert_true (st.read_hits > st.read_misses);
  assert_int_equal (st.readahead_wasted, 0);     /* the cache holds it all */
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

static void
test_off (void **state)
{
  struct fake_backing *fb = remote (false);
  struct cache_config cfg = config (32 * M, CACHE_READAHEAD_AUTO);
  struct cache *c = ct_cache (fb, &cfg);

  assert_non_null (c);                           /* auto, not remote */
  read_check (c, 0, 4 * M, 64 * K);
  assert_int_equal (stats (c).readahead_bytes, 0);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);

  fb = remote (true);
  cfg = config (32 * M, 0);                      /* readahead=0 */
  c = ct_cache (fb, &cfg);
  assert_non_null (c);
  read_check (c, 0, 4 * M, 64 * K);
  assert_int_equal (stats (c).readahead_bytes, 0);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

static void
test_random (void **state)
{
  struct fake_backing *fb = remote (true);
  struct cache_config cfg = config (32 * M, CACHE_READAHEAD_AUTO);
  struct cache *c = ct_cache (fb, &cfg);
  struct fake_totals t;
  uint64_t rng = 42;

  assert_non_null (c);
  fake_set_delay_us (fb, 0);
  fake_reset_log (fb);
  for (int i = 0; i < 2000; i++) {
    uint64_t off = fake_rand_below (&rng, SIZE / (4 * K)) * 4 * K;
    read_check (c, off, 4 * K, 4 * K);
  }
  fake_get_totals (fb, &t);
  assert_int_equal (stats (c).readahead_windows, 0);
  assert_true (t.read_bytes <= 2000 * 4 * K);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

/* A loop serving hits from many connections must not take readahead's
 * lock for each: 4 MiB cached without a client read (prefetch), then
 * random 4 KiB reads of it.  Then a sequential reader starting in that
 * cached part and going on past it is still seen as a stream. */
static void
test_random_hits_skip_readahead (void **state)
{
  struct fake_backing *fb = remote (true);
  struct cache_config cfg = config (32 * M, CACHE_READAHEAD_AUTO);
  struct cache *c = ct_cache (fb, &cfg);
  uint64_t rng = 7;

  assert_non_null (c);
  fake_set_delay_us (fb, 0);
  assert_int_equal (cache_prefetch (c, 4 * M, 0), 0);
  for (int i = 0; i < 1000; i++)
    read_check (c, fake_rand_below (&rng, 4 * M / (4 * K)) * 4 * K, 4 * K,
                4 * K);
  struct cache_stats st = stats (c);
  printf ("1000 random hits: %llu hits, %llu noted by readahead\n",
          (unsigned long long) st.read_hits,
          (unsigned long long) st.readahead_notes);
  assert_int_equal (st.read_hits, 1000);
  assert_int_equal (st.readahead_notes, 0);

  /* The reads of 3M-4M hit and continue nothing: not noted.  The first
   * read past 4M misses and is; from then on every read continues the
   * stream, a miss or a hit of what readahead brought, and is noted too
   * (a stream followed only through its misses would lose the readahead
   * hits' reads: how many depends on who is faster, readahead or the
   * reader, but they are most of them). */
  read_check (c, 3 * M, 8 * M, 64 * K);
  st = stats (c);
  printf ("then 8M sequential from 3M: %llu noted, %llu windows, %llu "
          "readahead hits\n", (unsigned long long) st.readahead_notes,
          (unsigned long long) st.readahead_windows,
          (unsigned long long) st.readahead_hits);
  assert_true (st.readahead_notes >= 7 * M / (64 * K));
  assert_true (st.readahead_notes <= 7 * M / (64 * K) + 2);
  assert_true (st.readahead_windows >= 2);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

static void
test_working_set (void **state)
{
  struct fake_backing *fb = remote (true);
  struct cache_config cfg = config (8 * M, CACHE_READAHEAD_AUTO);
  struct cache *c = ct_cache (fb, &cfg);
  uint64_t ws = 60 * M, misses = 0;

  assert_non_null (c);
  fake_set_delay_us (fb, 100);
  read_check (c, ws, 2 * M, 64 * K);            /* 32 of the 128 folios */
  for (uint64_t off = 0; off < 32 * M; off += M) {
    read_check (c, off, M, 64 * K);             /* the stream */
    uint64_t m0 = stats (c).read_misses;
    read_check (c, ws, 2 * M, 64 * K);
    misses += stats (c).read_misses - m0;
  }
  struct cache_stats st = stats (c);
  printf ("32M stream through 8M beside a 2M working set: readahead %llu "
          "bytes, %llu folios read, %llu wasted; working set misses %llu\n",
          (unsigned long long) st.readahead_bytes,
          (unsigned long long) st.readahead_hits,
          (unsigned long long) st.readahead_wasted,
          (unsigned long long) misses);
  assert_true (st.readahead_hits >= 128);       /* of the stream's 512 */
  assert_int_equal (misses, 0);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

/* --- streams and a writer through a small cache --- */

struct run {
  struct cache *c;
  uint64_t off, len;
  _Atomic bool stop;
};

static void *
reader (void *arg)
{
  struct run *r = arg;
  read_check (r->c, r->off, r->len, 64 * K);
  return NULL;
}

/* Writes 4 KiB blocks of a byte derived from their number into the
 * first 8 MiB, one in every 16, then stops. */
static void *
writer (void *arg)
{
  struct run *r = arg;
  unsigned char buf[4096];

  for (uint64_t b = 0; b < 8 * M / 4096; b += 16) {
    memset (buf, (int) (b / 16 % 251) + 1, sizeof buf);
    assert_int_equal (cache_write (r->c, buf, sizeof buf, b * 4096, 0), 0);
  }
  return NULL;
}

static void
test_dirty_survives (void **state)
{
  struct fake_backing *fb = remote (true);
  struct cache_config cfg = config (4 * M, CACHE_READAHEAD_AUTO);
  cfg.dirty_expire_ms = 600000;
  struct cache *c = ct_cache (fb, &cfg);
  struct run w = { .c = c }, r1 = { .c = c, .off = 8 * M, .len = 24 * M },
             r2 = { .c = c, .off = 40 * M, .len = 24 * M };
  pthread_t tw, t1, t2;
  unsigned char buf[4096];

  assert_non_null (c);
  fake_set_delay_us (fb, 100);
  assert_int_equal (pthread_create (&t1, NULL, reader, &r1), 0);
  assert_int_equal (pthread_create (&t2, NULL, reader, &r2), 0);
  assert_int_equal (pthread_create (&tw, NULL, writer, &w), 0);
  pthread_join (tw, NULL);
  pthread_join (t1, NULL);
  pthread_join (t2, NULL);
  struct cache_stats st = stats (c);
  printf ("two streams and a writer through 4M: readahead %llu bytes, "
          "%llu wasted folios, %llu evictions, %llu dirty\n",
          (unsigned long long) st.readahead_bytes,
          (unsigned long long) st.readahead_wasted,
          (unsigned long long) st.evictions,
          (unsigned long long) st.dirty_bytes);
  assert_true (st.readahead_bytes > 0);
  for (uint64_t b = 0; b < 8 * M / 4096; b += 16) {   /* read back */
    assert_int_equal (cache_read (c, buf, 4096, b * 4096, 0), 0);
    assert_int_equal (buf[0], b / 16 % 251 + 1);
    assert_int_equal (buf[4095], b / 16 % 251 + 1);
  }
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (stats (c).dirty_bytes, 0);
  for (uint64_t b = 0; b < 8 * M / 4096; b += 16) {   /* on the backing */
    fake_peek (fb, buf, 4096, b * 4096);
    assert_int_equal (buf[0], b / 16 % 251 + 1);
  }
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

/* Review 2026-12c F12: the readahead flag outlived its folio when
 * cache_write_commit swapped a new folio in (folio_replace), so the
 * folio read next from the slot counted a readahead hit. */
static void
test_replaced_unread (void **state)
{
  struct fake_backing *fb = remote (true);
  struct cache_config cfg = config (32 * M, CACHE_READAHEAD_AUTO);
  struct cache *c = ct_cache (fb, &cfg);
  struct cache_prep p;

  assert_non_null (c);
  fake_set_delay_us (fb, 0);
  assert_int_equal (cache_readahead_fill (c, 64 * K, 0), 0);  /* folio 0 */
  assert_int_equal (stats (c).readahead_bytes, 64 * K);
  assert_int_equal (cache_write_prepare (c, 64 * K, 0, &p), 0);
  assert_int_equal (p.n, 1);
  memset (p.data[0], 0xab, p.folio_size);
  assert_int_equal (cache_write_commit (c, &p, 0), 0);
  assert_int_equal (stats (c).readahead_wasted, 1);
  /* A miss far off takes the slot folio 0 left (free slots are a stack). */
  read_check (c, 32 * M, 64 * K, 64 * K);
  assert_int_equal (stats (c).readahead_hits, 0);
  assert_int_equal (cache_flush (c), 0);          /* the write's folio */
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_sequential),
    cmocka_unit_test (test_off),
    cmocka_unit_test (test_random),
    cmocka_unit_test (test_random_hits_skip_readahead),
    cmocka_unit_test (test_working_set),
    cmocka_unit_test (test_dirty_survives),
    cmocka_unit_test (test_replaced_unread),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
