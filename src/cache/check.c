/* The argument checks of the request paths (ops.h): range, writable,
 * direct.  They read the configuration only. */
#include <errno.h>

#include "cache/ops.h"

int
range_check (const struct cache *c, uint64_t len, uint64_t off)
{
  if (off > c->size || len > c->size - off) {
    errno = EINVAL;
    return -1;
  }
  return 0;
}

int
writable_check (const struct cache *c)
{
  if (c->b->caps & BACKING_READ_ONLY) {
    errno = EPERM;
    return -1;
  }
  return 0;
}

bool
use_direct (const struct cache *c, uint64_t len, unsigned flags)
{
  return (flags & CACHE_DIRECT) || c->cfg.mode == CACHE_NONE ||
         (c->cfg.direct_threshold && len >= c->cfg.direct_threshold);
}
