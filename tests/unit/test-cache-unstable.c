/* A backing that loses acknowledged but unflushed writes when it "crashes"
 * (a remote NBD server restarting): the cache must write them again, so a
 * FLUSH that succeeds means the data is durable; lost passthrough writes,
 * which cannot be redone, must fail every later FLUSH. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "foliod/cache.h"

#define SIZE (4u << 20)

/* Two layers: what the backing acknowledged, and what it has made
 * durable.  A crash throws the first away and moves the loss epoch. */
struct vol {
  struct backing b;
  unsigned char durable[SIZE], acked[SIZE];
  uint64_t epoch;
  int crash_on_flush;      /* crash just before the next flush */
  uint64_t writes;
};

static int
v_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  memcpy (buf, ((struct vol *) b)->acked + off, len);
  return 0;
}

static int
v_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
         unsigned flags)
{
  struct vol *v = (struct vol *) b;

  memcpy (v->acked + off, buf, len);
  if (flags & BACKING_FUA)
    memcpy (v->durable + off, buf, len);
  v->writes++;
  return 0;
}

static int
v_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct vol *v = (struct vol *) b;

  memset (v->acked + off, 0, len);
  if (flags & BACKING_FUA)
    memset (v->durable + off, 0, len);
  return 0;
}

static int
v_flush (struct backing *b)
{
  struct vol *v = (struct vol *) b;

  if (v->crash_on_flush) {          /* the remote restarts: the reconnected */
    v->crash_on_flush = 0;          /* flush succeeds on what survived */
    memcpy (v->acked, v->durable, SIZE);
    v->epoch++;
    return 0;
  }
  memcpy (v->durable, v->acked, SIZE);
  return 0;
}

static uint64_t v_epoch (struct backing *b) { return ((struct vol *) b)->epoch; }
static void v_close (struct backing *b) { (void) b; }

static const struct backing_ops vol_ops = {
  .name = "volatile", .read = v_read, .write = v_write, .zero = v_zero,
  .flush = v_flush, .loss_epoch = v_epoch, .close = v_close,
};

static struct cache *
open_cache (struct vol *v)
{
  struct cache_config cfg;
  char err[256];

  memset (v, 0, sizeof *v);
  v->b.ops = &vol_ops;
  v->b.size = SIZE;
  v->b.caps = BACKING_CAN_ZERO;
  cache_config_default (&cfg);
  cfg.cache_size = 1u << 20;
  cfg.dirty_expire_ms = 3600000;       /* only flushes write back */
  struct cache *c = cache_create (&v->b, NULL, &cfg, err, sizeof err);
  assert_non_null (c);
  return c;
}

static void
test_rewrite_after_loss (void **state)
{
  static struct vol v;
  unsigned char buf[8192];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (buf, 0x42, sizeof buf);
  assert_int_equal (cache_write (c, buf, sizeof buf, 12288, 0), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), 0);
  /* The flush that saw the crash wrote the blocks again. */
  assert_memory_equal (v.durable + 12288, buf, sizeof buf);
  assert_int_equal (v.writes, 2);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, 0);
  assert_int_equal (st.dirty_bytes, 0);
  assert_int_equal (cache_destroy (c), 0);
}

static void
test_unstable_pins_until_flush (void **state)
{
  static struct vol v;
  unsigned char buf[4096];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (buf, 7, sizeof buf);
  assert_int_equal (cache_write (c, buf, sizeof buf, 0, 0), 0);
  assert_int_equal (cache_flush (c), 0);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, 0);
  assert_memory_equal (v.durable, buf, sizeof buf);
  /* FUA writes are durable at once: never unstable. */
  assert_int_equal (cache_write (c, buf, sizeof buf, 65536, CACHE_FUA), 0);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, 0);
  assert_memory_equal (v.durable + 65536, buf, sizeof buf);
  assert_int_equal (cache_destroy (c), 0);
}

static void
test_lost_passthrough_fails_flush (void **state)
{
  static struct vol v;
  unsigned char buf[4096];
  struct cache *c = open_cache (&v);

  memset (buf, 9, sizeof buf);
  assert_int_equal (cache_write (c, buf, sizeof buf, 0, CACHE_DIRECT), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  /* No later flush may claim it durable; the cache reads what the
   * backing really has. */
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_read (c, buf, sizeof buf, 0, 0), 0);
  assert_memory_equal (buf, v.durable, sizeof buf);
  /* The flushes reported the loss; destroy drops nothing dirty. */
  assert_int_equal (cache_destroy (c), 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_rewrite_after_loss),
    cmocka_unit_test (test_unstable_pins_until_flush),
    cmocka_unit_test (test_lost_passthrough_fails_flush),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
