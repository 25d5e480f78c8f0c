/* src/cache/ra-window.h, the readahead windows:
 *   - a sequential stream issues a first window past its third read,
 *     then, each time a read reaches the last window's mark, the next one
 *     right behind it, twice as large up to the cap, up to the export end;
 *   - random reads issue nothing, and do not push out a live stream;
 *   - two interleaved streams are each detected, each with its windows;
 *   - a read that arrives a little out of order stays in its stream;
 *   - no budget: no window, and the next read tries again.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cache/ra-window.h"

#define K 1024ull
#define M (1024ull * 1024)
#define SIZE (1024 * M)
#define ANY UINT64_MAX

static struct ra_streams rs;

static int
setup (void **state)
{
  ra_streams_init (&rs, 128 * K, 4 * M);
  return 0;
}

/* Note a 64 KiB read at off; the window issued, or len 0. */
static struct ra_window
rd (uint64_t off, uint64_t budget)
{
  struct ra_window w = { 0, 0 };

  if (!ra_streams_note (&rs, off, 64 * K, SIZE, budget, &w))
    w.len = 0;
  return w;
}

/* Read [from, to) in 64 KiB steps; returns the windows' bytes and checks
 * that each starts where the one before ended. */
static uint64_t
stream (uint64_t from, uint64_t to, uint64_t *last_end, uint64_t *biggest)
{
  uint64_t total = 0;

  for (uint64_t off = from; off < to; off += 64 * K) {
    struct ra_window w = rd (off, ANY);
    if (w.len == 0)
      continue;
    if (*last_end)
      assert_true (w.off == *last_end);
    assert_true (w.off >= off + 64 * K);    /* ahead of the reader */
    assert_true (w.len <= 4 * M);
    *last_end = w.off + w.len;
    if (w.len > *biggest)
      *biggest = w.len;
    total += w.len;
  }
  return total;
}

static void
test_sequential_grows (void **state)
{
  struct ra_window w;

  assert_int_equal (rd (0, ANY).len, 0);   /* one read: not a stream yet */
  assert_int_equal (rd (64 * K, ANY).len, 0); /* one sequential read */
  w = rd (128 * K, ANY);                    /* two: the first window */
  assert_true (w.off == 192 * K && w.len == 128 * K);
  assert_int_equal (rd (128 * K, ANY).len, 0); /* late, out of order */
  w = rd (192 * K, ANY);                    /* reaches the mark */
  assert_true (w.off == 320 * K && w.len == 256 * K);
  assert_int_equal (rd (256 * K, ANY).len, 0);
  w = rd (320 * K, ANY);
  assert_true (w.off == 576 * K && w.len == 512 * K);

  uint64_t end = w.off + w.len, biggest = 0;
  uint64_t total = stream (384 * K, 64 * M, &end, &biggest);
  assert_true (biggest == 4 * M);           /* grew to the cap */
  assert_true (end >= 64 * M && end <= 64 * M + 8 * M); /* ahead, bounded */
  assert_true (total >= 60 * M);
}

static void
test_export_end (void **state)
{
  uint64_t end = 0, biggest = 0;

  stream (SIZE - 16 * M, SIZE, &end, &biggest);
  assert_true (end == SIZE);                /* never past the export */
}

static void
test_random_nothing (void **state)
{
  srandom (7);
  for (int i = 0; i < 100000; i++) {
    uint64_t off = ((uint64_t) random () % (SIZE / (4 * K))) * 4 * K;
    struct ra_window w;
    assert_false (ra_streams_note (&rs, off, 4 * K, SIZE, ANY, &w));
  }
}

static void
test_random_keeps_stream (void **state)
{
  uint64_t off = 100 * M, issued = 0;

  srandom (3);
  for (int i = 0; i < 2000; i++) {
    issued += rd (off, ANY).len;
    off += 64 * K;
    for (int j = 0; j < 20; j++) {          /* 20 random reads in between */
      struct ra_window w;
      uint64_t r = ((uint64_t) random () % (SIZE / (4 * K))) * 4 * K;
      if (r >= 90 * M && r < 300 * M)
        continue;
      assert_false (ra_streams_note (&rs, r, 4 * K, SIZE, ANY, &w));
    }
  }
  assert_true (issued >= 2000 * 64 * K - 8 * M);
}

static void
test_two_streams (void **state)
{
  uint64_t a = 0, b = 512 * M, ra = 0, rb = 0, ea = 0, eb = 0;

  for (int i = 0; i < 1000; i++) {
    struct ra_window w = rd (a, ANY);
    if (w.len) {
      assert_true (w.off > a && w.off < 512 * M);
      assert_true (ea == 0 || w.off == ea);
      ea = w.off + w.len;
      ra += w.len;
    }
    w = rd (b, ANY);
    if (w.len) {
      assert_true (w.off > b);
      assert_true (eb == 0 || w.off == eb);
      eb = w.off + w.len;
      rb += w.len;
    }
    a += 64 * K;
    b += 64 * K;
  }
  assert_true (ra >= 1000 * 64 * K - 8 * M && ra <= 1000 * 64 * K + 8 * M);
  assert_true (rb >= 1000 * 64 * K - 8 * M && rb <= 1000 * 64 * K + 8 * M);
}

static void
test_no_budget (void **state)
{
  struct ra_window w;

  rd (0, ANY);
  rd (64 * K, ANY);
  assert_int_equal (rd (128 * K, 0).len, 0); /* no room: nothing */
  w = rd (192 * K, ANY);                    /* the next read retries */
  assert_true (w.off == 256 * K && w.len == 128 * K);
  w = rd (256 * K, 64 * K);                 /* clipped to the budget */
  assert_true (w.off == 384 * K && w.len == 64 * K);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup (test_sequential_grows, setup),
    cmocka_unit_test_setup (test_export_end, setup),
    cmocka_unit_test_setup (test_random_nothing, setup),
    cmocka_unit_test_setup (test_random_keeps_stream, setup),
    cmocka_unit_test_setup (test_two_streams, setup),
    cmocka_unit_test_setup (test_no_budget, setup),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
