/* The file backing: a regular file or a block device.
 *
 * Data moves with pread/pwrite at explicit offsets, so every op is safe
 * from any number of threads without a lock on the fd.  Direct mode opens
 * the file a second time with O_DIRECT; requests the kernel would refuse
 * (offset, length or buffer not aligned) go through an aligned bounce
 * buffer, so callers may pass any range.  The partial sector at the end of
 * a file whose size is not aligned is served by the buffered fd: writing it
 * with O_DIRECT would have to write a whole sector and grow the file.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include "foliod/lock.h"
#include "backing/file-private.h"
#include "foliod/minmax.h"

#define ROUND_DOWN(x, a) ((x) / (a) * (a))
#define ROUND_UP(x, a)   (((x) + (a) - 1) / (a) * (a))

static inline struct file_backing *
to_file (struct backing *b)
{
  return (struct file_backing *) b;
}

/* errno values meaning "this method does not exist here". */
static int
is_unsupported (int e)
{
  /* ENODEV: fallocate on a block device before Linux 4.9. */
  return e == EOPNOTSUPP || e == ENOSYS || e == ENOTTY || e == ENODEV;
}

/* Read until len bytes or end of file.  Returns bytes read (short only at
 * end of file), or -1 with errno. */
static ssize_t
pread_full (int fd, void *buf, size_t len, uint64_t off)
{
  size_t done = 0;

  while (done < len) {
    ssize_t r = pread (fd, (char *) buf + done, len - done, off + done);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0)
      break;
    done += r;
  }
  return done;
}

/* Read exactly len bytes; end of file inside the range is EIO (the file
 * shrank under us). */
static int
pread_exact (int fd, void *buf, size_t len, uint64_t off)
{
  ssize_t r = pread_full (fd, buf, len, off);

  if (r == -1)
    return -1;
  if ((size_t) r < len) {
    errno = EIO;
    return -1;
  }
  return 0;
}

static int
pwrite_exact (int fd, const void *buf, size_t len, uint64_t off)
{
  size_t done = 0;

  while (done < len) {
    ssize_t r = pwrite (fd, (const char *) buf + done, len - done, off + done);
    if (r == -1) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    if (r == 0) {
      errno = ENOSPC;
      return -1;
    }
    done += r;
  }
  return 0;
}

/* Bounce buffers: a free list, grown on demand, so a steady state does no
 * allocation per request (one buffer per thread doing unaligned I/O). */
static void *
bounce_get (struct file_backing *fb)
{
  struct file_bounce *p;
  void *mem;
  int r;

  lock_or_die (&fb->pool_lock);
  p = fb->pool;
  if (p)
    fb->pool = p->next;
  unlock_or_die (&fb->pool_lock);
  if (p)
    return p;
  r = posix_memalign (&mem, MAX (fb->dio_align, 4096u), FILE_BOUNCE_SIZE);
  if (r != 0) {
    errno = r;
    return NULL;
  }
  return mem;
}

static void
bounce_put (struct file_backing *fb, void *mem)
{
  struct file_bounce *p = mem;

  lock_or_die (&fb->pool_lock);
  p->next = fb->pool;
  fb->pool = p;
  unlock_or_die (&fb->pool_lock);
}

static int
buf_aligned (struct file_backing *fb, const void *p)
{
  return (uintptr_t) p % fb->mem_align == 0;
}

static pthread_mutex_t *
rmw_lock_for (struct file_backing *fb, uint64_t sector_off)
{
  return &fb->rmw_lock[(sector_off / fb->dio_align) % FILE_RMW_STRIPES];
}

/* Write one bounced window [ws, we) holding [pos, cend) of new data from
 * src; the partial edge sectors are read first, under their stripe locks. */
static int
dio_write_window (struct file_backing *fb, char *bounce, const char *src,
                  uint64_t pos, uint64_t cend, uint64_t ws, uint64_t we)
{
  const uint64_t a = fb->dio_align;
  int head = pos > ws, tail = cend < we;
  pthread_mutex_t *l1 = NULL, *l2 = NULL;
  int ret = -1;

  if (head)
    l1 = rmw_lock_for (fb, ws);
  if (tail)
    l2 = rmw_lock_for (fb, we - a);
  if (l1 && l2 && l1 > l2) {    /* lock order: lower address first */
    pthread_mutex_t *t = l1; l1 = l2; l2 = t;
  }
  if (l1 == l2)
    l2 = NULL;
  if (!l1) {
    l1 = l2;
    l2 = NULL;
  }
  if (l1)
    lock_or_die (l1);
  if (l2)
    lock_or_die (l2);

  if (head && pread_exact (fb->fd_dio, bounce, a, ws) == -1)
    goto out;
  if (tail && (!head || we - a != ws) &&
      pread_exact (fb->fd_dio, bounce + (we - a - ws), a, we - a) == -1)
    goto out;
  memcpy (bounce + (pos - ws), src, cend - pos);
  ret = pwrite_exact (fb->fd_dio, bounce, we - ws, ws);
 out:
  if (l2)
    unlock_or_die (l2);
  if (l1)
    unlock_or_die (l1);
  return ret;
}

/* Bounce one window [ws, we) of a read around [pos, cend). */
static int
dio_read_window (struct file_backing *fb, char *bounce, char *dst,
                 uint64_t pos, uint64_t cend, uint64_t ws, uint64_t we)
{
  if (pread_exact (fb->fd_dio, bounce, we - ws, ws) == -1)
    return -1;
  memcpy (dst, bounce + (pos - ws), cend - pos);
  return 0;
}

/* O_DIRECT read or write of [off, off+len), all below direct_end: the
 * aligned body straight from or to buf when buf is aligned too, the rest
 * a bounce window (FILE_BOUNCE_SIZE) at a time. */
static int
dio_walk (struct file_backing *fb, bool write, char *buf, uint64_t len,
          uint64_t off)
{
  const uint64_t a = fb->dio_align, end = off + len;
  uint64_t pos = off;
  char *bounce = NULL;
  int ret = 0;

  while (pos < end) {
    char *p = buf + (pos - off);
    uint64_t body = ROUND_DOWN (end - pos, a);

    if (pos % a == 0 && body > 0 && buf_aligned (fb, p)) {
      if ((write ? pwrite_exact (fb->fd_dio, p, body, pos)
                 : pread_exact (fb->fd_dio, p, body, pos)) == -1)
        goto fail;
      pos += body;
      continue;
    }
    uint64_t ws = ROUND_DOWN (pos, a);
    uint64_t we = MIN (ws + FILE_BOUNCE_SIZE, ROUND_UP (end, a));
    uint64_t cend = MIN (end, we);
    if (!bounce && !(bounce = bounce_get (fb)))
      goto fail;
    if ((write ? dio_write_window (fb, bounce, p, pos, cend, ws, we)
               : dio_read_window (fb, bounce, p, pos, cend, ws, we)) == -1)
      goto fail;
    pos = cend;
  }
 out:
  if (bounce)
    bounce_put (fb, bounce);
  return ret;
 fail:
  ret = -1;
  goto out;
}

static int
dio_read (struct file_backing *fb, char *buf, uint64_t len, uint64_t off)
{
  return dio_walk (fb, false, buf, len, off);
}

/* The walk does not write to buf when it writes. */
static int
dio_write (struct file_backing *fb, const char *buf, uint64_t len,
           uint64_t off)
{
  return dio_walk (fb, true, (char *) buf, len, off);
}

static int
check_range (struct backing *b, uint64_t len, uint64_t off)
{
  if (off > b->size || len > b->size - off) {
    errno = EINVAL;
    return -1;
  }
  return 0;
}

static int
check_writable (struct backing *b, uint64_t len, uint64_t off)
{
  if ((b->caps & BACKING_READ_ONLY) || atomic_load (&b->released)) {
    errno = EROFS;
    return -1;
  }
  return check_range (b, len, off);
}

static int
file_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  struct file_backing *fb = to_file (b);
  uint64_t dlen;

  if (check_range (b, len, off) == -1)
    return -1;
  if (!b->direct && !(len >= FILE_DIRECT_READ_MIN && fb->fd_dio >= 0))
    return pread_exact (fb->fd_buf, buf, len, off);
  dlen = off < fb->direct_end ? MIN (len, fb->direct_end - off) : 0;
  if (dlen && dio_read (fb, buf, dlen, off) == -1)
    return -1;
  if (dlen < len &&
      pread_exact (fb->fd_buf, (char *) buf + dlen, len - dlen, off + dlen) == -1)
    return -1;
  return 0;
}

/* Write without the FUA part; with O_DIRECT when the backing is direct or
 * the caller asks (and the file allows it). */
static int
file_write_data (struct file_backing *fb, const void *buf, uint64_t len,
                 uint64_t off, bool direct)
{
  uint64_t dlen;

  if (!fb->b.direct && !(direct && fb->fd_dio >= 0))
    return pwrite_exact (fb->fd_buf, buf, len, off);
  dlen = off < fb->direct_end ? MIN (len, fb->direct_end - off) : 0;
  if (dlen && dio_write (fb, buf, dlen, off) == -1)
    return -1;
  if (dlen < len &&
      pwrite_exact (fb->fd_buf, (const char *) buf + dlen, len - dlen,
                    off + dlen) == -1)
    return -1;
  return 0;
}

/* Not under the lock: an op must not wait for a sync to begin.  A
 * failure still being counted is seen by the op's own file_sync, which
 * runs after it under the lock. */
static uint64_t
file_sync_seen (struct file_backing *fb)
{
  return atomic_load (&fb->sync_failures);
}

/* fdatasync is per inode: it covers every fd of the file.  When it fails,
 * Linux has marked the pages whose writeback failed clean (their data is
 * not on the device) and reports the error once per open file
 * description: a later fdatasync succeeds.  So everything written since
 * the last good sync may be lost, and a sync that follows a failed one
 * says nothing about writes made before that failure: two FUA writes at
 * once, the first one's fdatasync fails and drops both pages, the second
 * one's succeeds.  Hence the rule: an op's sync succeeds only if no sync
 * of the file failed since the op began (seen, sampled before its
 * writes).  The syncs are serialized so that a failure is counted before
 * any later sync returns.  They are also numbered as they begin: one
 * that begins after an op's writes completed covers them (fdatasync
 * writes back and flushes the whole inode), so an op that waited for
 * the lock while such a sync ran and succeeded takes its result instead
 * of syncing again (a group commit: at queue depth 16, two syncs serve
 * the sixteen ops where sixteen ran one after the other).  A failure is
 * only returned: the cache sees it (a failed flush, or a FUA op that
 * failed) and its ledger's rule alone makes it a loss. */
static int
file_sync (struct file_backing *fb, int fd, uint64_t seen)
{
  /* The op's writes are done: any sync numbered above this covers them. */
  uint64_t covered_by = atomic_load (&fb->sync_begun) + 1;
  int r = 0, err = 0;

  lock_or_die (&fb->sync_lock);
  if (fb->sync_good < covered_by) {
    uint64_t me = atomic_fetch_add (&fb->sync_begun, 1) + 1;
    if (fdatasync (fd) == -1 && errno != EINVAL && errno != EROFS) {
      /* (EINVAL/EROFS: this kind of file has nothing to sync.) */
      err = errno;
      atomic_fetch_add (&fb->sync_failures, 1);
      r = -1;
    } else {
      fb->sync_good = me;
    }
  }
  if (r == 0 && atomic_load (&fb->sync_failures) != seen) {
    err = EIO;                  /* another op's sync failed meanwhile */
    r = -1;
  }
  unlock_or_die (&fb->sync_lock);
  errno = err;
  return r;
}

static int
file_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct file_backing *fb = to_file (b);
  uint64_t seen = file_sync_seen (fb);

  if (check_writable (b, len, off) == -1)
    return -1;
  if (file_write_data (fb, buf, len, off, flags & BACKING_DIRECT) == -1)
    return -1;
  return (flags & BACKING_FUA) ? file_sync (fb, fb->fd, seen) : 0;
}

/* fallocate with one method; on "unsupported" clears *flag for good.
 * Returns 0 done, 1 method unavailable, -1 error. */
static int
try_fallocate (struct file_backing *fb, atomic_int *flag, int mode,
               uint64_t len, uint64_t off)
{
  if (!atomic_load (flag))
    return 1;
  for (;;) {
    if (fallocate (fb->fd, mode, off, len) == 0)
      return 0;
    if (errno == EINTR)
      continue;
    if (is_unsupported (errno)) {
      atomic_store (flag, 0);
      return 1;
    }
    return -1;
  }
}

/* The slow way: write zeroes from the shared zero buffer, splitting at
 * io_align boundaries so O_DIRECT chunks start aligned. */
static int
zero_by_writing (struct file_backing *fb, uint64_t len, uint64_t off)
{
  const uint64_t a = fb->b.io_align;

  while (len > 0) {
    uint64_t n = MIN (len, (uint64_t) FILE_BOUNCE_SIZE);
    if (off % a)
      n = MIN (len, a - off % a);
    if (file_write_data (fb, fb->zero_buf, n, off, false) == -1)
      return -1;
    off += n;
    len -= n;
  }
  return 0;
}

static int
blk_zeroout (struct file_backing *fb, uint64_t len, uint64_t off)
{
  uint64_t range[2] = { off, len };

  if (!atomic_load (&fb->can_zeroout))
    return 1;
  if (ioctl (fb->fd, BLKZEROOUT, range) == 0)
    return 0;
  if (is_unsupported (errno) || errno == EINVAL) {
    atomic_store (&fb->can_zeroout, 0);
    return 1;
  }
  return -1;
}

/* Zero a block device range whose ends are sector aligned. */
static int
blk_zero_aligned (struct file_backing *fb, uint64_t len, uint64_t off,
                  unsigned flags)
{
  int r;

  /* PUNCH_HOLE on a block device never falls back to writing: fast. */
  if (flags & BACKING_MAY_TRIM) {
    r = try_fallocate (fb, &fb->can_punch,
                       FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len, off);
    if (r <= 0)
      return r;
  }
  /* ZERO_RANGE and BLKZEROOUT may make the kernel write zero pages. */
  if (flags & BACKING_FAST_ZERO) {
    errno = ENOTSUP;
    return -1;
  }
  r = try_fallocate (fb, &fb->can_zero_range,
                     FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, len, off);
  if (r <= 0)
    return r;
  r = blk_zeroout (fb, len, off);
  if (r <= 0)
    return r;
  return zero_by_writing (fb, len, off);
}

static int
blk_zero (struct file_backing *fb, uint64_t len, uint64_t off, unsigned flags)
{
  const uint64_t s = fb->sector, end = off + len;
  uint64_t mid = ROUND_UP (off, s), mend = ROUND_DOWN (end, s);

  if (mid >= mend) {            /* less than one whole sector */
    if (flags & BACKING_FAST_ZERO) {
      errno = ENOTSUP;
      return -1;
    }
    return zero_by_writing (fb, len, off);
  }
  if (flags & BACKING_FAST_ZERO && (mid != off || mend != end)) {
    errno = ENOTSUP;
    return -1;
  }
  if (mid > off && zero_by_writing (fb, mid - off, off) == -1)
    return -1;
  if (blk_zero_aligned (fb, mend - mid, mid, flags) == -1)
    return -1;
  if (end > mend && zero_by_writing (fb, end - mend, mend) == -1)
    return -1;
  return 0;
}

/* The ladder of nbdkit's file plugin: where holes are allowed (no
 * NBD_CMD_FLAG_NO_HOLE) punch them, so zeroing keeps a sparse file sparse;
 * otherwise allocate zeroes (ZERO_RANGE), then punch and re-allocate, then
 * write them. */
static int
reg_zero (struct file_backing *fb, uint64_t len, uint64_t off, unsigned flags)
{
  int r;

  if (flags & BACKING_MAY_TRIM) {
    r = try_fallocate (fb, &fb->can_punch,
                       FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len, off);
    if (r <= 0)
      return r;
  }
  r = try_fallocate (fb, &fb->can_zero_range,
                     FALLOC_FL_ZERO_RANGE | FALLOC_FL_KEEP_SIZE, len, off);
  if (r <= 0)
    return r;
  /* No ZERO_RANGE (tmpfs, old kernels): punch, then allocate again so the
   * caller still gets allocated zeroes it did not allow us to trim. */
  if (atomic_load (&fb->can_punch) && atomic_load (&fb->can_alloc)) {
    r = try_fallocate (fb, &fb->can_punch,
                       FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len, off);
    if (r == -1)
      return -1;
    if (r == 0) {
      /* The range reads as zeroes already; allocation is best effort. */
      if (try_fallocate (fb, &fb->can_alloc, FALLOC_FL_KEEP_SIZE, len,
                         off) == -1 && errno != ENOSPC)
        return -1;
      return 0;
    }
  }
  if (flags & BACKING_FAST_ZERO) {
    errno = ENOTSUP;
    return -1;
  }
  return zero_by_writing (fb, len, off);
}

static int
file_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct file_backing *fb = to_file (b);
  uint64_t seen = file_sync_seen (fb);
  int r;

  if (check_writable (b, len, off) == -1)
    return -1;
  if (len == 0)
    return 0;
  r = fb->is_blk ? blk_zero (fb, len, off, flags)
                 : reg_zero (fb, len, off, flags);
  if (r == -1)
    return -1;
  return (flags & BACKING_FUA) ? file_sync (fb, fb->fd, seen) : 0;
}

static int
file_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct file_backing *fb = to_file (b);
  uint64_t seen = file_sync_seen (fb);
  int r;

  if (check_writable (b, len, off) == -1)
    return -1;
  if (len == 0)
    return 0;
  if (fb->is_blk && (off % fb->sector || len % fb->sector)) {
    /* Shrink to whole sectors: trim is advisory. */
    uint64_t s = ROUND_UP (off, fb->sector), e = ROUND_DOWN (off + len,
                                                             fb->sector);
    if (s >= e)
      return 0;
    off = s;
    len = e - s;
  }
  r = try_fallocate (fb, &fb->can_punch,
                     FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, len, off);
  if (r == -1)
    return -1;
  /* r == 1: no hole punching here; trim is advisory, so done. */
  return (flags & BACKING_FUA) ? file_sync (fb, fb->fd, seen) : 0;
}

static int
file_flush (struct backing *b)
{
  struct file_backing *fb = to_file (b);

  if ((b->caps & BACKING_READ_ONLY) || atomic_load (&b->released))
    return 0;     /* released: the release flushed what it wrote */
  /* What this flush covers was written before it began: a sync that
   * failed since may have dropped it (fd_flush's own report of that
   * error may have gone to a concurrent flush). */
  return file_sync (fb, fb->fd_flush, file_sync_seen (fb));
}

/* foliod release: the image's locks go (all of them are on fd_buf's open
 * file description); this foliod goes on reading it unlocked, as
 * qemu-img -U does, while the next host writes it. */
static int
file_release (struct backing *b)
{
  return file_unlock_image (to_file (b)->fd_buf);
}

static void
ext_set (struct backing_extent *ext, uint64_t off, uint64_t len,
         enum backing_extent_type t)
{
  ext->offset = off;
  ext->length = len;
  ext->type = t;
}

/* SEEK_DATA/SEEK_HOLE.  lseek moves the shared file position, which no
 * other op uses (all I/O is positional), so concurrent calls are fine. */
static int
file_map (struct backing *b, uint64_t off, uint64_t len,
          struct backing_extent *ext)
{
  struct file_backing *fb = to_file (b);
  off_t d, h;

  if (len == 0 || check_range (b, len, off) == -1) {
    errno = EINVAL;
    return -1;
  }
  if (!atomic_load (&fb->can_seek_data)) {
    ext_set (ext, off, len, BACKING_DATA);
    return 0;
  }
  d = lseek (fb->fd_buf, off, SEEK_DATA);
  if (d == -1) {
    if (errno == ENXIO) {       /* no data from off to end of file */
      ext_set (ext, off, len, BACKING_HOLE);
      return 0;
    }
    if (errno == EINVAL || is_unsupported (errno)) {
      atomic_store (&fb->can_seek_data, 0);
      ext_set (ext, off, len, BACKING_DATA);
      return 0;
    }
    return -1;
  }
  if ((uint64_t) d > off) {
    ext_set (ext, off, MIN (len, (uint64_t) d - off), BACKING_HOLE);
    return 0;
  }
  h = lseek (fb->fd_buf, off, SEEK_HOLE);
  if (h == -1 || (uint64_t) h <= off) {
    ext_set (ext, off, len, BACKING_DATA);
    return 0;
  }
  ext_set (ext, off, MIN (len, (uint64_t) h - off), BACKING_DATA);
  return 0;
}

static void
file_close (struct backing *b)
{
  struct file_backing *fb = to_file (b);
  struct file_bounce *p;
  unsigned i;

  if (fb->fd_dio >= 0)
    close (fb->fd_dio);         /* fd is fd_dio or fd_buf */
  if (fb->fd_flush >= 0 && fb->fd_flush != fb->fd_buf)
    close (fb->fd_flush);
  if (fb->fd_buf >= 0)
    close (fb->fd_buf);
  while ((p = fb->pool) != NULL) {
    fb->pool = p->next;
    free (p);
  }
  free (fb->zero_buf);
  pthread_mutex_destroy (&fb->pool_lock);
  for (i = 0; i < FILE_RMW_STRIPES; i++)
    pthread_mutex_destroy (&fb->rmw_lock[i]);
  pthread_mutex_destroy (&fb->sync_lock);
  free (fb);
}

static const struct backing_ops file_ops = {
  .name = "file",
  .read = file_read,
  .write = file_write,
  .zero = file_zero,
  .trim = file_trim,
  .flush = file_flush,
  .map = file_map,
  .stats = NULL,
  .release = file_release,
  .close = file_close,
};

/* Try one alignment with a read the kernel must check: a buffer aligned to
 * exactly a (not to 2a), a bytes at offset 0.  1 ok, 0 refused, -1 error. */
static int
probe_align (int fd, uint32_t a)
{
  void *mem;
  ssize_t r;

  if (posix_memalign (&mem, 8192, 16384) != 0)
    return -1;
  do
    r = pread (fd, (char *) mem + (a % 8192 ? a : 0), a, 0);
  while (r == -1 && errno == EINTR);
  free (mem);
  if (r >= 0)
    return 1;
  return errno == EINVAL ? 0 : -1;
}

/* Find io_align for the O_DIRECT fd.  Returns 0, or -1 when direct I/O
 * turns out not to work (the caller falls back to buffered I/O). */
static int
find_alignment (struct file_backing *fb, int fd, unsigned test_flags)
{
  uint32_t oa = 0, ma = 0;
  int r = 0;

  if (fb->is_blk) {
    oa = ma = fb->sector;
  }
  else {
    if (!(test_flags & FILE_TEST_NO_STATX))
      r = file_statx_dioalign (fd, &oa, &ma);
    if (r == -1)
      return -1;
    if (r == 0) {
      static const uint32_t tries[] = { 512, 4096 };
      unsigned i;
      for (i = 0; i < 2 && r == 0; i++) {
        r = probe_align (fd, tries[i]);
        if (r == 1)
          oa = ma = tries[i];
      }
      if (r != 1)
        return -1;
    }
  }
  fb->dio_align = MAX (oa, ma);
  fb->mem_align = ma;
  return 0;
}

static void
file_init_locks (struct file_backing *fb)
{
  unsigned i;

  pthread_mutex_init (&fb->pool_lock, NULL);
  for (i = 0; i < FILE_RMW_STRIPES; i++)
    pthread_mutex_init (&fb->rmw_lock[i], NULL);
  pthread_mutex_init (&fb->sync_lock, NULL);
}

/* Does PUNCH_HOLE work?  Punching past end of file (KEEP_SIZE) changes
 * nothing, so it is a harmless probe. */
static void
probe_punch (struct file_backing *fb)
{
  if (fb->is_blk)
    return;                     /* found out on first use */
  if (fallocate (fb->fd_buf, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                 ROUND_UP (fb->b.size, 4096), 4096) == -1 &&
      is_unsupported (errno))
    atomic_store (&fb->can_punch, 0);
}

static int
open_sizes (struct file_backing *fb, const char *path, char *err,
            size_t errlen)
{
  struct stat st;
  int ss;

  if (fstat (fb->fd_buf, &st) == -1) {
    snprintf (err, errlen, "%s: fstat: %s", path, strerror (errno));
    return -1;
  }
  if (S_ISREG (st.st_mode)) {
    fb->b.size = st.st_size;
    fb->sector = 512;
    return 0;
  }
  if (!S_ISBLK (st.st_mode)) {
    snprintf (err, errlen, "%s: not a regular file or block device", path);
    return -1;
  }
  fb->is_blk = 1;
  if (ioctl (fb->fd_buf, BLKGETSIZE64, &fb->b.size) == -1) {
    snprintf (err, errlen, "%s: BLKGETSIZE64: %s", path, strerror (errno));
    return -1;
  }
  if (ioctl (fb->fd_buf, BLKSSZGET, &ss) == -1 || ss <= 0)
    ss = 512;
  fb->sector = ss;
  return 0;
}

/* A second open of the same inode (not of the path, which may have been
 * renamed meanwhile) for flush; without /proc, flush shares fd_buf. */
static void
open_flush_fd (struct file_backing *fb)
{
  char p[64];

  snprintf (p, sizeof p, "/proc/self/fd/%d", fb->fd_buf);
  fb->fd_flush = open (p, O_RDONLY | O_CLOEXEC);
  if (fb->fd_flush == -1)
    fb->fd_flush = fb->fd_buf;
}

/* Open the O_DIRECT fd and find its alignment.  With all, every read and
 * write uses it (b.direct); else only writes that ask (BACKING_DIRECT).
 * On refusal stay buffered (b.direct = 0, the caller logs it); without
 * all, any failure just leaves the writes buffered. */
static int
open_direct (struct file_backing *fb, const char *path, int flags, bool all,
             unsigned test_flags, char *err, size_t errlen)
{
  int fd;

  if (test_flags & FILE_TEST_REFUSE_DIRECT) {
    fd = -1;
    errno = EINVAL;
  }
  else
    fd = open (path, flags | O_DIRECT);
  if (fd == -1) {
    if (errno == EINVAL || !all)
      return 0;
    snprintf (err, errlen, "%s: open O_DIRECT: %s", path, strerror (errno));
    return -1;
  }
  if (find_alignment (fb, fd, test_flags) == -1) {
    close (fd);
    fb->dio_align = 1;
    fb->mem_align = 1;
    return 0;
  }
  fb->fd_dio = fd;
  fb->direct_end = ROUND_DOWN (fb->b.size, fb->dio_align);
  if (all) {
    fb->fd = fd;
    fb->b.direct = 1;
    fb->b.io_align = fb->dio_align;
  }
  return 0;
}

struct backing *
backing_file_open_flags (const char *path, const struct backing_opts *o,
                         unsigned test_flags, char *err, size_t errlen)
{
  static const struct backing_opts defaults;
  struct file_backing *fb;
  int flags;

  if (!o)
    o = &defaults;
  if (!path || !*path) {
    snprintf (err, errlen, "file backing: empty path");
    return NULL;
  }
  fb = calloc (1, sizeof *fb);
  if (!fb) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    return NULL;
  }
  fb->b.ops = &file_ops;
  fb->b.io_align = fb->dio_align = 1;
  fb->mem_align = 1;
  fb->fd = fb->fd_buf = fb->fd_flush = fb->fd_dio = -1;
  atomic_init (&fb->can_zero_range, 1);
  atomic_init (&fb->can_punch, 1);
  atomic_init (&fb->can_alloc, 1);
  atomic_init (&fb->can_zeroout, 1);
  atomic_init (&fb->can_seek_data, 1);
  file_init_locks (fb);

  flags = (o->read_only ? O_RDONLY : O_RDWR) | O_CLOEXEC;
  fb->fd_buf = open (path, flags);
  if (fb->fd_buf == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    goto fail;
  }
  fb->fd = fb->fd_buf;
  if (open_sizes (fb, path, err, errlen) == -1)
    goto fail;
  /* Lock before probing: what is probed must not change meanwhile. */
  if (!o->no_locking &&
      file_lock_image (fb->fd_buf, path, !o->read_only, err, errlen) == -1)
    goto fail;
  if (!o->format_raw &&
      file_probe_format (fb->fd_buf, fb->b.size, path, err, errlen) == -1)
    goto fail;
  /* A writable, buffered regular file: large writes the cache writes back
   * may still skip the page cache (BACKING_DIRECT), the copy costing more
   * than the device write (measured on files; block devices stay as they
   * were, their writes reaching the device through its page cache). */
  if ((o->direct || (!o->read_only && !fb->is_blk)) &&
      open_direct (fb, path, flags, o->direct, test_flags, err, errlen) == -1)
    goto fail;

  if (o->read_only)
    fb->b.caps |= BACKING_READ_ONLY;
  else {
    if (posix_memalign (&fb->zero_buf, MAX (fb->dio_align, 4096u),
                        FILE_BOUNCE_SIZE) != 0) {
      snprintf (err, errlen, "%s: out of memory", path);
      goto fail;
    }
    memset (fb->zero_buf, 0, FILE_BOUNCE_SIZE);
    open_flush_fd (fb);
    probe_punch (fb);
    if (atomic_load (&fb->can_punch))
      fb->b.caps |= BACKING_CAN_TRIM | BACKING_CAN_ZERO | BACKING_CAN_FAST_ZERO;
  }
  if (!fb->is_blk)
    fb->b.caps |= BACKING_CAN_MAP;
  /* Writes sit in the page cache (or a device's volatile cache) until an
   * fdatasync succeeds. */
  fb->b.caps |= BACKING_CAN_DIRECT | BACKING_VOLATILE | BACKING_SYNC_FINAL;
  return &fb->b;

 fail:
  {
    int saved = errno;   /* EMEDIUMTYPE from the probe: callers look */
    file_close (&fb->b);
    errno = saved;
  }
  return NULL;
}

struct backing *
backing_file_open (const char *path, const struct backing_opts *o,
                   char *err, size_t errlen)
{
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic push     /* -fanalyzer: the failed open's close then */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak" /* errno = saved */
#endif
  return backing_file_open_flags (path, o, 0, err, errlen);
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic pop
#endif
}
