/* The file backing's private state, shared by file.c, file-align.c and the
 * unit tests (which flip the method flags to walk the fallback paths).
 */
#ifndef FOLIOD_BACKING_FILE_PRIVATE_H
#define FOLIOD_BACKING_FILE_PRIVATE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "foliod/backing.h"

/* Bounce buffers are this big; larger unaligned requests go through in
 * pieces of this size. */
#define FILE_BOUNCE_SIZE (1u << 20)

/* Reads at least this long use the O_DIRECT fd where there is one, even
 * when the backing is buffered: the cache above keeps what it reads, and a
 * second copy in the page cache would cost the copy (and, for a stream,
 * the memory) for nothing; shorter reads keep the kernel's readahead. */
#define FILE_DIRECT_READ_MIN (256u << 10)

/* Read-modify-write of a partial edge sector holds one of these locks
 * (chosen by sector number), so two partial writes into different bytes
 * of the same sector cannot lose each other's update. */
#define FILE_RMW_STRIPES 64

struct file_bounce {
  struct file_bounce *next;     /* free list link, while unused */
};

struct file_backing {
  struct backing b;             /* first: the cache sees only this */
  int fd;                       /* O_DIRECT when b.direct, else == fd_buf */
  int fd_dio;                   /* the O_DIRECT fd (== fd when b.direct), or
                                 * -1: writes with BACKING_DIRECT use it */
  int fd_buf;                   /* buffered fd: tail past direct_end */
  int fd_flush;                 /* flush's own open of the file: Linux
                                 * reports a writeback error once per open
                                 * file description, so a FUA op's failing
                                 * fdatasync (on fd) cannot hide it from
                                 * the next flush */
  int is_blk;                   /* block device */
  uint32_t sector;              /* logical sector size (block device) */
  uint32_t dio_align;           /* offset and length alignment O_DIRECT
                                 * needs (b.io_align when b.direct) */
  uint32_t mem_align;           /* buffer alignment O_DIRECT needs */
  uint64_t direct_end;          /* size rounded down to dio_align; O_DIRECT
                                 * only below, the partial last sector goes
                                 * through fd_buf so the file never grows */

  /* Methods known to work.  Start at 1, cleared for good the first time
   * the kernel answers EOPNOTSUPP.  Atomic: any thread may clear them. */
  atomic_int can_zero_range;    /* fallocate FALLOC_FL_ZERO_RANGE */
  atomic_int can_punch;         /* fallocate PUNCH_HOLE|KEEP_SIZE */
  atomic_int can_alloc;         /* fallocate mode 0 (re-allocate) */
  atomic_int can_zeroout;       /* ioctl BLKZEROOUT (block devices) */
  atomic_int can_seek_data;     /* lseek SEEK_DATA/SEEK_HOLE */

  pthread_mutex_t pool_lock;    /* protects pool */
  struct file_bounce *pool;     /* free bounce buffers */
  pthread_mutex_t rmw_lock[FILE_RMW_STRIPES];

  /* Every fdatasync of the file, on any fd, runs under sync_lock, and
   * counts its failure before the lock goes: an op that syncs trusts its
   * fdatasync only if none failed since the op began (file_sync).  The
   * syncs are numbered as they begin; an op whose writes a sync that
   * succeeded covers (it began after them) takes its result. */
  pthread_mutex_t sync_lock;
  atomic_uint_fast64_t sync_failures; /* written under sync_lock */
  atomic_uint_fast64_t sync_begun;    /* written under sync_lock */
  uint64_t sync_good;           /* under sync_lock: the last good one's */

  void *zero_buf;               /* FILE_BOUNCE_SIZE aligned zeroes, never
                                 * written after open, shared read-only */
};

/* Test seam for backing_file_open_flags. */
#define FILE_TEST_REFUSE_DIRECT (1u << 0) /* act as if open(O_DIRECT) gave
                                           * EINVAL (tmpfs before 6.6) */
#define FILE_TEST_NO_STATX      (1u << 1) /* skip statx: probe alignment */

struct backing *backing_file_open_flags (const char *path,
                                         const struct backing_opts *o,
                                         unsigned test_flags,
                                         char *err, size_t errlen);

/* Direct I/O alignment of an open O_DIRECT fd on a regular file, from
 * statx(STATX_DIOALIGN).  Returns 1 and fills both when the kernel told,
 * 0 when it does not know (old kernel or file system), -1 when it says
 * the file does not support direct I/O. */
int file_statx_dioalign (int fd, uint32_t *offset_align, uint32_t *mem_align);

/* Lock the image on fd (open for reading at least) as qemu does, so that
 * neither another foliod nor qemu's tools write it while foliod serves it
 * (see file-lock.c).  Returns 0, or -1 with a one-line reason in err that
 * names the file and the permission in conflict. */
int file_lock_image (int fd, const char *path, int writable, char *err,
                     size_t errlen);

/* Drop every lock file_lock_image took on fd (and none of anyone
 * else's: OFD locks are per open file description).  0, or -1 with
 * errno. */
int file_unlock_image (int fd);

/* Refuse a file holding an image format qemu knows (qcow2, vmdk, ...):
 * foliod serves raw bytes (see file-probe.c).  Returns 0 when none is
 * recognised, -1 with the format and the way out in err. */
int file_probe_format (int fd, uint64_t size, const char *path, char *err,
                       size_t errlen);

#endif /* FOLIOD_BACKING_FILE_PRIVATE_H */
