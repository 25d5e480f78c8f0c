/* The CACHE_NOWAIT contract of cache_write (foliod/cache.h): a try that
 * gives up with EAGAIN changed nothing.  No clean folio was evicted for
 * it, nothing was counted, the data is as before, and the cache holds
 * the same folios; the same write without the flag then does the work. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/cachetest.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

static struct cache_stats
stats_of (struct cache *c)
{
  struct cache_stats st;
  cache_get_stats (c, &st);
  return st;
}

/* A cache of 8 MiB (128 folios of 64 KiB, 4 KiB blocks) over 32 MiB,
 * filled with clean folios by reading 16 MiB: no slot is free. */
static struct cache *
full_cache (struct fake_backing **fbp)
{
  struct cache_config cfg;
  struct fake_backing *fb = fake_backing_new (32 * MiB);
  uint8_t *buf = malloc (1 * MiB);
  struct cache *c;

  assert_non_null (fb);
  assert_non_null (buf);
  cache_config_default (&cfg);
  cfg.cache_size = 8 * MiB;
  cfg.folio_size = 64 * KiB;
  cfg.block_size = 4 * KiB;
  cfg.max_io_bytes = 1 * MiB;
  cfg.mode = CACHE_WRITEBACK;
  cfg.direct_threshold = 0;
  cfg.readahead_bytes = 0;
  c = ct_cache (fb, &cfg);
  assert_non_null (c);
  fake_fill_pattern (fb, 32 * MiB, 0, 7);
  for (uint64_t off = 0; off < 16 * MiB; off += 1 * MiB)
    assert_int_equal (cache_read (c, buf, 1 * MiB, off, 0), 0);
  assert_true (stats_of (c).evictions > 0);
  free (buf);
  *fbp = fb;
  return c;
}

/* Gives up: nothing evicted, nothing counted, nothing cached anew, and
 * the bytes read back as the backing has them. */
static void
expect_nowait_changes_nothing (struct cache *c, struct fake_backing *fb,
                               const void *data, uint64_t len, uint64_t off)
{
  struct cache_stats before = stats_of (c), after;
  uint8_t *got = malloc (len), *want = malloc (len);

  assert_int_equal (cache_write (c, data, len, off, CACHE_NOWAIT), -1);
  assert_int_equal (errno, EAGAIN);
  after = stats_of (c);
  assert_int_equal (after.evictions, before.evictions);
  assert_int_equal (after.client_write_bytes, before.client_write_bytes);
  assert_int_equal (after.cached_bytes, before.cached_bytes);
  assert_int_equal (after.dirty_bytes, before.dirty_bytes);
  fake_peek (fb, want, len, off);
  assert_int_equal (cache_read (c, got, len, off, 0), 0);
  assert_memory_equal (got, want, len);
  free (got);
  free (want);
}

/* A partial block in a folio that is not cached must be read first: the
 * try gives up, and must not have evicted a clean folio to make room for
 * it on the way. */
static void
test_nowait_partial_block_evicts_nothing (void **state)
{
  struct fake_backing *fb;
  struct cache *c = full_cache (&fb);
  uint8_t data[512];

  memset (data, 0xa5, sizeof data);
  expect_nowait_changes_nothing (c, fb, data, sizeof data, 24 * MiB + 100);
  /* Without the flag it is done, and counted once. */
  uint64_t w0 = stats_of (c).client_write_bytes;
  assert_int_equal (cache_write (c, data, sizeof data, 24 * MiB + 100, 0), 0);
  assert_int_equal (stats_of (c).client_write_bytes, w0 + sizeof data);
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

/* Whole blocks into folios that are not cached, the cache full of clean
 * folios: a try takes free room only (it never evicts: an eviction is
 * for the retry, which may wait), so it gives up with nothing changed. */
static void
test_nowait_full_cache_evicts_nothing (void **state)
{
  struct fake_backing *fb;
  struct cache *c = full_cache (&fb);
  uint8_t *data = malloc (128 * KiB);

  memset (data, 0x3c, 128 * KiB);
  expect_nowait_changes_nothing (c, fb, data, 128 * KiB, 20 * MiB + 32 * KiB);
  free (data);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_nowait_partial_block_evicts_nothing),
    cmocka_unit_test (test_nowait_full_cache_evicts_nothing),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
