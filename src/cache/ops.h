/* Helpers shared by the request paths of src/cache/. */
#ifndef FOLIOD_CACHE_OPS_H
#define FOLIOD_CACHE_OPS_H

#include "cache/cache-int.h"

/* cache_write inside: write back before the reply (FUA with flush=backing,
 * writethrough). */
#define CACHE_WRITE_NOW (1u << 16)

/* The argument checks (check.c).  0 if [off, off+len) lies in the export,
 * else -1/EINVAL. */
int range_check (const struct cache *c, uint64_t len, uint64_t off);
/* 0 if the backing may be written, else -1/EPERM. */
int writable_check (const struct cache *c);
/* Does this request bypass the cache (cache=none, direct flag, or at least
 * direct_threshold bytes)? */
bool use_direct (const struct cache *c, uint64_t len, unsigned flags);

/* Direct I/O kept coherent with the cache (direct.c). */
int direct_read (struct cache *c, void *buf, uint64_t len, uint64_t off);
int direct_write (struct cache *c, const void *buf, uint64_t len,
                  uint64_t off, unsigned flags);

#endif /* FOLIOD_CACHE_OPS_H */
