/* The pmem store: folio data, bitmaps and slot table in a mapped file
 * (pmem-layout.h), persisted with libpmem2 (pmem-map.h).
 *
 * Ordering contract.  The store persists in the order persist() is called;
 * the cache keeps these rules (issue 14, DESIGN.md "store=pmem"):
 *
 *  - write: data into data(slot), persist(data); then the dirty bits,
 *    persist(bits); then the reply.  A FLUSH, or a FUA write, calls
 *    sync() before its reply.
 *  - a slot takes a folio with set_index(slot, folio) before any of its
 *    bits says uptodate or dirty.  set_index clears the slot's bits, stamps
 *    its bitmap with a new store-wide generation and writes the slot entry
 *    with the same generation, persisted before it returns (cache-line
 *    store).  Recovery trusts a bitmap only when its stamp equals the
 *    entry's generation, and of two slots naming one folio only the newer
 *    generation, so a reuse whose stores reached the media out of order
 *    never attributes one folio's bits to another.
 *  - writeback: backing write; set the unstable bits, persist(bits); only
 *    then clear the dirty bits, persist(bits) (the planes may lie in
 *    different words, and a torn update must not leave a block neither);
 *    backing flush; then clear the unstable bits, persist(bits): a
 *    written-back block stays recoverable until the backing has flushed
 *    it.  A slot is reused (set_index) only after its dirty and unstable
 *    bits are clear and persisted, and when may_reuse allows; no data of
 *    the new folio goes into the slot before its set_index.
 *  - shutdown: everything written back and flushed, then
 *    mark_clean(); the next open trusts every uptodate block.
 *    Open marks the store in use (not clean); after an unclean shutdown
 *    recover() keeps only dirty and unstable blocks; unstable
 *    ones come back dirty (the backing may have lost its unflushed writes).
 *    Recovery ends with a sync of the whole store (page store: after a
 *    kill the mapping may hold more than the media).
 *
 * What "persistent" means:
 *  - cache-line store (a DAX file mapped MAP_SYNC, device-DAX): persist()
 *    is libpmem2's CPU flush + fence, power-safe when it returns; no
 *    system call on the write path.  sync() has nothing to do.
 *  - page store (any other file): the mapping is shared, so a store is
 *    safe against the death of the process as soon as it is made; persist()
 *    only records the range, and sync() msyncs what was recorded
 *    since its last call.  Power-safe from that call on: between two calls
 *    the kernel writes pages in any order and at any time, so after a power
 *    cut (not a process crash) a 512-byte sector written since the last
 *    FLUSH may come back as any data it held since (its older or its new
 *    data, or what an earlier folio of the slot left there: the bitmap's
 *    page reached the media, the data's did not); every other sector
 *    comes back exact.  That includes the sectors of a block a write
 *    covered only in part: the cache (STORE_MAPPED) syncs the block's
 *    other bytes before it sets the block's dirty bit (else a clean
 *    copy, a read fill never persisted, would come back as the slot's
 *    older data under that bit: FAULT_SEED=350 of the fault model).  That includes the slot's earlier folios:
 *    until a sync, the media may still hold bits a writeback cleared, so
 *    a slot takes a new folio only after the sync that carries the clear
 *    of its dirty and unstable bits (else the new folio's data would land
 *    under the old folio's trusted bits).  reuse_note names that sync,
 *    may_reuse tells the cache whether it is done; the cache never waits
 *    for it (it evicts another slot, or has its writeback thread sync).
 *    A persist of bits that were clean already (a read fill) names none:
 *    the media's bits are clean since that sync, and a reuse whose stores
 *    land out of order is dropped by the generation stamp.  After a
 *    failed sync no cleared slot is reused again: the cache fails what
 *    needs one (EIO) instead of reusing a slot whose media bits may
 *    still say dirty.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>

#include "foliod/minmax.h"
#include "foliod/store.h"
#include "store/pmem-layout.h"
#include "store/pmem-map.h"

/* Page stores track pending msync in chunks of this many bytes. */
#define PMEM_SYNC_CHUNK_SHIFT 16

struct store_pmem {
  struct store s;                /* first: the base */
  struct pmem_map map;
  struct pmem_meta meta;
  uint32_t blocks;               /* blocks per folio */
  uint64_t next_gen;             /* atomic: the next set_index's generation */
  bool formatted, was_clean;
  bool was_doubt;                /* PMEM_FLAG_DOUBT at open */
  bool was_fenced;               /* PMEM_FLAG_FENCED at open */
  bool was_pt_lost;              /* PMEM_FLAG_PT_LOST at open */
  const char *warm_dropped;      /* why a clean store was not trusted */
  char *backing_file;            /* a regular file backing: stat'ed at open
                                  * and at mark_clean (warm cache trust) */
  bool clean;                    /* atomic: header says clean right now */
  bool defer;                    /* page store: persist() records only */
  uint64_t *pending;             /* atomic bits: chunks to msync */
  uint64_t *pending_top;         /* atomic bits: words of pending not 0, so
                                  * a FLUSH scans 1/4096 of the chunks */
  size_t pending_words, top_words;
  /* The one sequence of the persistence protocol (dm-writecache's
   * seq_count): what is durable, and which slot may be reused. */
  uint64_t syncs_started;        /* atomic: pmem_sync calls begun */
  uint64_t syncs_done;           /* atomic: the last one that succeeded */
  uint64_t *reuse_sync;          /* atomic, per slot: the sync that must be
                                  * done before the slot takes a new folio
                                  * (its media bits may say dirty); 0: none */
  bool *bits_dirty;              /* per slot: the bits last persisted had
                                  * dirty or unstable blocks (the slot's
                                  * stripe in the cache orders them) */
  pthread_mutex_t sync_lock;     /* one sync at a time; guards the header */
  int sync_errno;                /* under sync_lock: an msync failed */
  struct recover_ent *recover;   /* pmem_recover's, until it returns */
};

#define SP(s) ((struct store_pmem *) (s))

static void *
pmem_data (struct store *s, uint32_t slot)
{
  return pmem_layout_data (&SP (s)->meta, slot);
}

static uint64_t *
pmem_bitmap (struct store *s, uint32_t slot)
{
  return pmem_layout_bitmap (&SP (s)->meta, slot) + 1;  /* past the stamp */
}

/* Record [addr, addr+len) for the next sync: the chunk bits, then the
 * summary bit of their word, which pmem_sync takes first. */
static void
pending_mark (struct store_pmem *p, const void *addr, size_t len)
{
  size_t off = (const unsigned char *) addr - p->map.base;
  size_t first = off >> PMEM_SYNC_CHUNK_SHIFT;
  size_t last = (off + len - 1) >> PMEM_SYNC_CHUNK_SHIFT;

  for (size_t c = first; c <= last; c++) {
    size_t w = c / 64;
    __atomic_fetch_or (&p->pending[w], 1ull << (c % 64), __ATOMIC_RELEASE);
    __atomic_fetch_or (&p->pending_top[w / 64], 1ull << (w % 64),
                       __ATOMIC_SEQ_CST);   /* before reuse_note's load */
  }
}

/* A store marked clean that is written again is no longer clean: say so
 * in the header before the first new byte can become persistent. */
static void
pmem_unclean (struct store_pmem *p)
{
  if (!__atomic_load_n (&p->clean, __ATOMIC_ACQUIRE))
    return;
  pthread_mutex_lock (&p->sync_lock);
  if (p->clean) {
    pmem_layout_set_clean (&p->meta, false);
    __atomic_store_n (&p->clean, false, __ATOMIC_RELEASE);
  }
  pthread_mutex_unlock (&p->sync_lock);
}

/* Page store: the kernel writes pages back in any order and at any time,
 * so until the next sync the media may still hold a slot's dirty bits of
 * before a writeback.  Such a slot must not take a new folio (whose data
 * would land under the old folio's trusted bits) before that sync: note
 * which one, while the bits are dirty or unstable and at the persist that
 * clears them; not later (bits clean on the media stay clean).  Called
 * after pending_mark; a sync that began before it may have missed its
 * chunks, so the next one is named. */
static void
reuse_note (struct store_pmem *p, const void *addr, size_t len)
{
  size_t off = (const unsigned char *) addr - p->map.base;
  size_t stride = p->meta.l.bitmap_stride;
  size_t end = p->meta.l.bitmaps_off + (size_t) p->s.nslots * stride;

  if (off + len <= p->meta.l.bitmaps_off || off >= end)
    return;
  size_t first = off < p->meta.l.bitmaps_off
                 ? 0 : (off - p->meta.l.bitmaps_off) / stride;
  size_t last = (MIN (off + len, end) - 1 - p->meta.l.bitmaps_off) / stride;
  uint64_t next = __atomic_load_n (&p->syncs_started, __ATOMIC_SEQ_CST) + 1;

  for (size_t i = first; i <= last; i++) {
    const uint64_t *bits = pmem_layout_bitmap (&p->meta, (uint32_t) i) + 1;
    bool dirty = pmem_bits_dirty_or_unstable (bits, p->blocks);
    if (dirty || p->bits_dirty[i])
      __atomic_store_n (&p->reuse_sync[i], next, __ATOMIC_RELAXED);
    p->bits_dirty[i] = dirty;
  }
}

static int
pmem_persist (struct store *s, const void *addr, size_t len)
{
  struct store_pmem *p = SP (s);

  if (len == 0)
    return 0;
  assert ((const unsigned char *) addr >= p->map.base &&
          (const unsigned char *) addr + len <= p->map.base + p->map.size);
  pmem_unclean (p);
  if (p->defer) {
    pending_mark (p, addr, len);
    reuse_note (p, addr, len);
  } else
    p->map.persist (addr, len);
  return 0;
}

static void
pmem_write (struct store *s, void *dst, const void *src, size_t len)
{
  struct store_pmem *p = SP (s);

  if (p->defer) {       /* libpmem2's copy would msync each time */
    memcpy (dst, src, len);
    pmem_persist (s, dst, len);
    return;
  }
  pmem_unclean (p);
  p->map.memcpy (dst, src, len, 0);   /* non-temporal, then a fence */
}

/* May slot take a new folio: is the sync reuse_note named done?  After a
 * failed sync, syncs_done stays where it was: a slot cleared since is
 * never reused (the error is sticky, see pmem_sync). */
static bool
pmem_may_reuse (struct store *s, uint32_t slot)
{
  struct store_pmem *p = SP (s);

  return !p->defer ||
         __atomic_load_n (&p->reuse_sync[slot], __ATOMIC_RELAXED) <=
         __atomic_load_n (&p->syncs_done, __ATOMIC_ACQUIRE);
}

static void
pmem_set_index (struct store *s, uint32_t slot, uint64_t folio_index)
{
  struct store_pmem *p = SP (s);
  uint64_t gen = __atomic_fetch_add (&p->next_gen, 1, __ATOMIC_RELAXED);
  uint64_t *rec = pmem_layout_bitmap (&p->meta, slot);
  struct pmem_slot *e = pmem_layout_slot (&p->meta, slot);

  assert (folio_index == STORE_NO_FOLIO || pmem_may_reuse (s, slot));
  pmem_unclean (p);
  memset (rec + 1, 0, (size_t) s->bitmap_words * sizeof *rec);
  rec[0] = gen;
  pmem_layout_slot_set (&p->meta, slot, folio_index, gen);
  if (p->defer) {
    pending_mark (p, rec, p->meta.l.bitmap_stride);
    pending_mark (p, e, sizeof *e);
  } else {      /* either may land first: the stamp check covers both */
    p->map.flush (rec, p->meta.l.bitmap_stride);
    p->map.flush (e, sizeof *e);
    p->map.drain ();
  }
}

/* msync chunks [first, end), the whole chunks clipped to the mapping. */
static int
pmem_msync_chunks (struct store_pmem *p, size_t first, size_t end)
{
  size_t off = first << PMEM_SYNC_CHUNK_SHIFT;
  size_t len = (end << PMEM_SYNC_CHUNK_SHIFT) - off;

  if (off + len > p->map.size)
    len = p->map.size - off;
  return p->map.sync (p->map.base + off, len);
}

/* Take the pending bits (only the words the summary names) and msync each
 * run of set bits.  Returns 0 or -1/errno. */
static int
pmem_sync_runs (struct store_pmem *p)
{
  size_t run = 0, run_end = 0;   /* the run being gathered, [run, run_end) */

  for (size_t t = 0; t < p->top_words; t++) {
    uint64_t top = __atomic_exchange_n (&p->pending_top[t], 0,
                                        __ATOMIC_SEQ_CST);
    while (top) {
      size_t w = t * 64 + (size_t) __builtin_ctzll (top);
      uint64_t bits = __atomic_exchange_n (&p->pending[w], 0, __ATOMIC_ACQ_REL);
      top &= top - 1;
      while (bits) {
        size_t c = w * 64 + (size_t) __builtin_ctzll (bits);
        bits &= bits - 1;
        if (c == run_end && run_end > run) {
          run_end++;
          continue;
        }
        if (run_end > run && pmem_msync_chunks (p, run, run_end) == -1)
          return -1;
        run = c;
        run_end = c + 1;
      }
    }
  }
  if (run_end > run && pmem_msync_chunks (p, run, run_end) == -1)
    return -1;
  return 0;
}

/* Page stores: msync what persist() recorded since the last call.
 * Cache-line stores: 0 at once.  0 or -1/errno (the ranges stay
 * pending; the error sticks). */
static int
pmem_sync (struct store *s)
{
  struct store_pmem *p = SP (s);
  int r = 0;

  if (!p->defer)
    return 0;
  /* Any sync numbered above this one starts after the caller's ranges
   * were recorded, so it covers them. */
  uint64_t want = __atomic_load_n (&p->syncs_started, __ATOMIC_SEQ_CST) + 1;
  /* Serialised: a second FLUSH must not return while the first is still
   * writing the ranges it took, some of which may be the second's. */
  pthread_mutex_lock (&p->sync_lock);
  /* Group commit: FLUSHes that queued here while one sync ran are all
   * answered by the next one, not one msync each in a row. */
  if (p->sync_errno == 0 &&
      __atomic_load_n (&p->syncs_done, __ATOMIC_ACQUIRE) >= want) {
    pthread_mutex_unlock (&p->sync_lock);
    return 0;
  }
  uint64_t n = __atomic_add_fetch (&p->syncs_started, 1, __ATOMIC_SEQ_CST);
  if (p->sync_errno == 0 && pmem_sync_runs (p) == -1)
    p->sync_errno = errno;
  if (p->sync_errno == 0)
    __atomic_store_n (&p->syncs_done, n, __ATOMIC_RELEASE);
  /* Linux reports a writeback error once and then marks the pages clean:
   * a later msync would succeed with the data lost, so the error sticks. */
  if (p->sync_errno) {
    errno = p->sync_errno;
    r = -1;
  }
  pthread_mutex_unlock (&p->sync_lock);
  return r;
}

/* A backing file's content state: mtime and ctime in ns (a write, a cp
 * onto it, a truncate, a chmod all move the ctime; the mtime can be set
 * back, the ctime cannot).  0, or -1 if it is not the file (dev, ino). */
static int
backing_stamp (const char *file, uint64_t dev, uint64_t ino, uint64_t t[2])
{
  struct stat st;

  if (stat (file, &st) == -1 || (uint64_t) st.st_dev != dev ||
      (uint64_t) st.st_ino != ino)
    return -1;
  t[0] = (uint64_t) st.st_mtim.tv_sec * 1000000000u +
         (uint64_t) st.st_mtim.tv_nsec;
  t[1] = (uint64_t) st.st_ctim.tv_sec * 1000000000u +
         (uint64_t) st.st_ctim.tv_nsec;
  return 0;
}

/* Clean shutdown, the backing written back and flushed: record its state
 * in the header (the caller writes it), so that the next open can tell
 * whether it changed meanwhile.  Under sync_lock. */
static void
pmem_stamp_backing (struct store_pmem *p)
{
  struct pmem_header *h = &p->meta.hdr;
  uint64_t t[2];

  h->flags &= ~PMEM_FLAG_STAMPED;
  if (p->backing_file &&
      backing_stamp (p->backing_file, h->backing_dev, h->backing_ino, t) == 0) {
    h->backing_mtime_ns = t[0];
    h->backing_ctime_ns = t[1];
    h->flags |= PMEM_FLAG_STAMPED;
  }
}

static int
pmem_mark_clean (struct store *s)
{
  struct store_pmem *p = SP (s);

  if (pmem_sync (s) == -1)
    return -1;
  pthread_mutex_lock (&p->sync_lock);
  pmem_stamp_backing (p);
  pmem_layout_set_clean (&p->meta, true);
  __atomic_store_n (&p->clean, true, __ATOMIC_RELEASE);
  pthread_mutex_unlock (&p->sync_lock);
  return 0;
}

static void
pmem_free (struct store_pmem *p)
{
  pmem_map_close (&p->map);
  pthread_mutex_destroy (&p->sync_lock);
  free (p->pending);
  free (p->pending_top);
  free (p->reuse_sync);
  free (p->bits_dirty);
  free (p->recover);
  free (p->backing_file);
  free (p);
}

static void
pmem_destroy (struct store *s)
{
  pmem_sync (s);   /* best effort: nothing is lost by a miss */
  pmem_free (SP (s));
}

static void
pmem_info (struct store *s, struct store_info *info)
{
  struct store_pmem *p = SP (s);

  info->granularity = pmem_map_granularity_name (p->map.gran);
  info->devdax = p->map.devdax;
  info->mechanism = p->map.devdax ? "device-DAX"
                    : !(s->caps & STORE_DEFERRED) ? "MAP_SYNC" : "msync";
  info->formatted = p->formatted;
  info->was_clean = p->was_clean;
  info->warm_dropped = p->warm_dropped;
  info->doubt = p->was_doubt;
  info->fenced = p->was_fenced;
  info->pt_lost = p->was_pt_lost;
}

/* A flag of the ledger's in the header (under sync_lock, which guards
 * it): writes in doubt, fenced, passthrough writes lost.  Into both
 * copies: one damaged newer copy would otherwise give back the older
 * one, without the fact (every later header update carries it). */
static int
pmem_set_flag (struct store *s, uint32_t flag, bool on)
{
  struct store_pmem *p = SP (s);

  pthread_mutex_lock (&p->sync_lock);
  if (on)
    p->meta.hdr.flags |= flag;
  else
    p->meta.hdr.flags &= ~flag;
  pmem_layout_update_both (&p->meta);
  pthread_mutex_unlock (&p->sync_lock);
  return 0;
}

static int
pmem_set_doubt (struct store *s, bool doubt)
{
  return pmem_set_flag (s, PMEM_FLAG_DOUBT, doubt);
}

static int
pmem_set_fenced (struct store *s, bool fenced)
{
  return pmem_set_flag (s, PMEM_FLAG_FENCED, fenced);
}

static int
pmem_set_pt_lost (struct store *s, bool lost)
{
  return pmem_set_flag (s, PMEM_FLAG_PT_LOST, lost);
}

static int pmem_recover (struct store *s, store_recover_fn fn, void *arg,
                         struct store_recovery *out);

static const struct store_ops pmem_ops = {
  .name = "pmem",
  .data = pmem_data,
  .bitmap = pmem_bitmap,
  .set_index = pmem_set_index,
  .persist = pmem_persist,
  .write = pmem_write,
  .sync = pmem_sync,
  .may_reuse = pmem_may_reuse,
  .recover = pmem_recover,
  .mark_clean = pmem_mark_clean,
  .info = pmem_info,
  .set_doubt = pmem_set_doubt,
  .set_fenced = pmem_set_fenced,
  .set_pt_lost = pmem_set_pt_lost,
  .destroy = pmem_destroy,
};

/* The next generation: past every entry and every stamp on the media. */
static void
pmem_init_gen (struct store_pmem *p)
{
  uint64_t max = 0;

  for (uint32_t i = 0; i < p->s.nslots; i++) {
    uint64_t g = pmem_layout_slot (&p->meta, i)->gen;   /* sound or not */
    uint64_t t = pmem_layout_bitmap (&p->meta, i)[0];
    max = g > max ? g : max;
    max = t > max ? t : max;
  }
  p->next_gen = max + 1;
}

/* A clean store is warm (every block trusted) only if its backing did
 * not change while foliod was down.  A regular file tells: its mtime and
 * ctime (cfg's: taken before foliod opened it, which may touch them) must
 * be those recorded at the clean shutdown.  A block device or
 * a remote cannot tell (foliod(8) says so): trusted.  NULL (trusted), or
 * why the warm cache is dropped. */
static const char *
pmem_warm_check (struct store_pmem *p, const struct store_config *cfg)
{
  const struct pmem_header *h = &p->meta.hdr;

  if (cfg->backing_file == NULL)
    return NULL;
  if (!(h->flags & PMEM_FLAG_STAMPED))
    return "the clean shutdown recorded no state of the backing file";
  if (cfg->backing_mtime_ns != h->backing_mtime_ns ||
      cfg->backing_ctime_ns != h->backing_ctime_ns)
    return "the backing file changed while foliod was down (its mtime or "
           "ctime is not the clean shutdown's)";
  return NULL;
}

/* Format or validate the mapped store; it is then marked in use. */
static int
pmem_open_meta (struct store_pmem *p, const struct store_config *cfg,
                char *err, size_t errlen)
{
  struct pmem_geometry g = { cfg->folio_size, cfg->block_size, cfg->nslots,
                             cfg->export_size };
  struct pmem_backing_id b = { cfg->backing_spec, cfg->backing_size,
                               cfg->backing_dev, cfg->backing_ino };
  struct pmem_layout l;
  int r;

  if (pmem_layout_compute (&l, &g, err, errlen) == -1)
    return -1;
  r = pmem_layout_open (&p->meta, &p->map, &g, &b, cfg->path, err, errlen);
  if (r == 1) {
    r = pmem_layout_format (&p->meta, &p->map, &l, &b, err, errlen);
    p->formatted = r == 0;
    if (r == -1 && errno == ENOSPC)   /* name the file */
      snprintf (err, errlen, "%s: store too small: %zu bytes, needs %" PRIu64,
                cfg->path, p->map.size, l.total_size);
  }
  if (r == -1)
    return -1;
  p->was_clean = p->meta.hdr.flags & PMEM_FLAG_CLEAN;
  p->was_doubt = p->meta.hdr.flags & PMEM_FLAG_DOUBT;
  p->was_fenced = p->meta.hdr.flags & PMEM_FLAG_FENCED;
  p->was_pt_lost = p->meta.hdr.flags & PMEM_FLAG_PT_LOST;
  if (p->was_clean)
    p->warm_dropped = pmem_warm_check (p, cfg);
  p->was_clean = p->was_clean && p->warm_dropped == NULL;
  p->meta.hdr.flags &= ~PMEM_FLAG_STAMPED;   /* the next clean stop's */
  pmem_layout_set_clean (&p->meta, false);
  return 0;
}

static int
pmem_init_pending (struct store_pmem *p)
{
  size_t chunks = (p->map.size >> PMEM_SYNC_CHUNK_SHIFT) + 1;

  p->defer = p->map.gran == PMEM2_GRANULARITY_PAGE;
  if (!p->defer)
    return 0;
  p->pending_words = (chunks + 63) / 64;
  p->top_words = (p->pending_words + 63) / 64;
  p->pending = calloc (p->pending_words, sizeof *p->pending);
  p->pending_top = calloc (p->top_words, sizeof *p->pending_top);
  p->reuse_sync = calloc (p->s.nslots, sizeof *p->reuse_sync);
  p->bits_dirty = calloc (p->s.nslots, sizeof *p->bits_dirty);
  return p->pending && p->pending_top && p->reuse_sync && p->bits_dirty
         ? 0 : -1;
}

struct store *
store_pmem_open_map (struct pmem_map *m,
                     const struct store_config *cfg,
                     char *err, size_t errlen)
{
  struct store_pmem *p = calloc (1, sizeof *p);

  if (p == NULL) {
    pmem_map_close (m);
    snprintf (err, errlen, "%s: out of memory", cfg->path);
    errno = ENOMEM;
    return NULL;
  }
  p->map = *m;
  pthread_mutex_init (&p->sync_lock, NULL);
  if (cfg->backing_file && (p->backing_file = strdup (cfg->backing_file)) ==
      NULL) {
    snprintf (err, errlen, "%s: out of memory", cfg->path);
    errno = ENOMEM;
    goto fail;
  }
  if (pmem_open_meta (p, cfg, err, errlen) == -1)
    goto fail;
  p->s.ops = &pmem_ops;
  p->s.caps = STORE_DURABLE | STORE_MAPPED;
  p->s.nslots = cfg->nslots;
  p->s.folio_size = cfg->folio_size;
  p->s.bitmap_words = p->meta.l.bitmap_words;
  p->blocks = cfg->folio_size / cfg->block_size;
  if (pmem_init_pending (p) == -1) {
    snprintf (err, errlen, "%s: out of memory", cfg->path);
    errno = ENOMEM;
    goto fail;
  }
  if (p->defer)   /* a cleared slot is reused after its msync only */
    p->s.caps |= STORE_DEFERRED | STORE_REUSE_SYNC;
  pmem_init_gen (p);
  return &p->s;

fail:;
  int saved = errno;
  pmem_free (p);
  errno = saved;
  return NULL;
}

struct store *
store_pmem_open (const struct store_config *cfg, char *err, size_t errlen)
{
  struct pmem_geometry g = { cfg->folio_size, cfg->block_size, cfg->nslots,
                             cfg->export_size };
  struct pmem_layout l;
  struct pmem_map m;

  if (pmem_layout_compute (&l, &g, err, errlen) == -1 ||
      pmem_map_open (&m, cfg->path, l.total_size, PMEM_HEADERS_BYTES, 0,
                     err, errlen) == -1)
    return NULL;
  return store_pmem_open_map (&m, cfg, err, errlen);   /* closes m on error */
}

/* Recovery. */

struct recover_ent {
  uint64_t folio, gen;
  uint32_t slot;
};

static int
recover_cmp (const void *a, const void *b)
{
  const struct recover_ent *x = a, *y = b;

  if (x->folio != y->folio)
    return x->folio < y->folio ? -1 : 1;
  return x->gen > y->gen ? -1 : x->gen < y->gen;   /* newest first */
}

/* After an unclean shutdown a clean block may hold a torn write: keep only
 * dirty and unstable blocks.  Returns how many blocks stay uptodate; adds
 * the dirty and unstable ones to out. */
static uint32_t
recover_trim (struct store_pmem *p, uint64_t *bits, bool clean,
              struct store_recovery *out)
{
  uint32_t kept = 0, dirty = 0, unstable = 0;

  for (uint32_t b = 0; b < p->blocks; b++) {
    bool d = pmem_plane_test (bits, p->blocks, FP_DIRTY, b);
    bool u = pmem_plane_test (bits, p->blocks, FP_UNSTABLE, b);
    if (!clean)
      pmem_plane_assign (bits, p->blocks, FP_UPTODATE, b, d || u);
    kept += pmem_plane_test (bits, p->blocks, FP_UPTODATE, b);
    dirty += d;
    unstable += u;
  }
  if (kept) {
    out->dirty_blocks += dirty;
    out->unstable_blocks += unstable;
  }
  return kept;
}

/* The backing may have lost what it had not flushed when foliod stopped:
 * unstable blocks are dirty again.  Dirty is persisted before unstable is
 * cleared (the planes may be in different words: a torn update must not
 * leave a block neither). */
static void
recover_redirty (struct store_pmem *p, uint64_t *bits)
{
  size_t len = (size_t) p->s.bitmap_words * sizeof *bits;
  bool any = false;

  for (uint32_t b = 0; b < p->blocks; b++)
    if (pmem_plane_test (bits, p->blocks, FP_UNSTABLE, b)) {
      pmem_plane_assign (bits, p->blocks, FP_DIRTY, b, true);
      any = true;
    }
  if (!any)
    return;
  pmem_persist (&p->s, bits, len);
  for (uint32_t b = 0; b < p->blocks; b++)
    pmem_plane_assign (bits, p->blocks, FP_UNSTABLE, b, false);
  pmem_persist (&p->s, bits, len);
}

/* The live slots whose folio is inside the export, sorted by folio, newest
 * generation first; the others are freed.  A damaged entry (its crc fails
 * over dirty bits) is counted in out: its folio is unknown, so its data
 * goes nowhere (the alternative is to write it over another folio's). */
static struct recover_ent *
recover_collect (struct store_pmem *p, uint32_t *n,
                 struct store_recovery *out)
{
  uint64_t nfolios = (p->meta.l.g.export_size + p->s.folio_size - 1) /
                     p->s.folio_size;
  struct recover_ent *v = p->recover = calloc (p->s.nslots, sizeof *v);

  *n = 0;
  for (uint32_t i = 0; v && i < p->s.nslots; i++) {
    const struct pmem_slot *e = pmem_layout_slot (&p->meta, i);
    uint32_t damaged = pmem_layout_slot_damaged (&p->meta, i);
    if (damaged) {
      out->bad_entries++;
      out->lost_blocks += damaged;
    }
    if (e->folio_index == STORE_NO_FOLIO &&
        pmem_layout_slot_sound (&p->meta, i))
      continue;
    /* A garbled record under a sound entry: its bits are not to be
     * trusted either (reported above). */
    if (damaged || !pmem_layout_slot_live (&p->meta, i) ||
        e->folio_index >= nfolios) {
      pmem_set_index (&p->s, i, STORE_NO_FOLIO);
      out->dropped++;
      continue;
    }
    v[(*n)++] = (struct recover_ent) { e->folio_index, e->gen, i };
  }
  if (v)
    qsort (v, *n, sizeof *v, recover_cmp);
  return v;
}

static int
pmem_recover (struct store *s, store_recover_fn fn, void *arg,
              struct store_recovery *out)
{
  struct store_pmem *p = SP (s);
  struct recover_ent *v;
  uint32_t n;
  int r = 0;

  v = recover_collect (p, &n, out);
  if (v == NULL)
    return -1;
  for (uint32_t k = 0; k < n && r == 0; k++) {
    uint64_t *bits = pmem_bitmap (s, v[k].slot);
    /* A newer slot took the folio: this one was evicted, clean. */
    bool older = k > 0 && v[k - 1].folio == v[k].folio;
    if (older || recover_trim (p, bits, p->was_clean, out) == 0) {
      pmem_set_index (s, v[k].slot, STORE_NO_FOLIO);
      out->dropped++;
      continue;
    }
    pmem_persist (s, bits, (size_t) s->bitmap_words * sizeof *bits);
    recover_redirty (p, bits);
    out->folios++;
    r = fn (arg, v[k].slot, v[k].folio, bits);
  }
  free (v);
  p->recover = NULL;
  /* Page store after a kill: the mapping holds what the dead process wrote
   * (trusted now), the media maybe not yet: sync all of it, or a power cut
   * later could bring back bits and data older than what was recovered. */
  if (p->defer)
    pending_mark (p, p->map.base, p->map.size);
  if (r == 0 && pmem_sync (s) == -1)
    r = -1;
  return r;
}
