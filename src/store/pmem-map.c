/* Opening, locking, sizing and mapping a store file with libpmem2. */
#define _GNU_SOURCE   /* fallocate */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/pmem-map.h"
#include "store/pmem-sigbus.h"

#define FAIL(e, ...) \
  do { snprintf (err, errlen, __VA_ARGS__); errno = (e); return -1; } while (0)

const char *
pmem_map_granularity_name (enum pmem2_granularity g)
{
  switch (g) {
  case PMEM2_GRANULARITY_BYTE: return "byte";
  case PMEM2_GRANULARITY_CACHE_LINE: return "cache-line";
  case PMEM2_GRANULARITY_PAGE: return "page";
  }
  return "unknown";
}

/* open(2) the store, creating it when allowed (*made then). */
static int
map_open_fd (struct pmem_map *m, const char *path, uint64_t create_size,
             unsigned flags, bool *made, char *err, size_t errlen)
{
  int mode = (flags & PMEM_MAP_READONLY) ? O_RDONLY : O_RDWR;

  m->fd = open (path, mode | O_CLOEXEC);
  if (m->fd == -1 && errno == ENOENT && create_size > 0 && mode == O_RDWR) {
    m->fd = open (path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    *made = m->created = m->fd != -1;
  }
  if (m->fd == -1 && (errno == EACCES || errno == EROFS || errno == EPERM))
    FAIL (errno, "%s: store is read-only (%s)", path, strerror (errno));
  if (m->fd == -1)
    FAIL (errno, "%s: %s", path, strerror (errno));
  return 0;
}

/* A second foliod on the same store would corrupt it: refuse it here.
 * flock locks belong to the open file, so this also holds within one
 * process, and the kernel drops them when the process dies. */
static int
map_lock (struct pmem_map *m, const char *path, unsigned flags,
          char *err, size_t errlen)
{
  int op = (flags & PMEM_MAP_READONLY) ? LOCK_SH : LOCK_EX;

  if (flock (m->fd, op | LOCK_NB) == 0)
    return 0;
  if (errno == EWOULDBLOCK)
    FAIL (EBUSY, "%s: store is in use by another foliod (locked)", path);
  FAIL (errno, "%s: flock: %s", path, strerror (errno));
}

/* A store of full size may still have holes (made with truncate -s, or
 * copied by cp or rsync): the first store into a hole on a full file
 * system raises SIGBUS, which would kill every export.  Allocate every
 * block now (a no-op where allocated) or refuse the store.  fallocate
 * mode 0, not posix_fallocate: glibc's emulation writes into the file. */
static int
map_allocate (struct pmem_map *m, const char *path, uint64_t size,
              char *err, size_t errlen)
{
  if (fallocate (m->fd, 0, 0, (off_t) size) == 0)
    return 0;
  if (errno == EOPNOTSUPP)
    return 0;   /* nothing to allocate with (the file system has no holes
                 * or no fallocate: the SIGBUS handler names the store) */
  FAIL (errno, "%s: cannot allocate the store (%" PRIu64 " bytes): %s", path,
        size, strerror (errno));
}

/* Check the file's kind, mode and size; give a new file its size. */
static int
map_size (struct pmem_map *m, const char *path, uint64_t create_size,
          uint64_t min_size, unsigned flags, char *err, size_t errlen)
{
  struct stat st;
  int r;

  if (fstat (m->fd, &st) == -1)
    FAIL (errno, "%s: fstat: %s", path, strerror (errno));
  m->devdax = S_ISCHR (st.st_mode);
  if (m->devdax)
    return 0;   /* libpmem2 tells a device-DAX apart and sizes it */
  if (!S_ISREG (st.st_mode))
    FAIL (EINVAL, "%s: not a regular file or device-DAX", path);
  /* root opens a 0444 file for writing: keep the owner's intent. */
  if (!(flags & PMEM_MAP_READONLY) && (st.st_mode & 0222) == 0)
    FAIL (EACCES, "%s: store is read-only (mode %04o)", path,
          (unsigned) (st.st_mode & 07777));
  if (st.st_size == 0 && create_size > 0 && !(flags & PMEM_MAP_READONLY)) {
    r = posix_fallocate (m->fd, 0, (off_t) create_size);
    if (r != 0)
      FAIL (r, "%s: cannot allocate %" PRIu64 " bytes: %s", path,
            create_size, strerror (r));
    m->created = true;
    return 0;
  }
  if ((uint64_t) st.st_size < min_size)
    FAIL (ENOSPC, "%s: store too small: %" PRIu64 " bytes, needs %" PRIu64,
          path, (uint64_t) st.st_size, min_size);
  if (!(flags & PMEM_MAP_READONLY))
    return map_allocate (m, path, (uint64_t) st.st_size, err, errlen);
  return 0;
}

static int
map_msync (void *addr, size_t len)
{
  return msync (addr, len, MS_SYNC);
}

/* Map the whole file, asking for PAGE granularity at least, so that a
 * plain file (msync) is accepted and DAX reports CACHE_LINE or BYTE. */
static int
map_map (struct pmem_map *m, const char *path, unsigned flags,
         char *err, size_t errlen)
{
  struct pmem2_source *src = NULL;
  struct pmem2_config *cfg = NULL;
  int r;

  r = pmem2_source_from_fd (&src, m->fd);
  if (r == 0)
    r = pmem2_config_new (&cfg);
  if (r == 0)
    r = pmem2_config_set_required_store_granularity (cfg,
                                                     PMEM2_GRANULARITY_PAGE);
  if (r == 0 && (flags & PMEM_MAP_READONLY))
    r = pmem2_config_set_protection (cfg, PMEM2_PROT_READ);
  if (r == 0)
    r = pmem2_map_new (&m->map, cfg, src);
  if (r != 0)
    snprintf (err, errlen, "%s: cannot map: %s", path, pmem2_errormsg ());
  pmem2_config_delete (&cfg);
  pmem2_source_delete (&src);
  if (r != 0) {
    /* -errno, or a PMEM2_E_* code (pmem2_err_to_errno is not exported) */
    errno = r > PMEM2_E_UNKNOWN ? -r : EINVAL;
    return -1;
  }
  m->base = pmem2_map_get_address (m->map);
  m->size = pmem2_map_get_size (m->map);
  m->gran = pmem2_map_get_store_granularity (m->map);
  m->persist = pmem2_get_persist_fn (m->map);
  m->flush = pmem2_get_flush_fn (m->map);
  m->drain = pmem2_get_drain_fn (m->map);
  m->memcpy = pmem2_get_memcpy_fn (m->map);
  m->memset = pmem2_get_memset_fn (m->map);
  m->sync = map_msync;
  return 0;
}

int
pmem_map_open (struct pmem_map *m, const char *path, uint64_t create_size,
               uint64_t min_size, unsigned flags, char *err, size_t errlen)
{
  bool made = false;

  memset (m, 0, sizeof *m);
  m->fd = -1;
  if (map_open_fd (m, path, create_size, flags, &made, err, errlen) == -1)
    return -1;
  if (map_lock (m, path, flags, err, errlen) == 0 &&
      map_size (m, path, create_size, min_size, flags, err, errlen) == 0 &&
      map_map (m, path, flags, err, errlen) == 0) {
    m->sigbus = pmem_sigbus_watch (m->base, m->size, path);
    return 0;
  }
  int saved = errno;
  if (made)
    unlink (path);      /* do not leave a store we made half-way */
  close (m->fd);
  m->fd = -1;
  errno = saved;
  return -1;
}

void
pmem_map_close (struct pmem_map *m)
{
  pmem_sigbus_forget (m->sigbus);
  m->sigbus = 0;
  if (m->map)
    pmem2_map_delete (&m->map);
  if (m->fd != -1)
    close (m->fd);      /* drops the lock */
  m->fd = -1;
  m->base = NULL;
}
