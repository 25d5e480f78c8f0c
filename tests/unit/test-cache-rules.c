/* One test per rule of the folio cache (shared/DESIGN.md, "Rules the cache
 * keeps"), each measured on the fake backing's request log. */
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
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "cache/cache-int.h"     /* space_waiters, throttle_futile */
#include "foliod/export.h"
#include "lib/cachetest.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)

struct t {
  struct fake_backing *fb;
  struct cache *c;
  struct cache_config cfg;
  uint64_t size;
};

/* Default geometry for these tests: 64 KiB folios, 4 KiB blocks, 8 MiB
 * cache, 1 MiB I/O cap, 30 s expiry (no background writeback during a
 * test unless it asks for it). */
static void
cfg_small (struct cache_config *cfg)
{
  cache_config_default (cfg);
  cfg->cache_size = 8 * MiB;
  cfg->folio_size = 64 * KiB;
  cfg->block_size = 4 * KiB;
  cfg->max_io_bytes = 1 * MiB;
  cfg->mode = CACHE_WRITEBACK;
  cfg->direct_threshold = 0;
}

static void
t_open (struct t *t, uint64_t size, const struct cache_config *cfg)
{
  memset (t, 0, sizeof *t);
  t->size = size;
  t->fb = fake_backing_new (size);
  assert_non_null (t->fb);
  if (cfg)
    t->cfg = *cfg;
  else
    cfg_small (&t->cfg);
  t->c = ct_cache (t->fb, &t->cfg);
  assert_non_null (t->c);
}

static void
t_close (struct t *t)
{
  struct fake_totals tot;
  fake_get_totals (t->fb, &tot);
  assert_int_equal (tot.bad, 0);     /* no out-of-range request, ever */
  assert_int_equal (cache_flush (t->c), 0);
  assert_int_equal (cache_destroy (t->c), 0);
  fake_free (t->fb);
}

static struct cache_stats
stats_of (struct cache *c)
{
  struct cache_stats st;
  cache_get_stats (c, &st);
  return st;
}

static struct fake_totals
totals (struct t *t)
{
  struct fake_totals tot;
  fake_get_totals (t->fb, &tot);
  return tot;
}

static struct cache_stats
stats (struct t *t)
{
  struct cache_stats st;
  cache_get_stats (t->c, &st);
  return st;
}

/* The i-th logged request of kind op (successful or not). */
static struct fake_req
nth (struct t *t, enum fake_op op, size_t i)
{
  struct fake_req r;
  size_t n = fake_log_len (t->fb), k = 0;
  for (size_t j = 0; j < n; j++) {
    assert_int_equal (fake_log_get (t->fb, j, &r), 0);
    if (r.op == op && k++ == i)
      return r;
  }
  fake_log_dump (t->fb, "request not found");
  fail_msg ("no request #%zu of kind %d", i, op);
  return r;
}

static void
expect_one (struct t *t, enum fake_op op, uint64_t off, uint64_t len)
{
  if (fake_log_count (t->fb, op) != 1)
    fake_log_dump (t->fb, "expected exactly one request");
  assert_int_equal (fake_log_count (t->fb, op), 1);
  struct fake_req r = nth (t, op, 0);
  assert_int_equal (r.off, off);
  assert_int_equal (r.len, len);
}

static void
fill (uint8_t *buf, uint64_t len, uint8_t seed)
{
  for (uint64_t i = 0; i < len; i++)
    buf[i] = (uint8_t) (seed + i * 7 + (i >> 9));
}

static void
expect_backing (struct t *t, const uint8_t *want, uint64_t len, uint64_t off)
{
  uint8_t *got = malloc (len);
  assert_non_null (got);
  fake_peek (t->fb, got, len, off);
  assert_memory_equal (got, want, len);
  free (got);
}

static void
expect_read (struct t *t, const uint8_t *want, uint64_t len, uint64_t off)
{
  uint8_t *got = malloc (len);
  assert_non_null (got);
  memset (got, 0xee, len);
  assert_int_equal (cache_read (t->c, got, len, off, 0), 0);
  assert_memory_equal (got, want, len);
  free (got);
}

static int
wait_for (struct t *t, int (*cond) (struct t *), unsigned ms)
{
  uint64_t end = ct_now_ms () + ms;
  while (!cond (t)) {
    if (ct_now_ms () > end)
      return 0;
    usleep (5000);
  }
  return 1;
}

/* ---- rule 1: writes read only what they must ---- */

/* 4 KiB into an uptodate 64 KiB folio: writeback sends exactly 4096.  On
 * a backing without native FUA (a file): the flush writes it, then
 * flushes the backing (with native FUA: test_small_flush_writes_fua). */
static void
test_write_4k_into_uptodate_folio (void **state)
{
  struct t t;
  uint8_t buf[4096], folio[65536];

  t_open (&t, 4 * MiB, NULL);
  fake_set_caps (t.fb, FAKE_DEFAULT_CAPS & ~BACKING_CAN_FUA);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  assert_int_equal (cache_read (t.c, folio, 65536, 65536, 0), 0);
  fake_reset_log (t.fb);
  fill (buf, sizeof buf, 3);
  assert_int_equal (cache_write (t.c, buf, 4096, 65536 + 5 * 4096, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (totals (&t).ops[FAKE_WRITE], 0);  /* write-back, not -through */
  assert_int_equal (stats (&t).dirty_bytes, 4096);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 65536 + 5 * 4096, 4096);
  assert_int_equal (totals (&t).write_bytes, 4096);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_true (totals (&t).ops[FAKE_FLUSH] >= 1);
  assert_int_equal (stats (&t).dirty_bytes, 0);
  expect_backing (&t, buf, 4096, 65536 + 5 * 4096);
  t_close (&t);
}

/* 16 adjacent 4 KiB writes from mid-folio across a folio boundary: whole
 * blocks read nothing, and writeback merges them into one 64 KiB request. */
static void
test_adjacent_writes_merge_across_folios (void **state)
{
  struct t t;
  uint8_t buf[65536];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fill (buf, sizeof buf, 9);
  for (int i = 0; i < 16; i++)
    assert_int_equal (cache_write (t.c, buf + i * 4096, 4096,
                                   32 * KiB + i * 4096ull, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 32 * KiB, 65536);
  expect_backing (&t, buf, 65536, 32 * KiB);
  t_close (&t);
}

/* 512 bytes into a cold block of data: read that block only, write back
 * that block only. */
static void
test_partial_block_write_reads_one_block (void **state)
{
  struct t t;
  uint8_t buf[512], want[4096];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 4096, 3 * 65536 + 4096);
  fill (buf, sizeof buf, 5);
  memcpy (want + 1000, buf, 512);
  assert_int_equal (cache_write (t.c, buf, 512, 3 * 65536 + 4096 + 1000, 0), 0);
  expect_one (&t, FAKE_READ, 3 * 65536 + 4096, 4096);
  assert_int_equal (totals (&t).read_bytes, 4096);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 3 * 65536 + 4096, 4096);
  expect_backing (&t, want, 4096, 3 * 65536 + 4096);
  t_close (&t);
}

/* A partial write of a block the backing calls a hole reads nothing. */
static void
test_partial_block_write_into_hole_reads_nothing (void **state)
{
  struct t t;
  uint8_t buf[100], want[4096] = { 0 };

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 5);
  memcpy (want + 7, buf, 100);
  assert_int_equal (cache_write (t.c, buf, 100, 8192 + 7, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 8192, 4096);
  expect_backing (&t, want, 4096, 8192);
  t_close (&t);
}

static void
test_full_folio_write_reads_nothing (void **state)
{
  struct t t;
  uint8_t buf[65536];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fill (buf, sizeof buf, 11);
  assert_int_equal (cache_write (t.c, buf, 65536, 2 * 65536, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  expect_read (&t, buf, 65536, 2 * 65536);      /* and it is all cached */
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 2 * 65536, 65536);
  expect_backing (&t, buf, 65536, 2 * 65536);
  t_close (&t);
}

/* ---- rule 2: reads fetch only what is missing ---- */

static void
test_hole_read_no_io (void **state)
{
  struct t t;
  uint8_t *buf = malloc (3 * 65536), *z = calloc (1, 3 * 65536);

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 65536, 0, 1);         /* data only in folio 0 */
  memset (buf, 0xee, 3 * 65536);
  assert_int_equal (cache_read (t.c, buf, 3 * 65536 - 100, 65536 + 50, 0), 0);
  assert_memory_equal (buf, z, 3 * 65536 - 100);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (totals (&t).ops[FAKE_WRITE], 0);
  free (buf);
  free (z);
  t_close (&t);
}

/* Blocks 2-3 and 8 dirty in a folio: reading the folio reads [0,2),
 * [4,8), [9,16): three requests, exact sizes, and the data is right. */
static void
test_read_fetches_only_missing_runs (void **state)
{
  struct t t;
  uint8_t want[65536], blk[8192];
  const uint64_t base = 5 * 65536;

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 65536, base);
  fill (blk, sizeof blk, 77);
  assert_int_equal (cache_write (t.c, blk, 8192, base + 2 * 4096, 0), 0);
  assert_int_equal (cache_write (t.c, blk, 4096, base + 8 * 4096, 0), 0);
  memcpy (want + 2 * 4096, blk, 8192);
  memcpy (want + 8 * 4096, blk, 4096);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  expect_read (&t, want, 65536, base);
  if (fake_log_count (t.fb, FAKE_READ) != 3)
    fake_log_dump (t.fb, "missing runs");
  assert_int_equal (fake_log_count (t.fb, FAKE_READ), 3);
  struct fake_req r0 = nth (&t, FAKE_READ, 0), r1 = nth (&t, FAKE_READ, 1),
    r2 = nth (&t, FAKE_READ, 2);
  assert_int_equal (r0.off, base);
  assert_int_equal (r0.len, 2 * 4096);
  assert_int_equal (r1.off, base + 4 * 4096);
  assert_int_equal (r1.len, 4 * 4096);
  assert_int_equal (r2.off, base + 9 * 4096);
  assert_int_equal (r2.len, 7 * 4096);
  /* Now all of it is cached: the next read is a hit. */
  fake_reset_log (t.fb);
  uint64_t hits = stats (&t).read_hits;
  expect_read (&t, want, 65536, base);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (stats (&t).read_hits, hits + 1);
  t_close (&t);
}

/* An unaligned small read of a cold block reads that block only. */
static void
test_small_read_reads_one_block (void **state)
{
  struct t t;
  uint8_t want[100];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 100, 5000);
  expect_read (&t, want, 100, 5000);
  expect_one (&t, FAKE_READ, 4096, 4096);
  t_close (&t);
}

/* A cold read spanning four folios is one request; with a 64 KiB cap it
 * is four. */
static void
test_cold_read_spanning_folios_one_request (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t *want = malloc (4 * 65536);

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 4 * 65536, 65536);
  expect_read (&t, want, 4 * 65536, 65536);
  expect_one (&t, FAKE_READ, 65536, 4 * 65536);
  t_close (&t);

  cfg_small (&cfg);
  cfg.max_io_bytes = 64 * KiB;
  t_open (&t, 4 * MiB, &cfg);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  expect_read (&t, want, 4 * 65536, 65536);
  assert_int_equal (totals (&t).read_bytes, 4 * 65536);
  assert_int_equal (fake_log_count (t.fb, FAKE_READ), 4);
  for (int i = 0; i < 4; i++)
    assert_true (nth (&t, FAKE_READ, i).len <= 64 * KiB);
  free (want);
  t_close (&t);
}

static void
test_prefetch_makes_read_a_hit (void **state)
{
  struct t t;
  uint8_t want[4096];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  assert_int_equal (cache_prefetch (t.c, 128 * KiB, 64 * KiB), 0);
  assert_int_equal (totals (&t).read_bytes, 128 * KiB);
  fake_reset_log (t.fb);
  struct cache_stats before = stats (&t);
  fake_peek (t.fb, want, 4096, 100 * KiB + 3);
  expect_read (&t, want, 4096, 100 * KiB + 3);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  struct cache_stats after = stats (&t);
  assert_int_equal (after.read_hits, before.read_hits + 1);
  assert_int_equal (after.read_misses, before.read_misses);
  t_close (&t);
}

/* ---- rule 3: writeback writes only dirty blocks, merged, capped ---- */

static void
test_writeback_skips_clean_blocks (void **state)
{
  struct t t;
  uint8_t buf[4096], folio[65536];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  assert_int_equal (cache_read (t.c, folio, 65536, 0, 0), 0);
  fill (buf, sizeof buf, 1);
  assert_int_equal (cache_write (t.c, buf, 4096, 0, 0), 0);
  assert_int_equal (cache_write (t.c, buf, 4096, 2 * 4096, 0), 0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (fake_log_count (t.fb, FAKE_WRITE), 2);
  assert_int_equal (totals (&t).write_bytes, 8192);
  struct fake_req a = nth (&t, FAKE_WRITE, 0), b = nth (&t, FAKE_WRITE, 1);
  assert_true ((a.off == 0 && b.off == 8192) || (a.off == 8192 && b.off == 0));
  t_close (&t);
}

/* Merging must not depend on where a writeback batch of folios happens to
 * end: with a block dirty in each of folios 0-14 and a small run across
 * the boundary of folios 15 and 16 (1 MiB = max_io from folio 0), the run
 * still goes out whole: 15 + 1 requests. */
static void
test_merge_across_batch_boundary (void **state)
{
  struct t t;
  uint8_t buf[8192];

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 5);
  for (int i = 0; i < 15; i++)
    assert_int_equal (cache_write (t.c, buf, 4096, i * 65536ull, 0), 0);
  assert_int_equal (cache_write (t.c, buf, 8192, 1 * MiB - 4096, 0), 0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  if (fake_log_count (t.fb, FAKE_WRITE) != 16)
    fake_log_dump (t.fb, "merge across batch boundary");
  assert_int_equal (fake_log_count (t.fb, FAKE_WRITE), 16);
  expect_backing (&t, buf, 8192, 1 * MiB - 4096);
  t_close (&t);
}

static void
test_writeback_cap_splits (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t *buf = malloc (256 * KiB);

  cfg_small (&cfg);
  cfg.max_io_bytes = 64 * KiB;
  t_open (&t, 4 * MiB, &cfg);
  fill (buf, 256 * KiB, 2);
  assert_int_equal (cache_write (t.c, buf, 256 * KiB, 96 * KiB, 0), 0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  size_t n = fake_log_count (t.fb, FAKE_WRITE);
  /* 4 is the minimum; splitting at cap-aligned offsets gives 5. */
  if (n < 4 || n > 5)
    fake_log_dump (t.fb, "cap split");
  assert_in_range (n, 4, 5);
  /* Together they cover the range exactly (any order). */
  uint64_t covered = 0;
  for (size_t i = 0; i < n; i++) {
    struct fake_req r = nth (&t, FAKE_WRITE, i);
    assert_true (r.len <= 64 * KiB);
    assert_true (r.off >= 96 * KiB && r.off + r.len <= 352 * KiB);
    covered += r.len;
  }
  assert_int_equal (covered, 256 * KiB);
  expect_backing (&t, buf, 256 * KiB, 96 * KiB);
  free (buf);
  t_close (&t);
}

/* Block-aligned random writes into uptodate folios: amplification 1.00. */
static void
test_write_amplification_one (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[4096];
  uint64_t seed = 12345, written = 0;
  const uint64_t size = 64 * MiB;

  cfg_small (&cfg);
  cfg.cache_size = 32 * MiB;
  t_open (&t, size, &cfg);     /* all hole: folios come uptodate for free */
  for (int i = 0; i < 256; i++) {
    uint64_t off = fake_rand_below (&seed, size / 4096) * 4096;
    fill (buf, sizeof buf, (uint8_t) i);
    assert_int_equal (cache_write (t.c, buf, 4096, off, 0), 0);
  }
  written = stats (&t).dirty_bytes;
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (totals (&t).write_bytes, written);
  assert_true (written <= 256 * 4096 && written > 200 * 4096);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  t_close (&t);
}

/* ---- rule 4: dirty data is never dropped ---- */

static void
test_flush_error_keeps_data_dirty (void **state)
{
  struct t t;
  uint8_t buf[8192];

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 4);
  assert_int_equal (cache_write (t.c, buf, 8192, 40960, 0), 0);
  fake_fail_range (t.fb, FAKE_M (FAKE_WRITE), 0, 4 * MiB, EIO);
  errno = 0;
  assert_int_equal (cache_flush (t.c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (stats (&t).dirty_bytes, 8192);
  assert_true (stats (&t).writeback_errors >= 1);
  /* Still readable from the cache while the backing fails. */
  expect_read (&t, buf, 8192, 40960);
  fake_clear_faults (t.fb);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 40960, 8192);
  assert_int_equal (stats (&t).dirty_bytes, 0);
  expect_backing (&t, buf, 8192, 40960);
  t_close (&t);
}

/* A flush over a folio with more dirty runs than a batch takes (its batch
 * is cut, and the pass comes back for the rest) while every backing write
 * fails: the flush fails with EIO, once.  It used to come back to the cut
 * folio for ever, rewriting the same failing runs (test-model,
 * MODEL_SEED=1796427009157604). */
struct flush_bg {
  struct cache *c;
  int r, err;
  _Atomic bool done;
};

static void *
flush_bg_main (void *arg)
{
  struct flush_bg *f = arg;

  f->r = cache_flush (f->c);
  f->err = errno;
  atomic_store (&f->done, true);
  return NULL;
}

static void
test_flush_error_cut_batch_ends (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[512];
  pthread_t th;

  cfg_small (&cfg);
  cfg.folio_size = 128 * KiB;
  cfg.block_size = 512;           /* 256 blocks: 128 runs, over WB_RUNS_MAX */
  t_open (&t, 4 * MiB, &cfg);
  fill (buf, sizeof buf, 7);
  for (uint64_t off = 0; off < 128 * KiB; off += 1024)
    assert_int_equal (cache_write (t.c, buf, sizeof buf, off, 0), 0);
  fake_fail_range (t.fb, FAKE_M (FAKE_WRITE), 0, 4 * MiB, EIO);
  struct flush_bg f = { .c = t.c };
  assert_int_equal (pthread_create (&th, NULL, flush_bg_main, &f), 0);
  for (int i = 0; i < 3000 && !atomic_load (&f.done); i++)
    usleep (10000);
  if (!atomic_load (&f.done))
    fail_msg ("the flush did not end within 30 s with every write failing");
  pthread_join (th, NULL);
  assert_int_equal (f.r, -1);
  assert_int_equal (f.err, EIO);
  assert_int_equal (stats (&t).dirty_bytes, 128 * 512);
  fake_clear_faults (t.fb);
  t_close (&t);
}

/* A failing range does not stop writeback of everything else. */
static void
test_flush_error_writes_the_rest (void **state)
{
  struct t t;
  uint8_t a[8192], b[8192];

  t_open (&t, 4 * MiB, NULL);
  fill (a, sizeof a, 1);
  fill (b, sizeof b, 2);
  assert_int_equal (cache_write (t.c, a, 8192, 1 * MiB, 0), 0);
  assert_int_equal (cache_write (t.c, b, 8192, 3 * MiB, 0), 0);
  assert_int_equal (cache_write (t.c, b, 8192, 64 * KiB, 0), 0);
  fake_fail_range (t.fb, FAKE_M (FAKE_WRITE), 1 * MiB, 8192, EIO);
  assert_int_equal (cache_flush (t.c), -1);
  assert_int_equal (errno, EIO);
  expect_backing (&t, b, 8192, 3 * MiB);
  expect_backing (&t, b, 8192, 64 * KiB);
  assert_int_equal (stats (&t).dirty_bytes, 8192);
  fake_clear_faults (t.fb);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 1 * MiB, 8192);
  expect_backing (&t, a, 8192, 1 * MiB);
  t_close (&t);
}

/* A transient error on the backing flush itself reaches cache_flush
 * (without native FUA: with it, a flush this small needs no backing
 * flush, see test_small_flush_fua_error_keeps_dirty). */
static void
test_backing_flush_error_reported (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  fake_set_caps (t.fb, FAKE_DEFAULT_CAPS & ~BACKING_CAN_FUA);
  fill (buf, sizeof buf, 4);
  assert_int_equal (cache_write (t.c, buf, 4096, 0, 0), 0);
  fake_fail_next (t.fb, FAKE_M (FAKE_FLUSH), 1, EIO);
  assert_int_equal (cache_flush (t.c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, buf, 4096, 0);
  t_close (&t);
}

/* With native FUA and only a few dirty blocks, a flush writes them with
 * FUA and does not flush the backing: one round trip to a remote instead
 * of two (cache_flush_pass); every write is durable when it returns. */
static void
test_small_flush_writes_fua (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  for (unsigned i = 0; i < 3; i++) {
    fill (buf, sizeof buf, (uint8_t) (20 + i));
    assert_int_equal (cache_write (t.c, buf, 4096, (uint64_t) i * MiB, 0), 0);
  }
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (fake_log_count (t.fb, FAKE_WRITE), 3);
  for (size_t i = 0; i < 3; i++)
    assert_true (nth (&t, FAKE_WRITE, i).flags & BACKING_FUA);
  assert_int_equal (fake_log_count (t.fb, FAKE_FLUSH), 0);
  assert_int_equal (fake_unflushed (t.fb), 0);
  assert_int_equal (stats (&t).dirty_bytes, 0);
  assert_int_equal (stats (&t).unstable_bytes, 0);
  for (unsigned i = 0; i < 3; i++) {
    fill (buf, sizeof buf, (uint8_t) (20 + i));
    expect_backing (&t, buf, 4096, (uint64_t) i * MiB);
  }
  t_close (&t);
}

/* Many dirty blocks: plain writes and one backing flush, not a FUA each. */
static void
test_big_flush_writes_then_flushes (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 5);
  for (unsigned i = 0; i < 64; i++)
    assert_int_equal (cache_write (t.c, buf, 4096, (uint64_t) i * 65536, 0),
                      0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (fake_log_count (t.fb, FAKE_WRITE), 64);
  assert_int_equal (totals (&t).fua_writes, 0);
  assert_int_equal (fake_log_count (t.fb, FAKE_FLUSH), 1);
  assert_int_equal (fake_unflushed (t.fb), 0);
  t_close (&t);
}

/* Something the backing still has to flush (a direct write past the
 * cache) makes the small flush flush the backing: FUA writes alone would
 * leave that write volatile. */
static void
test_small_flush_after_plain_write_flushes (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t big[65536], buf[4096];

  cfg_small (&cfg);
  cfg.direct_threshold = 64 * KiB;
  t_open (&t, 4 * MiB, &cfg);
  fill (big, sizeof big, 6);
  assert_int_equal (cache_write (t.c, big, sizeof big, 0, 0), 0);
  assert_int_equal (fake_unflushed (t.fb), 1);   /* passed straight through */
  fill (buf, sizeof buf, 8);
  assert_int_equal (cache_write (t.c, buf, 4096, MiB, 0), 0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (fake_log_count (t.fb, FAKE_FLUSH), 1);
  assert_int_equal (fake_unflushed (t.fb), 0);
  expect_backing (&t, big, sizeof big, 0);
  expect_backing (&t, buf, 4096, MiB);
  t_close (&t);
}

/* A FUA write of a small flush that fails reaches cache_flush and leaves
 * the block dirty; the next flush writes it. */
static void
test_small_flush_fua_error_keeps_dirty (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 7);
  assert_int_equal (cache_write (t.c, buf, 4096, 0, 0), 0);
  fake_fail_next (t.fb, FAKE_M (FAKE_WRITE), 1, EIO);
  assert_int_equal (cache_flush (t.c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (stats (&t).dirty_bytes, 4096);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (stats (&t).dirty_bytes, 0);
  assert_int_equal (fake_unflushed (t.fb), 0);
  expect_backing (&t, buf, 4096, 0);
  t_close (&t);
}

static int
cond_wb_error (struct t *t)
{
  return stats (t).writeback_errors > 0;
}

/* A background writeback failure is retried and reported on FLUSH. */
static void
test_background_error_reported_by_flush (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[4096];

  cfg_small (&cfg);
  cfg.dirty_expire_ms = 50;
  cfg.writeback_interval_ms = 10;
  t_open (&t, 4 * MiB, &cfg);
  fake_fail_range (t.fb, FAKE_M (FAKE_WRITE), 0, 4 * MiB, EIO);
  fill (buf, sizeof buf, 4);
  assert_int_equal (cache_write (t.c, buf, 4096, 4096, 0), 0);
  assert_true (wait_for (&t, cond_wb_error, 5000));
  assert_int_equal (stats (&t).dirty_bytes, 4096);
  assert_int_equal (cache_flush (t.c), -1);
  assert_int_equal (errno, EIO);
  fake_clear_faults (t.fb);
  /* Either the background retry or this flush writes it. */
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (stats (&t).dirty_bytes, 0);
  expect_backing (&t, buf, 4096, 4096);
  t_close (&t);
}

static void
test_fua_write_error_returned (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 4);
  fake_fail_range (t.fb, FAKE_M (FAKE_WRITE) | FAKE_M (FAKE_FLUSH), 0,
                   4 * MiB, EIO);
  assert_int_equal (cache_write (t.c, buf, 4096, 0, CACHE_FUA), -1);
  assert_int_equal (errno, EIO);
  fake_clear_faults (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  t_close (&t);
}

static void
test_read_error_then_success (void **state)
{
  struct t t;
  uint8_t want[8192];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 8192, 12288);
  fake_fail_next (t.fb, FAKE_M (FAKE_READ), 1, EIO);
  uint8_t got[8192];
  assert_int_equal (cache_read (t.c, got, 8192, 12288, 0), -1);
  assert_int_equal (errno, EIO);
  assert_true (stats (&t).read_errors >= 1);
  expect_read (&t, want, 8192, 12288);      /* nothing wrong was cached */
  t_close (&t);
}

/* A failed read-modify-write read fails the write and caches no junk: the
 * rest of the block still reads as the backing's data. */
static void
test_rmw_read_error_fails_write (void **state)
{
  struct t t;
  uint8_t want[4096], got[4096], buf[512];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 4096, 4096);
  fill (buf, sizeof buf, 9);
  fake_fail_next (t.fb, FAKE_M (FAKE_READ), 1, EIO);
  assert_int_equal (cache_write (t.c, buf, 512, 4096 + 1000, 0), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_read (t.c, got, 4096, 4096, 0), 0);
  assert_memory_equal (got, want, 1000);
  assert_memory_equal (got + 1512, want + 1512, 4096 - 1512);
  assert_int_equal (cache_flush (t.c), 0);
  t_close (&t);
}

/* A cache of 8 folios takes 4 MiB of scattered partial writes: eviction
 * happens, nothing is lost. */
static void
test_eviction_never_loses_dirty (void **state)
{
  struct t t;
  struct cache_config cfg;
  const uint64_t size = 4 * MiB;
  uint8_t *ref = malloc (size), *got = malloc (size), buf[6000];
  uint64_t seed = 99;

  cfg_small (&cfg);
  cfg.cache_size = 8 * 64 * KiB;
  t_open (&t, size, &cfg);
  fake_fill_pattern (t.fb, size, 0, 1);
  fake_peek (t.fb, ref, size, 0);
  for (int i = 0; i < 600; i++) {
    uint64_t len = 1 + fake_rand_below (&seed, sizeof buf);
    uint64_t off = fake_rand_below (&seed, size - len);
    fill (buf, len, (uint8_t) (i * 13));
    assert_int_equal (cache_write (t.c, buf, len, off, 0), 0);
    memcpy (ref + off, buf, len);
  }
  assert_true (stats (&t).evictions > 0);
  assert_true (stats (&t).cached_bytes <= cfg.cache_size);
  assert_int_equal (cache_read (t.c, got, size, 0, 0), 0);
  assert_memory_equal (got, ref, size);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, ref, size, 0);
  free (ref);
  free (got);
  t_close (&t);
}

/* cache_destroy writes nothing back (the shutdown policy, flush and
 * retries, is export_close's): after a flush it drops nothing, without one
 * it reports the dirty data it drops.  A failed flush keeps the data for
 * the next one. */
static void
test_destroy_writes_nothing_back (void **state)
{
  struct fake_backing *fb = fake_backing_new (4 * MiB);
  struct cache_config cfg;
  struct cache *c;
  uint8_t buf[4096], got[4096], before[4096];

  cfg_small (&cfg);
  fill (buf, sizeof buf, 5);
  c = ct_cache (fb, &cfg);
  assert_non_null (c);
  assert_int_equal (cache_write (c, buf, 4096, 8192, 0), 0);
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (cache_destroy (c), 0);
  fake_peek (fb, got, 4096, 8192);
  assert_memory_equal (got, buf, 4096);

  fill (buf, sizeof buf, 6);
  c = ct_cache (fb, &cfg);
  assert_non_null (c);
  assert_int_equal (cache_write (c, buf, 4096, 8192, 0), 0);
  fake_fail_next (fb, FAKE_M (FAKE_WRITE), 2, EIO);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (cache_flush (c), 0);
  fake_peek (fb, got, 4096, 8192);
  assert_memory_equal (got, buf, 4096);
  assert_int_equal (cache_destroy (c), 0);

  fake_peek (fb, before, 4096, 8192);
  fill (buf, sizeof buf, 7);
  c = ct_cache (fb, &cfg);
  assert_non_null (c);
  assert_int_equal (cache_write (c, buf, 4096, 8192, 0), 0);
  errno = 0;
  assert_int_equal (cache_destroy (c), -1);
  assert_int_equal (errno, EIO);
  fake_peek (fb, got, 4096, 8192);
  assert_memory_equal (got, before, 4096);
  fake_free (fb);
}

/* ---- block status, zero, trim, FUA ---- */

struct ext_list {
  unsigned n;
  struct { uint64_t off, len; enum backing_extent_type type; } e[64];
};

static int
ext_collect (void *opaque, uint64_t off, uint64_t len,
             enum backing_extent_type type)
{
  struct ext_list *l = opaque;
  if (l->n == 64)
    return -1;
  l->e[l->n].off = off;
  l->e[l->n].len = len;
  l->e[l->n].type = type;
  l->n++;
  return 0;
}

/* Type at offset off per the extents; checks they tile the range. */
static enum backing_extent_type
ext_type_at (const struct ext_list *l, uint64_t start, uint64_t len,
             uint64_t off)
{
  uint64_t pos = start;
  for (unsigned i = 0; i < l->n; i++) {
    assert_int_equal (l->e[i].off, pos);
    assert_true (l->e[i].len > 0);
    pos += l->e[i].len;
  }
  assert_int_equal (pos, start + len);
  for (unsigned i = 0; i < l->n; i++)
    if (off >= l->e[i].off && off < l->e[i].off + l->e[i].len)
      return l->e[i].type;
  fail ();
  return BACKING_DATA;
}

static void
test_block_status_dirty_is_data (void **state)
{
  struct t t;
  struct ext_list l = { 0 };
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);     /* all hole */
  fill (buf, sizeof buf, 1);
  assert_int_equal (cache_write (t.c, buf, 4096, 64 * KiB, 0), 0);
  assert_int_equal (cache_block_status (t.c, 256 * KiB, 0, ext_collect, &l), 0);
  assert_true (l.n >= 2);
  assert_int_equal (ext_type_at (&l, 0, 256 * KiB, 64 * KiB), BACKING_DATA);
  assert_int_equal (ext_type_at (&l, 0, 256 * KiB, 68 * KiB - 1), BACKING_DATA);
  assert_int_not_equal (ext_type_at (&l, 0, 256 * KiB, 0), BACKING_DATA);
  assert_int_not_equal (ext_type_at (&l, 0, 256 * KiB, 200 * KiB), BACKING_DATA);
  /* After a flush the backing says DATA too; still DATA. */
  assert_int_equal (cache_flush (t.c), 0);
  memset (&l, 0, sizeof l);
  assert_int_equal (cache_block_status (t.c, 4096, 64 * KiB, ext_collect, &l), 0);
  assert_int_equal (ext_type_at (&l, 64 * KiB, 4096, 64 * KiB), BACKING_DATA);
  t_close (&t);
}

static void *
flush_later (void *arg)
{
  struct t *t = arg;
  usleep (20000);
  assert_int_equal (cache_flush (t->c), 0);
  return NULL;
}

/* The backing's map says "hole" for a dirty block; while the answer is on
 * its way, writeback writes the block and clears its dirty bit.  Block
 * status must still call it DATA (it is data now, in the backing). */
static void
test_block_status_races_writeback (void **state)
{
  struct t t;
  struct ext_list l = { 0 };
  uint8_t buf[4096];
  pthread_t th;

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 1);
  assert_int_equal (cache_write (t.c, buf, 4096, 64 * KiB, 0), 0);
  fake_set_map_delay_us (t.fb, 200000);
  assert_int_equal (pthread_create (&th, NULL, flush_later, &t), 0);
  assert_int_equal (cache_block_status (t.c, 256 * KiB, 0, ext_collect, &l), 0);
  pthread_join (th, NULL);
  fake_set_map_delay_us (t.fb, 0);
  assert_true (fake_is_data (t.fb, 64 * KiB));
  assert_int_equal (ext_type_at (&l, 0, 256 * KiB, 64 * KiB), BACKING_DATA);
  t_close (&t);
}

static void
test_zero_and_trim_of_dirty_blocks (void **state)
{
  struct t t;
  uint8_t ref[65536];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fill (ref, sizeof ref, 21);
  assert_int_equal (cache_write (t.c, ref, 65536, 0, 0), 0);
  /* Unaligned zero: exactly its bytes become zero. */
  assert_int_equal (cache_zero (t.c, 8000, 4096 + 100, 0), 0);
  memset (ref + 4096 + 100, 0, 8000);
  expect_read (&t, ref, 65536, 0);
  /* Block-aligned trim of dirty blocks: zeroes, and they stay zero. */
  assert_int_equal (cache_trim (t.c, 16 * KiB, 32 * KiB, 0), 0);
  memset (ref + 32 * KiB, 0, 16 * KiB);
  expect_read (&t, ref, 65536, 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, ref, 65536, 0);
  expect_read (&t, ref, 65536, 0);
  /* Zero with MAY_TRIM of a whole cold folio, then read: zeroes. */
  uint8_t z[65536] = { 0 };
  assert_int_equal (cache_zero (t.c, 65536, 128 * KiB, CACHE_MAY_TRIM), 0);
  expect_read (&t, z, 65536, 128 * KiB);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, z, 65536, 128 * KiB);
  t_close (&t);
}

static void
test_fua_write_reaches_backing (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  fill (buf, sizeof buf, 8);
  assert_int_equal (cache_write (t.c, buf, 4096, 12288, CACHE_FUA), 0);
  expect_backing (&t, buf, 4096, 12288);
  /* Durable: written with FUA, or written then flushed. */
  size_t n = fake_log_len (t.fb);
  int wrote = 0, durable = 0;
  for (size_t i = 0; i < n; i++) {
    struct fake_req r;
    fake_log_get (t.fb, i, &r);
    if (r.op == FAKE_WRITE && r.err == 0 && r.off <= 12288 &&
        r.off + r.len >= 16384) {
      wrote = 1;
      durable |= (r.flags & BACKING_FUA) != 0;
    }
    if (r.op == FAKE_FLUSH && wrote && r.err == 0)
      durable = 1;
  }
  assert_true (wrote && durable);
  t_close (&t);
}

/* ---- rule 5: flush cost follows dirty data, not device size ---- */

static void
test_idle_flush_no_writes (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 4 * MiB, NULL);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (totals (&t).ops[FAKE_WRITE], 0);
  fill (buf, sizeof buf, 1);
  assert_int_equal (cache_write (t.c, buf, 4096, 0, 0), 0);
  assert_int_equal (cache_flush (t.c), 0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (totals (&t).ops[FAKE_WRITE], 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  t_close (&t);
}

static void
test_idle_flush_1tib (void **state)
{
  struct t t;
  uint8_t buf[4096];

  t_open (&t, 1ull << 40, NULL);
  fill (buf, sizeof buf, 1);
  assert_int_equal (cache_write (t.c, buf, 4096, (1ull << 39) + 8192, 0), 0);
  assert_int_equal (cache_write (t.c, buf, 4096, (1ull << 40) - 4096, 0), 0);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (totals (&t).write_bytes, 8192);
  fake_reset_log (t.fb);
  uint64_t t0 = ct_now_ms ();
  for (int i = 0; i < 100; i++)
    assert_int_equal (cache_flush (t.c), 0);
  uint64_t ms = ct_now_ms () - t0;
  assert_int_equal (totals (&t).ops[FAKE_WRITE], 0);
  /* 100 idle flushes: microseconds each.  The bound is loose for loaded
   * machines and valgrind; walking the 16 Mi folios of 1 TiB would take
   * seconds per flush. */
  if (ms > (ct_valgrind () ? 5000u : 1000u))
    fail_msg ("100 idle flushes on 1 TiB took %llu ms", (unsigned long long) ms);
  assert_true (stats (&t).cached_bytes <= 4 * 64 * KiB);
  expect_backing (&t, buf, 4096, (1ull << 40) - 4096);
  t_close (&t);
}

/* ---- rule 6: bounded memory, background writeback ---- */

static int
cond_clean (struct t *t)
{
  return stats (t).dirty_bytes == 0 && totals (t).write_bytes >= 8192;
}

static void
test_background_writeback_expiry (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[8192];

  cfg_small (&cfg);
  cfg.dirty_expire_ms = 100;
  cfg.writeback_interval_ms = 20;
  t_open (&t, 4 * MiB, &cfg);
  fill (buf, sizeof buf, 3);
  assert_int_equal (cache_write (t.c, buf, 8192, 65536 - 4096, 0), 0);
  assert_true (wait_for (&t, cond_clean, 5000));
  assert_int_equal (totals (&t).write_bytes, 8192);
  expect_backing (&t, buf, 8192, 65536 - 4096);
  t_close (&t);
}

static int
cond_below_background (struct t *t)
{
  return stats (t).dirty_bytes <= t->cfg.cache_size * t->cfg.dirty_background_pct / 100;
}

/* Dirtying half of a 1 MiB cache (limit 20%): writers get throttled,
 * background writeback brings dirty data under 10% without any expiry. */
static void
test_dirty_limit_and_background_threshold (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t *buf = malloc (512 * KiB);

  cfg_small (&cfg);
  cfg.cache_size = 1 * MiB;
  cfg.dirty_background_pct = 10;
  cfg.dirty_limit_pct = 20;
  cfg.dirty_expire_ms = 600000;
  cfg.writeback_interval_ms = 20;
  t_open (&t, 4 * MiB, &cfg);
  fill (buf, 512 * KiB, 3);
  for (int i = 0; i < 128; i++) {
    assert_int_equal (cache_write (t.c, buf + i * 4096, 4096, i * 4096ull, 0), 0);
    assert_true (stats (&t).dirty_bytes <= cfg.cache_size * 20 / 100 + 64 * KiB);
  }
  assert_true (totals (&t).write_bytes > 0);
  assert_true (wait_for (&t, cond_below_background, 5000));
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, buf, 512 * KiB, 0);
  free (buf);
  t_close (&t);
}

struct big_writer {
  struct cache *c;
  uint64_t off;
  uint8_t buf[64 * KiB];
  int r;
};

static void *
big_writer_main (void *arg)
{
  struct big_writer *w = arg;

  w->r = cache_write (w->c, w->buf, sizeof w->buf, w->off, 0);
  return NULL;
}

/* Writers waiting on the dirty limit are woken when there is room for
 * them, not every time writeback cleans a little: two 64 KiB writers wait
 * while writeback, held at the gate, then cleans 4 KiB a batch (one
 * dirty block every other folio, batches of two folios); they are not
 * woken to find no room (before: every batch woke both, 16 to 37 times
 * in all). */
static void
test_dirty_limit_wakes_only_with_room (void **state)
{
  struct t t;
  struct cache_config cfg;
  struct big_writer *w = calloc (2, sizeof *w);
  pthread_t th[2];
  uint8_t blk[4096];
  uint64_t limit, off = 0;

  cfg_small (&cfg);
  cfg.folio_size = 4 * KiB;
  cfg.max_io_bytes = 8 * KiB;          /* a batch: two folios, 4 KiB dirty */
  cfg.dirty_auto = false;
  cfg.dirty_background_pct = 5;
  cfg.dirty_limit_pct = 10;
  cfg.dirty_expire_ms = 600000;
  cfg.writeback_interval_ms = 600000;
  t_open (&t, 16 * MiB, &cfg);
  limit = cfg.cache_size * cfg.dirty_limit_pct / 100;
  fill (blk, sizeof blk, 9);
  fake_gate_close (t.fb, FAKE_M (FAKE_WRITE));
  while (stats (&t).dirty_bytes + sizeof blk <= limit) {
    assert_int_equal (cache_write (t.c, blk, sizeof blk, off, 0), 0);
    off += 2 * sizeof blk;
  }
  for (int i = 0; i < 2; i++) {
    w[i].c = t.c;
    w[i].off = 8 * MiB + i * 1 * MiB;
    fill (w[i].buf, sizeof w[i].buf, (uint8_t) (20 + i));
    assert_int_equal (pthread_create (&th[i], NULL, big_writer_main, &w[i]), 0);
  }
  while (atomic_load (&t.c->space_waiters) < 2)
    usleep (1000);
  fake_set_delay_us (t.fb, 2000);      /* batches slower than wake-ups */
  fake_gate_open (t.fb);
  for (int i = 0; i < 2; i++) {
    assert_int_equal (pthread_join (th[i], NULL), 0);
    assert_int_equal (w[i].r, 0);
  }
  lock_or_die (&t.c->throttle_lock);
  uint64_t futile = t.c->throttle_futile;
  unlock_or_die (&t.c->throttle_lock);
  /* At most one: the second can be woken for room that the first, let
   * through but not yet written, takes after all. */
  assert_true (futile <= 1);
  assert_true (stats (&t).throttle_waits >= 2);
  assert_int_equal (cache_flush (t.c), 0);
  for (int i = 0; i < 2; i++)
    expect_backing (&t, w[i].buf, sizeof w[i].buf, w[i].off);
  free (w);
  t_close (&t);
}

/* Write the whole of a 4 MiB export in 64 KiB pieces, give the writeback
 * thread a few wake-ups, and return the bytes it wrote meanwhile. */
static uint64_t
write_all_then_idle (struct t *t, const uint8_t *buf)
{
  for (uint64_t off = 0; off < 4 * MiB; off += 64 * KiB)
    assert_int_equal (cache_write (t->c, buf + off, 64 * KiB, off, 0), 0);
  usleep (100000);
  return totals (t).write_bytes;
}

/* With the default thresholds and a cache that holds the whole export,
 * dirty data takes no room (nothing is ever evicted): no writer waits and
 * nothing is written back before it expires or a flush asks; thresholds
 * set by hand (dirty_auto off) still apply, and so do the defaults when
 * the export is larger than the cache or the backing is a remote. */
static void
test_whole_export_cached_keeps_dirty (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t *buf = malloc (4 * MiB);

  fill (buf, 4 * MiB, 5);
  cfg_small (&cfg);                    /* 8 MiB cache, 10% / 20% */
  cfg.dirty_expire_ms = 600000;
  cfg.writeback_interval_ms = 20;
  t_open (&t, 4 * MiB, &cfg);
  assert_int_equal (write_all_then_idle (&t, buf), 0);
  assert_int_equal (stats (&t).dirty_bytes, 4 * MiB);
  assert_int_equal (stats (&t).throttle_waits, 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, buf, 4 * MiB, 0);
  t_close (&t);

  cfg.dirty_auto = false;              /* as if dirty-limit = 20 was set */
  t_open (&t, 4 * MiB, &cfg);
  assert_true (write_all_then_idle (&t, buf) > 0);
  assert_true (stats (&t).dirty_bytes <= cfg.cache_size * 20 / 100 + 64 * KiB);
  t_close (&t);

  cfg.dirty_auto = true;
  cfg.cache_size = 2 * MiB;            /* half the export */
  t_open (&t, 4 * MiB, &cfg);
  assert_true (write_all_then_idle (&t, buf) > 0);
  t_close (&t);

  /* A remote keeps them: they bound what FLUSH and shutdown must write
   * over the link. */
  cfg.cache_size = 8 * MiB;
  memset (&t, 0, sizeof t);
  t.size = 4 * MiB;
  t.fb = fake_backing_new (4 * MiB);
  assert_non_null (t.fb);
  fake_set_caps (t.fb, FAKE_DEFAULT_CAPS | BACKING_REMOTE);
  t.cfg = cfg;
  t.c = ct_cache (t.fb, &t.cfg);
  assert_non_null (t.c);
  assert_true (write_all_then_idle (&t, buf) > 0);
  assert_true (stats (&t).dirty_bytes <= cfg.cache_size * 20 / 100 + 64 * KiB);
  t_close (&t);
  free (buf);
}

/* Either threshold given as an option makes both the user's. */
static void
test_dirty_options_clear_auto (void **state)
{
  static const char *const keys[] = { "dirty-background", "dirty-limit" };
  struct export_config ec;
  char err[256];

  for (int i = 0; i < 2; i++) {
    export_config_init (&ec);
    assert_true (ec.cache.dirty_auto);
    assert_int_equal (export_config_set (&ec, "dirty-expire", "100", err,
                                         sizeof err), 0);
    assert_true (ec.cache.dirty_auto);
    assert_int_equal (export_config_set (&ec, keys[i], "20", err,
                                         sizeof err), 0);
    assert_false (ec.cache.dirty_auto);
    export_config_free (&ec);
  }
}

/* ---- writes received straight into folios (cache_write_prepare) ---- */

static void
prep_fill (struct cache_prep *p, const uint8_t *src)
{
  for (unsigned i = 0; i < p->n; i++)
    memcpy (p->data[i], src + i * p->folio_size, p->folio_size);
}

/* The whole folios of a write are handed out, filled, then committed in
 * place of the cached ones: until the commit a read sees the old data;
 * after it the new, dirty, written back by a flush.  Dirty folios replaced
 * do not count twice; an abort publishes nothing and keeps no slot (more
 * aborts than the cache has slots); the edges are the caller's. */
static void
test_prepared_write_swaps_folios (void **state)
{
  struct t t;
  struct cache_prep p;
  uint8_t *a = malloc (1 * MiB), *b = malloc (1 * MiB), *want = malloc (1 * MiB);

  fill (a, 1 * MiB, 1);
  fill (b, 1 * MiB, 2);
  t_open (&t, 4 * MiB, NULL);                  /* 8 MiB cache, 64 KiB folios */
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  assert_int_equal (cache_write (t.c, a, 1 * MiB, 0, 0), 0);   /* dirty */

  /* 1 MiB at 4 KiB: folios 1..15 are whole, the edges are not. */
  assert_int_equal (cache_write_prepare (t.c, 1 * MiB, 4096, &p), 0);
  assert_int_equal (p.n, 15);
  assert_int_equal (p.off, 64 * KiB);
  assert_int_equal (p.len, 15 * 64 * KiB);
  prep_fill (&p, b + (64 * KiB - 4096));
  expect_read (&t, a, 1 * MiB, 0);             /* not yet */
  assert_int_equal (cache_write (t.c, b, 64 * KiB - 4096, 4096, 0), 0);
  assert_int_equal (cache_write (t.c, b + 1 * MiB - 4096, 4096, 1 * MiB, 0), 0);
  assert_int_equal (cache_write_commit (t.c, &p, CACHE_NOWAIT), 0);
  assert_int_equal (p.n, 0);
  memcpy (want, a, 4096);
  memcpy (want + 4096, b, 1 * MiB - 4096);
  expect_read (&t, want, 1 * MiB, 0);
  expect_read (&t, b + 1 * MiB - 4096, 4096, 1 * MiB);
  assert_int_equal (stats (&t).dirty_bytes, 1 * MiB + 4096);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, want, 1 * MiB, 0);
  expect_backing (&t, b + 1 * MiB - 4096, 4096, 1 * MiB);
  assert_int_equal (stats (&t).dirty_bytes, 0);

  /* Aborted: never seen, and the slots come back every time. */
  for (int i = 0; i < 200; i++) {
    assert_int_equal (cache_write_prepare (t.c, 1 * MiB, 2 * MiB, &p), 0);
    memset (p.data[0], 0x5a, p.folio_size);
    cache_write_abort (t.c, &p);
    assert_int_equal (p.n, 0);
  }
  fake_peek (t.fb, want, 1 * MiB, 2 * MiB);
  expect_read (&t, want, 1 * MiB, 2 * MiB);

  /* Into folios not cached at all: nothing is read from the backing. */
  fake_reset_log (t.fb);
  assert_int_equal (cache_write_prepare (t.c, 128 * KiB, 3 * MiB, &p), 0);
  prep_fill (&p, b);
  assert_int_equal (cache_write_commit (t.c, &p, 0), 0);
  expect_read (&t, b, 128 * KiB, 3 * MiB);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);

  /* Less than one whole folio: nothing to hand out. */
  assert_int_equal (cache_write_prepare (t.c, 64 * KiB, 4096, &p), -1);
  assert_int_equal (errno, EAGAIN);
  assert_int_equal (p.n, 0);
  t_close (&t);
  free (a);
  free (b);
  free (want);
}

/* Where the fast path does not apply, prepare says so and holds nothing:
 * write-through, direct I/O, a read-only backing. */
static void
test_prepared_write_refused (void **state)
{
  struct t t;
  struct cache_config cfg;
  struct cache_prep p;

  cfg_small (&cfg);
  cfg.mode = CACHE_WRITETHROUGH;
  t_open (&t, 4 * MiB, &cfg);
  assert_int_equal (cache_write_prepare (t.c, 1 * MiB, 0, &p), -1);
  assert_int_equal (p.n, 0);
  t_close (&t);
  cfg_small (&cfg);
  cfg.direct_threshold = 512 * KiB;
  t_open (&t, 4 * MiB, &cfg);
  assert_int_equal (cache_write_prepare (t.c, 1 * MiB, 0, &p), -1);
  assert_int_equal (cache_write_prepare (t.c, 256 * KiB, 0, &p), 0);
  cache_write_abort (t.c, &p);
  assert_int_equal (cache_write_prepare (t.c, 1 * MiB, 4 * MiB, &p), -1);
  assert_int_equal (errno, EINVAL);            /* beyond the end */
  t_close (&t);
}

/* ---- modes ---- */

static void
test_writethrough_mode (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[4096];

  cfg_small (&cfg);
  cfg.mode = CACHE_WRITETHROUGH;
  t_open (&t, 4 * MiB, &cfg);
  fill (buf, sizeof buf, 3);
  assert_int_equal (cache_write (t.c, buf, 4096, 4096, 0), 0);
  expect_backing (&t, buf, 4096, 4096);
  assert_int_equal (stats (&t).dirty_bytes, 0);
  fake_reset_log (t.fb);
  expect_read (&t, buf, 4096, 4096);     /* still cached */
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  t_close (&t);
}

/* A direct write over a dirty cached block wins, also after a flush; a
 * direct read sees dirty cached data. */
static void
test_direct_io_coherent (void **state)
{
  struct t t;
  uint8_t a[4096], d[131072];

  t_open (&t, 4 * MiB, NULL);
  fill (a, sizeof a, 1);
  fill (d, sizeof d, 2);
  assert_int_equal (cache_write (t.c, a, 4096, 8192, 0), 0);
  assert_int_equal (cache_write (t.c, d, sizeof d, 0, CACHE_DIRECT), 0);
  expect_read (&t, d, sizeof d, 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, d, sizeof d, 0);

  assert_int_equal (cache_write (t.c, a, 4096, 65536 + 512, 0), 0);
  uint8_t got[8192], want[8192];
  memcpy (want, d + 65536, 8192);
  memcpy (want + 512, a, 4096);
  assert_int_equal (cache_read (t.c, got, 8192, 65536, CACHE_DIRECT), 0);
  assert_memory_equal (got, want, 8192);
  t_close (&t);
}

/* Zero-length requests do nothing; requests past the end fail cleanly. */
static void
test_zero_length_and_out_of_range (void **state)
{
  struct t t;
  uint8_t buf[8192];
  struct ext_list l = { 0 };

  t_open (&t, 4 * MiB + 512, NULL);
  assert_int_equal (cache_size_bytes (t.c), 4 * MiB + 512);
  assert_int_equal (cache_get_config (t.c)->folio_size, 64 * KiB);
  fake_fill_pattern (t.fb, 4 * MiB + 512, 0, 1);
  assert_int_equal (cache_read (t.c, buf, 0, 4096, 0), 0);
  assert_int_equal (cache_write (t.c, buf, 0, 4096, 0), 0);
  assert_int_equal (cache_zero (t.c, 0, 4096, 0), 0);
  assert_int_equal (cache_trim (t.c, 0, 4096, 0), 0);
  assert_int_equal (cache_prefetch (t.c, 0, 4096), 0);
  assert_int_equal (cache_block_status (t.c, 0, 4096, ext_collect, &l), 0);
  assert_int_equal (l.n, 0);
  assert_int_equal (totals (&t).ops[FAKE_READ] + totals (&t).ops[FAKE_WRITE] +
                    totals (&t).ops[FAKE_ZERO] + totals (&t).ops[FAKE_TRIM], 0);
  assert_int_equal (stats (&t).dirty_bytes, 0);

  errno = 0;
  assert_int_equal (cache_read (t.c, buf, 4096, 4 * MiB - 2048, 0), -1);
  assert_int_equal (errno, EINVAL);
  assert_int_equal (cache_write (t.c, buf, 1, 4 * MiB + 512, 0), -1);
  assert_int_equal (cache_zero (t.c, 2, UINT64_MAX - 1, 0), -1);
  assert_int_equal (cache_trim (t.c, UINT64_MAX, 4096, 0), -1);
  assert_int_equal (stats (&t).dirty_bytes, 0);

  /* The odd tail: a write over the last 512 bytes reads nothing (the
   * block ends at the export end) and writes back exactly those bytes. */
  fill (buf, 512, 3);
  fake_reset_log (t.fb);
  assert_int_equal (cache_write (t.c, buf, 512, 4 * MiB, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 4 * MiB, 512);
  expect_backing (&t, buf, 512, 4 * MiB);
  t_close (&t);
}

/* With every folio dirty and writeback failing, a request that needs a
 * new folio fails (it must not hang); the dirty data survives. */
static void
test_full_of_unwritable_dirty_data (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t *buf = malloc (4 * 65536), got[4096];

  cfg_small (&cfg);
  cfg.cache_size = 4 * 64 * KiB;
  cfg.dirty_limit_pct = 100;
  cfg.dirty_background_pct = 100;
  cfg.writeback_interval_ms = 10;
  t_open (&t, 4 * MiB, &cfg);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_fail_range (t.fb, FAKE_M (FAKE_WRITE), 0, 4 * MiB, EIO);
  fill (buf, 4 * 65536, 7);
  assert_int_equal (cache_write (t.c, buf, 4 * 65536, 0, 0), 0);
  assert_int_equal (cache_flush (t.c), -1);
  uint64_t t0 = ct_now_ms ();
  int r = cache_read (t.c, got, 4096, 1 * MiB, 0);
  uint64_t ms = ct_now_ms () - t0;
  if (r == -1)
    assert_true (errno != 0);
  if (ms > 10000)
    fail_msg ("read with the cache full of unwritable data took %llu ms",
              (unsigned long long) ms);
  r = cache_write (t.c, buf, 4096, 2 * MiB, 0);
  assert_true (ct_now_ms () - t0 < 20000);
  fake_clear_faults (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  expect_backing (&t, buf, 4 * 65536, 0);
  if (r == 0)
    expect_backing (&t, buf, 4096, 2 * MiB);
  free (buf);
  t_close (&t);
}

/* A flush fails, and does not hang, while the backing keeps failing;
 * cache_destroy then reports the loss instead of hanging. */
static void
test_shutdown_gives_up (void **state)
{
  struct fake_backing *fb = fake_backing_new (4 * MiB);
  struct cache_config cfg;
  struct cache *c;
  uint8_t buf[4096];

  cfg_small (&cfg);
  c = ct_cache (fb, &cfg);
  assert_non_null (c);
  fill (buf, sizeof buf, 1);
  assert_int_equal (cache_write (c, buf, 4096, 0, 0), 0);
  fake_fail_range (fb, FAKE_M (FAKE_WRITE), 0, 4 * MiB, EIO);
  uint64_t t0 = ct_now_ms ();
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (cache_destroy (c), -1);
  assert_true (ct_now_ms () - t0 < 20000);
  fake_free (fb);
}

static void
test_fast_zero_refused_and_read_only (void **state)
{
  struct t t;
  uint8_t buf[4096], want[4096];

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  fake_peek (t.fb, want, 4096, 0);
  fake_set_caps (t.fb, FAKE_DEFAULT_CAPS & ~BACKING_CAN_FAST_ZERO);
  errno = 0;
  assert_int_equal (cache_zero (t.c, 4096, 0, CACHE_FAST_ZERO), -1);
  assert_int_equal (errno, ENOTSUP);
  expect_read (&t, want, 4096, 0);
  assert_int_equal (cache_zero (t.c, 4096, 0, 0), 0);
  memset (want, 0, sizeof want);
  expect_read (&t, want, 4096, 0);
  t_close (&t);

  /* A read-only backing: reads work, every write kind fails. */
  struct fake_backing *fb = fake_backing_new (4 * MiB);
  struct cache_config cfg;
  cfg_small (&cfg);
  fake_fill_pattern (fb, 4 * MiB, 0, 2);
  fake_set_caps (fb, FAKE_DEFAULT_CAPS | BACKING_READ_ONLY);
  struct cache *c = ct_cache (fb, &cfg);
  assert_non_null (c);
  fake_peek (fb, want, 4096, 8192);
  assert_int_equal (cache_read (c, buf, 4096, 8192, 0), 0);
  assert_memory_equal (buf, want, 4096);
  assert_int_equal (cache_write (c, buf, 4096, 0, 0), -1);
  assert_int_equal (cache_zero (c, 4096, 0, 0), -1);
  assert_int_equal (cache_trim (c, 4096, 0, 0), -1);
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (cache_destroy (c), 0);
  struct fake_totals tot;
  fake_get_totals (fb, &tot);
  assert_int_equal (tot.ops[FAKE_WRITE] + tot.ops[FAKE_ZERO] + tot.ops[FAKE_TRIM], 0);
  fake_free (fb);
}

/* Without map() the cache must read what it cannot know is a hole, and
 * still return the right data. */
static void
test_backing_without_map (void **state)
{
  struct t t;
  uint8_t want[65536], got[65536];

  t_open (&t, 4 * MiB, NULL);
  fake_set_caps (t.fb, FAKE_DEFAULT_CAPS & ~BACKING_CAN_MAP);
  fake_fill_pattern (t.fb, 16384, 65536 + 8192, 3);
  fake_peek (t.fb, want, 65536, 65536);
  assert_int_equal (cache_read (t.c, got, 65536, 65536, 0), 0);
  assert_memory_equal (got, want, 65536);
  expect_one (&t, FAKE_READ, 65536, 65536);
  struct ext_list l = { 0 };
  assert_int_equal (cache_block_status (t.c, 65536, 0, ext_collect, &l), 0);
  assert_int_equal (ext_type_at (&l, 0, 65536, 0), BACKING_DATA);
  t_close (&t);
}

/* The counters agree with what the backing saw. */
static void
test_stats_match_backing (void **state)
{
  struct t t;
  uint8_t buf[65536];
  uint64_t seed = 5;

  t_open (&t, 4 * MiB, NULL);
  fake_fill_pattern (t.fb, 2 * MiB, 0, 1);
  uint64_t wbytes = 0;
  for (int i = 0; i < 200; i++) {
    uint64_t len = 1 + fake_rand_below (&seed, sizeof buf);
    uint64_t off = fake_rand_below (&seed, 4 * MiB - len);
    fill (buf, len, (uint8_t) i);
    switch (i % 4) {
    case 0: assert_int_equal (cache_write (t.c, buf, len, off, 0), 0);
      wbytes += len; break;
    case 1: assert_int_equal (cache_read (t.c, buf, len, off, 0), 0); break;
    case 2: assert_int_equal (cache_zero (t.c, len, off, 0), 0); break;
    default: assert_int_equal (cache_flush (t.c), 0); break;
    }
  }
  assert_int_equal (cache_flush (t.c), 0);
  struct cache_stats st = stats (&t);
  struct fake_totals tot = totals (&t);
  assert_int_equal (st.client_write_bytes, wbytes);
  assert_int_equal (st.backing_read_ops, tot.ops[FAKE_READ]);
  assert_int_equal (st.backing_read_bytes, tot.read_bytes);
  assert_int_equal (st.backing_write_ops, tot.ops[FAKE_WRITE]);
  assert_int_equal (st.backing_write_bytes, tot.write_bytes);
  assert_int_equal (st.backing_zero_ops, tot.ops[FAKE_ZERO]);
  assert_int_equal (st.backing_flush_ops, tot.ops[FAKE_FLUSH]);
  assert_int_equal (st.read_ops, 50);
  assert_int_equal (st.read_hits + st.read_misses, 50);
  assert_int_equal (st.dirty_bytes, 0);
  t_close (&t);
}

/* FLUSH must flush the backing whenever something reached it since the
 * last flush: background writeback, a direct write, a zero, a trim. */
static void
test_flush_reaches_backing_after_background_writes (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[8192];

  cfg_small (&cfg);
  cfg.dirty_expire_ms = 30;
  cfg.writeback_interval_ms = 10;
  t_open (&t, 4 * MiB, &cfg);
  fill (buf, sizeof buf, 3);
  assert_int_equal (cache_write (t.c, buf, 8192, 65536 - 4096, 0), 0);
  assert_true (wait_for (&t, cond_clean, 5000));
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  assert_int_equal (fake_unflushed (t.fb), 0);  /* durable now */
  assert_true (totals (&t).ops[FAKE_FLUSH] <= 1);
  assert_int_equal (totals (&t).ops[FAKE_WRITE], 0);

  static const struct { const char *what; int kind; } steps[] = {
    { "direct write", 0 }, { "zero", 1 }, { "trim", 2 },
  };
  for (unsigned i = 0; i < 3; i++) {
    int r = -1;
    switch (steps[i].kind) {
    case 0: r = cache_write (t.c, buf, 8192, 1 * MiB, CACHE_DIRECT); break;
    case 1: r = cache_zero (t.c, 8192, 1 * MiB, 0); break;
    default: r = cache_trim (t.c, 8192, 1 * MiB, 0); break;
    }
    assert_int_equal (r, 0);
    fake_reset_log (t.fb);
    assert_int_equal (cache_flush (t.c), 0);
    if (totals (&t).ops[FAKE_FLUSH] == 0 || fake_unflushed (t.fb) != 0)
      fail_msg ("flush after a %s did not flush the backing", steps[i].what);
  }
  t_close (&t);
}

/* A folio read again and again stays cached while a stream of other
 * folios passes through a small cache (LRU or CLOCK, not FIFO). */
static void
test_hot_folio_stays_cached (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[4096];

  cfg_small (&cfg);
  cfg.cache_size = 8 * 64 * KiB;
  t_open (&t, 16 * MiB, &cfg);
  fake_fill_pattern (t.fb, 16 * MiB, 0, 1);
  assert_int_equal (cache_read (t.c, buf, 4096, 0, 0), 0);
  fake_reset_log (t.fb);
  for (int i = 1; i < 100; i++) {
    assert_int_equal (cache_read (t.c, buf, 4096, i * 65536ull, 0), 0);
    assert_int_equal (cache_read (t.c, buf, 4096, 0, 0), 0);
  }
  /* Only the stream missed: 99 reads, none of offset 0. */
  assert_int_equal (totals (&t).ops[FAKE_READ], 99);
  for (int i = 0; i < 99; i++)
    assert_int_not_equal (nth (&t, FAKE_READ, i).off, 0);
  assert_true (stats (&t).evictions >= 90);
  t_close (&t);
}

/* A hit on a folio looked up before takes its stripe only: the index
 * lock, shared by every request, is not taken (CLOCK's referenced bit in
 * place of moving the folio in the LRU under that lock). */
static void
test_hit_takes_no_index_lock (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[4096];

  cfg_small (&cfg);
  t_open (&t, 4 * MiB, &cfg);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  assert_int_equal (cache_read (t.c, buf, 4096, 0, 0), 0);     /* miss */
  assert_int_equal (cache_read (t.c, buf, 4096, 0, 0), 0);     /* referenced */
  uint64_t taken = stats (&t).lock_taken_index;
  for (int i = 0; i < 10; i++) {
    assert_int_equal (cache_read (t.c, buf, 4096, 0, 0), 0);
    assert_int_equal (cache_read (t.c, buf, 512, 512, CACHE_NOWAIT), 0);
  }
  assert_int_equal (stats (&t).lock_taken_index, taken);
  assert_int_equal (stats (&t).read_hits, 21);
  t_close (&t);
}

/* Hits on every folio of a full cache take no index lock either: a hit
 * only counts itself in its folio (lru.c), whatever its place in the
 * replacement policy's lists. */
static void
test_hits_over_full_cache_take_no_index_lock (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[4096];

  cfg_small (&cfg);
  cfg.cache_size = 16 * 64 * KiB;
  t_open (&t, 4 * MiB, &cfg);
  fake_fill_pattern (t.fb, 4 * MiB, 0, 1);
  for (int i = 0; i < 16; i++)                                 /* misses */
    assert_int_equal (cache_read (t.c, buf, 4096, i * 65536ull, 0), 0);
  uint64_t taken = stats (&t).lock_taken_index;
  uint64_t reads = totals (&t).ops[FAKE_READ];
  for (int round = 0; round < 4; round++)
    for (int i = 0; i < 16; i++)
      assert_int_equal (cache_read (t.c, buf, 4096, i * 65536ull, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], reads);        /* all hits */
  assert_int_equal (stats (&t).read_hits, 64);
  assert_int_equal (stats (&t).lock_taken_index, taken);
  t_close (&t);
}

/* Scan resistance: a hot set read again and again survives streams of
 * folios read once and written once that are more than the cache holds
 * between its reads (an LRU would evict the hot set every round: its
 * reuse distance is beyond the cache). */
static void
test_hot_set_survives_streams (void **state)
{
  struct t t;
  struct cache_config cfg;
  uint8_t buf[65536];
  const uint64_t hot = 24 * MiB, nhot = 6, nstream = 6;
  uint64_t next = 0, hot_misses = 0;

  cfg_small (&cfg);
  cfg.cache_size = 16 * 64 * KiB;       /* 16 folios < 6 hot + 2 x 6 */
  t_open (&t, 32 * MiB, &cfg);
  fake_fill_pattern (t.fb, 32 * MiB, 0, 1);
  fill (buf, sizeof buf, 9);
  for (int round = 0; round < 20; round++) {
    fake_reset_log (t.fb);
    for (int pass = 0; pass < 2; pass++)
      for (uint64_t i = 0; i < nhot; i++)
        assert_int_equal (cache_read (t.c, buf, 4096, hot + i * 65536, 0),
                          0);
    if (round > 0)      /* the first round brings the hot set in */
      for (size_t j = 0; j < fake_log_len (t.fb); j++) {
        struct fake_req r;
        assert_int_equal (fake_log_get (t.fb, j, &r), 0);
        hot_misses += r.op == FAKE_READ && r.off >= hot &&
                      r.off < hot + nhot * 65536;
      }
    for (uint64_t i = 0; i < nstream; i++, next += 2 * 65536) {
      assert_int_equal (cache_read (t.c, buf, 65536, next, 0), 0);
      assert_int_equal (cache_write (t.c, buf, 65536, next + 65536, 0), 0);
    }
    assert_int_equal (cache_flush (t.c), 0);    /* the writes go clean */
  }
  assert_true (next < hot);
  assert_true (stats (&t).evictions > 100);
  assert_int_equal (hot_misses, 0);
  t_close (&t);
}

/* A store supplied by the caller: used as is when its geometry fits,
 * refused when it does not (a pmem store's header may disagree with the
 * configuration), and never freed by the cache. */
static void
test_external_store (void **state)
{
  struct fake_backing *fb = fake_backing_new (4 * MiB);
  struct cache_config cfg;
  char err[256] = "";
  uint8_t buf[4096];

  cfg_small (&cfg);
  struct store *good = store_ram_create (8, cfg.folio_size, cfg.block_size);
  assert_non_null (good);
  struct cache *c = cache_create (fake_backing_base (fb), good, &cfg, err,
                                  sizeof err);
  assert_non_null (c);
  fill (buf, sizeof buf, 1);
  for (int i = 0; i < 32; i++)
    assert_int_equal (cache_write (c, buf, 4096, i * 65536ull, 0), 0);
  assert_true (stats_of (c).cached_bytes <= 8 * 65536);
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (cache_destroy (c), 0);
  assert_int_equal (good->nslots, 8);          /* still ours, still alive */

  struct store *small = store_ram_create (8, cfg.folio_size / 2, cfg.block_size);
  assert_non_null (small);
  c = cache_create (fake_backing_base (fb), small, &cfg, err, sizeof err);
  if (c != NULL) {
    assert_int_equal (cache_destroy (c), 0);
    fail_msg ("a store of 32 KiB folios was accepted for 64 KiB folios");
  }
  struct store *coarse = store_ram_create (8, cfg.folio_size, 64 * KiB);
  assert_non_null (coarse);
  cfg.block_size = 512;   /* 128 blocks: more bitmap than the store has */
  c = cache_create (fake_backing_base (fb), coarse, &cfg, err, sizeof err);
  if (c != NULL) {
    assert_int_equal (cache_destroy (c), 0);
    fail_msg ("a store with a 1-block bitmap was accepted for 128 blocks");
  }
  store_destroy (good);
  store_destroy (small);
  store_destroy (coarse);
  fake_free (fb);
}

/* store_ram_populate's callback: count and result, for the waiter. */
struct populated {
  pthread_mutex_t lock;
  pthread_cond_t cond;
  int calls, err;
  uint64_t bytes;
};

static void
on_populated (void *arg, int err, uint64_t bytes, uint64_t ms)
{
  struct populated *p = arg;

  (void) ms;
  pthread_mutex_lock (&p->lock);
  p->calls++;
  p->err = err;
  p->bytes = bytes;
  pthread_cond_broadcast (&p->cond);
  pthread_mutex_unlock (&p->lock);
}

/* The ram store's memory is resident once store_ram_populate's thread is
 * done (no request pays for a page's first touch after that), and what
 * was written meanwhile is still there: populating never writes. */
static void
test_ram_store_populated (void **state)
{
  const uint32_t nslots = 1024, folio = 64 * KiB;   /* 64 MiB: two chunks */
  struct store *s = store_ram_create (nslots, folio, 4 * KiB);
  struct populated p = { .lock = PTHREAD_MUTEX_INITIALIZER,
                        .cond = PTHREAD_COND_INITIALIZER };
  long page = sysconf (_SC_PAGESIZE);
  struct timespec until;

  assert_non_null (s);
  size_t len = (size_t) nslots * folio, pages = len / (size_t) page;
  unsigned char *base = s->ops->data (s, 0), *vec = malloc (pages);
  assert_non_null (vec);
  assert_ptr_equal (s->ops->data (s, nslots - 1), base + len - folio);
  assert_int_equal (store_ram_populate (s, on_populated, &p), 0);
  assert_int_equal (store_ram_populate (s, on_populated, &p), -1); /* once */
  /* Writes while it populates: every slot's first and last byte. */
  for (uint32_t i = 0; i < nslots; i++) {
    unsigned char *d = s->ops->data (s, i);
    d[0] = (unsigned char) (i | 1);
    d[folio - 1] = (unsigned char) (i | 1);
  }
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += 60;
  pthread_mutex_lock (&p.lock);
  while (p.calls == 0)
    if (pthread_cond_timedwait (&p.cond, &p.lock, &until) != 0)
      break;
  pthread_mutex_unlock (&p.lock);
  assert_int_equal (p.calls, 1);
  assert_int_equal (p.err, 0);
  assert_int_equal (p.bytes, len);
  for (uint32_t i = 0; i < nslots; i++) {
    unsigned char *d = s->ops->data (s, i);
    assert_int_equal (d[0], (unsigned char) (i | 1));
    assert_int_equal (d[folio - 1], (unsigned char) (i | 1));
  }
  assert_int_equal (mincore (base, len, vec), 0);
  size_t resident = 0;
  for (size_t i = 0; i < pages; i++)
    resident += vec[i] & 1;
  assert_int_equal (resident, pages);
  free (vec);
  store_destroy (s);
}

/* Destroying a store while its memory is being populated stops the
 * thread (destroy joins it), and the callback is not called after. */
static void
test_ram_store_destroy_populating (void **state)
{
  struct store *s = store_ram_create (8192, 64 * KiB, 4 * KiB); /* 512 MiB */
  struct populated p = { .lock = PTHREAD_MUTEX_INITIALIZER,
                        .cond = PTHREAD_COND_INITIALIZER };

  assert_non_null (s);
  assert_int_equal (store_ram_populate (s, on_populated, &p), 0);
  store_destroy (s);
  assert_true (p.calls == 0 || p.calls == 1);  /* done before, or never */
}

/* Exports smaller than one folio, and an empty one. */
static void
test_tiny_exports (void **state)
{
  struct t t;
  uint8_t buf[1536], got[1536];

  t_open (&t, 1536, NULL);
  fake_fill_pattern (t.fb, 1536, 0, 4);
  fill (buf, 100, 9);
  assert_int_equal (cache_write (t.c, buf, 100, 1400, 0), 0);
  /* The only block is partial (ends at the export end): one read of it. */
  expect_one (&t, FAKE_READ, 0, 1536);
  fake_peek (t.fb, got, 1536, 0);
  memcpy (got + 1400, buf, 100);
  expect_read (&t, got, 1536, 0);
  fake_reset_log (t.fb);
  assert_int_equal (cache_flush (t.c), 0);
  expect_one (&t, FAKE_WRITE, 0, 1536);
  expect_backing (&t, got, 1536, 0);
  assert_int_equal (cache_zero (t.c, 1536, 0, 0), 0);
  memset (got, 0, sizeof got);
  expect_read (&t, got, 1536, 0);
  assert_int_equal (cache_read (t.c, got, 1, 1536, 0), -1);
  t_close (&t);

  t_open (&t, 0, NULL);
  assert_int_equal (cache_size_bytes (t.c), 0);
  assert_int_equal (cache_read (t.c, buf, 0, 0, 0), 0);
  assert_int_equal (cache_write (t.c, buf, 1, 0, 0), -1);
  assert_int_equal (cache_flush (t.c), 0);
  t_close (&t);
}

/* The extremes of the geometry: 2 MiB folios of 512-byte blocks (4096
 * blocks, the largest bitmaps), in a cache of the minimum 4 folios. */
static void
test_largest_folio_smallest_block (void **state)
{
  struct t t;
  struct cache_config cfg;
  const uint64_t F = 2 * MiB;
  uint8_t buf[1024];
  uint8_t *want = malloc (F), *got = malloc (F);

  cfg_small (&cfg);
  cfg.folio_size = (uint32_t) F;
  cfg.block_size = 512;
  cfg.max_io_bytes = (uint32_t) F;
  cfg.cache_size = 4 * F;
  t_open (&t, 64 * MiB, &cfg);
  fake_fill_pattern (t.fb, 16 * MiB, 0, 1);
  fill (buf, sizeof buf, 3);
  /* Whole sectors: no reads; across the folio boundary: one write. */
  assert_int_equal (cache_write (t.c, buf, 1024, F - 512, 0), 0);
  assert_int_equal (cache_write (t.c, buf, 512, 5000 * 512ull, 0), 0);
  assert_int_equal (totals (&t).ops[FAKE_READ], 0);
  assert_int_equal (cache_flush (t.c), 0);
  if (fake_log_count (t.fb, FAKE_WRITE) != 2)
    fake_log_dump (t.fb, "2 MiB folios: merge across the folio boundary");
  assert_int_equal (fake_log_count (t.fb, FAKE_WRITE), 2);
  assert_int_equal (totals (&t).write_bytes, 1536);
  struct fake_req w0 = nth (&t, FAKE_WRITE, 0), w1 = nth (&t, FAKE_WRITE, 1);
  assert_true ((w0.off == F - 512 && w0.len == 1024) ||
               (w1.off == F - 512 && w1.len == 1024));
  /* Folio 0 now has block 4095 uptodate: reading it reads one run. */
  fake_reset_log (t.fb);
  fake_peek (t.fb, want, F, 0);
  assert_int_equal (cache_read (t.c, got, F, 0, 0), 0);
  assert_memory_equal (got, want, F);
  expect_one (&t, FAKE_READ, 0, F - 512);
  /* Partial sector write into a cold folio reads that sector only. */
  fake_reset_log (t.fb);
  assert_int_equal (cache_write (t.c, buf, 100, 3 * F + 700, 0), 0);
  expect_one (&t, FAKE_READ, 3 * F + 512, 512);
  /* Stream through more folios than the cache holds. */
  for (int i = 0; i < 8; i++)
    assert_int_equal (cache_write (t.c, buf, 1024, (8 + i) * F + 4096, 0), 0);
  assert_true (stats (&t).evictions > 0);
  assert_int_equal (cache_flush (t.c), 0);
  for (int i = 0; i < 8; i++)
    expect_backing (&t, buf, 1024, (8 + i) * F + 4096);
  free (want);
  free (got);
  t_close (&t);
}

/* ---- configuration ---- */

static int
check (struct cache_config cfg)
{
  char err[256] = "";
  int r = cache_config_check (&cfg, err, sizeof err);
  if (r == -1)
    assert_true (strlen (err) > 0);
  return r;
}

static void
test_config_check (void **state)
{
  struct cache_config d, c;

  cache_config_default (&d);
  assert_int_equal (d.folio_size, 64 * KiB);
  assert_int_equal (d.block_size, 4 * KiB);
  assert_int_equal (check (d), 0);
  c = d; c.folio_size = 3 * 4096;            assert_int_equal (check (c), -1);
  c = d; c.block_size = 3000;                assert_int_equal (check (c), -1);
  c = d; c.block_size = 128 * KiB;           assert_int_equal (check (c), -1);
  c = d; c.folio_size = 2048; c.block_size = 512; assert_int_equal (check (c), -1);
  c = d; c.folio_size = 4 * MiB;             assert_int_equal (check (c), -1);
  c = d; c.block_size = 256;                 assert_int_equal (check (c), -1);
  c = d; c.folio_size = 0;                   assert_int_equal (check (c), -1);
  c = d; c.folio_size = 4096; c.block_size = 512; assert_int_equal (check (c), 0);
  c = d; c.folio_size = 2 * MiB; c.block_size = 2 * MiB; c.max_io_bytes = 2 * MiB;
  assert_int_equal (check (c), 0);
  c = d; c.block_size = 64 * KiB;            assert_int_equal (check (c), 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_write_4k_into_uptodate_folio),
    cmocka_unit_test (test_adjacent_writes_merge_across_folios),
    cmocka_unit_test (test_partial_block_write_reads_one_block),
    cmocka_unit_test (test_partial_block_write_into_hole_reads_nothing),
    cmocka_unit_test (test_full_folio_write_reads_nothing),
    cmocka_unit_test (test_hole_read_no_io),
    cmocka_unit_test (test_read_fetches_only_missing_runs),
    cmocka_unit_test (test_small_read_reads_one_block),
    cmocka_unit_test (test_cold_read_spanning_folios_one_request),
    cmocka_unit_test (test_prefetch_makes_read_a_hit),
    cmocka_unit_test (test_writeback_skips_clean_blocks),
    cmocka_unit_test (test_merge_across_batch_boundary),
    cmocka_unit_test (test_writeback_cap_splits),
    cmocka_unit_test (test_write_amplification_one),
    cmocka_unit_test (test_flush_error_keeps_data_dirty),
    cmocka_unit_test (test_flush_error_cut_batch_ends),
    cmocka_unit_test (test_flush_error_writes_the_rest),
    cmocka_unit_test (test_backing_flush_error_reported),
    cmocka_unit_test (test_small_flush_writes_fua),
    cmocka_unit_test (test_big_flush_writes_then_flushes),
    cmocka_unit_test (test_small_flush_after_plain_write_flushes),
    cmocka_unit_test (test_small_flush_fua_error_keeps_dirty),
    cmocka_unit_test (test_background_error_reported_by_flush),
    cmocka_unit_test (test_fua_write_error_returned),
    cmocka_unit_test (test_read_error_then_success),
    cmocka_unit_test (test_rmw_read_error_fails_write),
    cmocka_unit_test (test_eviction_never_loses_dirty),
    cmocka_unit_test (test_destroy_writes_nothing_back),
    cmocka_unit_test (test_block_status_dirty_is_data),
    cmocka_unit_test (test_block_status_races_writeback),
    cmocka_unit_test (test_zero_and_trim_of_dirty_blocks),
    cmocka_unit_test (test_fua_write_reaches_backing),
    cmocka_unit_test (test_idle_flush_no_writes),
    cmocka_unit_test (test_idle_flush_1tib),
    cmocka_unit_test (test_background_writeback_expiry),
    cmocka_unit_test (test_dirty_limit_and_background_threshold),
    cmocka_unit_test (test_dirty_limit_wakes_only_with_room),
    cmocka_unit_test (test_whole_export_cached_keeps_dirty),
    cmocka_unit_test (test_dirty_options_clear_auto),
    cmocka_unit_test (test_prepared_write_swaps_folios),
    cmocka_unit_test (test_prepared_write_refused),
    cmocka_unit_test (test_writethrough_mode),
    cmocka_unit_test (test_direct_io_coherent),
    cmocka_unit_test (test_zero_length_and_out_of_range),
    cmocka_unit_test (test_full_of_unwritable_dirty_data),
    cmocka_unit_test (test_shutdown_gives_up),
    cmocka_unit_test (test_fast_zero_refused_and_read_only),
    cmocka_unit_test (test_backing_without_map),
    cmocka_unit_test (test_stats_match_backing),
    cmocka_unit_test (test_flush_reaches_backing_after_background_writes),
    cmocka_unit_test (test_hot_folio_stays_cached),
    cmocka_unit_test (test_hits_over_full_cache_take_no_index_lock),
    cmocka_unit_test (test_hot_set_survives_streams),
    cmocka_unit_test (test_hit_takes_no_index_lock),
    cmocka_unit_test (test_external_store),
    cmocka_unit_test (test_ram_store_populated),
    cmocka_unit_test (test_ram_store_destroy_populating),
    cmocka_unit_test (test_tiny_exports),
    cmocka_unit_test (test_largest_folio_smallest_block),
    cmocka_unit_test (test_config_check),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
