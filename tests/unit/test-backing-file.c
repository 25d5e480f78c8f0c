/* The file backing against real files in a real directory (/var/tmp, not
 * tmpfs where it can be avoided: holes and O_DIRECT behave differently). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <cmocka.h>

#include "foliod/backing.h"
#include "backing/file-private.h"

#define KiB 1024ull
#define MiB (1024ull * 1024)
#define TMPFS_MAGIC 0x01021994

/* An odd size, so the last partial sector is exercised too. */
#define FSIZE (4 * MiB + 1000)

struct fx {
  char dir[64];
  char path[96];
  uint8_t *ref;                 /* what the file should hold */
  char loopdev[64];             /* attached loop device, if any */
  uint64_t seed;
};

static uint64_t
rnd (struct fx *f)
{
  f->seed ^= f->seed << 13;
  f->seed ^= f->seed >> 7;
  f->seed ^= f->seed << 17;
  return f->seed;
}

static void
fill_random (struct fx *f, uint8_t *p, size_t n)
{
  for (size_t i = 0; i < n; i++)
    p[i] = rnd (f) >> 24;
}

static int
setup (void **state)
{
  struct fx *f = calloc (1, sizeof *f);
  int fd;

  assert_non_null (f);
  strcpy (f->dir, "/var/tmp/foliod-backing-XXXXXX");
  assert_non_null (mkdtemp (f->dir));
  snprintf (f->path, sizeof f->path, "%s/disk", f->dir);
  fd = open (f->path, O_RDWR | O_CREAT | O_EXCL, 0600);
  assert_true (fd >= 0);
  assert_int_equal (ftruncate (fd, FSIZE), 0);
  close (fd);
  f->ref = calloc (1, FSIZE);
  assert_non_null (f->ref);
  f->seed = 0x9e3779b97f4a7c15ull;
  *state = f;
  return 0;
}

static int
teardown (void **state)
{
  struct fx *f = *state;
  char cmd[128];

  if (f->loopdev[0]) {
    snprintf (cmd, sizeof cmd, "losetup -d %s", f->loopdev);
    if (system (cmd) != 0)
      fprintf (stderr, "cannot detach %s\n", f->loopdev);
  }
  snprintf (cmd, sizeof cmd, "rm -rf '%s'", f->dir);
  if (system (cmd) != 0)
    fprintf (stderr, "cannot remove %s\n", f->dir);
  free (f->ref);
  free (f);
  return 0;
}

static int
on_tmpfs (const char *path)
{
  struct statfs sf;
  return statfs (path, &sf) == 0 && sf.f_type == TMPFS_MAGIC;
}

static struct backing *
open_file (struct fx *f, int direct, int ro, unsigned test_flags)
{
  struct backing_opts o = { .direct = direct, .read_only = ro };
  char err[256] = "";
  struct backing *b = backing_file_open_flags (f->path, &o, test_flags,
                                               err, sizeof err);
  if (!b)
    fail_msg ("open %s: %s", f->path, err);
  return b;
}

/* Read the file through a fresh buffered fd: what is really on disk. */
static void
assert_file_equals_ref (struct fx *f)
{
  uint8_t *p = malloc (FSIZE + 1);
  int fd = open (f->path, O_RDONLY);
  struct stat st;

  assert_true (fd >= 0);
  assert_int_equal (fstat (fd, &st), 0);
  assert_int_equal (st.st_size, FSIZE);        /* never grew */
  assert_int_equal (pread (fd, p, FSIZE, 0), FSIZE);
  assert_memory_equal (p, f->ref, FSIZE);
  close (fd);
  free (p);
}

/* Random writes and reads with odd offsets, lengths and buffer addresses,
 * checked against the reference; writes get extra flags half the time. */
static void
random_rw_flags (struct fx *f, struct backing *b, int rounds, unsigned extra)
{
  uint8_t *mem = malloc (512 * KiB + 64), *buf;

  for (int i = 0; i < rounds; i++) {
    uint64_t len = 1 + rnd (f) % (rnd (f) % 4 ? 9000 : 512 * KiB);
    uint64_t off = rnd (f) % (FSIZE - len + 1);
    if (i % 7 == 0)
      off = FSIZE - len;        /* the unaligned tail */
    if (i % 5 == 0)
      off &= ~511ull;           /* aligned offset, maybe odd length */
    buf = mem + rnd (f) % 64;   /* usually not aligned */
    if (rnd (f) % 2) {
      fill_random (f, buf, len);
      unsigned flags = (i % 11 ? 0 : BACKING_FUA) | (rnd (f) % 2 ? extra : 0);
      assert_int_equal (b->ops->write (b, buf, len, off, flags), 0);
      memcpy (f->ref + off, buf, len);
    }
    else {
      assert_int_equal (b->ops->read (b, buf, len, off), 0);
      assert_memory_equal (buf, f->ref + off, len);
    }
  }
  free (mem);
}

static void
random_rw (struct fx *f, struct backing *b, int rounds)
{
  random_rw_flags (f, b, rounds, 0);
}

static void
test_roundtrip_unaligned (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);

  assert_int_equal (b->size, FSIZE);
  assert_int_equal (b->direct, 0);
  assert_int_equal (b->io_align, 1);
  random_rw (f, b, 300);
  assert_int_equal (b->ops->flush (b), 0);
  assert_file_equals_ref (f);
  backing_close (b);
}

static void
test_out_of_range (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  char buf[16] = { 0 };

  assert_int_equal (b->ops->write (b, buf, 16, FSIZE - 8, 0), -1);
  assert_int_equal (errno, EINVAL);
  assert_int_equal (b->ops->read (b, buf, 16, FSIZE - 8), -1);
  assert_int_equal (errno, EINVAL);
  backing_close (b);
  assert_file_equals_ref (f);
}

static void
assert_map (struct backing *b, uint64_t off, uint64_t len,
            enum backing_extent_type type, uint64_t elen)
{
  struct backing_extent e;

  assert_int_equal (b->ops->map (b, off, len, &e), 0);
  assert_int_equal (e.offset, off);
  assert_int_equal (e.type, type);
  assert_int_equal (e.length, elen);
}

static void
test_map_holes (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  uint8_t buf[64 * KiB];

  if (on_tmpfs (f->path))
    skip ();
  assert_true (b->caps & BACKING_CAN_MAP);
  /* Brand-new sparse file: one hole to the end. */
  assert_map (b, 0, b->size, BACKING_HOLE, b->size);
  memset (buf, 0xab, sizeof buf);
  assert_int_equal (b->ops->write (b, buf, sizeof buf, 1 * MiB, 0), 0);
  assert_map (b, 0, b->size, BACKING_HOLE, 1 * MiB);
  assert_map (b, 1 * MiB, b->size - 1 * MiB, BACKING_DATA, 64 * KiB);
  assert_map (b, 1 * MiB + 64 * KiB, b->size - 1 * MiB - 64 * KiB,
              BACKING_HOLE, b->size - 1 * MiB - 64 * KiB);
  /* Lengths are clipped to the question. */
  assert_map (b, 4096, 8192, BACKING_HOLE, 8192);
  assert_map (b, 1 * MiB + 4096, 100, BACKING_DATA, 100);
  backing_close (b);
}

static uint64_t
blocks_of (struct fx *f)
{
  struct stat st;
  assert_int_equal (stat (f->path, &st), 0);
  return st.st_blocks;
}

static void
write_all (struct fx *f, struct backing *b)
{
  uint8_t *p = malloc (FSIZE);

  fill_random (f, p, FSIZE);
  assert_int_equal (b->ops->write (b, p, FSIZE, 0, BACKING_FUA), 0);
  memcpy (f->ref, p, FSIZE);
  free (p);
}

static void
test_trim_punches (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  uint64_t before;

  if (on_tmpfs (f->path))
    skip ();
  assert_true (b->caps & BACKING_CAN_TRIM);
  write_all (f, b);
  before = blocks_of (f);
  assert_int_equal (b->ops->trim (b, 1 * MiB, 1 * MiB, BACKING_FUA), 0);
  memset (f->ref + 1 * MiB, 0, 1 * MiB);
  assert_true (blocks_of (f) <= before - 2048);  /* 1 MiB in 512 B units */
  assert_map (b, 1 * MiB, 2 * MiB, BACKING_HOLE, 1 * MiB);
  assert_file_equals_ref (f);
  backing_close (b);
}

/* Zero one range with a given set of methods, check the result. */
static void
zero_with (struct fx *f, struct backing *b, int zr, int punch, int alloc,
           unsigned flags, uint64_t off, uint64_t len)
{
  struct file_backing *fb = (struct file_backing *) b;

  atomic_store (&fb->can_zero_range, zr);
  atomic_store (&fb->can_punch, punch);
  atomic_store (&fb->can_alloc, alloc);
  assert_int_equal (b->ops->zero (b, len, off, flags), 0);
  memset (f->ref + off, 0, len);
  assert_file_equals_ref (f);
}

static void
test_zero_methods (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  uint64_t blocks;

  write_all (f, b);
  /* ZERO_RANGE, unaligned ends. */
  zero_with (f, b, 1, 1, 1, 0, 100, 300 * KiB + 7);
  /* No ZERO_RANGE, MAY_TRIM: a hole. */
  zero_with (f, b, 0, 1, 1, BACKING_MAY_TRIM, 1 * MiB, 1 * MiB);
  if (!on_tmpfs (f->path))
    assert_map (b, 1 * MiB, 1 * MiB, BACKING_HOLE, 1 * MiB);
  /* Every method, MAY_TRIM: a hole too (ZERO_RANGE would allocate). */
  zero_with (f, b, 1, 1, 1, BACKING_MAY_TRIM, 3 * MiB + 4096, 256 * KiB);
  if (!on_tmpfs (f->path))
    assert_map (b, 3 * MiB + 4096, 256 * KiB, BACKING_HOLE, 256 * KiB);
  /* No ZERO_RANGE, no MAY_TRIM: punch then allocate again. */
  blocks = blocks_of (f);
  zero_with (f, b, 0, 1, 1, 0, 2 * MiB + 3, 512 * KiB);
  assert_true (blocks_of (f) + 16 >= blocks);   /* still allocated */
  /* No fallocate at all: zeroes are written. */
  zero_with (f, b, 0, 0, 0, 0, 3 * MiB - 5, 600 * KiB);
  assert_map (b, 3 * MiB, 4096, BACKING_DATA, 4096);
  /* ... also with FUA and MAY_TRIM, over the unaligned end. */
  zero_with (f, b, 0, 0, 0, BACKING_FUA | BACKING_MAY_TRIM, FSIZE - 5000, 5000);
  backing_close (b);
}

static void
test_fast_zero (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  struct file_backing *fb = (struct file_backing *) b;

  write_all (f, b);
  assert_true (b->caps & BACKING_CAN_FAST_ZERO);
  /* A working fallocate method makes it fast. */
  zero_with (f, b, 1, 1, 1, BACKING_FAST_ZERO, 10000, 100000);
  zero_with (f, b, 0, 1, 0, BACKING_FAST_ZERO | BACKING_MAY_TRIM, 1 * MiB,
             4096);
  /* Nothing but writing zeroes: refused, data untouched. */
  atomic_store (&fb->can_zero_range, 0);
  atomic_store (&fb->can_punch, 0);
  assert_int_equal (b->ops->zero (b, 8192, 2 * MiB, BACKING_FAST_ZERO), -1);
  assert_int_equal (errno, ENOTSUP);
  assert_file_equals_ref (f);
  /* Without FAST_ZERO the same request writes zeroes. */
  zero_with (f, b, 0, 0, 0, 0, 2 * MiB, 8192);
  backing_close (b);
}

static void
test_read_only (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  uint8_t buf[4096];

  write_all (f, b);
  backing_close (b);
  b = open_file (f, 0, 1, 0);
  assert_true (b->caps & BACKING_READ_ONLY);
  assert_false (b->caps & BACKING_CAN_TRIM);
  assert_int_equal (b->ops->write (b, buf, 10, 0, 0), -1);
  assert_int_equal (errno, EROFS);
  assert_int_equal (b->ops->zero (b, 10, 0, 0), -1);
  assert_int_equal (errno, EROFS);
  assert_int_equal (b->ops->trim (b, 4096, 0, 0), -1);
  assert_int_equal (errno, EROFS);
  assert_int_equal (b->ops->read (b, buf, sizeof buf, 12345), 0);
  assert_memory_equal (buf, f->ref + 12345, sizeof buf);
  assert_int_equal (b->ops->flush (b), 0);
  backing_close (b);
  assert_file_equals_ref (f);
}

static void
test_direct (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 1, 0, 0);
  struct file_backing *fb = (struct file_backing *) b;

  if (!b->direct) {
    /* This file system refused O_DIRECT: the fallback must work. */
    print_message ("O_DIRECT refused on %s: testing the fallback\n", f->dir);
    assert_int_equal (b->io_align, 1);
  }
  else {
    assert_true (fcntl (fb->fd, F_GETFL) & O_DIRECT);
    assert_false (fcntl (fb->fd_buf, F_GETFL) & O_DIRECT);
    assert_true (b->io_align >= 512 && (b->io_align & (b->io_align - 1)) == 0);
    assert_int_equal (fb->direct_end, FSIZE / b->io_align * b->io_align);
  }
  random_rw (f, b, 300);
  zero_with (f, b, 0, 0, 0, 0, 12345, 100000);
  assert_int_equal (b->ops->flush (b), 0);
  assert_file_equals_ref (f);
  backing_close (b);
}

/* Buffered, but writes asking for BACKING_DIRECT go through the O_DIRECT
 * fd (writeback of long runs): mixed with buffered reads and writes, odd
 * ranges and the unaligned tail, the file holds what was written. */
static void
test_direct_writes_hint (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 0, 0, 0);
  struct file_backing *fb = (struct file_backing *) b;

  assert_int_equal (b->direct, 0);
  assert_int_equal (b->io_align, 1);
  assert_int_equal (fb->fd, fb->fd_buf);
  if (fb->fd_dio >= 0)
    assert_true (fcntl (fb->fd_dio, F_GETFL) & O_DIRECT);
  else
    print_message ("O_DIRECT refused on %s: hint ignored\n", f->dir);
  random_rw_flags (f, b, 300, BACKING_DIRECT);
  assert_int_equal (b->ops->flush (b), 0);
  assert_file_equals_ref (f);
  backing_close (b);
}

static void
test_direct_probe (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 1, 0, FILE_TEST_NO_STATX);

  if (b->direct)
    assert_true (b->io_align == 512 || b->io_align == 4096);
  random_rw (f, b, 100);
  assert_file_equals_ref (f);
  backing_close (b);
}

static void
test_direct_refused (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 1, 0, FILE_TEST_REFUSE_DIRECT);
  struct file_backing *fb = (struct file_backing *) b;

  assert_int_equal (b->direct, 0);
  assert_int_equal (b->io_align, 1);
  assert_false (fcntl (fb->fd, F_GETFL) & O_DIRECT);
  random_rw (f, b, 100);
  assert_file_equals_ref (f);
  backing_close (b);
}

/* Several threads write disjoint 100-byte pieces that share sectors: the
 * read-modify-write of edge sectors must not lose a neighbour's bytes. */
struct rmw_arg {
  struct backing *b;
  int t, nthreads;
};

#define RMW_PIECE 100
#define RMW_PIECES 2000

static void *
rmw_thread (void *p)
{
  struct rmw_arg *a = p;
  uint8_t buf[RMW_PIECE + 1];

  for (int round = 0; round < 3; round++)
    for (int i = a->t; i < RMW_PIECES; i += a->nthreads) {
      memset (buf + 1, (uint8_t) (i * 7 + round), RMW_PIECE);
      if (a->b->ops->write (a->b, buf + 1, RMW_PIECE,
                            (uint64_t) i * RMW_PIECE, 0) != 0)
        return (void *) 1;
    }
  return NULL;
}

static void
test_direct_threads_rmw (void **state)
{
  struct fx *f = *state;
  struct backing *b = open_file (f, 1, 0, 0);
  enum { N = 4 };
  pthread_t th[N];
  struct rmw_arg args[N];
  void *ret;

  for (int t = 0; t < N; t++) {
    args[t] = (struct rmw_arg) { b, t, N };
    assert_int_equal (pthread_create (&th[t], NULL, rmw_thread, &args[t]), 0);
  }
  for (int t = 0; t < N; t++) {
    assert_int_equal (pthread_join (th[t], &ret), 0);
    assert_null (ret);
  }
  for (int i = 0; i < RMW_PIECES; i++)
    memset (f->ref + (uint64_t) i * RMW_PIECE, (uint8_t) (i * 7 + 2),
            RMW_PIECE);
  assert_file_equals_ref (f);
  backing_close (b);
}

/* A block device (a loop device over our file, when we may make one):
 * size from BLKGETSIZE64, alignment from BLKSSZGET, zero and trim by
 * ioctl/fallocate on the device, data through both buffered and direct
 * I/O.  Skipped without root or loop devices. */
static const char *
attach_loop (struct fx *f)
{
  char cmd[256], dev[64] = "";
  FILE *p;

  if (geteuid () != 0)
    return NULL;
  snprintf (cmd, sizeof cmd, "losetup -f --show %s 2>/dev/null", f->path);
  p = popen (cmd, "r");
  if (!p)
    return NULL;
  if (!fgets (dev, sizeof dev, p))
    dev[0] = '\0';
  if (pclose (p) != 0 || strncmp (dev, "/dev/loop", 9) != 0)
    return NULL;
  dev[strcspn (dev, "\n")] = '\0';
  strcpy (f->loopdev, dev);
  return f->loopdev;
}

static void
test_block_device (void **state)
{
  struct fx *f = *state;
  const char *dev = attach_loop (f);
  char err[256];
  struct backing *b;

  if (!dev)
    skip ();

  for (int direct = 0; direct < 2; direct++) {
    struct backing_opts o = { .direct = direct };
    struct file_backing *fb;
    b = backing_file_open (dev, &o, err, sizeof err);
    if (!b)
      break;
    fb = (struct file_backing *) b;
    if (!fb->is_blk || b->size != FSIZE / 512 * 512 ||
        (direct && (!b->direct || b->io_align != fb->sector))) {
      backing_close (b);
      b = NULL;
      break;
    }
    /* The loop device ends at the last whole sector of the file. */
    uint8_t *mem = malloc (300 * KiB + 8), *buf = mem + 3;
    for (int i = 0; i < 60; i++) {
      uint64_t len = 1 + rnd (f) % (300 * KiB);
      uint64_t off = rnd (f) % (b->size - len);
      fill_random (f, buf, len);
      if (b->ops->write (b, buf, len, off, i % 5 ? 0 : BACKING_FUA) != 0)
        fail_msg ("write: %s", strerror (errno));
      memcpy (f->ref + off, buf, len);
      off = rnd (f) % (b->size - 70000);
      if (b->ops->zero (b, 70000, off, i % 2 ? BACKING_MAY_TRIM : 0) != 0)
        fail_msg ("zero: %s", strerror (errno));
      memset (f->ref + off, 0, 70000);
      off = rnd (f) % (b->size - len);
      if (b->ops->read (b, buf, len, off) != 0)
        fail_msg ("read: %s", strerror (errno));
      if (memcmp (buf, f->ref + off, len) != 0)
        fail_msg ("data differs at %llu", (unsigned long long) off);
    }
    free (mem);
    if (b->ops->flush (b) != 0)
      fail_msg ("flush: %s", strerror (errno));
    backing_close (b);
  }
  if (!b)
    fail_msg ("block device %s: open or geometry wrong", dev);
  assert_file_equals_ref (f);
}

static void
test_open_dispatch (void **state)
{
  struct fx *f = *state;
  char spec[128], err[256];
  struct backing *b;

  snprintf (spec, sizeof spec, "file:%s", f->path);
  b = backing_open (spec, NULL, err, sizeof err);
  assert_non_null (b);
  assert_string_equal (b->ops->name, "file");
  backing_close (b);
  b = backing_open (f->path, NULL, err, sizeof err);
  assert_non_null (b);
  backing_close (b);

  err[0] = '\0';
  assert_null (backing_open ("http://example.com/x", NULL, err, sizeof err));
  assert_non_null (strstr (err, "unsupported backing scheme"));
  assert_null (backing_open ("", NULL, err, sizeof err));
  snprintf (spec, sizeof spec, "%s/missing", f->dir);
  assert_null (backing_open (spec, NULL, err, sizeof err));
  assert_non_null (strstr (err, "missing"));
  assert_non_null (strstr (err, "No such file"));
  assert_null (strchr (err, '\n'));
  assert_null (backing_open ("/dev/null", NULL, err, sizeof err));
  assert_non_null (strstr (err, "not a regular file or block device"));
  err[0] = '\0';
  snprintf (spec, sizeof spec, "nbd+unix:///?socket=%s/nosock", f->dir);
  assert_null (backing_open (spec, NULL, err, sizeof err));
  assert_true (strlen (err) > 0);
  assert_null (strchr (err, '\n'));
}

/* Open path with the given options; NULL with the reason in err. */
static struct backing *
try_open (const char *path, int ro, int no_locking, int raw, char *err,
          size_t errlen)
{
  struct backing_opts o = { .read_only = ro, .no_locking = no_locking,
                            .format_raw = raw };

  err[0] = '\0';
  return backing_file_open (path, &o, err, errlen);
}

static void
assert_in_use (const char *path, int ro)
{
  char err[512];
  struct backing *b = try_open (path, ro, 0, 0, err, sizeof err);

  if (b)
    fail_msg ("%s opened twice (read-only %d)", path, ro);
  assert_non_null (strstr (err, path));
  assert_non_null (strstr (err, "in use"));
  assert_non_null (strstr (err, "\"write\""));
  assert_non_null (strstr (err, "locking=off"));
  assert_null (strchr (err, '\n'));
}

/* Locks on one path: a writer excludes everyone; readers share with
 * readers; locking=off opens regardless; the locks go with the backing. */
static void
check_locks (const char *path)
{
  char err[512];
  struct backing *b1, *b2;

  b1 = try_open (path, 0, 0, 0, err, sizeof err);
  if (!b1)
    fail_msg ("open %s: %s", path, err);
  assert_in_use (path, 0);
  assert_in_use (path, 1);
  b2 = try_open (path, 0, 1, 0, err, sizeof err);
  assert_non_null (b2);         /* locking=off */
  backing_close (b2);
  backing_close (b1);

  b1 = try_open (path, 1, 0, 0, err, sizeof err);
  assert_non_null (b1);         /* the writer's locks are gone */
  b2 = try_open (path, 1, 0, 0, err, sizeof err);
  assert_non_null (b2);         /* two readers */
  assert_in_use (path, 0);
  backing_close (b2);
  backing_close (b1);
}

static void
test_lock (void **state)
{
  check_locks (((struct fx *) *state)->path);
}

static void
test_lock_block_device (void **state)
{
  const char *dev = attach_loop (*state);

  if (!dev)
    skip ();
  check_locks (dev);
}

/* Put bytes at off of the file (the rest stays zero). */
static void
put (struct fx *f, uint64_t off, const void *p, size_t n)
{
  int fd = open (f->path, O_RDWR);

  assert_true (fd >= 0);
  assert_int_equal (pwrite (fd, p, n, off), (ssize_t) n);
  close (fd);
}

/* An image format in the file is refused, naming the format and the ways
 * out; format=raw serves it. */
static void
test_probe_formats (void **state)
{
  static const struct { const char *fmt; uint64_t off; const char *m;
                        size_t n; } cases[] = {
#define C(fmt, off, m) { fmt, off, m, sizeof (m) - 1 }
    C ("qcow2", 0, "QFI\xfb\0\0\0\x03"),
    C ("qcow2", 0, "QFI\xfb\0\0\0\x02"),
    C ("qcow", 0, "QFI\xfb\0\0\0\x01"),
    C ("qed", 0, "QED\0"),
    C ("vmdk", 0, "KDMV"),
    C ("vmdk", 0, "# Disk DescriptorFile\n"),
    C ("vhdx", 0, "vhdxfile"),
    C ("vdi", 0x40, "\x7f\x10\xda\xbe"),
    C ("vpc", 0, "conectix"),
    C ("vpc", FSIZE - 512, "conectix"),
    C ("dmg", FSIZE - 512, "koly"),
    C ("luks", 0, "LUKS\xba\xbe"),
    C ("parallels", 0, "WithoutFreeSpace"),
    C ("bochs", 0, "Bochs Virtual HD Image"),
    C ("cloop", 0, "#!/bin/sh\n#V2.0 Format\n"),
#undef C
  };
  struct fx *f = *state;
  char err[1024], want[64];
  struct backing *b;
  static const char zeroes[64];

  b = try_open (f->path, 0, 0, 0, err, sizeof err);
  assert_non_null (b);          /* zeroes: raw */
  backing_close (b);
  assert_int_equal (backing_file_probe (f->path, err, sizeof err), 0);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    put (f, cases[i].off, cases[i].m, cases[i].n);
    for (int ro = 0; ro < 2; ro++) {
      errno = 0;
      b = try_open (f->path, ro, 0, 0, err, sizeof err);
      if (b)
        fail_msg ("a %s image was opened", cases[i].fmt);
      if (errno != EMEDIUMTYPE)    /* the daemon serves the others then */
        fail_msg ("%s: errno %d, not EMEDIUMTYPE", cases[i].fmt, errno);
      /* The advice: format=raw, and qemu-img info for a backing file
       * first; never qemu-img convert, which follows it (issue 34). */
      snprintf (want, sizeof want, "a %s image", cases[i].fmt);
      if (!strstr (err, want) || !strstr (err, f->path) ||
          !strstr (err, "format=raw") || !strstr (err, "qemu-img info") ||
          !strstr (err, "backing file") || strstr (err, "qemu-img convert"))
        fail_msg ("%s: %s", cases[i].fmt, err);
    }
    /* --check-config's probe says the same. */
    assert_int_equal (backing_file_probe (f->path, err, sizeof err), 1);
    snprintf (want, sizeof want, "a %s image", cases[i].fmt);
    if (!strstr (err, want))
      fail_msg ("backing_file_probe %s: %s", cases[i].fmt, err);
    b = try_open (f->path, 0, 0, 1, err, sizeof err);
    assert_non_null (b);        /* format=raw */
    backing_close (b);
    put (f, cases[i].off, zeroes, cases[i].n);
  }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
#define T(fn) cmocka_unit_test_setup_teardown (fn, setup, teardown)
    T (test_roundtrip_unaligned),
    T (test_out_of_range),
    T (test_map_holes),
    T (test_trim_punches),
    T (test_zero_methods),
    T (test_fast_zero),
    T (test_read_only),
    T (test_direct),
    T (test_direct_writes_hint),
    T (test_direct_probe),
    T (test_direct_refused),
    T (test_direct_threads_rmw),
    T (test_block_device),
    T (test_open_dispatch),
    T (test_lock),
    T (test_lock_block_device),
    T (test_probe_formats),
#undef T
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
