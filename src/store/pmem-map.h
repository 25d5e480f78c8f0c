/* A store file mapped with libpmem2: a regular file (any file system; DAX
 * with MAP_SYNC where offered) or a device-DAX character device.  libpmem2
 * finds out how stores become persistent (CPU cache flush or msync); this
 * module only opens, locks, sizes and maps, and hands out its functions. */
#ifndef FOLIOD_PMEM_MAP_H
#define FOLIOD_PMEM_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <libpmem2.h>

struct pmem_map {
  int fd;
  struct pmem2_map *map;
  unsigned char *base;          /* the whole file, mapped shared */
  size_t size;                  /* bytes mapped (the file's size) */
  enum pmem2_granularity gran;  /* what libpmem2 found */
  bool devdax;                  /* a device-DAX character device */
  bool created;                 /* made (or grown from 0 bytes) by this open */
  int sigbus;                   /* pmem_sigbus_watch's handle, 0: none */
  pmem2_persist_fn persist;     /* flush + drain (msync on PAGE) */
  pmem2_flush_fn flush;         /* no drain: batch several, then drain */
  pmem2_drain_fn drain;
  pmem2_memcpy_fn memcpy;       /* non-temporal copy + persist */
  pmem2_memset_fn memset;
  int (*sync) (void *addr, size_t len);  /* PAGE: msync MS_SYNC, 0 or -1 */
};

enum pmem_map_flags {
  PMEM_MAP_READONLY = 1,  /* inspection: read-only, shared lock */
};

/* Open and map path.  A missing (or empty) regular file is created with
 * create_size bytes when create_size > 0; an existing one must hold at
 * least min_size bytes.  The file gets an exclusive lock (shared with
 * PMEM_MAP_READONLY), so a second foliod on it is refused.  Returns 0, or
 * -1 with errno and one line in err naming the file and the reason. */
int pmem_map_open (struct pmem_map *m, const char *path, uint64_t create_size,
                   uint64_t min_size, unsigned flags, char *err, size_t errlen);
void pmem_map_close (struct pmem_map *m);

/* A store over a map that is already set up: store_pmem_open's second
 * half, and how tests run the store over simulated memory (m->map NULL,
 * m->fd -1; the functions, base and size theirs).  Takes m over. */
struct store;
struct store_config;
struct store *store_pmem_open_map (struct pmem_map *m,
                                   const struct store_config *cfg,
                                   char *err, size_t errlen);

/* "byte", "cache-line" or "page". */
const char *pmem_map_granularity_name (enum pmem2_granularity g);

#endif /* FOLIOD_PMEM_MAP_H */
