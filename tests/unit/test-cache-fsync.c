/* A failed fdatasync is not forgotten ("fsyncgate"): the cache over the
 * real file backing, with fdatasync replaced by a model of what Linux does
 * when writeback fails.  The model keeps a "device" copy of the file,
 * updated by each good fdatasync; a failing one reports EIO once and puts
 * the device's content back into the file (the pages whose writeback
 * failed are gone, the next fdatasync succeeds and says nothing).  A FLUSH
 * that succeeds must leave the data on the device. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <cmocka.h>

#include "foliod/backing.h"
#include "foliod/cache.h"

#define SIZE (4u << 20)

static struct {
  pthread_mutex_t lock;
  int fd;                       /* the test's own fd on the file */
  unsigned char device[SIZE];   /* what survived the last good sync */
  unsigned fail_next;           /* syncs still to fail */
  unsigned syncs, failed;
} dev = { .lock = PTHREAD_MUTEX_INITIALIZER, .fd = -1 };

static void
full_io (bool write, void *buf)
{
  ssize_t r = write ? pwrite (dev.fd, buf, SIZE, 0)
                    : pread (dev.fd, buf, SIZE, 0);
  assert_int_equal (r, SIZE);
}

/* Replaces libc's for the whole test program, the file backing included. */
int
fdatasync (int fd)
{
  int r = 0;

  pthread_mutex_lock (&dev.lock);
  dev.syncs++;
  if (dev.fd >= 0 && dev.fail_next > 0) {
    dev.fail_next--;
    dev.failed++;
    full_io (true, dev.device);
    errno = EIO;
    r = -1;
  }
  else {
    r = (int) syscall (SYS_fdatasync, fd);
    if (r == 0 && dev.fd >= 0)
      full_io (false, dev.device);
  }
  pthread_mutex_unlock (&dev.lock);
  return r;
}

static void
fail_syncs (unsigned n)
{
  pthread_mutex_lock (&dev.lock);
  dev.fail_next = n;
  pthread_mutex_unlock (&dev.lock);
}

static unsigned
syncs_failed (void)
{
  pthread_mutex_lock (&dev.lock);
  unsigned n = dev.failed;
  pthread_mutex_unlock (&dev.lock);
  return n;
}

static void
assert_on_device (const void *buf, size_t len, uint64_t off)
{
  pthread_mutex_lock (&dev.lock);
  int same = memcmp (dev.device + off, buf, len) == 0;
  pthread_mutex_unlock (&dev.lock);
  assert_true (same);
}

struct fx {
  char path[64];
  struct backing *b;
  struct cache *c;
};

/* A zeroed file (on the device), the file backing and a cache over it. */
static struct fx *
fx_open_mode (enum cache_mode mode, uint64_t cache_size, unsigned expire_ms,
              unsigned interval_ms)
{
  struct fx *f = calloc (1, sizeof *f);
  struct backing_opts o = { 0 };
  struct cache_config cfg;
  char err[256] = "";

  assert_non_null (f);
  strcpy (f->path, "/var/tmp/foliod-fsync-XXXXXX");
  dev.fd = mkstemp (f->path);
  assert_true (dev.fd >= 0);
  assert_int_equal (ftruncate (dev.fd, SIZE), 0);
  memset (dev.device, 0, SIZE);
  dev.fail_next = dev.failed = dev.syncs = 0;
  f->b = backing_file_open (f->path, &o, err, sizeof err);
  if (f->b == NULL)
    fail_msg ("%s", err);
  cache_config_default (&cfg);
  cfg.mode = mode;
  cfg.cache_size = cache_size;
  cfg.dirty_expire_ms = expire_ms;
  cfg.writeback_interval_ms = interval_ms;
  f->c = cache_create (f->b, NULL, &cfg, err, sizeof err);
  if (f->c == NULL)
    fail_msg ("%s", err);
  return f;
}

static struct fx *
fx_open (uint64_t cache_size, unsigned expire_ms, unsigned interval_ms)
{
  return fx_open_mode (CACHE_WRITEBACK, cache_size, expire_ms, interval_ms);
}

static void
fx_close (struct fx *f, int destroy_result)
{
  assert_int_equal (cache_destroy (f->c), destroy_result);
  backing_close (f->b);
  close (dev.fd);
  dev.fd = -1;
  unlink (f->path);
  free (f);
}

static void
test_failed_flush_rewrites (void **state)
{
  struct fx *f = fx_open (1u << 20, 3600000, 1000);
  static unsigned char buf[8192];
  struct cache_stats st;

  memset (buf, 0x42, sizeof buf);
  assert_int_equal (cache_write (f->c, buf, sizeof buf, 12288, 0), 0);
  fail_syncs (1);
  assert_int_equal (cache_flush (f->c), -1);
  assert_int_equal (errno, EIO);
  /* The failed sync lost the writes: the blocks are dirty again. */
  cache_get_stats (f->c, &st);
  assert_int_equal (st.dirty_bytes, sizeof buf);
  assert_int_equal (st.unstable_bytes, 0);
  /* The next FLUSH writes them again before it succeeds. */
  assert_int_equal (cache_flush (f->c), 0);
  assert_on_device (buf, sizeof buf, 12288);
  cache_get_stats (f->c, &st);
  assert_int_equal (st.backing_write_ops, 2);
  assert_int_equal (st.dirty_bytes + st.unstable_bytes, 0);
  fx_close (f, 0);
}

/* A FUA write's fdatasync that fails hides the error from the next flush
 * (Linux reports it once): a passthrough write before it, which the cache
 * cannot redo, must fail every later flush. */
static void
test_fua_sync_loses_passthrough (void **state)
{
  struct fx *f = fx_open (1u << 20, 3600000, 1000);
  static unsigned char a[65536], b[4096];

  memset (a, 0xaa, sizeof a);
  memset (b, 0xbb, sizeof b);
  assert_int_equal (cache_write (f->c, a, sizeof a, 0, CACHE_DIRECT), 0);
  fail_syncs (1);
  assert_int_equal (cache_write (f->c, b, sizeof b, 1 << 20, CACHE_FUA), -1);
  for (int i = 0; i < 2; i++) {
    assert_int_equal (cache_flush (f->c), -1);
    assert_int_equal (errno, EIO);
  }
  /* The FUA write's own block was kept and made it on a later sync. */
  assert_on_device (b, sizeof b, 1 << 20);
  fx_close (f, 0);        /* the flushes reported the loss: nothing dirty */
}

/* Background writeback meets the failure (no client FLUSH sees the EIO):
 * it must still get the data onto the device. */
static void
test_background_failed_sync (void **state)
{
  struct fx *f = fx_open (1u << 20, 0, 10);
  static unsigned char buf[65536];
  struct cache_stats st;

  memset (buf, 0x5c, sizeof buf);
  fail_syncs (1);
  assert_int_equal (cache_write (f->c, buf, sizeof buf, 131072, 0), 0);
  for (int i = 0; i < 1000; i++) {       /* at most 10 s */
    cache_get_stats (f->c, &st);
    if (syncs_failed () == 1 && st.dirty_bytes + st.unstable_bytes == 0)
      break;
    usleep (10000);
  }
  assert_int_equal (syncs_failed (), 1);
  assert_int_equal (st.dirty_bytes + st.unstable_bytes, 0);
  assert_on_device (buf, sizeof buf, 131072);
  assert_int_equal (cache_flush (f->c), 0);
  fx_close (f, 0);
}

/* cache=writethrough: a write whose fdatasync fails gets EIO; the cache
 * keeps it dirty, and the next FLUSH puts it on the device. */
static void
test_writethrough_failed_sync (void **state)
{
  struct fx *f = fx_open_mode (CACHE_WRITETHROUGH, 1u << 20, 3600000, 1000);
  static unsigned char buf[4096];

  memset (buf, 0x77, sizeof buf);
  fail_syncs (1);
  assert_int_equal (cache_write (f->c, buf, sizeof buf, 8192, 0), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_flush (f->c), 0);
  assert_on_device (buf, sizeof buf, 8192);
  fx_close (f, 0);
}

/* Written-back blocks are pinned until the backing flushes; a cache of 4
 * folios must still take 4 MiB of writes (writers waiting for room get it
 * after a flush) and all of it reaches the device. */
static void
test_unstable_leaves_room (void **state)
{
  struct fx *f = fx_open (256u << 10, 3600000, 1000);
  static unsigned char buf[65536], want[SIZE];
  struct cache_stats st;

  for (uint32_t off = 0; off < SIZE; off += sizeof buf) {
    memset (buf, (int) (off >> 16) | 1, sizeof buf);
    memcpy (want + off, buf, sizeof buf);
    assert_int_equal (cache_write (f->c, buf, sizeof buf, off, 0), 0);
  }
  cache_get_stats (f->c, &st);
  assert_true (st.backing_flush_ops > 0);
  assert_true (st.cached_bytes <= (256u << 10));
  assert_int_equal (cache_flush (f->c), 0);
  assert_on_device (want, SIZE, 0);
  fx_close (f, 0);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_failed_flush_rewrites),
    cmocka_unit_test (test_fua_sync_loses_passthrough),
    cmocka_unit_test (test_background_failed_sync),
    cmocka_unit_test (test_writethrough_failed_sync),
    cmocka_unit_test (test_unstable_leaves_room),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
