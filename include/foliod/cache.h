/* The folio cache: iomap-style buffered I/O in front of a backing.
 *
 * The cache divides the export into folios (folio_size bytes, aligned) and
 * each folio into blocks (block_size bytes).  Per block it remembers whether
 * the data is uptodate and whether it is dirty, so that:
 *   - a write of whole blocks reads nothing; a partial write of a block that
 *     is not uptodate reads that block only;
 *   - a read fetches only the blocks that are not uptodate, one backing
 *     request per contiguous missing run; holes cost no I/O;
 *   - writeback writes only dirty blocks, merging adjacent ones (also across
 *     folios) into one request of at most max_io_bytes.
 * Dirty data is never dropped.
 *
 * All calls are thread-safe and take byte ranges of any alignment inside the
 * export.  Calls returning int return 0 on success, -1 with errno set.
 */
#ifndef FOLIOD_CACHE_H
#define FOLIOD_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "foliod/attr.h"
#include "foliod/backing.h"
#include "foliod/store.h"

/* Flags for cache_read/write/zero/trim. */
#define CACHE_FUA        (1u << 0) /* write/zero/trim: durable on return */
#define CACHE_DIRECT     (1u << 1) /* bypass the cache, stay coherent */
#define CACHE_MAY_TRIM   (1u << 2) /* zero: a hole is fine */
#define CACHE_FAST_ZERO  (1u << 3) /* zero: ENOTSUP unless fast */
/* read/write: complete without waiting or fail at once with -1/EAGAIN
 * (a miss or a partial block to read, a folio busy with I/O, no free
 * room, the dirty limit, FUA, write-through, direct I/O, a write over
 * more than one window).  A write that fails changed nothing: no data,
 * no folio created or evicted (a try takes free room only, once it knows
 * it can finish); a read that fails may have filled part of buf.  Nothing
 * is counted then: the caller repeats the call without the flag where it
 * may block (the kernel's IOCB_NOWAIT). */
#define CACHE_NOWAIT     (1u << 4)

/* What a client FLUSH (and a FUA write) waits for. */
enum cache_flush_mode {
  CACHE_FLUSH_DEFAULT = 0, /* store with a persistent store, else backing */
  CACHE_FLUSH_STORE,       /* the data is persistent in the store */
  CACHE_FLUSH_BACKING,     /* written back and flushed by the backing */
};

enum cache_mode {
  CACHE_WRITEBACK = 0,   /* writes land in the cache; flush writes back */
  CACHE_WRITETHROUGH,    /* writes reach the backing before returning */
  CACHE_NONE,            /* every request passes through (direct I/O) */
};

struct cache_config {
  uint64_t cache_size;        /* bytes of folio memory */
  uint32_t folio_size;        /* power of two, 4 KiB .. 2 MiB */
  uint32_t block_size;        /* power of two, 512 .. folio_size */
  enum cache_mode mode;
  uint64_t direct_threshold;  /* writeback mode: requests >= this bypass; 0 off */
  uint32_t max_io_bytes;      /* cap of one merged backing request (raised
                                 to block_size if smaller) */
  unsigned dirty_background_pct; /* background writeback above this % */
  unsigned dirty_limit_pct;      /* writers throttled above this % */
  /* The two percentages are defaults, not the user's: when the cache
   * holds every folio of the export, neither applies (see cache_create).
   * Cleared by export_config_set when either is given. */
  bool dirty_auto;
  unsigned dirty_expire_ms;      /* dirty data older than this is written */
  unsigned writeback_interval_ms;/* how often the writeback thread wakes */
  enum cache_flush_mode flush;   /* CACHE_FLUSH_STORE needs a pmem store */
  /* Readahead of sequential reads: the largest window in bytes, 0 off,
   * CACHE_READAHEAD_AUTO (the default): 4 MiB on a remote backing
   * (BACKING_REMOTE), off on a file (the kernel reads ahead there). */
  uint32_t readahead_bytes;
  /* Upgrade in place: the ram store is the one handed over on this memfd
   * (store_ram_adopt), its folios and their bits taken back as they were.
   * The fd stays the caller's (the store maps a copy). */
  bool ram_adopt;
  int ram_memfd;
};
#define CACHE_READAHEAD_AUTO UINT32_MAX
#define CACHE_READAHEAD_MAX  (64u << 20)

/* Fill *cfg with the defaults: 256 MiB cache, 64 KiB folios, 4 KiB blocks,
 * writeback, 1 MiB I/O cap, 10% / 20% / 30 s like the kernel (dirty_auto:
 * thresholds of at least 1 GiB / 2 GiB when the whole export of a local
 * file fits in the cache). */
void cache_config_default (struct cache_config *cfg) FOLIOD_NONNULL (1);

/* Check a configuration against a backing size.  Returns 0, or -1 with a
 * one-line reason in err. */
int cache_config_check (const struct cache_config *cfg, char *err,
                        size_t errlen) FOLIOD_NONNULL (1) FOLIOD_WUR;

struct cache_stats {
  uint64_t read_ops, read_hits, read_misses; /* client reads (hit: no I/O) */
  uint64_t client_read_bytes, client_write_bytes;
  uint64_t client_zero_bytes, client_trim_bytes;
  uint64_t backing_read_ops, backing_read_bytes;
  uint64_t backing_write_ops, backing_write_bytes;
  uint64_t backing_zero_ops, backing_zero_bytes;
  uint64_t backing_trim_ops, backing_flush_ops;
  uint64_t direct_read_ops, direct_read_bytes;
  uint64_t direct_write_ops, direct_write_bytes;
  uint64_t dirty_bytes;       /* now */
  uint64_t unstable_bytes;    /* now: written back, backing not yet flushed */
  uint64_t cached_bytes;      /* folio memory in use now */
  uint64_t evictions;
  uint64_t writeback_errors, read_errors;
  uint64_t throttle_waits;
  /* Contended acquisitions (the lock was held by another thread) of the
   * index lock and the stripes on the request path, and of the walk's
   * lock: what limits the core's scaling, if anything (core-bench). */
  uint64_t lock_waits_index, lock_waits_stripe, lock_waits_walk;
  uint64_t lock_taken_index;  /* acquisitions of the index lock there */
  uint64_t flush_ops;         /* cache_flush calls answered */
  uint64_t flush_passes;      /* passes run for them (several share one) */
  uint64_t flush_waiting;     /* now: flushes waiting for a pass to start */
  uint64_t readahead_bytes;   /* brought into the cache by readahead */
  uint64_t readahead_windows; /* windows issued */
  uint64_t readahead_hits;    /* folios it brought that a client then read */
  uint64_t readahead_wasted;  /* ... that were evicted unread */
  uint64_t readahead_notes;   /* client reads readahead looked at */
  /* Time spent (ns), over backing_write_ops, backing_flush_ops and
   * flush_ops: their mean latencies.  flush_ns is each flush's own wait,
   * a pass shared with other flushes included. */
  uint64_t backing_write_ns, backing_flush_ns, flush_ns;
  struct store_stats store;   /* the store's own (store_get_stats) */
  /* The dirty thresholds in force (bytes): writeback starts above the
   * first, writers wait above the second. */
  uint64_t dirty_background_bytes, dirty_limit_bytes;
  /* The durability ledger (docs/internals.md): passthrough writes the
   * backing has not flushed yet; passthrough writes lost (then every
   * FLUSH fails until 'foliod clear-doubt'; 1 for those a previous run
   * lost, kept in a persistent store); the errno every FLUSH answers for
   * that (or 0); why writeback fails now (errno, or 0). */
  uint64_t passthrough_unflushed, passthrough_lost;
  int flush_error, writeback_error;
  /* Losses the ledger found (the backing may have lost writes it had
   * acknowledged: a connection ended or a flush failed with writes
   * unflushed; cached blocks were written again), and clear-doubts that
   * moved its epoch. */
  uint64_t losses, doubt_clears;
  /* Writes in doubt: the backing's and a previous run's (1 when it left
   * any, kept in the store), and that part alone.  Not 0: every FLUSH
   * that reaches the backing fails until 'foliod clear-doubt'. */
  uint64_t writes_in_doubt, doubt_inherited;
  /* Fenced: the backing no longer owns its image (its lock was broken,
   * the image changed under it), or a previous run's store says so.
   * Then every read, write and FLUSH fails with EIO and nothing is
   * written back (foliod(8), Lost lock); why, for the log, or NULL. */
  bool fenced;
  const char *fence_reason;
};

struct cache;

/* Create a cache over b, with folio memory from store (NULL: a ram store of
 * cfg->cache_size).  The cache owns neither b nor store.  Starts the
 * writeback thread.  Returns NULL with errno set and a reason in err. */
struct cache *cache_create (struct backing *b, struct store *store,
                            const struct cache_config *cfg,
                            char *err, size_t errlen)
  FOLIOD_NONNULL (1, 3) FOLIOD_WUR;

/* Stop the writeback thread and free the cache.  It writes nothing back:
 * the caller flushes first (export_close holds the shutdown policy: how
 * often to retry, and for how long).  Returns 0, or -1 with errno EIO
 * when dirty or unstable data was still cached: it is lost. */
int cache_destroy (struct cache *c) FOLIOD_WUR;

/* Start/stop the background writeback thread and its helpers
 * (cache_create starts them; nbdkit forks after loading plugins, so its
 * adapter restarts them). */
int cache_start_writeback (struct cache *c) FOLIOD_NONNULL (1) FOLIOD_WUR;
void cache_stop_writeback (struct cache *c) FOLIOD_NONNULL (1);

/* Writes received straight into folio memory (the kernel's write_begin /
 * write_end, the copy being the caller's recv).  cache_write_prepare
 * hands out free folios, not in the index, for the whole folios inside
 * [off, off+len): [p->off, p->off+p->len), p->data[i] the i-th folio's
 * memory (p->folio_size bytes).  The caller fills every byte, then
 * cache_write_commit puts them in place of the cached folios, uptodate
 * and dirty, or cache_write_abort gives them back.  Nothing is locked in
 * between: a client that stops mid-payload holds no one up, and no reader
 * sees the folios before the commit (nor ever, after an abort).  The
 * bytes of the request outside p's range are the caller's to write with
 * cache_write.  Only writeback mode, a store whose slot memory may hold
 * data before the slot is indexed (STORE_EARLY_DATA: ram, ssd), no direct
 * I/O, and only while free folios are plenty: else -1 (EAGAIN), nothing
 * held. */
#define CACHE_PREP_MAX 32
struct cache_prep {
  uint64_t off, len;
  unsigned n;                 /* folios held; 0: none */
  size_t folio_size;
  void *data[CACHE_PREP_MAX];
  uint32_t slot[CACHE_PREP_MAX];
  /* The caller's: which of the bytes around p's range it has written
   * (CACHE_PREP_HEAD, _TAIL), so that a write retried after a
   * CACHE_NOWAIT try gave up goes on from there; 0 after a prepare. */
  unsigned edges_done;
};
#define CACHE_PREP_HEAD (1u << 0)
#define CACHE_PREP_TAIL (1u << 1)
int cache_write_prepare (struct cache *c, uint64_t len, uint64_t off,
                         struct cache_prep *p) FOLIOD_NONNULL (1, 4);
/* flags: CACHE_NOWAIT (then -1 EAGAIN, nothing changed, p still held, if
 * it would wait).  0 or -1 with errno; p is released either way, except
 * for that EAGAIN. */
int cache_write_commit (struct cache *c, struct cache_prep *p,
                        unsigned flags) FOLIOD_NONNULL (1, 2);
void cache_write_abort (struct cache *c, struct cache_prep *p)
  FOLIOD_NONNULL (1, 2);

int cache_read (struct cache *c, void *buf, uint64_t len, uint64_t off,
                unsigned flags) FOLIOD_NONNULL (1) FOLIOD_WUR;
/* A read miss that holds no thread (src/cache/fetch.c): cache_fetch has
 * the backing read what [off, off+len) misses (whole blocks, holes left
 * out) into buf, which holds cache_fetch_room bytes, asynchronously: 0
 * when issued (done (opaque, 0 or errno) follows on a backing thread, or
 * at once when nothing needs reading; *fx is for cache_read_fetched), -1
 * when this cache or backing cannot without waiting (ENOTSUP, EAGAIN):
 * use cache_read.  After done said 0, cache_read_fetched puts the fetched
 * blocks the cache misses into it and leaves in buf[0, len) what a
 * cache_read would have returned (flags: CACHE_NOWAIT, as for
 * cache_read; a try that gives up marks *fx as fetching nothing, and the
 * retry reads from the backing).  After an error, cache_read. */
struct cache_fetched {
  uint64_t base;              /* the byte buf[0] stands for */
  uint64_t off, end;          /* the bytes fetched; off == end: none */
  uint64_t gen;               /* the backing write log at the start */
};
uint64_t cache_fetch_room (struct cache *c, uint64_t len, uint64_t off)
  FOLIOD_NONNULL (1);
int cache_fetch (struct cache *c, void *buf, uint64_t len, uint64_t off,
                 struct cache_fetched *fx,
                 void (*done) (void *opaque, int err),
                 void *opaque) FOLIOD_NONNULL (1, 2, 5, 6) FOLIOD_WUR;
int cache_read_fetched (struct cache *c, void *buf, uint64_t len,
                        uint64_t off, struct cache_fetched *fx,
                        unsigned flags)
  FOLIOD_NONNULL (1, 2, 5) FOLIOD_WUR;
/* With CACHE_FUA on a backing without native FUA (a file), the write is
 * made durable by a cache_flush, shared with concurrent ones, whose
 * result it returns. */
int cache_write (struct cache *c, const void *buf, uint64_t len, uint64_t off,
                 unsigned flags) FOLIOD_NONNULL (1) FOLIOD_WUR;
int cache_zero (struct cache *c, uint64_t len, uint64_t off, unsigned flags)
  FOLIOD_NONNULL (1) FOLIOD_WUR;
int cache_trim (struct cache *c, uint64_t len, uint64_t off, unsigned flags)
  FOLIOD_NONNULL (1) FOLIOD_WUR;
/* A client FLUSH.  flush=backing: write back all dirty data and flush the
 * backing (and sync a pmem store).  flush=store: make what was written
 * persistent in the store only (the backing gets it by background
 * writeback).  A writeback error leaves the data dirty (it is retried)
 * and is returned here.  Concurrent calls that write back share one pass:
 * each is answered by a pass that began after it was called, and gets
 * that pass's result.  On a backing with native FUA, a pass with only a
 * few dirty blocks and nothing else unflushed writes them with FUA and
 * skips the backing's flush (one round trip to a remote, not two). */
int cache_flush (struct cache *c) FOLIOD_NONNULL (1) FOLIOD_WUR;
/* Write back all dirty data, flush the backing, sync the store, whatever
 * the flush mode: shutdown, foliod flush, foliod store writeback. */
int cache_write_back (struct cache *c) FOLIOD_NONNULL (1) FOLIOD_WUR;
/* The operator's word that the backing's remote is done with every write
 * it abandoned (backing_ops.clear_doubt): cached blocks written since the
 * last good flush are written again before a flush succeeds; passthrough
 * writes made meanwhile are not counted lost by it.  Also the word that
 * passthrough writes counted lost (this run's, or a previous run's kept
 * in the store) are known lost: FLUSH may succeed again.  Returns how
 * many writes were in doubt or lost (a fenced store counts one). */
uint64_t cache_clear_doubt (struct cache *c) FOLIOD_NONNULL (1);
/* Only the word that passthrough writes counted lost are known lost:
 * writes in doubt stay in doubt (an operator who knows a loss but not
 * what the remote may still carry out; foliod clear-doubt --lost-only).
 * Returns how many were counted lost. */
uint64_t cache_clear_lost (struct cache *c) FOLIOD_NONNULL (1);
/* Bring the range into the cache (NBD_CMD_CACHE). */
int cache_prefetch (struct cache *c, uint64_t len, uint64_t off)
  FOLIOD_NONNULL (1) FOLIOD_WUR;

/* Block status: calls fn once per extent, in order, covering [off,
 * off+len) or stopping early when fn returns non-zero.  Dirty or cached
 * data that the backing calls a hole is reported as DATA. */
typedef int (*cache_extent_fn) (void *opaque, uint64_t off, uint64_t len,
                                enum backing_extent_type type);
int cache_block_status (struct cache *c, uint64_t len, uint64_t off,
                        cache_extent_fn fn, void *opaque)
  FOLIOD_NONNULL (1, 4) FOLIOD_WUR;

/* The cache's state of a range (the foliod:cache metadata context): fn
 * once per extent of like blocks, in order, covering [off, off+len) or
 * stopping early when fn returns non-zero; state is a set of these: */
enum {
  CACHE_STATE_CACHED = 1,   /* the data is in the cache */
  CACHE_STATE_DIRTY = 2,    /* newer than the backing: a FLUSH or a shutdown
                               writes it (also while writeback does) */
  CACHE_STATE_UNSTABLE = 4, /* written back, but not yet flushed by the
                               backing: a FLUSH makes it keep it */
};
typedef int (*cache_state_fn) (void *opaque, uint64_t off, uint64_t len,
                               uint32_t state);
int cache_state_status (struct cache *c, uint64_t len, uint64_t off,
                        cache_state_fn fn, void *opaque)
  FOLIOD_NONNULL (1, 4) FOLIOD_WUR;

void cache_get_stats (struct cache *c, struct cache_stats *st)
  FOLIOD_NONNULL (1, 2);

/* The store and what cache_create recovered from it. */
struct cache_store_info {
  const char *kind;           /* "ram" or "pmem" */
  const char *granularity;    /* pmem: "cache-line", "byte" or "page" */
  const char *mechanism;      /* the store's: what makes writes durable */
  int power_safe_per_write;   /* pmem: each write, else at FLUSH/FUA */
  int devdax;                 /* pmem: a device-DAX character device */
  int formatted;              /* pmem: a new store, nothing recovered */
  int was_clean;              /* pmem: the last shutdown was clean */
  const char *warm_dropped;   /* pmem: clean, but not trusted: why */
  bool doubt;                 /* a previous run left writes in doubt:
                               * FLUSH fails until clear-doubt */
  bool fenced;                /* a previous run lost its image with dirty
                               * data in the store: fenced until
                               * clear-doubt */
  bool pt_lost;               /* a previous run lost passthrough writes:
                               * FLUSH fails until clear-doubt */
  uint32_t bad_entries;       /* pmem: damaged slot entries (crc) over */
  uint64_t lost_bytes;        /* these dirty bytes: written nowhere */
  enum cache_flush_mode flush;/* what FLUSH waits for (never DEFAULT) */
  uint32_t recovered_folios;
  uint64_t recovered_bytes, recovered_dirty_bytes;
  uint64_t recover_ms;
};
/* Populate the memory of a cache's ram store in the background (see
 * store_ram_populate; done is called from that thread).  0 when started,
 * 1 when there is nothing to populate (a persistent store: its file is
 * the memory), -1 with errno. */
int cache_populate (struct cache *c, store_populated_fn *done, void *arg)
  FOLIOD_NONNULL (1);
/* Upgrade in place: c (its own ram store) is quiesced for good (no
 * request, cache_stop_writeback done): stamp its memfd handed over for
 * the export name (store_ram_keep) and return the store, the caller's
 * from now on (store_ram_kept_fd: the fd to send; store_destroy when
 * done); cache_destroy then reports no loss for the dirty data it
 * holds.  NULL with errno: not a ram store, or it failed (then write
 * back instead). */
struct store *cache_keep_ram (struct cache *c, const char *name)
  FOLIOD_NONNULL (1, 2);
void cache_get_store_info (const struct cache *c,
                           struct cache_store_info *out) FOLIOD_NONNULL (1, 2);
const struct cache_config *cache_get_config (const struct cache *c)
  FOLIOD_NONNULL (1);
uint64_t cache_size_bytes (const struct cache *c) /* export size */
  FOLIOD_NONNULL (1);

#endif /* FOLIOD_CACHE_H */
