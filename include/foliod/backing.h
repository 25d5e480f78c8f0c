/* The backing store interface: where an export's data really lives.
 *
 * A backing is a const ops table plus a base struct (placed first in each
 * implementation's own struct).  The cache never knows which backing it
 * talks to.  Every op may be called from several threads at once, on any
 * ranges; ordering between overlapping requests is the caller's business
 * (the cache serialises them with its folio locks).
 *
 * Return contract of every op that returns int: 0 on success, -1 with errno
 * set on failure.  A backing that cannot be reached at all (a remote that
 * stays away after its reconnect window, or does not answer in time) fails
 * with ENOTCONN or ETIMEDOUT: the caller then stops trying the rest of its
 * work (see backing_unreachable).  Short transfers never escape an op: read/write loop until
 * the whole range is done or fail.
 */
#ifndef FOLIOD_BACKING_H
#define FOLIOD_BACKING_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "foliod/attr.h"

/* Flags for write, zero and trim. */
#define BACKING_FUA        (1u << 0) /* durable before the op returns */
#define BACKING_MAY_TRIM   (1u << 1) /* zero: punching a hole is fine */
#define BACKING_FAST_ZERO  (1u << 2) /* zero: fail with ENOTSUP unless fast */
#define BACKING_DIRECT     (1u << 3) /* write: a hint, bypass the host's page
                                      * cache where the backing can (a large
                                      * run the cache holds already) */

/* Capabilities, in struct backing.caps. */
#define BACKING_CAN_TRIM       (1u << 0)
#define BACKING_CAN_ZERO       (1u << 1) /* zero is efficient (no data sent) */
#define BACKING_CAN_FAST_ZERO  (1u << 2)
#define BACKING_CAN_FUA        (1u << 3) /* native FUA; else op + flush */
#define BACKING_CAN_MAP        (1u << 4) /* map() knows holes */
#define BACKING_READ_ONLY      (1u << 5)
#define BACKING_CAN_MULTI_CONN (1u << 6)
#define BACKING_CAN_DIRECT     (1u << 7) /* honours backing_opts.direct;
                                          * struct backing.direct says
                                          * whether it got O_DIRECT */
#define BACKING_REMOTE         (1u << 8) /* a read waits for a network
                                          * round trip (the cache reads
                                          * ahead: readahead=auto) */
#define BACKING_VOLATILE       (1u << 9) /* a write it acknowledged may be
                                          * lost until a flush (or a FUA
                                          * op) succeeds: a page cache, a
                                          * remote's.  The cache's ledger
                                          * then keeps written blocks
                                          * unstable until a good flush,
                                          * counts passthrough writes, and
                                          * takes a failed flush or FUA op
                                          * after writes for a loss (its
                                          * own rule: no backing counts
                                          * them).  Without it an
                                          * acknowledged write is durable */
#define BACKING_SYNC_FINAL     (1u << 10) /* a flush or FUA op that succeeds
                                          * is durable whatever the others
                                          * at the same time answer: the
                                          * backing fails an op whose
                                          * writes another's failed sync
                                          * may have dropped (the file
                                          * backing: its syncs serialized,
                                          * each checks the failures since
                                          * its op began).  Else the
                                          * cache's ledger waits for the
                                          * others (ledger_durable_end) */

enum backing_extent_type {
  BACKING_DATA = 0, /* must be read */
  BACKING_HOLE = 1, /* reads as zeroes, no I/O needed (unallocated) */
  BACKING_ZERO = 2, /* reads as zeroes, allocated */
};

struct backing_extent {
  uint64_t offset;
  uint64_t length;
  enum backing_extent_type type;
};

/* Counters a backing keeps about itself (remote backings mostly). */
struct backing_stats {
  uint64_t reconnects;
  uint64_t retries;
  uint64_t errors;
  uint64_t writes_in_doubt;     /* see backing_ops.clear_doubt */
  uint64_t abandoned;           /* requests given up on at their timeout */
};

struct backing;

struct backing_ops {
  const char *name;

  /* Read len bytes at off into buf.  off+len <= size. */
  int (*read) (struct backing *b, void *buf, uint64_t len, uint64_t off)
    FOLIOD_NONNULL (1, 2) FOLIOD_WUR;

  /* The same without holding the caller: 0 when issued, and then done
   * (0 or an errno value) is called exactly once, on a thread of the
   * backing (maybe this one, before the return), within the backing's
   * request timeout; buf must stay until then.  -1 (errno) when not
   * issued, done never called: the caller uses read, which reconnects,
   * retries and fails as the contract says (an async read is never
   * retried: on an error the caller reads again with read).  NULL: no
   * such reads (every read has a thread anyway). */
  int (*read_async) (struct backing *b, void *buf, uint64_t len,
                     uint64_t off, void (*done) (void *opaque, int err),
                     void *opaque) FOLIOD_NONNULL (1, 2, 5) FOLIOD_WUR;

  /* Write len bytes at off.  flags: BACKING_FUA. */
  int (*write) (struct backing *b, const void *buf, uint64_t len,
                uint64_t off, unsigned flags) FOLIOD_NONNULL (1, 2) FOLIOD_WUR;

  /* Make the range read as zeroes.  Always supported (a backing without a
   * native zero writes zeroes), except that with BACKING_FAST_ZERO it fails
   * with ENOTSUP when it cannot be fast.  flags: FUA, MAY_TRIM, FAST_ZERO. */
  int (*zero) (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
    FOLIOD_NONNULL (1) FOLIOD_WUR;

  /* Discard the range: afterwards it reads as zeroes or as the old data;
   * advisory.  Only called when caps has BACKING_CAN_TRIM.  flags: FUA. */
  int (*trim) (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
    FOLIOD_NONNULL (1) FOLIOD_WUR;

  /* Make every completed write durable. */
  int (*flush) (struct backing *b) FOLIOD_NONNULL (1) FOLIOD_WUR;

  /* Describe the extent starting at off: fills *ext with ext->offset == off,
   * 0 < ext->length <= len.  A backing without hole knowledge (no
   * BACKING_CAN_MAP) may leave this NULL: everything is DATA. */
  int (*map) (struct backing *b, uint64_t off, uint64_t len,
              struct backing_extent *ext) FOLIOD_NONNULL (1, 4) FOLIOD_WUR;
  /* The same from what the backing knows already, never waiting for I/O
   * (the server's loop thread asks it for a parked miss): 0 with *ext as
   * map gives it, or -1 (EAGAIN) when map would have to ask.  NULL: map
   * may always wait. */
  int (*map_cached) (struct backing *b, uint64_t off, uint64_t len,
                     struct backing_extent *ext) FOLIOD_NONNULL (1, 4)
    FOLIOD_WUR;

  /* A fact for the cache's durability ledger (src/cache/ledger.c), which
   * alone decides what it costs; one meaning for every backing: a count
   * of the events the cache cannot see itself after which what the
   * backing acknowledged may be gone or overwritten --
   *  - a remote connection ended (nbd): the remote may have restarted and
   *    dropped its volatile cache, and a write unanswered on it may still
   *    be carried out later;
   *  - a write the backing abandoned ended after it was given up on
   *    (rbd): it may have landed over data written since.
   * Never a failed flush or FUA op: the cache sees those and the ledger's
   * own rule covers them (see BACKING_VOLATILE).  The ledger moves its
   * own epoch for an event when anything was unflushed, keeps written
   * blocks "unstable" until a flush succeeds with the epoch unchanged,
   * and writes them again when it moved.  A lost lock or image is its
   * own fact (owner_lost), writes abandoned and still out another
   * (stats' writes_in_doubt).  NULL: no such event (a local file). */
  uint64_t (*loss_epoch) (struct backing *b) FOLIOD_NONNULL (1);

  /* Writes in doubt: a write the backing gave up on (no answer in time,
   * or its connection lost under it) may still be carried out by a remote
   * at any later time, over newer data.  While any is in doubt, flush and
   * FUA fail with EIO (no range may be reported durable).  Only the
   * operator can say the remote is done with them: this clears them
   * (returns how many).  The cache's ledger moves its epoch first, so
   * that what was written meanwhile is written again before a flush
   * succeeds (cache_clear_doubt).  May be NULL: the backing abandons no
   * write. */
  uint64_t (*clear_doubt) (struct backing *b) FOLIOD_NONNULL (1);

  /* One writer per image (a fact for the ledger): a backing that holds
   * an image's lock (rbd) says whether it still owns the image as it
   * opened it.  NULL while it does; else why not, for the log (its lock
   * was broken and it was blocklisted, the lock feature was disabled,
   * the image was resized by another client).  Sticky: from then on
   * its writes and flushes fail.  Never waits.  NULL op: a backing
   * that cannot lose its image. */
  const char *(*owner_lost) (struct backing *b) FOLIOD_NONNULL (1);

  /* The same, confirmed by the image's home (the cluster) within the
   * backing's lease: 0 when it was (at once, unless the confirmation is
   * older than the lease, as after a stall: then it waits for one, up
   * to request-timeout); -1 with errno when ownership is lost (EIO) or
   * not confirmed in time (ETIMEDOUT).  What the cache asks before it
   * reports data durable that only its store holds.  NULL: 0. */
  int (*owner_confirm) (struct backing *b) FOLIOD_NONNULL (1) FOLIOD_WUR;

  /* Fill *st with the backing's own counters.  May be NULL. */
  void (*stats) (struct backing *b, struct backing_stats *st)
    FOLIOD_NONNULL (1, 2);

  /* Shutdown: no op may wait past deadline_ms (now_ms() clock); an op
   * still waiting then fails with ETIMEDOUT.  A backing that is down gets
   * one more reconnect window (within the deadline).  May be NULL: ops
   * never wait long (local files). */
  void (*set_deadline) (struct backing *b, uint64_t deadline_ms)
    FOLIOD_NONNULL (1);

  /* Give the image up to another host (foliod release), the cache
   * having written back and flushed everything: drop the image's lock (a
   * file's OFD locks, rbd's exclusive lock) so that the next writer may
   * take it.  backing_release has already set b->released, so that no
   * write, zero or trim reaches the image from then on (EROFS); reads go
   * on.  0, or -1 with errno: then the lock is still held (the caller
   * clears b->released).  NULL: nothing to release (a remote). */
  int (*release) (struct backing *b) FOLIOD_NONNULL (1) FOLIOD_WUR;

  /* Release everything.  Called once, with no op in flight. */
  void (*close) (struct backing *b) FOLIOD_NONNULL (1);
};

/* Did an op fail because the backing is unreachable (see the contract
 * above), so that the next op would fail the same way? */
static inline int
backing_unreachable (int err)
{
  return err == ENOTCONN || err == ETIMEDOUT;
}

/* The base struct every backing starts with. */
struct backing {
  const struct backing_ops *ops;
  uint64_t size;       /* bytes; fixed for the backing's life */
  unsigned caps;       /* BACKING_CAN_* */
  uint32_t io_align;   /* direct I/O alignment in bytes (1: none needed).
                        * Any range works; a request whose offset, length
                        * and buffer address are multiples of io_align
                        * avoids a bounce copy (and, for writes, reading
                        * the partial edge sectors first). */
  int direct;          /* 1 when opened for direct I/O (O_DIRECT) */
  _Atomic int released; /* backing_release: writes fail with EROFS */
};

/* Options that backing_open understands. */
struct backing_opts {
  int read_only;          /* open read-only */
  int direct;             /* file: try O_DIRECT (cache=none) */
  unsigned connections;   /* nbd: connections to the remote (0: default 4) */
  const char *tls_certificates; /* nbds: directory with ca-cert.pem etc. */
  const char *tls_psk_file;     /* nbds: PSK file */
  const char *tls_username;     /* nbds: PSK user name */
  unsigned retry_timeout_ms;    /* nbd: a request whose connection dropped
                                 * keeps reconnecting (backoff 50 ms..2 s)
                                 * this long, then fails (0: 30000) */
  unsigned request_timeout_ms;  /* nbd: a request the remote has not
                                 * answered this long fails with ETIMEDOUT
                                 * and its connection is dropped
                                 * (0: 30000) */
  int no_locking;         /* file: take no image locks (locking=off) */
  int format_raw;         /* file: serve the bytes without probing for an
                           * image format (format=raw) */
  const char *ceph_conf;        /* rbd: ceph.conf path (NULL: librados'
                                 * default search) */
  const char *ceph_id;          /* rbd: client name without "client."
                                 * (NULL: admin) */
  const char *ceph_keyring;     /* rbd: keyring (NULL: the conf's) */
};

/* Open a backing from a spec: "file:PATH" (or a bare path), "nbd://...",
 * "nbds://...", "nbd+unix://...", "nbds+unix://...", "rbd:POOL/IMAGE".  On failure returns
 * NULL and writes a one-line reason into err; errno is EMEDIUMTYPE when a
 * file holds an image format (the probe, unless format_raw). */
struct backing *backing_open (const char *spec, const struct backing_opts *o,
                              char *err, size_t errlen) FOLIOD_WUR;

/* Implementations (called by backing_open; exposed for tests). */
struct backing *backing_file_open (const char *path,
                                   const struct backing_opts *o,
                                   char *err, size_t errlen) FOLIOD_WUR;
/* The format probe of a file backing alone (foliod --check-config): 0 when
 * path holds no image format qemu knows, 1 when it does (the refusal
 * backing_file_open would give, in err, errno EMEDIUMTYPE), -1 when it
 * cannot be read (the reason in err). */
int backing_file_probe (const char *path, char *err, size_t errlen)
  FOLIOD_WUR;
struct backing *backing_nbd_open (const char *uri,
                                  const struct backing_opts *o,
                                  char *err, size_t errlen) FOLIOD_WUR;
struct backing *backing_rbd_open (const char *spec,
                                  const struct backing_opts *o,
                                  char *err, size_t errlen) FOLIOD_WUR;

/* How many writes were in doubt (0 also for a backing without them). */
static inline uint64_t
backing_clear_doubt (struct backing *b)
{
  return b->ops->clear_doubt ? b->ops->clear_doubt (b) : 0;
}

/* For the remote backings' ops: a request of len bytes at off must lie
 * inside the export, and a write (write != 0) needs a writable one.  0,
 * or -1 with errno EINVAL or EROFS. */
static inline int
backing_check_range (const struct backing *b, uint64_t len, uint64_t off,
                     int write)
{
  if (write && ((b->caps & BACKING_READ_ONLY) || atomic_load (&b->released))) {
    errno = EROFS;
    return -1;
  }
  if (off > b->size || len > b->size - off) {
    errno = EINVAL;
    return -1;
  }
  return 0;
}

/* Writes end here for good (each backing's write ops check b->released),
 * then the image's lock goes: 0, or -1 with errno and the backing as it
 * was (writable, locked). */
static inline int
backing_release (struct backing *b)
{
  atomic_store (&b->released, 1);
  if (b->ops->release && b->ops->release (b) == -1) {
    int e = errno;
    atomic_store (&b->released, 0);
    errno = e;
    return -1;
  }
  return 0;
}

static inline void
backing_set_deadline (struct backing *b, uint64_t deadline_ms)
{
  if (b->ops->set_deadline)
    b->ops->set_deadline (b, deadline_ms);
}

/* Why the backing no longer owns its image (owner_lost), or NULL. */
static inline const char *
backing_owner_lost (struct backing *b)
{
  return b->ops->owner_lost ? b->ops->owner_lost (b) : NULL;
}

static inline int
backing_owner_confirm (struct backing *b)
{
  return b->ops->owner_confirm ? b->ops->owner_confirm (b) : 0;
}

/* The backing's own counters; zeroes when it keeps none. */
static inline void
backing_get_stats (struct backing *b, struct backing_stats *st)
{
  *st = (struct backing_stats) { 0 };
  if (b->ops->stats)
    b->ops->stats (b, st);
}

static inline void
backing_close (struct backing *b)
{
  if (b)
    b->ops->close (b);
}

#endif /* FOLIOD_BACKING_H */
