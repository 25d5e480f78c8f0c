/* One ublk request on the cache: the kernel's operations mapped to the
 * cache's, as the NBD server maps its commands (src/server/execute.c):
 *   READ          cache_read
 *   WRITE         cache_write, CACHE_FUA with REQ_FUA
 *   FLUSH         cache_flush
 *   DISCARD       cache_trim
 *   WRITE_ZEROES  cache_zero; a hole is fine unless REQ_NOUNMAP
 * Under nowait only a READ or a WRITE without FUA of at most
 * UBLK_INLINE_MAX bytes is tried, with CACHE_NOWAIT: the queue thread
 * answers hits without a thread switch and gives the rest to a worker.
 */
#include <errno.h>

#include "foliod/cache.h"
#include "foliod/export.h"
#include "ublk/internal.h"

/* -errno for the kernel; -EIO when errno says nothing. */
static int
exec_error (void)
{
  return errno > 0 ? -errno : -EIO;
}

/* The request on the cache, once admitted. */
static int
exec_op (struct cache *c, const struct ublksrv_io_desc *iod, void *buf,
         bool nowait)
{
  unsigned op = ublksrv_get_op (iod);
  uint64_t off = iod->start_sector << 9, len = (uint64_t) iod->nr_sectors << 9;
  unsigned fua = (iod->op_flags & UBLK_IO_F_FUA) ? CACHE_FUA : 0;
  unsigned f = nowait ? CACHE_NOWAIT : 0;
  int r;

  switch (op) {
  case UBLK_IO_OP_READ:
    r = len ? cache_read (c, buf, len, off, f) : 0;
    break;
  case UBLK_IO_OP_WRITE:
    r = len ? cache_write (c, buf, len, off, f | fua) : 0;
    break;
  case UBLK_IO_OP_FLUSH:
    return cache_flush (c) < 0 ? exec_error () : 0;
  case UBLK_IO_OP_DISCARD:
    return cache_trim (c, len, off, 0) < 0 ? exec_error () : 0;
  case UBLK_IO_OP_WRITE_ZEROES:
    f = fua | ((iod->op_flags & UBLK_IO_F_NOUNMAP) ? 0 : CACHE_MAY_TRIM);
    return cache_zero (c, len, off, f) < 0 ? exec_error () : 0;
  default:
    return -EOPNOTSUPP;         /* WRITE_SAME, zoned: never announced */
  }
  if (r < 0)
    return exec_error ();
  return (int) len;             /* <= max_io, < 2^31 */
}

/* Write, discard and zeroes change the image: the one place where a gate
 * on writes (a read-only export; a hand-over to another host) applies. */
static bool
op_writes (unsigned op)
{
  return op == UBLK_IO_OP_WRITE || op == UBLK_IO_OP_DISCARD ||
    op == UBLK_IO_OP_WRITE_ZEROES;
}

int
ublk_exec (struct export *e, const struct ublksrv_io_desc *iod, void *buf,
           bool nowait)
{
  unsigned op = ublksrv_get_op (iod);
  uint64_t len = (uint64_t) iod->nr_sectors << 9;

  if (nowait && (len > UBLK_INLINE_MAX || (iod->op_flags & UBLK_IO_F_FUA) ||
                 (op != UBLK_IO_OP_READ && op != UBLK_IO_OP_WRITE)))
    return -EAGAIN;
  if (!op_writes (op))
    return exec_op (e->cache, iod, buf, nowait);
  if (e->read_only)
    return -EROFS;              /* the device is read-only: a bug upstairs */
  /* The gate of foliod release: once the image is handed to another
   * host, nothing more is written through this device either. */
  if (export_write_begin (e) == -1)
    return -EROFS;
  int r = exec_op (e->cache, iod, buf, nowait);
  export_write_end (e);
  return r;
}
