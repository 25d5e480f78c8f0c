/* The cache object, the top of src/cache: configuration, creation and
 * teardown, its threads, counters.  The request paths are in rw.c and
 * direct.c, FLUSH in flush.c. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/cache-int.h"
#include "cache/ops.h"
#include "foliod/minmax.h"
#include "foliod/util.h"

void
cache_config_default (struct cache_config *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->cache_size = 256u << 20;
  cfg->folio_size = 64u << 10;
  cfg->block_size = 4u << 10;
  cfg->mode = CACHE_WRITEBACK;
  cfg->max_io_bytes = 1u << 20;
  cfg->dirty_background_pct = 10;
  cfg->dirty_limit_pct = 20;
  cfg->dirty_auto = true;
  cfg->dirty_expire_ms = 30000;
  cfg->writeback_interval_ms = 1000;
  cfg->readahead_bytes = CACHE_READAHEAD_AUTO;
}

#define CHECK(cond, ...) \
  do { if (!(cond)) { snprintf (err, errlen, __VA_ARGS__); \
                      errno = EINVAL; return -1; } } while (0)

int
cache_config_check (const struct cache_config *cfg, char *err, size_t errlen)
{
  CHECK (is_power_of_2 (cfg->folio_size) && cfg->folio_size >= 4096 &&
         cfg->folio_size <= (2u << 20),
         "folio-size must be a power of two from 4K to 2M (got %" PRIu32 ")",
         cfg->folio_size);
  CHECK (is_power_of_2 (cfg->block_size) && cfg->block_size >= 512,
         "block-size must be a power of two of at least 512 (got %" PRIu32 ")",
         cfg->block_size);
  CHECK (cfg->block_size <= cfg->folio_size,
         "block-size (%" PRIu32 ") must not exceed folio-size (%" PRIu32 ")",
         cfg->block_size, cfg->folio_size);
  CHECK (cfg->cache_size >= 4ull * cfg->folio_size,
         "cache-size must hold at least 4 folios (%" PRIu32 " bytes each)",
         cfg->folio_size);
  CHECK (cfg->cache_size / cfg->folio_size <= UINT32_MAX,
         "cache-size too large for this folio-size");
  CHECK (cfg->max_io_bytes >= 512 && cfg->max_io_bytes <= (32u << 20),
         "max-io must be between 512 and 32M (got %" PRIu32 ")",
         cfg->max_io_bytes);
  CHECK (cfg->dirty_limit_pct >= 1 && cfg->dirty_limit_pct <= 100 &&
         cfg->dirty_background_pct >= 1 &&
         cfg->dirty_background_pct <= cfg->dirty_limit_pct,
         "dirty limits must satisfy 1 <= dirty-background <= dirty-limit <= 100");
  CHECK (cfg->mode <= CACHE_NONE, "unknown cache mode");
  CHECK (cfg->writeback_interval_ms > 0, "writeback interval must be > 0");
  CHECK (cfg->readahead_bytes == CACHE_READAHEAD_AUTO ||
         cfg->readahead_bytes <= CACHE_READAHEAD_MAX,
         "readahead must be auto or at most 64M (got %" PRIu32 ")",
         cfg->readahead_bytes);
  return 0;
}

static unsigned
log2u (uint64_t v)
{
  return (unsigned) __builtin_ctzll (v);
}

/* Error-checking mutexes: a lock taken twice by its holder, or released
 * by a thread that does not hold it, fails (and lock_or_die aborts)
 * instead of hanging or going unnoticed. */
static int
cache_init_locks (struct cache *c)
{
  pthread_mutexattr_t ma;
  int bad = 0;

  if (pthread_mutexattr_init (&ma) != 0)
    return -1;
  bad |= pthread_mutexattr_settype (&ma, PTHREAD_MUTEX_ERRORCHECK);
  for (unsigned i = 0; i < NSTRIPES; i++) {
    bad |= pthread_mutex_init (&c->stripes[i].lock, &ma);
    bad |= cond_init_monotonic (&c->stripes[i].wb_done);
  }
  bad |= pthread_mutex_init (&c->lock, &ma);
  bad |= pthread_mutex_init (&c->wb_mutex, &ma);
  bad |= pthread_mutex_init (&c->walk_lock, &ma);
  bad |= pthread_mutex_init (&c->wlog_lock, &ma);
  bad |= pthread_mutex_init (&c->throttle_lock, &ma);
  bad |= pthread_mutex_init (&c->led.pt_lock, &ma);
  bad |= pthread_mutex_init (&c->led.facts_lock, &ma);
  bad |= pthread_mutex_init (&c->led.doubt_lock, &ma);
  bad |= pthread_mutex_init (&c->led.durable_lock, &ma);
  pthread_mutexattr_destroy (&ma);
  /* These are waited on with timeouts (cond_wait_ms). */
  if (bad != 0 || cond_init_monotonic (&c->space_cv) != 0 ||
      cond_init_monotonic (&c->wb_cv) != 0 ||
      cond_init_monotonic (&c->walk_cv) != 0 ||
      cond_init_monotonic (&c->led.durable_cv) != 0 ||
      pthread_key_create (&c->bounce_key, free) != 0)
    return -1;
  c->bounce_key_ok = true;
  if (flush_group_init (&c->flush_group) != 0)
    return -1;
  c->flush_group_ok = true;
  return 0;
}

static int
cache_init_slots (struct cache *c)
{
  uint32_t n = c->store->nslots;

  c->folios = calloc (n, sizeof *c->folios);
  c->free_slots = calloc (n, sizeof *c->free_slots);
  /* About a bucket per slot (folio_lookup's chains stay short). */
  c->buckets_per_stripe = 1;
  while (c->buckets_per_stripe * NSTRIPES < n)
    c->buckets_per_stripe *= 2;
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  c->buckets = calloc (c->buckets_per_stripe * NSTRIPES, sizeof *c->buckets);
  if (c->folios == NULL || c->free_slots == NULL || c->buckets == NULL)
    return -1;
  for (uint32_t i = 0; i < n; i++) {
    struct folio *f = &c->folios[i];
    f->slot = i;
    f->data = c->store->ops->data (c->store, i);
    f->bits = c->store->ops->bitmap (c->store, i);
    c->free_slots[n - 1 - i] = i;   /* slot 0 is handed out first */
  }
  c->nr_free = n;
  return 0;
}

static void cache_free (struct cache *c);

/* A slot of a persistent store that holds folio fi with bits (the store's
 * recover trimmed them): the folio goes back into the index, its dirty
 * blocks are written back in the background (dirtied long ago, unless
 * an upgrade handed them over). */
static int
cache_recover_one (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct cache *c = arg;
  struct folio *f = &c->folios[slot];
  uint32_t bpf = c->blocks_per_folio;

  if (fi >= c->nr_folios || bits != f->bits || f->cached) {
    errno = EINVAL;
    return -1;
  }
  for (uint32_t i = 0; i < bpf; i++) {
    f->nr_uptodate += folio_test (c, f, FP_UPTODATE, i);
    f->nr_dirty += folio_test (c, f, FP_DIRTY, i);
    f->nr_unstable += folio_test (c, f, FP_UNSTABLE, i);
  }
  if (folio_adopt (c, f, fi) == -1)
    return -1;
  if (f->nr_dirty) {   /* expired: the next background pass takes it */
    uint64_t now = now_ms ();
    f->dirtied_ms = now > c->cfg.dirty_expire_ms + 1
                    ? now - c->cfg.dirty_expire_ms : 1;
    /* Dirty in a store closed cleanly: an upgrade in place handed it
     * over a moment ago (export_close_keep); it ages from now. */
    if (c->sinfo.was_clean)
      f->dirtied_ms = now;
  }
  STAT_ADD (c, dirty_bytes, (uint64_t) f->nr_dirty << c->block_shift);
  STAT_ADD (c, unstable_bytes, (uint64_t) f->nr_unstable << c->block_shift);
  c->sinfo.recovered_folios++;
  c->sinfo.recovered_bytes += (uint64_t) f->nr_uptodate << c->block_shift;
  c->sinfo.recovered_dirty_bytes += (uint64_t) f->nr_dirty << c->block_shift;
  return 0;
}

/* A store closed cleanly keeps clean blocks the backing must still hold
 * (written back and flushed, or read from it).  A file's times are
 * checked by the store; a remote or a block device says nothing, and
 * may have been changed, or another image put behind the same spec,
 * while foliod was down (issue 33 item 8).  Up to WARM_CHECKS of them,
 * the first in each part of the export, are read from the backing and
 * compared: one that differs refuses the store before anything is served
 * or written back.  A backing that cannot be read now is not checked. */
#define WARM_CHECKS 8

static int
warm_check (struct cache *c, char *err, size_t errlen)
{
  uint64_t part = (c->size + WARM_CHECKS - 1) / WARM_CHECKS;
  uint64_t bs = (uint64_t) 1 << c->block_shift;
  bool seen[WARM_CHECKS] = { false };
  unsigned char *buf;
  int r = 0;

  if (!c->sinfo.was_clean || part == 0 || (buf = malloc (bs)) == NULL)
    return 0;
  for (uint32_t s = 0; s < c->store->nslots && r == 0; s++) {
    struct folio *f = &c->folios[s];
    for (uint32_t i = 0; f->cached && i < c->blocks_per_folio; i++) {
      uint64_t off = folio_pos (c, f->index) + block_pos (c, i);
      uint64_t k = off / part;
      if (k >= WARM_CHECKS || seen[k] || off + bs > c->size ||
          !folio_block_uptodate (c, f, i) || folio_block_dirty (c, f, i) ||
          folio_test (c, f, FP_UNSTABLE, i))
        continue;
      seen[k] = true;
      if (c->b->ops->read (c->b, buf, bs, off) == -1)
        goto out;
      if (memcmp (buf, f->data + block_pos (c, i), bs) != 0) {
        snprintf (err, errlen, "the store's clean block at offset %" PRIu64
                  " differs from the backing's: the backing was changed "
                  "while foliod was down, or is another image (remove the "
                  "store to serve the backing as it is)", off);
        errno = EINVAL;
        r = -1;
        break;
      }
    }
  }
 out:
  free (buf);
  return r;
}

/* The store's caps; a durable store is rebuilt into the index (before
 * any set_index), and the free slots are those it left free. */
static int cache_recover_store (struct cache *c, char *err, size_t errlen);

/* What a previous process left in the store for the ledger. */
static void
cache_store_facts (struct cache *c, const struct store_info *info)
{
  struct cache_store_info *si = &c->sinfo;

  si->doubt = info->doubt;
  ledger_store_opened (c, info->doubt);
  si->fenced = info->fenced;
  ledger_store_fenced (c, info->fenced);
  si->pt_lost = info->pt_lost;
  ledger_store_pt_lost (c, info->pt_lost);
}

static int
cache_init_store (struct cache *c, char *err, size_t errlen)
{
  struct cache_store_info *si = &c->sinfo;
  struct store_info info;

  si->kind = c->store->ops->name;
  si->flush = c->cfg.flush != CACHE_FLUSH_DEFAULT ? c->cfg.flush
              : store_has (c->store, STORE_DURABLE) ? CACHE_FLUSH_STORE
              : CACHE_FLUSH_BACKING;
  store_get_info (c->store, &info);
  if (!store_has (c->store, STORE_DURABLE)) {
    if (c->cfg.flush == CACHE_FLUSH_STORE) {
      snprintf (err, errlen, "flush=store needs a durable store (one "
                "that keeps dirty data across a crash: see store=)");
      errno = EINVAL;
      return -1;
    }
    /* A ram store handed over by an upgrade: its folios come back, and
     * the ledger's facts the old process had. */
    if (!info.was_clean)
      return 0;
    si->was_clean = true;
    cache_store_facts (c, &info);
    return cache_recover_store (c, err, errlen);
  }
  si->granularity = info.granularity;
  si->mechanism = info.mechanism ? info.mechanism : "?";
  si->power_safe_per_write = !(c->store->caps & STORE_DEFERRED);
  si->devdax = info.devdax;
  si->formatted = info.formatted;
  si->was_clean = info.was_clean;
  si->warm_dropped = info.warm_dropped;
  cache_store_facts (c, &info);
  return cache_recover_store (c, err, errlen);
}

/* Rebuild the index from the store's slots; the free slots are those it
 * left free. */
static int
cache_recover_store (struct cache *c, char *err, size_t errlen)
{
  struct cache_store_info *si = &c->sinfo;
  struct store_recovery rec;
  uint32_t n = c->store->nslots;
  uint64_t t0 = now_ms ();

  if (store_recover (c->store, cache_recover_one, c, &rec) != 0) {
    snprintf (err, errlen, "recovering the store: %s", strerror (errno));
    return -1;
  }
  si->bad_entries = rec.bad_entries;
  si->lost_bytes = rec.lost_blocks << c->block_shift;
  c->nr_free = 0;
  for (uint32_t i = n; i-- > 0;)   /* slot 0 is handed out first */
    if (!c->folios[i].cached)
      c->free_slots[c->nr_free++] = i;
  si->recover_ms = now_ms () - t0;
  return warm_check (c, err, errlen);
}

/* A store handed in by the caller must have the configured geometry. */
static int
store_check (const struct store *s, const struct cache_config *cfg,
             char *err, size_t errlen)
{
  uint32_t blocks = cfg->folio_size / cfg->block_size;

  CHECK (s->folio_size == cfg->folio_size,
         "store folio size %" PRIu32 " does not match folio-size %" PRIu32,
         s->folio_size, cfg->folio_size);
  CHECK (s->bitmap_words >= store_bitmap_words (blocks),
         "store bitmaps too small for %" PRIu32 " blocks per folio", blocks);
  CHECK (s->nslots >= 4, "store must hold at least 4 folios");
  return 0;
}

/* The thresholds keep room for clean folios: a write or a miss that needs
 * a new folio can only take a clean one.  When the cache holds every
 * folio of the export, none is ever evicted, so dirty data takes no room
 * from anyone: the default thresholds would only write back (and throttle
 * a stream to the backing's speed) data that the client may well rewrite.
 * Then, as the kernel's page cache with an export well under its
 * thresholds, only age (dirty_expire_ms), FLUSH, FUA and shutdown write
 * back, up to DIRTY_AUTO_BACKGROUND (writeback) and DIRTY_AUTO_LIMIT
 * (throttle) still: what a FLUSH or the shutdown (shutdown-timeout) must
 * write stays bounded in a big cache.  Not on a remote, where the
 * percentages bound that over a slow link, unless FLUSH is answered by a
 * persistent store (flush=store), which also keeps what a shutdown could
 * not write back.  Thresholds the user set always apply. */
#define DIRTY_AUTO_BACKGROUND (1ull << 30)
#define DIRTY_AUTO_LIMIT      (2ull << 30)

static bool
flush_by_store (const struct cache *c)
{
  return c->cfg.flush == CACHE_FLUSH_STORE ||
         (c->cfg.flush == CACHE_FLUSH_DEFAULT &&
          store_has (c->store, STORE_DURABLE));
}

static void
dirty_thresholds (struct cache *c, uint64_t bytes)
{
  if (c->cfg.dirty_auto && c->store->nslots >= c->nr_folios &&
      (!(c->b->caps & BACKING_REMOTE) || flush_by_store (c))) {
    c->dirty_background = MAX (DIRTY_AUTO_BACKGROUND,
                               bytes * c->cfg.dirty_background_pct / 100);
    c->dirty_limit = MAX (DIRTY_AUTO_LIMIT,
                          bytes * c->cfg.dirty_limit_pct / 100);
    return;
  }
  c->dirty_limit = bytes * c->cfg.dirty_limit_pct / 100;
  c->dirty_background = bytes * c->cfg.dirty_background_pct / 100;
}

struct cache *
cache_create (struct backing *b, struct store *store,
              const struct cache_config *cfg, char *err, size_t errlen)
{
  struct cache *c;

  if (cache_config_check (cfg, err, errlen) == -1 ||
      (store && store_check (store, cfg, err, errlen) == -1))
    return NULL;
  c = aligned_alloc (_Alignof (struct cache), sizeof *c); /* the stripes */
  if (c == NULL)
    goto nomem;
  memset (c, 0, sizeof *c);
  c->opst = stat_shards_new (sizeof *c->opst);
  if (c->opst == NULL)
    goto nomem;
  c->b = b;
  c->cfg = *cfg;
  if (c->cfg.max_io_bytes < cfg->block_size) /* a request is one block at least */
    c->cfg.max_io_bytes = cfg->block_size;
  c->size = b->size;
  c->folio_shift = log2u (cfg->folio_size);
  c->block_shift = log2u (cfg->block_size);
  c->blocks_per_folio = cfg->folio_size / cfg->block_size;
  c->nr_folios = c->size ? ((c->size - 1) >> c->folio_shift) + 1 : 0;
  c->store = store;
  if (store == NULL && cfg->ram_adopt) {
    uint32_t n = (uint32_t) (cfg->cache_size / cfg->folio_size);
    c->store = c->own_store = store_ram_adopt (cfg->ram_memfd, n,
                                               cfg->folio_size,
                                               cfg->block_size, c->size,
                                               err, errlen);
    if (c->store == NULL) {
      int e = errno;
      cache_free (c);
      errno = e;
      return NULL;
    }
  } else if (store == NULL) {
    uint32_t n = (uint32_t) (cfg->cache_size / cfg->folio_size);
    c->store = c->own_store = store_ram_create (n, cfg->folio_size,
                                                cfg->block_size);
    if (c->store == NULL)
      goto nomem;
  }
  uint64_t bytes = (uint64_t) c->store->nslots * cfg->folio_size;
  c->window = c->store->nslots / 4 < WINDOW_MAX ? c->store->nslots / 4
                                                : WINDOW_MAX;
  if (c->window == 0)
    c->window = 1;
  dirty_thresholds (c, bytes);
  fidx_init (&c->index, c->nr_folios ? c->nr_folios - 1 : 0);
  ledger_init (c);
  c->zero_block = calloc (1, cfg->block_size);
  if (c->zero_block == NULL || cache_init_locks (c) != 0 ||
      cache_init_slots (c) == -1)
    goto nomem;
  if (ra_create (c) == -1)
    goto nomem;
  if (cache_init_store (c, err, errlen) == -1) {
    int e = errno;
    cache_free (c);
    errno = e;
    return NULL;
  }
  if (cache_start_writeback (c) == -1) {
    snprintf (err, errlen, "cannot start the writeback thread: %s",
              strerror (errno));
    cache_free (c);
    return NULL;
  }
  return c;

 nomem:
  snprintf (err, errlen, "out of memory creating the cache");
  cache_free (c);
  errno = ENOMEM;
  return NULL;
}

int
cache_start_writeback (struct cache *c)
{
  int r;

  if (c->wb_running)
    return 0;
  if (wb_helpers_start (c) == -1)
    return -1;
  if (ra_start (c) == -1) {
    wb_helpers_stop (c);
    return -1;
  }
  atomic_store (&c->wb_stop, false);
  r = thread_start (&c->wb_thread, wb_thread_main, c, "wb");
  if (r != 0) {
    ra_stop (c);
    wb_helpers_stop (c);
    errno = r;
    return -1;
  }
  c->wb_running = true;
  return 0;
}

void
cache_stop_writeback (struct cache *c)
{
  if (!c->wb_running)
    return;
  lock_or_die (&c->lock);
  atomic_store (&c->wb_stop, true);
  pthread_cond_signal (&c->wb_cv);
  unlock_or_die (&c->lock);
  pthread_join (c->wb_thread, NULL);
  ra_stop (c);
  wb_helpers_stop (c);
  c->wb_running = false;
}

static void
cache_free (struct cache *c)
{
  if (c == NULL)
    return;
  ra_destroy (c);
  fidx_destroy (&c->index);
  free (c->folios);
  free (c->free_slots);
  free (c->buckets);
  free (c->zero_block);
  free (c->opst);
  store_destroy (c->own_store);
  if (c->bounce_key_ok) {
    free (pthread_getspecific (c->bounce_key));
    pthread_key_delete (c->bounce_key);
  }
  if (c->flush_group_ok)
    flush_group_destroy (&c->flush_group);
  free (c);
}

int
cache_destroy (struct cache *c)
{
  bool lost;

  if (c == NULL)
    return 0;
  cache_stop_writeback (c);
  /* A persistent store keeps them for the next start. */
  lost = !store_has (c->store, STORE_DURABLE) && !c->ram_kept &&
         (STAT_GET (c, dirty_bytes) > 0 || STAT_GET (c, unstable_bytes) > 0);
  cache_free (c);
  if (lost) {
    errno = EIO;
    return -1;
  }
  return 0;
}

struct store *
cache_keep_ram (struct cache *c, const char *name)
{
  struct store *s = c->own_store;

  if (s == NULL || c->wb_running) {
    errno = EINVAL;
    return NULL;
  }
  if (store_ram_keep (s, name, c->size) == -1)
    return NULL;
  c->ram_kept = true;
  c->own_store = NULL;        /* the caller's now: cache_free leaves it */
  return s;
}

int
cache_populate (struct cache *c, store_populated_fn *done, void *arg)
{
  if (c->own_store == NULL)
    return 1;
  return store_ram_populate (c->own_store, done, arg);
}

void
cache_get_store_info (const struct cache *c, struct cache_store_info *out)
{
  *out = c->sinfo;
}

void
cache_get_stats (struct cache *c, struct cache_stats *s)
{
#define G(f) s->f = STAT_GET (c, f)
#define S(f) s->f = OPSTAT_GET (c, f)
  S (read_ops); S (read_hits); S (read_misses);
  S (client_read_bytes); S (client_write_bytes);
  S (client_zero_bytes); S (client_trim_bytes);
  S (backing_read_ops); S (backing_read_bytes);
  S (backing_write_ops); S (backing_write_bytes);
  S (backing_zero_ops); S (backing_zero_bytes);
  S (backing_trim_ops); G (backing_flush_ops);
  S (direct_read_ops); S (direct_read_bytes);
  S (direct_write_ops); S (direct_write_bytes);
  G (dirty_bytes); G (unstable_bytes); S (evictions); G (writeback_errors);
  S (read_errors); G (throttle_waits);
  S (lock_waits_index); S (lock_waits_stripe); G (lock_waits_walk);
  S (readahead_bytes); G (readahead_windows);
  S (readahead_hits); S (readahead_wasted); S (readahead_notes);
  S (backing_write_ns); G (backing_flush_ns); G (flush_ns);
#undef S
#undef G
  ledger_get_stats (c, s);
  flush_group_stats (&c->flush_group, &s->flush_waiting, &s->flush_ops,
                     &s->flush_passes);
  store_get_stats (c->store, &s->store);
  lock_or_die (&c->lock);
  s->cached_bytes = (uint64_t) (c->store->nslots - c->nr_free)
                    << c->folio_shift;
  s->dirty_background_bytes = c->dirty_background;
  s->dirty_limit_bytes = c->dirty_limit;
  s->lock_taken_index = c->lock_taken;
  unlock_or_die (&c->lock);
}

const struct cache_config *
cache_get_config (const struct cache *c)
{
  return &c->cfg;
}

uint64_t
cache_size_bytes (const struct cache *c)
{
  return c->size;
}
