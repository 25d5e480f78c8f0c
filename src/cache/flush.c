/* FLUSH: the writeback pass a flush runs (shared by concurrent flushes,
 * flush-group.h), the backing's flush after it, and the store's sync. */
#include <errno.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

/* Write back everything, then flush the backing.  If the backing lost
 * acknowledged writes meanwhile (a remote restarted, a file's fdatasync
 * failed), the cached ones are dirty again and written once more, and the
 * flush succeeds only once a backing flush after them has.
 *
 * Lost passthrough writes (direct I/O, zero) cannot be written again: the
 * cache has no copy.  A successful FLUSH promises that every write
 * completed before it is durable (NBD spec), those included, so from then
 * on every flush fails with EIO, until the operator's word.  That is
 * qemu's answer to a failed fdatasync of a file it cannot rewrite
 * (file-posix.c, page_cache_inconsistent); Linux and nbdkit report the
 * error once, which is how a retried fsync came to claim lost data
 * durable (PostgreSQL, 2018).  Keeping a copy of every passthrough write
 * until the next flush would make direct I/O cost cache memory.  With a
 * persistent store the loss outlives the process (a restart must not
 * answer FLUSH with success either): it ends at the operator's
 * clear-doubt (ledger.c). */
/* A flush pass with this few dirty blocks writes them with FUA instead of
 * writing them and then flushing the backing: one round trip to a remote
 * instead of two (the seed workload: 8 clients flushing after every 4 KiB
 * write leave a few blocks per pass).  Only where FUA is native (else it
 * is a flush per write), and only when nothing else waits for the
 * backing's flush (then wb_stabilize flushes anyway, and plain writes
 * plus that one flush cost less).  Twice the walk's threads: the FUA
 * writes go out in at most two rounds, which costs no more than a round
 * of plain writes and the flush after it; a remote whose FUA is an
 * fdatasync pays a few of them side by side, which its journal batches,
 * and more would cost it more than the one flush they save. */
#define FLUSH_FUA_MAX_BLOCKS (2 * (WB_HELPERS + 1))

static unsigned
flush_pass_flags (struct cache *c)
{
  if (!(c->b->caps & BACKING_CAN_FUA) ||
      STAT_GET (c, dirty_bytes) > block_pos (c, FLUSH_FUA_MAX_BLOCKS) ||
      !ledger_fua_may_do (c))
    return 0;
  return BACKING_FUA;
}

static int
cache_flush_pass (void *arg)
{
  struct cache *c = arg;
  int err = 0, r;

  lock_or_die (&c->wb_mutex);
  for (unsigned attempt = 0;; attempt++) {
    int pass_err;
    /* A hint: wb_stabilize checks again what the FUA writes left to
     * flush (a passthrough write meanwhile, a loss) and flushes then. */
    wb_pass (c, true, flush_pass_flags (c), &pass_err);
    r = wb_stabilize (c);
    if (pass_err) {
      err = pass_err;
      break;
    }
    if (r == -1)
      err = errno;
    if (r != 1)
      break;
    if (attempt == 8) {   /* the backing keeps losing writes */
      err = EIO;
      break;
    }
  }
  if (err == 0)
    err = ledger_flush_error (c);
  unlock_or_die (&c->wb_mutex);
  lock_or_die (&c->lock);
  pthread_cond_broadcast (&c->space_cv);
  unlock_or_die (&c->lock);
  throttle_wake (c);
  return err;
}

/* Concurrent flushes share one pass (flush-group.h): eight clients that
 * flush after every write pay one backing flush, not eight in a row. */
static int
cache_flush_backing (struct cache *c)
{
  uint64_t t0 = now_ns ();
  int r = flush_group_run (&c->flush_group, cache_flush_pass, c);
  int err = errno;

  STAT_ADD (c, flush_ns, now_ns () - t0);
  errno = err;
  return r;
}

int
cache_write_back (struct cache *c)
{
  int r = cache_flush_backing (c), err = errno;

  if (cache_store_sync (c) == -1 && r == 0)
    return -1;
  errno = err;
  return r;
}

/* flush=store: what was written is persistent once the store is synced.
 * Passthrough writes (direct I/O, zero) are not in the store: they need
 * the backing's flush, not a writeback (wb_stabilize), and once lost
 * (this run or a previous one) every FLUSH fails.  Cached writes the
 * backing lost are dirty again in the store: nothing to report. */
static int
cache_flush_store (struct cache *c)
{
  int r = 0, err = 0;

  if (ledger_pt_unsynced_take (c)) {
    lock_or_die (&c->wb_mutex);
    r = wb_stabilize (c);
    err = errno;
    if (r == 1)
      r = 0;
    if (ledger_flush_error (c)) {
      r = -1;
      err = ledger_flush_error (c);
    }
    unlock_or_die (&c->wb_mutex);
    if (r == -1)
      ledger_pt_unsynced_keep (c);
  }
  if (cache_store_sync (c) == -1 && r == 0) {
    r = -1;
    err = errno;
  }
  if (r == 0 && ledger_flush_error (c)) {
    r = -1;
    err = ledger_flush_error (c);
  }
  errno = err;
  return r;
}

/* Fenced (the image is no longer ours), or not confirmed ours after a
 * stall: what was written may never reach the image, the FLUSH fails. */
int
cache_flush (struct cache *c)
{
  int r = c->sinfo.flush == CACHE_FLUSH_STORE ? cache_flush_store (c)
          : cache_write_back (c);
  int err = r == 0 ? ledger_durable_refused (c) : 0;

  if (err) {
    errno = err;
    return -1;
  }
  return r;
}
