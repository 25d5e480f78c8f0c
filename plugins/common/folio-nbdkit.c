/* The nbdkit adapters' common part (see folio-nbdkit.h): configuration,
 * lifecycle and every data callback of the plugin and the filter. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "foliod/cache.h"
#include "foliod/export.h"
#include "foliod/log.h"

#include "folio-nbdkit.h"

NBDKIT_DLL_PUBLIC int folio_debug_verbose = 0;

#define VDEBUG(fmt, ...) \
  do { if (folio_debug_verbose) nbdkit_debug (fmt, ##__VA_ARGS__); } while (0)

/* Report a failed cache call: message for the log, errno for the client
 * (nbdkit_set_error for the plugin, errno kept for the filter's *err).
 * Must be called with errno still holding the cache's error. */
static int
folio_fail (const char *what, uint32_t count, uint64_t offset)
{
  int err = errno ? errno : EIO;

  if (count == 0) /* flush: no range */
    nbdkit_error ("folio: %s: %s", what, strerror (err));
  else
    nbdkit_error ("folio: %s count=%" PRIu32 " offset=%" PRIu64 ": %s",
                  what, count, offset, strerror (err));
  nbdkit_set_error (err);
  errno = err;   /* the filter returns it in *err */
  return -1;
}

static void
folio_config_init_once (struct folio_nbdkit *s)
{
  if (!s->cfg_ready) {
    export_config_init (&s->cfg);
    s->cfg_ready = 1;
  }
}

/* The keys an adapter takes: all of them (plugin), the cache's (filter). */
static int
folio_key_wanted (const char *key, int filter)
{
  return !filter || export_key_is_cache (key);
}

/* The help text, built once per adapter (one per .so). */
static char *folio_help;

__attribute__((destructor)) static void
folio_free_help (void)
{
  free (folio_help);
  folio_help = NULL;
}

static char *folio_build_help (int filter);

const char *
folio_nbdkit_help (int filter)
{
  if (folio_help == NULL)
    folio_help = folio_build_help (filter);
  return folio_help;
}

static char *
folio_build_help (int filter)
{
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&buf, &len);
  size_t i;

  if (fp == NULL)
    return NULL;
  if (!filter)
    fprintf (fp, "[backing=]SPEC          file:PATH, PATH, nbd://..., "
             "nbds://..., nbd+unix://... (required)\n");
  for (i = 0; export_keys[i].key; i++) {
    if (strcmp (export_keys[i].key, "backing") == 0 ||
        !folio_key_wanted (export_keys[i].key, filter))
      continue;
    fprintf (fp, "%-23s %s\n", export_keys[i].key, export_keys[i].help);
  }
  if (fclose (fp) != 0) {
    free (buf);
    return NULL;
  }
  if (len > 0 && buf[len - 1] == '\n')
    buf[len - 1] = '\0';
  return buf;
}

void
folio_nbdkit_dump (int filter)
{
  size_t i, n = 0;

  printf ("folio_keys=");
  for (i = 0; export_keys[i].key; i++)
    if (folio_key_wanted (export_keys[i].key, filter))
      printf ("%s%s", n++ ? "," : "", export_keys[i].key);
  printf ("\n");
  for (i = 0; export_keys[i].key; i++)
    if (folio_key_wanted (export_keys[i].key, filter))
      printf ("folio_key_%s=%s\n", export_keys[i].key, export_keys[i].help);
  printf ("folio_max_request=%u\n", FOLIO_MAX_REQUEST);
}

/* Write back and close the export, saying what was lost. */
static void
folio_close_export (struct folio_nbdkit *s)
{
  uint64_t lost;

  if (export_close (s->export, FOLIO_SHUTDOWN_MS, &lost) == -1)
    nbdkit_error ("folio: writeback at shutdown failed: %m: %" PRIu64
                  " bytes of dirty data lost", lost);
  s->export = NULL;
}

/* The log sink of the rooms below (foliod/log.h): errors and warnings
 * through nbdkit_error, the rest through nbdkit_debug (shown with -v). */
static void
folio_log_line (int level, const char *msg)
{
  if (level <= LOG_LVL_WARN)
    nbdkit_error ("folio: %s", msg);
  else
    nbdkit_debug ("folio: %s", msg);
}

void
folio_nbdkit_load (struct folio_nbdkit *s)
{
  log_to_sink (folio_log_line);
  folio_config_init_once (s);
}

void
folio_nbdkit_unload (struct folio_nbdkit *s)
{
  /* cleanup is not always reached; never drop dirty data if we can help it. */
  if (s->export)
    folio_close_export (s);
  if (s->cfg_ready) {
    export_config_free (&s->cfg);
    s->cfg_ready = 0;
  }
}

int
folio_nbdkit_config (struct folio_nbdkit *s, const char *key,
                     const char *value)
{
  char err[256] = "";

  folio_config_init_once (s);
  if (export_config_set (&s->cfg, key, value, err, sizeof err) == -1) {
    /* err names the key and the value already. */
    if (err[0])
      nbdkit_error ("folio: %s", err);
    else
      nbdkit_error ("folio: %s=%s: invalid setting", key, value);
    return -1;
  }
  return 0;
}

int
folio_nbdkit_config_complete (struct folio_nbdkit *s)
{
  char err[256] = "";

  folio_config_init_once (s);
  if (export_config_check (&s->cfg, err, sizeof err) == -1) {
    nbdkit_error ("folio: %s", err[0] ? err : "invalid configuration");
    return -1;
  }
  return 0;
}

/* Which persistence a pmem store got, and what it brought back. */
static void
folio_log_store (struct folio_nbdkit *s)
{
  struct cache_store_info si;
  const char *store = s->cfg.store;

  if (s->export->store == NULL)
    return;
  cache_get_store_info (s->export->cache, &si);
  nbdkit_debug ("folio: store %s granularity=%s (%s) power-safe %s; "
                "flush=%s", store, si.granularity, si.mechanism,
                si.power_safe_per_write ? "at each write" : "at FLUSH/FUA",
                si.flush == CACHE_FLUSH_STORE ? "store" : "backing");
  if (!si.formatted)
    nbdkit_debug ("folio: store %s: last shutdown %s; recovered %" PRIu32
                  " folios, %" PRIu64 " dirty bytes in %" PRIu64 " ms",
                  store, si.was_clean ? "clean" : "NOT clean",
                  si.recovered_folios, si.recovered_dirty_bytes,
                  si.recover_ms);
  if (si.warm_dropped)
    nbdkit_debug ("folio: store %s: warm cache dropped: %s", store,
                  si.warm_dropped);
  if (si.bad_entries)
    nbdkit_error ("folio: store %s: %" PRIu32 " damaged slot entries: %"
                  PRIu64 " dirty bytes written nowhere (DATA LOST)",
                  store, si.bad_entries, si.lost_bytes);
}

void
folio_nbdkit_opened (struct folio_nbdkit *s)
{
  const struct cache_config *cc = cache_get_config (s->export->cache);

  folio_log_store (s);
  nbdkit_debug ("folio: export size=%" PRIu64 " folio=%" PRIu32
                " block=%" PRIu32 " cache=%" PRIu64 " mode=%d%s",
                s->export->size, cc->folio_size, cc->block_size,
                cc->cache_size, (int) cc->mode,
                s->export->read_only ? " read-only" : "");
}

int
folio_nbdkit_start (struct folio_nbdkit *s)
{
  if (cache_start_writeback (s->export->cache) == -1) {
    nbdkit_error ("folio: cannot start the writeback thread: %m");
    return -1;
  }
  /* Fault the ram cache's memory in behind the serving (as foliod does
   * once it listens); without it, requests fault pages in themselves. */
  if (cache_populate (s->export->cache, NULL, NULL) == -1)
    nbdkit_debug ("folio: cannot populate the cache in the background: %m");
  return 0;
}

static void
folio_log_stats (struct folio_nbdkit *s)
{
  struct cache_stats st;

  cache_get_stats (s->export->cache, &st);
  nbdkit_debug ("folio: stats client_read_bytes=%" PRIu64
                " client_write_bytes=%" PRIu64
                " client_zero_bytes=%" PRIu64 " client_trim_bytes=%" PRIu64,
                st.client_read_bytes, st.client_write_bytes,
                st.client_zero_bytes, st.client_trim_bytes);
  nbdkit_debug ("folio: stats read_ops=%" PRIu64 " read_hits=%" PRIu64
                " read_misses=%" PRIu64 " evictions=%" PRIu64
                " throttle_waits=%" PRIu64,
                st.read_ops, st.read_hits, st.read_misses, st.evictions,
                st.throttle_waits);
  nbdkit_debug ("folio: stats lock_taken_index=%" PRIu64
                " lock_waits_index=%" PRIu64
                " lock_waits_stripe=%" PRIu64 " lock_waits_walk=%" PRIu64,
                st.lock_taken_index, st.lock_waits_index,
                st.lock_waits_stripe, st.lock_waits_walk);
  nbdkit_debug ("folio: stats readahead_bytes=%" PRIu64
                " readahead_windows=%" PRIu64 " readahead_hits=%" PRIu64
                " readahead_wasted=%" PRIu64,
                st.readahead_bytes, st.readahead_windows, st.readahead_hits,
                st.readahead_wasted);
  nbdkit_debug ("folio: stats backing_read_ops=%" PRIu64
                " backing_read_bytes=%" PRIu64
                " backing_write_ops=%" PRIu64 " backing_write_bytes=%" PRIu64
                " backing_zero_ops=%" PRIu64 " backing_zero_bytes=%" PRIu64
                " backing_trim_ops=%" PRIu64 " backing_flush_ops=%" PRIu64,
                st.backing_read_ops, st.backing_read_bytes,
                st.backing_write_ops, st.backing_write_bytes,
                st.backing_zero_ops, st.backing_zero_bytes,
                st.backing_trim_ops, st.backing_flush_ops);
  nbdkit_debug ("folio: stats direct_read_bytes=%" PRIu64
                " direct_write_bytes=%" PRIu64 " dirty_bytes=%" PRIu64
                " writeback_errors=%" PRIu64 " read_errors=%" PRIu64,
                st.direct_read_bytes, st.direct_write_bytes, st.dirty_bytes,
                st.writeback_errors, st.read_errors);
}

void
folio_nbdkit_cleanup (struct folio_nbdkit *s)
{
  if (s->export == NULL)
    return;
  folio_log_stats (s);
  folio_close_export (s);
}

void
folio_nbdkit_block_size (struct folio_nbdkit *s, uint32_t *minimum,
                         uint32_t *preferred, uint32_t *maximum)
{
  *minimum = 1;
  *preferred = cache_get_config (s->export->cache)->block_size;
  *maximum = FOLIO_MAX_REQUEST;
}

int
folio_nbdkit_pread (struct folio_nbdkit *s, void *buf, uint32_t count,
                    uint64_t offset)
{
  VDEBUG ("folio: pread count=%" PRIu32 " offset=%" PRIu64, count, offset);
  if (cache_read (s->export->cache, buf, count, offset, 0) == -1)
    return folio_fail ("pread", count, offset);
  return 0;
}

int
folio_nbdkit_pwrite (struct folio_nbdkit *s, const void *buf, uint32_t count,
                     uint64_t offset, uint32_t flags)
{
  unsigned cf = (flags & NBDKIT_FLAG_FUA) ? CACHE_FUA : 0;

  VDEBUG ("folio: pwrite count=%" PRIu32 " offset=%" PRIu64 " fua=%d",
          count, offset, !!cf);
  if (cache_write (s->export->cache, buf, count, offset, cf) == -1)
    return folio_fail ("pwrite", count, offset);
  return 0;
}

int
folio_nbdkit_flush (struct folio_nbdkit *s)
{
  VDEBUG ("folio: flush");
  int r = cache_flush (s->export->cache);
  export_flush_done (s->export, r == -1, errno);
  if (r == -1)
    return folio_fail ("flush", 0, 0);
  return 0;
}

int
folio_nbdkit_trim (struct folio_nbdkit *s, uint32_t count, uint64_t offset,
                   uint32_t flags)
{
  unsigned cf = (flags & NBDKIT_FLAG_FUA) ? CACHE_FUA : 0;

  VDEBUG ("folio: trim count=%" PRIu32 " offset=%" PRIu64 " fua=%d",
          count, offset, !!cf);
  if (cache_trim (s->export->cache, count, offset, cf) == -1)
    return folio_fail ("trim", count, offset);
  return 0;
}

int
folio_nbdkit_zero (struct folio_nbdkit *s, uint32_t count, uint64_t offset,
                   uint32_t flags)
{
  unsigned cf = 0;

  if (flags & NBDKIT_FLAG_FUA)
    cf |= CACHE_FUA;
  if (flags & NBDKIT_FLAG_MAY_TRIM)
    cf |= CACHE_MAY_TRIM;
  if (flags & NBDKIT_FLAG_FAST_ZERO)
    cf |= CACHE_FAST_ZERO;
  VDEBUG ("folio: zero count=%" PRIu32 " offset=%" PRIu64 " flags=%#x",
          count, offset, cf);
  if (cache_zero (s->export->cache, count, offset, cf) == -1) {
    /* A refused fast zero is an answer, not a failure worth logging:
     * the client falls back to writing zeroes. */
    if ((cf & CACHE_FAST_ZERO) &&
        (errno == ENOTSUP || errno == EOPNOTSUPP)) {
      VDEBUG ("folio: fast zero refused");
      nbdkit_set_error (ENOTSUP);
      errno = ENOTSUP;
      return -1;
    }
    return folio_fail ("zero", count, offset);
  }
  return 0;
}

int
folio_nbdkit_cache (struct folio_nbdkit *s, uint32_t count, uint64_t offset)
{
  VDEBUG ("folio: cache count=%" PRIu32 " offset=%" PRIu64, count, offset);
  if (cache_prefetch (s->export->cache, count, offset) == -1)
    return folio_fail ("cache", count, offset);
  return 0;
}

struct folio_extents_ctx {
  struct nbdkit_extents *extents;
  int req_one;  /* NBDKIT_FLAG_REQ_ONE: the first extent is enough */
  int failed;   /* nbdkit_add_extent failed; errno set */
};

/* Returns 0 to go on, non-zero to stop the walk. */
static int
folio_add_extent (void *opaque, uint64_t off, uint64_t len,
                  enum backing_extent_type type)
{
  struct folio_extents_ctx *ctx = opaque;
  uint32_t nt;

  switch (type) {
  case BACKING_DATA: nt = 0; break;
  case BACKING_HOLE: nt = NBDKIT_EXTENT_HOLE | NBDKIT_EXTENT_ZERO; break;
  case BACKING_ZERO: nt = NBDKIT_EXTENT_ZERO; break;
  default:
    nbdkit_error ("folio: extents: unknown extent type %d", (int) type);
    errno = EIO;
    ctx->failed = 1;
    return 1;
  }
  if (nbdkit_add_extent (ctx->extents, off, len, nt) == -1) {
    ctx->failed = 1;
    return 1;
  }
  return ctx->req_one;
}

int
folio_nbdkit_extents (struct folio_nbdkit *s, uint32_t count,
                      uint64_t offset, uint32_t flags,
                      struct nbdkit_extents *extents)
{
  struct folio_extents_ctx ctx = {
    .extents = extents,
    .req_one = !!(flags & NBDKIT_FLAG_REQ_ONE),
  };

  VDEBUG ("folio: extents count=%" PRIu32 " offset=%" PRIu64 " req_one=%d",
          count, offset, ctx.req_one);
  if (cache_block_status (s->export->cache, count, offset,
                          folio_add_extent, &ctx) == -1 || ctx.failed) {
    if (ctx.failed) {
      /* nbdkit_add_extent already reported the error. */
      int err = errno ? errno : EIO;
      nbdkit_set_error (err);
      errno = err;
      return -1;
    }
    return folio_fail ("extents", count, offset);
  }
  return 0;
}
