/* Stores: where folio memory (and folio metadata) lives.
 *
 * The cache has nslots slots of folio_size bytes.  A store hands out, per
 * slot, the data and the state bitmap (enum folio_plane), and records
 * which folio a slot holds.  The ram store keeps all of it in anonymous
 * memory.  A persistent store (STORE_DURABLE) keeps dirty data and its
 * bitmap across a crash; the cache then follows one protocol, the same
 * for every persistent store (the pmem store maps a file; a log store on
 * an SSD would append records of what persist() names):
 *
 *  - write: the data into data(slot) (write(), which may copy in a way
 *    the media prefers), persist(data); then the bits, persist(bits);
 *    then the reply.  What persist() names is durable when it returns,
 *    or with STORE_DEFERRED from the next completed sync() on; before
 *    that a deferred store promises no order (the pmem page store: safe
 *    against the death of the process at once, after a power cut any
 *    version its sectors held).
 *  - FLUSH, FUA: sync().  It makes durable everything persisted before
 *    it began; FLUSHes that arrive while one runs share the next (group
 *    commit).  A store whose persist() is durable on return (no
 *    STORE_DEFERRED) answers at once.  A failed sync is sticky: every
 *    later one fails too (the media may have dropped what it was given).
 *  - slots: set_index(slot, folio) before any bit of the slot says
 *    uptodate or dirty; set_index(slot, STORE_NO_FOLIO) when the cache
 *    evicts it (its dirty and unstable bits clear and persisted).  A slot
 *    takes a new folio only when may_reuse(slot) says so: the store's one
 *    answer to "is the slot's last clear of dirty bits durable?" (the pmem
 *    page store: the sync after it has completed).  may_reuse never
 *    waits; when no slot may be reused, the cache's writeback thread
 *    calls sync() and tries again.
 *  - writeback: backing write; unstable bits set, persist(bits); dirty
 *    bits cleared, persist(bits); backing flush; unstable bits cleared,
 *    persist(bits).
 *  - recover(): once, before the first set_index: hands back each slot
 *    whose folio has blocks to keep (after an unclean stop: dirty ones;
 *    unstable ones come back dirty), frees the others.
 *  - mark_clean(): at shutdown, after everything was written back and the
 *    backing flushed: the next open trusts every uptodate block.
 *  - stats(): live counters for foliod stats and /metrics; any thread.
 * Optional operations may be NULL: the wrappers below answer for them.
 */
#ifndef FOLIOD_STORE_H
#define FOLIOD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>
#include <string.h>

#define STORE_NO_FOLIO UINT64_MAX

/* The planes of a slot's state bitmap, blocks_per_folio bits each, one
 * after the other in this order (iomap's enum iomap_block_state). */
enum folio_plane {
  FP_UPTODATE,  /* the folio holds the block's data */
  FP_DIRTY,     /* newer than the backing: to be written back */
  FP_UNSTABLE,  /* written back, but the backing may still lose it */
  FP_NPLANES
};

/* uint64_t words of one slot's state bitmap. */
static inline uint32_t
store_bitmap_words (uint32_t blocks_per_folio)
{
  return (FP_NPLANES * blocks_per_folio + 63) / 64;
}

struct store;

/* struct store.caps: what the store can do, which is all the cache asks
 * of it (never its kind). */
/* Dirty data and its bits survive a crash: the cache calls persist() and
 * sync() in the order of the protocol above, recovers at open, and FLUSH
 * defaults to flush=store.  Without it persist() and sync() are never
 * called (the ram store). */
#define STORE_DURABLE    (1u << 0)
/* persist() is durable at the next sync() only; without it a store
 * persists on its own (what persist() names is durable on return). */
#define STORE_DEFERRED   (1u << 1)
/* A slot whose folio was dropped may take another only once may_reuse
 * says so (a sync carries the drop first): the cache never hands such a
 * slot straight to another folio (the pmem page store, the ssd log). */
#define STORE_REUSE_SYNC (1u << 2)
/* Slot memory may hold data before the slot is indexed (set_index): what
 * lands in a free slot is nobody's, never seen by recovery, so a write
 * may be received into it and the slot indexed afterwards (the ram
 * store; the ssd store, whose slot memory is anonymous RAM and whose log
 * records only what a commit finds live in an indexed slot).  Not a
 * mapped store: there data in a slot is on the media under the slot's
 * last entry and bits. */
#define STORE_EARLY_DATA (1u << 3)
/* Slot memory is the media (a mapped file): what a read fill put in a
 * slot is never persisted, and the media may take a slot's bits before
 * data persisted with them (a page store: the kernel writes pages in any
 * order until a sync).  So a write that turns a block dirty covering it
 * only in part has the block's other bytes persisted (and with
 * STORE_DEFERRED synced) first: else a crash could bring them back as a
 * slot's older data under the new dirty bit, though no client wrote
 * them since the last FLUSH (the pmem store; not the ssd log, whose
 * records copy whole blocks at the commit). */
#define STORE_MAPPED     (1u << 4)

/* What a persistent store tells about itself (stats, the log line). */
struct store_info {
  const char *granularity;   /* pmem: "cache-line", "byte" or "page" */
  const char *mechanism;     /* what makes writes durable: "msync", ... */
  bool devdax;               /* pmem: a device-DAX character device */
  bool formatted;            /* new store: nothing to recover */
  bool was_clean;            /* shut down cleanly: every bit is trusted */
  const char *warm_dropped;  /* shut down cleanly but not trusted: why */
  bool doubt;                /* a previous run left writes in doubt
                              * (set_doubt): found at open */
  bool fenced;               /* a previous run lost its image (set_fenced):
                              * found at open */
  bool pt_lost;              /* a previous run lost passthrough writes
                              * (set_pt_lost): found at open */
};

/* What a store did, read live (stats, /metrics); 0 where it has no such
 * thing (the pmem store keeps no log). */
struct store_stats {
  uint64_t log_used, log_bytes;  /* a log store: bytes in use, its size */
  uint64_t records;              /* a log store: block records appended */
  uint64_t syncs;                /* sync()s completed */
  uint64_t sync_ns;              /* the time they took */
  uint64_t reclaims;             /* a log store: moves of the log's start */
  uint64_t reclaimed_bytes;      /* the log bytes they freed */
  uint64_t compactions;          /* reclaims that rewrote every live block */
};

/* Called by recover for each slot that holds a folio, in folio order,
 * with the slot's bitmap (in the store).  Non-zero stops the walk and is
 * returned. */
typedef int (*store_recover_fn) (void *arg, uint32_t slot,
                                 uint64_t folio_index, uint64_t *bits);
struct store_recovery {
  uint32_t folios;                     /* slots handed to fn */
  uint32_t dropped;                    /* slots freed: not trustworthy */
  uint64_t dirty_blocks, unstable_blocks;   /* as found (unstable: now dirty) */
  uint32_t bad_entries;                /* damaged slot entries (crc) over */
  uint64_t lost_blocks;                /* these dirty blocks: written nowhere */
};

struct store_ops {
  const char *name;
  /* Folio memory of a slot: folio_size bytes. */
  void *(*data) (struct store *s, uint32_t slot);
  /* State bitmap of a slot: bitmap_words words, FP_NPLANES planes. */
  uint64_t *(*bitmap) (struct store *s, uint32_t slot);
  /* Record that slot holds folio index (STORE_NO_FOLIO: free).  Never
   * waits: a new folio only in a slot that may_reuse allows. */
  void (*set_index) (struct store *s, uint32_t slot, uint64_t folio_index);
  /* [p, p+len) inside the store changed: make it durable, in order (at
   * once, or at the next sync with STORE_DEFERRED).  0 or -1/errno. */
  int (*persist) (struct store *s, const void *p, size_t len);
  /* Copy len bytes from src to dst inside the store and persist them.
   * NULL: write_begin, memcpy, write_end, then persist. */
  void (*write) (struct store *s, void *dst, const void *src, size_t len);
  /* The cache is about to change [p, p+len) of slot memory that may hold
   * dirty data, and is done changing it (every change of such memory
   * goes between the two, then persist()).  For a store that copies slot
   * memory while writers run (the ssd log's commit: a per-slot sequence
   * count tells it that a copy may be torn).  NULL: nothing. */
  void (*write_begin) (struct store *s, void *p, size_t len);
  void (*write_end) (struct store *s, void *p, size_t len);
  /* Make everything persisted before the call durable (group commit).
   * NULL: nothing to do.  0, or -1/errno, sticky. */
  int (*sync) (struct store *s);
  /* May slot take a new folio now (its last clear is durable)?  Never
   * waits.  NULL: always. */
  bool (*may_reuse) (struct store *s, uint32_t slot);
  /* See the protocol above.  NULL: nothing to recover. */
  int (*recover) (struct store *s, store_recover_fn fn, void *arg,
                  struct store_recovery *out);
  /* Sync, then mark the store clean (warm restart); the next persist or
   * set_index marks it in use again.  NULL: 0. */
  int (*mark_clean) (struct store *s);
  void (*info) (struct store *s, struct store_info *out);   /* NULL: zeros */
  /* The cache's durability ledger: a write the backing abandoned may
   * still land (doubt), or the operator cleared it (!doubt).  Durable
   * before it returns, so that a restart finds it (store_info.doubt) and
   * does not trust the backing with the recovered data until the
   * operator says so.  0 or -1/errno.  NULL: not kept.  (The ram store
   * keeps these three facts across an upgrade in place only.) */
  int (*set_doubt) (struct store *s, bool doubt);
  /* The same for "fenced": the backing no longer owned its image (its
   * lock was broken, the image changed under it) while this store held
   * dirty data written under that ownership.  A restart never writes
   * such data back without the operator's word.  NULL: not kept. */
  int (*set_fenced) (struct store *s, bool fenced);
  /* The same for "passthrough writes lost": writes that bypassed the
   * cache (direct I/O, zero) were lost by the backing before a flush,
   * so every FLUSH fails until the operator's word (cache_clear_doubt);
   * a restart must not answer FLUSH with success either.  NULL: not
   * kept. */
  int (*set_pt_lost) (struct store *s, bool lost);
  /* Any thread, while the store is open.  NULL: zeros. */
  void (*stats) (struct store *s, struct store_stats *out);
  void (*destroy) (struct store *s);
};

struct store {
  const struct store_ops *ops;
  unsigned caps;         /* STORE_DURABLE, STORE_DEFERRED, ... */
  uint32_t nslots;
  uint32_t folio_size;
  uint32_t bitmap_words; /* uint64_t words per slot bitmap */
};

static inline void
store_write_begin (struct store *s, void *p, size_t len)
{
  if (s->ops->write_begin)
    s->ops->write_begin (s, p, len);
}

static inline void
store_write_end (struct store *s, void *p, size_t len)
{
  if (s->ops->write_end)
    s->ops->write_end (s, p, len);
}

static inline void
store_write (struct store *s, void *dst, const void *src, size_t len)
{
  if (s->ops->write)
    s->ops->write (s, dst, src, len);
  else {
    store_write_begin (s, dst, len);
    memcpy (dst, src, len);
    store_write_end (s, dst, len);
    (void) s->ops->persist (s, dst, len);
  }
}

static inline bool
store_has (const struct store *s, unsigned cap)
{
  return (s->caps & cap) == cap;
}

static inline int
store_sync (struct store *s)
{
  return s->ops->sync ? s->ops->sync (s) : 0;
}

static inline bool
store_may_reuse (struct store *s, uint32_t slot)
{
  return s->ops->may_reuse == NULL || s->ops->may_reuse (s, slot);
}

static inline int
store_recover (struct store *s, store_recover_fn fn, void *arg,
               struct store_recovery *out)
{
  memset (out, 0, sizeof *out);
  return s->ops->recover ? s->ops->recover (s, fn, arg, out) : 0;
}

static inline int
store_mark_clean (struct store *s)
{
  return s->ops->mark_clean ? s->ops->mark_clean (s) : 0;
}

static inline int
store_set_doubt (struct store *s, bool doubt)
{
  return s->ops->set_doubt ? s->ops->set_doubt (s, doubt) : 0;
}

static inline int
store_set_fenced (struct store *s, bool fenced)
{
  return s->ops->set_fenced ? s->ops->set_fenced (s, fenced) : 0;
}

static inline int
store_set_pt_lost (struct store *s, bool lost)
{
  return s->ops->set_pt_lost ? s->ops->set_pt_lost (s, lost) : 0;
}

static inline void
store_get_info (struct store *s, struct store_info *out)
{
  memset (out, 0, sizeof *out);
  if (s->ops->info)
    s->ops->info (s, out);
}

static inline void
store_get_stats (struct store *s, struct store_stats *out)
{
  memset (out, 0, sizeof *out);
  if (s->ops->stats)
    s->ops->stats (s, out);
}

/* Memory for nslots folios of folio_size with block_size blocks, on a
 * memfd (its layout at the top of src/store/store-ram.c), not populated
 * yet: each page is faulted in when first touched. */
struct store *store_ram_create (uint32_t nslots, uint32_t folio_size,
                                uint32_t block_size);

/* The layout of a ram store's memfd: a process hands its ram stores to
 * a new one (upgrade in place) only if the new one reads this version;
 * else it writes them back first. */
#define STORE_RAM_LAYOUT_VERSION 1u

/* Upgrade in place, old process: the cache using ram store s is
 * quiesced (no request, writeback or readahead runs, nor will): stamp
 * the memfd handed over, for the export name of export_size bytes, and
 * make a new fd of it (close-on-exec) to send: store_ram_kept_fd (-1
 * before), which destroy closes.  0, or -1 with errno.  Once.  (A failed
 * upgrade adopts that fd again, then destroys s: its unmapping, some
 * 100 ms for 4 GiB, is no part of the hand-over's pause.) */
int store_ram_keep (struct store *s, const char *name, uint64_t export_size);
int store_ram_kept_fd (struct store *s);

/* Old process, the new one ready: free s but leave its mapping and fds
 * to the exit that follows (unmapping is no part of the pause). */
void store_ram_abandon (struct store *s);

/* The export name a handed-over memfd was kept for.  0, or -1 with err
 * (not a ram store of this version, or not handed over). */
int store_ram_handed_name (int fd, char *name, size_t len, char *err,
                           size_t errlen);

/* A ram store on a handed-over memfd, which must have this geometry and
 * export size: its recover() hands back every folio with its bits, and
 * its info says was_clean.  The store maps a copy of fd: fd stays the
 * caller's.  NULL with err if the memfd is not one. */
struct store *store_ram_adopt (int fd, uint32_t nslots, uint32_t folio_size,
                               uint32_t block_size, uint64_t export_size,
                               char *err, size_t errlen);

/* Called once from the populating thread when it is done: err 0, or the
 * errno that stopped it (EINVAL: a kernel before 5.14; ENOMEM) after
 * bytes; ms it took.  Not called when destroy stopped it first. */
typedef void store_populated_fn (void *arg, int err, uint64_t bytes,
                                 uint64_t ms);

/* Fault a ram store's memory in, in a background thread at SCHED_IDLE,
 * so that no request pays for a page's first touch later; requests
 * meanwhile fault in what they touch.  Once per store; destroy stops it.
 * 0, or -1 with errno (EINVAL: not a ram store, or already started). */
int store_ram_populate (struct store *s, store_populated_fn *done,
                        void *arg);

/* Persistent stores live in a file (or a device) named by
 * store=KIND:PATH, and are opened for one export: its geometry, and its
 * backing's identity, which the store records and checks at every open. */
struct store_config {
  const char *path;
  uint32_t nslots, folio_size, block_size;
  uint64_t export_size;
  const char *backing_spec;       /* the backing's identity: spec, size, */
  uint64_t backing_size;          /* and for a file st_dev / st_ino (else 0) */
  uint64_t backing_dev, backing_ino;
  const char *backing_file;       /* a regular file: its path, else NULL;
                                   * a clean store is warm only if its */
  uint64_t backing_mtime_ns;      /* mtime and ctime, taken before the */
  uint64_t backing_ctime_ns;      /* backing was opened, are the clean
                                   * stop's (stat'ed then at this path) */
};

/* What a store's header records: its geometry and its backing (offline:
 * foliod store writeback PATH opens the export it belongs to). */
struct store_header_info {
  uint32_t nslots, folio_size, block_size;
  uint64_t export_size, backing_size;
  char backing_spec[1024];
};

/* A kind of persistent store (store-kinds.c holds the table): how the
 * export opens one, and the offline tools (foliod store inspect,
 * foliod store writeback) read one. */
struct store_kind {
  const char *name;               /* KIND of store=KIND:PATH */
  /* Open the store at cfg->path, creating and formatting it when it is
   * missing or all zeros; an existing store must match cfg (geometry,
   * backing).  Marks it in use (not clean).  NULL with errno and one line
   * in err naming the file and the reason. */
  struct store *(*open) (const struct store_config *cfg,
                         char *err, size_t errlen);
  /* Print a store's headers, geometry, backing and dirty bytes to out.
   * 0, or -1 with err. */
  int (*inspect) (const char *path, FILE *out, char *err, size_t errlen);
  int (*read_header) (const char *path, struct store_header_info *out,
                      char *err, size_t errlen);
};

/* The kind spec (KIND:PATH) names, *path set to its PATH (not empty);
 * NULL if none does (the ram store, or a typo). */
const struct store_kind *store_kind_parse (const char *spec,
                                           const char **path);
/* The kind whose header the file at path has, with the header in *h;
 * NULL with err (the first kind's reason) if none. */
const struct store_kind *store_kind_probe (const char *path,
                                           struct store_header_info *h,
                                           char *err, size_t errlen);

/* The pmem store (store=pmem:PATH): folio data, bitmaps and the slot
 * table in a file mapped with libpmem2.  Its store_ops: sync msyncs what
 * persist() recorded (page store; cache-line stores persist at once),
 * may_reuse holds a slot back until the sync after its last clear,
 * recover keeps dirty and unstable blocks after an unclean shutdown (and
 * frees slots with a stale bitmap, a folio past the export, or a folio a
 * newer slot holds too), mark_clean is the warm restart.  The ordering
 * contract is at the top of src/store/store-pmem.c.  Its store_kind
 * functions: */
struct store *store_pmem_open (const struct store_config *cfg,
                               char *err, size_t errlen);
int store_pmem_inspect (const char *path, FILE *out, char *err, size_t errlen);
int store_pmem_read_header (const char *path, struct store_header_info *out,
                            char *err, size_t errlen);

static inline void
store_destroy (struct store *s)
{
  if (s)
    s->ops->destroy (s);
}

#endif /* FOLIOD_STORE_H */
