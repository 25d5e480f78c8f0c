/* The SSD log store's superblocks, checksums, sizing and its device on a
 * file or a block device. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "store/ssd-layout.h"

_Static_assert (sizeof (struct ssd_super) <= SSD_SUPER_COPY,
                "a superblock copy must fit its area");
_Static_assert (sizeof (struct ssd_entry) == 24, "entries are on disk");
_Static_assert (sizeof (struct ssd_batch) == 72, "batch header on disk");

#define FAIL(e, ...) \
  do { snprintf (err, errlen, __VA_ARGS__); errno = (e); return -1; } while (0)

uint32_t
ssd_data_crc (const void *p, size_t len)
{
  return (uint32_t) crc32 (0, p, (uInt) len);
}

uint32_t
ssd_batch_crc (const struct ssd_batch *b)
{
  struct ssd_batch h = *b;
  uint32_t c;

  h.crc = 0;
  c = (uint32_t) crc32 (0, (const Bytef *) &h, sizeof h);
  return (uint32_t) crc32 (c, (const Bytef *) (b + 1),
                           SSD_HEADER_BYTES - sizeof h);
}

static uint64_t
round_up (uint64_t v, uint64_t a)
{
  return (v + a - 1) / a * a;
}

/* A compaction writes every live block of every slot once, with a header
 * per batch, plus at most one batch lost at the end of the ring. */
uint64_t
ssd_compaction_max (uint32_t nslots, uint32_t folio_size, uint32_t block_size)
{
  uint64_t blocks = (uint64_t) nslots * (folio_size / block_size);
  uint64_t per = SSD_BATCH_DATA / block_size;
  uint64_t batch_max;

  if (per > SSD_ENTRIES)
    per = SSD_ENTRIES;
  if (per == 0)
    per = 1;
  batch_max = SSD_ALIGN + round_up (per * block_size, SSD_ALIGN);
  return blocks * block_size + (blocks + per - 1) / per * 2 * SSD_ALIGN +
         batch_max;
}

uint64_t
ssd_log_default (uint64_t cache_bytes)
{
  uint64_t v = 4 * cache_bytes;
  return round_up (v < (64u << 20) ? 64u << 20 : v, 1u << 20);
}

/* --- the device: a file or a block device --- */

struct ssd_fdev {
  struct ssd_dev d;
  int fd;
};

static int
fdev_pwrite (struct ssd_dev *d, const void *buf, size_t len, uint64_t off)
{
  int fd = ((struct ssd_fdev *) d)->fd;
  const char *p = buf;

  while (len > 0) {
    ssize_t n = pwrite (fd, p, len, (off_t) off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;
      return -1;
    }
    p += n; off += (uint64_t) n; len -= (size_t) n;
  }
  return 0;
}

static int
fdev_pread (struct ssd_dev *d, void *buf, size_t len, uint64_t off)
{
  int fd = ((struct ssd_fdev *) d)->fd;
  char *p = buf;

  while (len > 0) {
    ssize_t n = pread (fd, p, len, (off_t) off);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      if (n == 0)
        errno = EIO;     /* past the end: a truncated store */
      return -1;
    }
    p += n; off += (uint64_t) n; len -= (size_t) n;
  }
  return 0;
}

static int
fdev_flush (struct ssd_dev *d)
{
  return fdatasync (((struct ssd_fdev *) d)->fd);
}

static void
fdev_close (struct ssd_dev *d)
{
  close (((struct ssd_fdev *) d)->fd);
  free (d);
}

static const struct ssd_dev_ops fdev_ops = {
  fdev_pwrite, fdev_pread, fdev_flush, fdev_close,
};

static int
zero_fill (int fd, uint64_t size)
{
  const size_t chunk = 1u << 20;
  void *z;
  int r = 0;

  if (posix_memalign (&z, SSD_ALIGN, chunk) != 0) {
    errno = ENOMEM;
    return -1;
  }
  memset (z, 0, chunk);
  for (uint64_t off = 0; off < size && r == 0; off += chunk) {
    size_t n = size - off < chunk ? (size_t) (size - off) : chunk;
    if (pwrite (fd, z, n, (off_t) off) != (ssize_t) n)
      r = -1;
  }
  free (z);
  return r == 0 ? fdatasync (fd) : -1;
}

struct ssd_dev *
ssd_dev_open_file (const char *path, uint64_t create_size, bool readonly,
                   char *err, size_t errlen)
{
  int flags = (readonly ? O_RDONLY : O_RDWR | O_CREAT) | O_CLOEXEC;
  struct ssd_fdev *f;
  struct stat st;
  int fd = open (path, flags | O_DIRECT, 0600);

  /* A file system without O_DIRECT (tmpfs before Linux 6.6): the page
   * cache, still flushed by fdatasync at every sync. */
  if (fd == -1 && errno == EINVAL)
    fd = open (path, flags, 0600);
  if (fd == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    return NULL;
  }
  if (!readonly && flock (fd, LOCK_EX | LOCK_NB) == -1) {
    int e = errno;
    snprintf (err, errlen, "%s: store in use by another process (%s)", path,
              strerror (e));
    close (fd);
    errno = e == EWOULDBLOCK ? EBUSY : e;
    return NULL;
  }
  if (fstat (fd, &st) == -1)
    goto fail;
  f = calloc (1, sizeof *f);
  if (f == NULL)
    goto fail;
  f->d.ops = &fdev_ops;
  f->fd = fd;
  if (S_ISBLK (st.st_mode)) {
    if (ioctl (fd, BLKGETSIZE64, &f->d.size) == -1) {
      free (f);
      goto fail;
    }
  } else if (S_ISREG (st.st_mode)) {
    f->d.size = (uint64_t) st.st_size;
    if (f->d.size == 0 && !readonly && create_size > 0) {
      /* Allocated now: a full file system fails here, not at a write;
       * and written (zeros): the first lap of the log would otherwise pay
       * at each flush for the file system's conversion of unwritten
       * extents (a journal commit per fdatasync). */
      int r = posix_fallocate (fd, 0, (off_t) create_size);
      if (r == 0 && zero_fill (fd, create_size) == -1)
        r = errno;
      if (r != 0) {
        snprintf (err, errlen, "%s: allocating %" PRIu64 " bytes: %s", path,
                  create_size, strerror (r));
        if (ftruncate (fd, 0) == -1) { /* leave no half-made store */ }
        free (f);
        close (fd);
        errno = r;
        return NULL;
      }
      f->d.size = create_size;
      f->d.created = true;
    } else if (f->d.size > 0 && !readonly &&
               fallocate (fd, 0, 0, (off_t) f->d.size) == -1 &&
               errno != EOPNOTSUPP) {
      /* A log made beforehand with truncate, or copied sparse: its holes
       * allocated now (a no-op where allocated), else a commit would
       * fail with ENOSPC on a filling file system.  fallocate mode 0,
       * not posix_fallocate: glibc's emulation writes into the file. */
      int e = errno;
      snprintf (err, errlen, "%s: cannot allocate the log (%" PRIu64
                " bytes): %s", path, f->d.size, strerror (e));
      free (f);
      close (fd);
      errno = e;
      return NULL;
    }
  } else {
    snprintf (err, errlen, "%s: not a file or a block device", path);
    free (f);
    close (fd);
    errno = EINVAL;
    return NULL;
  }
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic push     /* -fanalyzer: &f->d is f, its first member */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
  return &f->d;
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic pop
#endif

 fail:
  snprintf (err, errlen, "%s: %s", path, strerror (errno));
  close (fd);
  return NULL;
}

/* --- superblocks --- */

static uint32_t
super_crc (const struct ssd_super *sb)
{
  return (uint32_t) crc32 (0, (const Bytef *) sb,
                           offsetof (struct ssd_super, crc));
}

enum copy_state { COPY_OK, COPY_ZERO, COPY_BAD_MAGIC, COPY_BAD_VERSION,
                  COPY_BAD_CRC };

static enum copy_state
super_check (const unsigned char *p, struct ssd_super *sb)
{
  static const unsigned char zero[sizeof *sb];

  memcpy (sb, p, sizeof *sb);
  if (memcmp (sb, zero, sizeof *sb) == 0)
    return COPY_ZERO;
  if (memcmp (sb->magic, SSD_MAGIC, sizeof sb->magic) != 0)
    return COPY_BAD_MAGIC;
  if (sb->version != SSD_VERSION || sb->super_bytes != sizeof *sb)
    return COPY_BAD_VERSION;
  if (sb->crc != super_crc (sb))
    return COPY_BAD_CRC;
  return COPY_OK;
}

int
ssd_super_read (struct ssd_dev *d, struct ssd_super *sb, int *cur,
                bool *other_bad, const char *path, char *err, size_t errlen)
{
  unsigned char *buf;
  struct ssd_super h[2];
  enum copy_state st[2] = { COPY_ZERO, COPY_ZERO };

  if (d->size < SSD_LOG_OFF)
    FAIL (ENOSPC, "%s: store truncated: %" PRIu64 " bytes, smaller than its "
          "superblocks", path, d->size);
  if (posix_memalign ((void **) &buf, SSD_ALIGN, SSD_LOG_OFF) != 0)
    FAIL (ENOMEM, "%s: out of memory", path);
  if (d->ops->pread (d, buf, SSD_LOG_OFF, 0) == -1) {
    int e = errno;
    free (buf);
    FAIL (e, "%s: reading the superblocks: %s", path, strerror (e));
  }
  for (int i = 0; i < 2; i++)
    st[i] = super_check (buf + (size_t) i * SSD_SUPER_COPY, &h[i]);
  free (buf);
  if (st[0] == COPY_OK || st[1] == COPY_OK) {   /* h[i] read for each */
    *cur = st[0] == COPY_OK && (st[1] != COPY_OK || h[0].seq > h[1].seq)
           ? 0 : 1;
    *sb = h[*cur];
    /* Every store has both copies written (a new one twice): a blank
     * one is damage too (a discard). */
    *other_bad = st[1 - *cur] != COPY_OK;
    if (sb->log_off != SSD_LOG_OFF || sb->log_bytes % SSD_ALIGN != 0 ||
        sb->log_bytes < 2 * SSD_ALIGN || sb->block_size == 0 ||
        sb->folio_size % sb->block_size != 0)
      FAIL (EBADMSG, "%s: store superblock is inconsistent", path);
    if (sb->log_off + sb->log_bytes > d->size)
      FAIL (ENOSPC, "%s: store truncated: its superblock needs %" PRIu64
            " bytes, it has %" PRIu64, path, sb->log_off + sb->log_bytes,
            d->size);
    return 0;
  }
  if (st[0] == COPY_ZERO && st[1] == COPY_ZERO)
    return 1;
  if (st[0] == COPY_BAD_VERSION || st[1] == COPY_BAD_VERSION)
    FAIL (EPROTO, "%s: ssd store layout version %" PRIu32 "; this foliod "
          "reads version %d", path,
          h[st[0] == COPY_BAD_VERSION ? 0 : 1].version, SSD_VERSION);
  if (st[0] == COPY_BAD_CRC || st[1] == COPY_BAD_CRC)
    FAIL (EBADMSG, "%s: both store superblocks are corrupt", path);
  FAIL (EINVAL, "%s: not a foliod ssd store (bad magic)", path);
}

int
ssd_super_write (struct ssd_dev *d, struct ssd_super *sb, int *cur)
{
  unsigned char *buf;
  int next = 1 - *cur, r;

  if (posix_memalign ((void **) &buf, SSD_ALIGN, SSD_SUPER_COPY) != 0) {
    errno = ENOMEM;
    return -1;
  }
  sb->seq++;
  sb->crc = super_crc (sb);
  memset (buf, 0, SSD_SUPER_COPY);
  memcpy (buf, sb, sizeof *sb);
  r = d->ops->pwrite (d, buf, SSD_SUPER_COPY,
                      (uint64_t) next * SSD_SUPER_COPY);
  free (buf);
  if (r == 0)
    *cur = next;
  return r;
}
