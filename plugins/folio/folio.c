/* nbdkit-folio-plugin: foliod's folio cache inside nbdkit.
 *
 * A thin adapter: every config key goes to export_config_set(), every
 * data callback to the matching cache_*() call on the one export that this
 * plugin instance serves to all its connections.  No cache or backing logic
 * lives here; the daemon and this plugin share every line below.
 *
 * Lifecycle (nbdkit 1.32):
 *   config           -> export_config_set (key=value passed through)
 *   config_complete  -> export_config_check
 *   get_ready        -> export_open; errors are still visible to the user
 *                       here.  The cache starts its writeback thread, which
 *                       would not survive nbdkit's fork, so it is stopped
 *                       again before returning ...
 *   after_fork       -> ... and restarted here.
 *   cleanup          -> write back all dirty data, export_close
 *   unload           -> free the configuration
 *
 * The global state below is the one place where foliod keeps mutable
 * globals: nbdkit's plugin API has no context pointer before .open.
 */
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

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

/* Largest request we advertise (NBD_INFO_BLOCK_SIZE maximum). */
#define FOLIO_MAX_REQUEST (32u * 1024 * 1024)

/* Shutdown writeback ends within this (export_close has the policy). */
#define FOLIO_SHUTDOWN_MS 60000

/* -D folio.verbose=1: log every request. */
NBDKIT_DLL_PUBLIC int folio_debug_verbose = 0;

static struct export_config folio_cfg; /* built from key=value pairs */
static int folio_cfg_ready;            /* folio_cfg initialised */
static struct export *folio_export;    /* opened in get_ready */
static char *folio_help;               /* config_help, built from export_keys */

/* Every connection shares the export; the handle only has to be non-NULL. */
#define FOLIO_HANDLE ((void *) &folio_export)

#define VDEBUG(fmt, ...) \
  do { if (folio_debug_verbose) nbdkit_debug (fmt, ##__VA_ARGS__); } while (0)

/* Report a failed cache call: message for the log, errno for the client.
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
  return -1;
}

static void
folio_config_init_once (void)
{
  if (!folio_cfg_ready) {
    export_config_init (&folio_cfg);
    folio_cfg_ready = 1;
  }
}

/* Build config_help from the shared key table, so that --help always lists
 * exactly the keys export_config_set accepts.  Runs when nbdkit dlopens us,
 * before plugin_init hands the struct over. */
static char *
folio_build_help (void)
{
  char *buf = NULL;
  size_t len = 0;
  FILE *fp = open_memstream (&buf, &len);
  size_t i;

  if (fp == NULL)
    return NULL;
  fprintf (fp, "[backing=]SPEC          file:PATH, PATH, nbd://..., nbds://..., "
           "nbd+unix://... (required)\n");
  for (i = 0; export_keys[i].key; i++) {
    if (strcmp (export_keys[i].key, "backing") == 0)
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

/* Write back and close the export, saying what was lost. */
static void
folio_close_export (void)
{
  uint64_t lost;

  if (export_close (folio_export, FOLIO_SHUTDOWN_MS, &lost) == -1)
    nbdkit_error ("folio: writeback at shutdown failed: %m: %" PRIu64
                  " bytes of dirty data lost", lost);
  folio_export = NULL;
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

static void
folio_load (void)
{
  log_to_sink (folio_log_line);
  folio_config_init_once ();
}

static void
folio_unload (void)
{
  /* cleanup is not always reached; never drop dirty data if we can help it. */
  if (folio_export) {
    folio_close_export ();
  }
  if (folio_cfg_ready) {
    export_config_free (&folio_cfg);
    folio_cfg_ready = 0;
  }
}

static int
folio_config (const char *key, const char *value)
{
  char err[256] = "";

  folio_config_init_once ();
  if (export_config_set (&folio_cfg, key, value, err, sizeof err) == -1) {
    /* err names the key and the value already. */
    if (err[0])
      nbdkit_error ("folio: %s", err);
    else
      nbdkit_error ("folio: %s=%s: invalid setting", key, value);
    return -1;
  }
  return 0;
}

static int
folio_config_complete (void)
{
  char err[256] = "";

  folio_config_init_once ();
  if (export_config_check (&folio_cfg, err, sizeof err) == -1) {
    nbdkit_error ("folio: %s", err[0] ? err : "invalid configuration");
    return -1;
  }
  return 0;
}

static void
folio_dump_plugin (void)
{
  size_t i;

  printf ("folio_keys=");
  for (i = 0; export_keys[i].key; i++)
    printf ("%s%s", i ? "," : "", export_keys[i].key);
  printf ("\n");
  for (i = 0; export_keys[i].key; i++)
    printf ("folio_key_%s=%s\n", export_keys[i].key, export_keys[i].help);
  printf ("folio_max_request=%u\n", FOLIO_MAX_REQUEST);
}

/* Which persistence a pmem store got, and what it brought back. */
static void
folio_log_store (void)
{
  struct cache_store_info si;

  if (folio_export->store == NULL)
    return;
  cache_get_store_info (folio_export->cache, &si);
  nbdkit_debug ("folio: store %s granularity=%s (%s) power-safe %s; "
                "flush=%s", folio_cfg.store, si.granularity, si.mechanism,
                si.power_safe_per_write ? "at each write" : "at FLUSH/FUA",
                si.flush == CACHE_FLUSH_STORE ? "store" : "backing");
  if (!si.formatted)
    nbdkit_debug ("folio: store %s: last shutdown %s; recovered %" PRIu32
                  " folios, %" PRIu64 " dirty bytes in %" PRIu64 " ms",
                  folio_cfg.store, si.was_clean ? "clean" : "NOT clean",
                  si.recovered_folios, si.recovered_dirty_bytes,
                  si.recover_ms);
  if (si.warm_dropped)
    nbdkit_debug ("folio: store %s: warm cache dropped: %s", folio_cfg.store,
                  si.warm_dropped);
  if (si.bad_entries)
    nbdkit_error ("folio: store %s: %" PRIu32 " damaged slot entries: %"
                  PRIu64 " dirty bytes written nowhere (DATA LOST)",
                  folio_cfg.store, si.bad_entries, si.lost_bytes);
}

static int
folio_get_ready (void)
{
  char err[1024] = "";  /* room for two paths (an image format's refusal) */
  const struct cache_config *cc;

  folio_export = export_open (&folio_cfg, err, sizeof err);
  if (folio_export == NULL) {
    nbdkit_error ("folio: %s", err[0] ? err : strerror (errno));
    return -1;
  }
  /* Threads do not survive fork; after_fork restarts writeback. */
  cache_stop_writeback (folio_export->cache);
  folio_log_store ();

  cc = cache_get_config (folio_export->cache);
  nbdkit_debug ("folio: export size=%" PRIu64 " folio=%" PRIu32
                " block=%" PRIu32 " cache=%" PRIu64 " mode=%d%s",
                folio_export->size, cc->folio_size, cc->block_size,
                cc->cache_size, (int) cc->mode,
                folio_export->read_only ? " read-only" : "");
  return 0;
}

static int
folio_after_fork (void)
{
  if (cache_start_writeback (folio_export->cache) == -1) {
    nbdkit_error ("folio: cannot start the writeback thread: %m");
    return -1;
  }
  /* Fault the ram cache's memory in behind the serving (as foliod does
   * once it listens); without it, requests fault pages in themselves. */
  if (cache_populate (folio_export->cache, NULL, NULL) == -1)
    nbdkit_debug ("folio: cannot populate the cache in the background: %m");
  return 0;
}

static void
folio_log_stats (void)
{
  struct cache_stats st;

  cache_get_stats (folio_export->cache, &st);
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

static void
folio_cleanup (void)
{
  if (folio_export == NULL)
    return;
  folio_log_stats ();
  folio_close_export ();
}

static void *
folio_open (int readonly)
{
  VDEBUG ("folio: open readonly=%d", readonly);
  return FOLIO_HANDLE;
}

static void
folio_close (void *handle)
{
  VDEBUG ("folio: close");
}

static const char *
folio_export_description (void *handle)
{
  return folio_export->description;
}

static int64_t
folio_get_size (void *handle)
{
  return (int64_t) folio_export->size;
}

static int
folio_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                  uint32_t *maximum)
{
  *minimum = 1;
  *preferred = cache_get_config (folio_export->cache)->block_size;
  *maximum = FOLIO_MAX_REQUEST;
  return 0;
}

static int
folio_can_write (void *handle)
{
  return !folio_export->read_only;
}

static int
folio_can_true (void *handle)
{
  return 1;
}

static int
folio_is_rotational (void *handle)
{
  return 0;
}

static int
folio_can_fua (void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
folio_can_cache (void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

static int
folio_pread (void *handle, void *buf, uint32_t count, uint64_t offset,
             uint32_t flags)
{
  VDEBUG ("folio: pread count=%" PRIu32 " offset=%" PRIu64, count, offset);
  if (cache_read (folio_export->cache, buf, count, offset, 0) == -1)
    return folio_fail ("pread", count, offset);
  return 0;
}

static int
folio_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  unsigned cf = (flags & NBDKIT_FLAG_FUA) ? CACHE_FUA : 0;

  VDEBUG ("folio: pwrite count=%" PRIu32 " offset=%" PRIu64 " fua=%d",
          count, offset, !!cf);
  if (cache_write (folio_export->cache, buf, count, offset, cf) == -1)
    return folio_fail ("pwrite", count, offset);
  return 0;
}

static int
folio_flush (void *handle, uint32_t flags)
{
  VDEBUG ("folio: flush");
  if (cache_flush (folio_export->cache) == -1)
    return folio_fail ("flush", 0, 0);
  return 0;
}

static int
folio_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  unsigned cf = (flags & NBDKIT_FLAG_FUA) ? CACHE_FUA : 0;

  VDEBUG ("folio: trim count=%" PRIu32 " offset=%" PRIu64 " fua=%d",
          count, offset, !!cf);
  if (cache_trim (folio_export->cache, count, offset, cf) == -1)
    return folio_fail ("trim", count, offset);
  return 0;
}

static int
folio_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
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
  if (cache_zero (folio_export->cache, count, offset, cf) == -1) {
    /* A refused fast zero is an answer, not a failure worth logging:
     * the client falls back to writing zeroes. */
    if ((cf & CACHE_FAST_ZERO) &&
        (errno == ENOTSUP || errno == EOPNOTSUPP)) {
      VDEBUG ("folio: fast zero refused");
      nbdkit_set_error (ENOTSUP);
      return -1;
    }
    return folio_fail ("zero", count, offset);
  }
  return 0;
}

static int
folio_cache (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  VDEBUG ("folio: cache count=%" PRIu32 " offset=%" PRIu64, count, offset);
  if (cache_prefetch (folio_export->cache, count, offset) == -1)
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

static int
folio_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               struct nbdkit_extents *extents)
{
  struct folio_extents_ctx ctx = {
    .extents = extents,
    .req_one = !!(flags & NBDKIT_FLAG_REQ_ONE),
  };

  VDEBUG ("folio: extents count=%" PRIu32 " offset=%" PRIu64 " req_one=%d",
          count, offset, ctx.req_one);
  if (cache_block_status (folio_export->cache, count, offset,
                          folio_add_extent, &ctx) == -1 || ctx.failed) {
    if (ctx.failed) {
      /* nbdkit_add_extent already reported the error. */
      nbdkit_set_error (errno ? errno : EIO);
      return -1;
    }
    return folio_fail ("extents", count, offset);
  }
  return 0;
}

static struct nbdkit_plugin plugin = {
  .name               = "folio",
  .longname           = "foliod folio cache",
  .version            = FOLIOD_VERSION,   /* from the Makefile */
  .description        = "iomap-style folio cache (per-block uptodate and "
                        "dirty bits) in front of a file or NBD backing",
  .load               = folio_load,
  .unload             = folio_unload,
  .config             = folio_config,
  .config_complete    = folio_config_complete,
  .config_help        = NULL, /* filled by folio_init_help */
  .magic_config_key   = "backing",
  .dump_plugin        = folio_dump_plugin,
  .get_ready          = folio_get_ready,
  .after_fork         = folio_after_fork,
  .cleanup            = folio_cleanup,
  .open               = folio_open,
  .close              = folio_close,
  .export_description = folio_export_description,
  .get_size           = folio_get_size,
  .block_size         = folio_block_size,
  .can_write          = folio_can_write,
  .can_flush          = folio_can_true,
  .is_rotational      = folio_is_rotational,
  .can_trim           = folio_can_true,
  .can_zero           = folio_can_true,
  .can_fast_zero      = folio_can_true,
  .can_fua            = folio_can_fua,
  .can_multi_conn     = folio_can_true,
  .can_extents        = folio_can_true,
  .can_cache          = folio_can_cache,
  .pread              = folio_pread,
  .pwrite             = folio_pwrite,
  .flush              = folio_flush,
  .trim               = folio_trim,
  .zero               = folio_zero,
  .extents            = folio_extents,
  .cache              = folio_cache,
  .errno_is_preserved = 0,
};

__attribute__((constructor)) static void
folio_init_help (void)
{
  folio_help = folio_build_help ();
  plugin.config_help = folio_help;
}

__attribute__((destructor)) static void
folio_free_help (void)
{
  plugin.config_help = NULL;
  free (folio_help);
  folio_help = NULL;
}

NBDKIT_REGISTER_PLUGIN (plugin)
