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
  int fail_flush;          /* the next flush fails (nothing made durable) */
  int fail_write;          /* the next write fails, half done */
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

  if (v->fail_write) {
    v->fail_write = 0;
    memcpy (v->acked + off, buf, len / 2);
    errno = EIO;
    return -1;
  }
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
v_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  memset (((struct vol *) b)->acked + off, 0xee, len); /* reads as anything */
  return 0;
}

static int
v_flush (struct backing *b)
{
  struct vol *v = (struct vol *) b;

  if (v->fail_flush) {
    v->fail_flush = 0;
    errno = EIO;
    return -1;
  }
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
  .trim = v_trim, .flush = v_flush, .loss_epoch = v_epoch, .close = v_close,
};

static struct cache *
open_cache (struct vol *v)
{
  struct cache_config cfg;
  char err[256];

  memset (v, 0, sizeof *v);
  v->b.ops = &vol_ops;
  v->b.size = SIZE;
  v->b.caps = BACKING_CAN_ZERO | BACKING_CAN_TRIM;
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

/* Dirty plus unstable bytes: what the cache still answers for. */
static uint64_t
pinned (struct cache *c)
{
  struct cache_stats st;

  cache_get_stats (c, &st);
  return st.dirty_bytes + st.unstable_bytes;
}

/* Fill buf with 0x42, write it and write it back, but leave it unflushed:
 * unstable. */
static void
write_unstable (struct cache *c, struct vol *v, unsigned char *buf,
                uint64_t len, uint64_t off)
{
  struct cache_stats st;

  memset (buf, 0x42, len);
  assert_int_equal (cache_write (c, buf, len, off, 0), 0);
  v->fail_flush = 1;
  assert_int_equal (cache_flush (c), -1);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, len);
  assert_int_equal (st.dirty_bytes, 0);
}

/* A trim over unstable blocks ends the cache's duty to them: a loss after
 * it writes nothing again (the blocks may read as anything), and nothing
 * stays pinned.  (The cache used to keep them unstable, and the loss made
 * them dirty without their data: dirty but not uptodate.) */
static void
test_trim_drops_unstable (void **state)
{
  static struct vol v;
  struct cache *c = open_cache (&v);
  unsigned char buf[8192];

  write_unstable (c, &v, buf, sizeof buf, 65536);
  assert_int_equal (cache_trim (c, sizeof buf, 65536, 0), 0);
  assert_int_equal (pinned (c), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (v.writes, 1);
  assert_int_equal (pinned (c), 0);
  assert_int_equal (cache_read (c, buf, sizeof buf, 65536, 0), 0);
  assert_memory_equal (buf, v.acked + 65536, sizeof buf);
  assert_int_equal (cache_destroy (c), 0);
}

/* A failed direct write over unstable blocks may have half overwritten
 * them in the backing: the cache still answers for what it acknowledged,
 * so it writes them again, and keeps its copy. */
static void
test_failed_direct_write_over_unstable (void **state)
{
  static struct vol v;
  struct cache *c = open_cache (&v);
  unsigned char buf[8192], other[8192];

  write_unstable (c, &v, buf, sizeof buf, 65536);
  memset (other, 0x17, sizeof other);
  v.fail_write = 1;
  assert_int_equal (cache_write (c, other, sizeof other, 65536,
                                 CACHE_DIRECT), -1);
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (v.durable + 65536, buf, sizeof buf);
  assert_int_equal (cache_read (c, other, sizeof other, 65536, 0), 0);
  assert_memory_equal (other, buf, sizeof buf);
  assert_int_equal (pinned (c), 0);
  assert_int_equal (cache_destroy (c), 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_rewrite_after_loss),
    cmocka_unit_test (test_unstable_pins_until_flush),
    cmocka_unit_test (test_lost_passthrough_fails_flush),
    cmocka_unit_test (test_trim_drops_unstable),
    cmocka_unit_test (test_failed_direct_write_over_unstable),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
