/* Self-test of the fake backing the cache tests measure with: if the fake
 * lies, every cache test lies with it. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "lib/fake_backing.h"

static void
test_sparse_holes_and_data (void **state)
{
  struct fake_backing *fb = fake_backing_new (1ull << 40); /* 1 TiB */
  struct backing *b = fake_backing_base (fb);
  struct backing_extent ext;
  uint8_t buf[8192], z[8192] = { 0 };

  assert_non_null (fb);
  assert_int_equal (b->size, 1ull << 40);
  /* All hole: one map call covers the whole device quickly. */
  assert_int_equal (b->ops->map (b, 0, b->size, &ext), 0);
  assert_int_equal (ext.type, BACKING_HOLE);
  assert_int_equal (ext.length, b->size);

  memset (buf, 7, sizeof buf);
  assert_int_equal (b->ops->write (b, buf, 1000, (1ull << 39) + 100, 0), 0);
  /* Sector [2^39, 2^39+1536) is now data (1100 bytes touched 3 sectors). */
  assert_int_equal (b->ops->map (b, 0, b->size, &ext), 0);
  assert_int_equal (ext.type, BACKING_HOLE);
  assert_int_equal (ext.length, 1ull << 39);
  assert_int_equal (b->ops->map (b, 1ull << 39, b->size - (1ull << 39), &ext), 0);
  assert_int_equal (ext.type, BACKING_DATA);
  assert_int_equal (ext.length, 1536);
  assert_int_equal (b->ops->read (b, buf, 2048, 1ull << 39), 0);
  assert_memory_equal (buf, z, 100);
  for (int i = 100; i < 1100; i++)
    assert_int_equal (buf[i], 7);
  assert_memory_equal (buf + 1100, z, 948);

  /* Trim of a partial sector zeroes but stays DATA; a whole sector holes. */
  assert_int_equal (b->ops->trim (b, 1024, (1ull << 39) + 256, 0), 0);
  assert_true (fake_is_data (fb, 1ull << 39));
  assert_false (fake_is_data (fb, (1ull << 39) + 512));
  assert_true (fake_is_data (fb, (1ull << 39) + 1024));
  assert_int_equal (b->ops->read (b, buf, 2048, 1ull << 39), 0);
  assert_memory_equal (buf, z, 100);
  for (int i = 100; i < 256; i++)
    assert_int_equal (buf[i], 7);
  assert_memory_equal (buf + 256, z, 2048 - 256);

  struct fake_totals t;
  fake_get_totals (fb, &t);
  assert_int_equal (t.ops[FAKE_WRITE], 1);
  assert_int_equal (t.write_bytes, 1000);
  assert_int_equal (t.ops[FAKE_READ], 2);
  assert_int_equal (t.read_bytes, 4096);
  assert_int_equal (t.ops[FAKE_TRIM], 1);
  assert_int_equal (t.trim_bytes, 1024);
  assert_int_equal (t.bad, 0);
  assert_int_equal (fake_log_count (fb, FAKE_MAP), 3);

  /* Out of range requests are rejected and counted. */
  assert_int_equal (b->ops->read (b, buf, 4096, b->size - 100), -1);
  assert_int_equal (errno, EINVAL);
  fake_get_totals (fb, &t);
  assert_int_equal (t.bad, 1);

  /* Map style: zero extents, capped lengths. */
  fake_set_map_style (fb, 1, 3000);
  assert_int_equal (b->ops->map (b, 0, b->size, &ext), 0);
  assert_int_equal (ext.type, BACKING_ZERO);
  assert_int_equal (ext.length, 3000);
  fake_set_map_style (fb, 0, 0);

  fake_reset_log (fb);
  assert_int_equal (fake_log_len (fb), 0);
  backing_close (b);
}

static void
test_fault_injection (void **state)
{
  struct fake_backing *fb = fake_backing_new (1 << 20);
  struct backing *b = fake_backing_base (fb);
  uint8_t buf[4096], old[4096];

  fake_fill_pattern (fb, 1 << 20, 0, 3);
  fake_peek (fb, old, 4096, 8192);
  assert_int_equal (old[0], fake_pattern_byte (8192, 3));

  fake_fail_next (fb, FAKE_M (FAKE_WRITE), 2, EIO);
  memset (buf, 1, sizeof buf);
  assert_int_equal (b->ops->read (b, buf, 4096, 8192), 0); /* reads unaffected */
  assert_int_equal (b->ops->write (b, buf, 4096, 8192, 0), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (b->ops->write (b, buf, 4096, 8192, 0), -1);
  memset (buf, 1, sizeof buf);
  fake_peek (fb, buf, 4096, 8192);
  assert_memory_equal (buf, old, 4096);   /* failed writes change nothing */
  memset (buf, 1, sizeof buf);
  assert_int_equal (b->ops->write (b, buf, 4096, 8192, BACKING_FUA), 0);

  /* Persistent range fault on reads: junk in the buffer, errno as asked. */
  assert_int_equal (fake_fail_range (fb, FAKE_M (FAKE_READ), 100000, 1, ENOSPC), 0);
  assert_int_equal (b->ops->read (b, buf, 4096, 98304), -1);
  assert_int_equal (errno, ENOSPC);
  assert_int_equal (buf[0], 0xa5);
  assert_int_equal (b->ops->read (b, buf, 4096, 0), 0);
  fake_clear_faults (fb);
  assert_int_equal (b->ops->read (b, buf, 4096, 98304), 0);

  /* Random faults: about p of the requests fail, reproducibly. */
  int fails = 0;
  fake_fail_random (fb, FAKE_M (FAKE_FLUSH), 0.25, 42, EIO);
  for (int i = 0; i < 1000; i++)
    fails += b->ops->flush (b) == -1;
  assert_in_range (fails, 180, 320);

  /* Torn writes store the first half. */
  fake_clear_faults (fb);
  fake_set_torn_writes (fb, 1);
  fake_fail_next (fb, FAKE_M (FAKE_WRITE), 1, EIO);
  memset (buf, 9, sizeof buf);
  assert_int_equal (b->ops->write (b, buf, 4096, 0, 0), -1);
  fake_peek (fb, buf, 4096, 0);
  assert_int_equal (buf[0], 9);
  assert_int_equal (buf[2047], 9);
  assert_int_equal (buf[2048], fake_pattern_byte (2048, 3));

  struct fake_totals t;
  fake_get_totals (fb, &t);
  assert_int_equal (t.fua_writes, 1);
  assert_int_equal (t.failed, 2 + 1 + fails + 1);
  struct fake_req r;
  assert_int_equal (fake_log_get (fb, 1, &r), 0);
  assert_int_equal (r.op, FAKE_WRITE);
  assert_int_equal (r.err, EIO);
  fake_free (fb);
}

static void
test_no_map_caps (void **state)
{
  struct fake_backing *fb = fake_backing_new (65536);
  struct backing *b = fake_backing_base (fb);

  fake_set_caps (fb, FAKE_DEFAULT_CAPS & ~(BACKING_CAN_MAP | BACKING_CAN_TRIM |
                                           BACKING_CAN_FAST_ZERO));
  assert_null (b->ops->map);
  assert_int_equal (b->ops->trim (b, 4096, 0, 0), -1);
  assert_int_equal (errno, EOPNOTSUPP);
  assert_int_equal (b->ops->zero (b, 4096, 0, BACKING_FAST_ZERO), -1);
  assert_int_equal (errno, ENOTSUP);
  assert_int_equal (b->ops->zero (b, 4096, 0, 0), 0);
  /* Durability tracking: plain writes count until a flush; FUA and
   * failed requests do not. */
  uint8_t buf[512] = { 1 };
  assert_int_equal (fake_unflushed (fb), 1);
  assert_int_equal (b->ops->write (b, buf, 512, 0, BACKING_FUA), 0);
  assert_int_equal (b->ops->trim (b, 512, 0, 0), -1);
  assert_int_equal (fake_unflushed (fb), 1);
  assert_int_equal (b->ops->write (b, buf, 512, 0, 0), 0);
  assert_int_equal (fake_unflushed (fb), 2);
  assert_int_equal (b->ops->flush (b), 0);
  assert_int_equal (fake_unflushed (fb), 0);
  backing_close (b);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_sparse_holes_and_data),
    cmocka_unit_test (test_fault_injection),
    cmocka_unit_test (test_no_map_caps),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
