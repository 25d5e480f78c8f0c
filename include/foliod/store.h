/* Stores: where folio memory (and folio metadata) lives.
 *
 * The cache has nslots slots of folio_size bytes.  A store hands out, per
 * slot, the data and the state bitmap (enum folio_plane), and records
 * which folio a slot holds.  The ram store keeps all of it in
 * anonymous memory; a persistent store maps a file so that dirty data and
 * its bitmap survive a crash, and needs persist() called after data and
 * again after the bitmap changes (data first, then the dirty bit).
 */
#ifndef FOLIOD_STORE_H
#define FOLIOD_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

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

struct store_ops {
  const char *name;
  /* Folio memory of a slot: folio_size bytes. */
  void *(*data) (struct store *s, uint32_t slot);
  /* State bitmap of a slot: bitmap_words words, FP_NPLANES planes. */
  uint64_t *(*bitmap) (struct store *s, uint32_t slot);
  /* Record that slot holds folio index (STORE_NO_FOLIO: free). */
  void (*set_index) (struct store *s, uint32_t slot, uint64_t folio_index);
  /* Make [p, p+len) inside the store durable.  0 or -1/errno. */
  int (*persist) (struct store *s, const void *p, size_t len);
  void (*destroy) (struct store *s);
};

struct store {
  const struct store_ops *ops;
  uint32_t nslots;
  uint32_t folio_size;
  uint32_t bitmap_words; /* uint64_t words per slot bitmap */
};

/* Anonymous memory for nslots folios of folio_size with block_size blocks,
 * not populated yet: each page is faulted in when first touched. */
struct store *store_ram_create (uint32_t nslots, uint32_t folio_size,
                                uint32_t block_size);

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

/* The pmem store (store = pmem:PATH): folio data, bitmaps and the slot
 * table in a file mapped with libpmem2.  The ordering contract the cache
 * keeps is at the top of src/cache/store-pmem.c. */
struct store_pmem_config {
  const char *path;
  uint32_t nslots, folio_size, block_size;
  uint64_t export_size;
  const char *backing_spec;       /* the backing's identity: spec, size, */
  uint64_t backing_size;          /* and for a file st_dev / st_ino (else 0) */
  uint64_t backing_dev, backing_ino;
};

/* Open the store at cfg->path, creating and formatting it when it is
 * missing or all zeros; an existing store must match cfg (geometry,
 * backing).  Marks it in use (not clean).  NULL with errno and one line in
 * err naming the file and the reason. */
struct store *store_pmem_open (const struct store_pmem_config *cfg,
                               char *err, size_t errlen);

struct store_pmem_info {
  const char *granularity;   /* "cache-line", "byte" or "page" */
  bool power_safe_per_write; /* persist() is a CPU flush, not deferred */
  bool devdax;
  bool formatted;            /* new store: nothing to recover */
  bool was_clean;            /* shut down cleanly: every bit is trusted */
};
void store_pmem_get_info (struct store *s, struct store_pmem_info *info);

/* Called by store_pmem_recover for each slot that holds a folio, in folio
 * order, with the slot's bitmap (in the store).  Non-zero stops the walk
 * and is returned. */
typedef int (*store_pmem_recover_fn) (void *arg, uint32_t slot,
                                      uint64_t folio_index, uint64_t *bits);
struct store_pmem_recovery {
  uint32_t folios;                     /* slots handed to fn */
  uint32_t dropped;                    /* slots freed: not trustworthy */
  uint64_t dirty_blocks, unstable_blocks;   /* as found (unstable: now dirty) */
};
/* Walk the slots that hold a folio.  After an unclean shutdown only dirty
 * and unstable blocks are kept (uptodate = dirty | unstable, persisted);
 * unstable blocks come back dirty (the backing may have lost them);
 * slots with nothing trusted left, a stale bitmap, a folio index past the
 * export, or a folio held by a newer slot too, are freed.  Call once,
 * before the first set_index. */
int store_pmem_recover (struct store *s, store_pmem_recover_fn fn, void *arg,
                        struct store_pmem_recovery *out);

/* Page-granular stores: msync what persist() recorded since the last call
 * (FLUSH, FUA; set_index calls it itself when a slot whose bits may still
 * say dirty on the media takes a new folio).  Cache-line stores: 0 at
 * once.  0 or -1/errno (the ranges stay pending). */
int store_pmem_sync_pending (struct store *s);

/* Copy len bytes from src into the store at dst and persist them: the
 * write path's copy (cache-line stores: non-temporal stores, no separate
 * flush; page stores: memcpy, recorded for the next sync_pending). */
void store_pmem_write (struct store *s, void *dst, const void *src,
                       size_t len);

/* Everything written back and flushed, no write in flight: sync and mark
 * the store clean, so that the next open trusts every block (warm
 * restart).  The next persist() or set_index marks it in use again. */
int store_pmem_mark_clean (struct store *s);

/* Print a store's headers, geometry, backing and dirty bytes to out
 * (offline: foliod store inspect PATH).  0, or -1 with err. */
int store_pmem_inspect (const char *path, FILE *out, char *err, size_t errlen);

/* What a store's header records: its geometry and its backing (offline:
 * foliod store writeback PATH opens the export it belongs to). */
struct store_pmem_header_info {
  uint32_t nslots, folio_size, block_size;
  uint64_t export_size, backing_size;
  char backing_spec[1024];
};
int store_pmem_read_header (const char *path,
                            struct store_pmem_header_info *out,
                            char *err, size_t errlen);

static inline void
store_destroy (struct store *s)
{
  if (s)
    s->ops->destroy (s);
}

#endif /* FOLIOD_STORE_H */
