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
 * Everything but the lifecycle lives in plugins/common/folio-nbdkit.c,
 * shared with the filter (plugins/folio-filter).  The global state below
 * is the one place where foliod keeps mutable globals: nbdkit's plugin
 * API has no context pointer before .open.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define NBDKIT_API_VERSION 2
#include <nbdkit-plugin.h>

#include "foliod/cache.h"
#include "foliod/export.h"

#include "../common/folio-nbdkit.h"

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

static struct folio_nbdkit folio;   /* the export, its configuration */

/* Every connection shares the export; the handle only has to be non-NULL. */
#define FOLIO_HANDLE ((void *) &folio)

static void
folio_load (void)
{
  folio_nbdkit_load (&folio);
}

static void
folio_unload (void)
{
  folio_nbdkit_unload (&folio);
}

static int
folio_config (const char *key, const char *value)
{
  return folio_nbdkit_config (&folio, key, value);
}

static int
folio_config_complete (void)
{
  return folio_nbdkit_config_complete (&folio);
}

static void
folio_dump_plugin (void)
{
  folio_nbdkit_dump (0);
}

static int
folio_get_ready (void)
{
  char err[1024] = "";  /* room for two paths (an image format's refusal) */

  folio.export = export_open (&folio.cfg, err, sizeof err);
  if (folio.export == NULL) {
    nbdkit_error ("folio: %s", err[0] ? err : strerror (errno));
    return -1;
  }
  /* Threads do not survive fork; after_fork restarts writeback. */
  cache_stop_writeback (folio.export->cache);
  folio_nbdkit_opened (&folio);
  return 0;
}

static int
folio_after_fork (void)
{
  return folio_nbdkit_start (&folio);
}

static void
folio_cleanup (void)
{
  folio_nbdkit_cleanup (&folio);
}

static void *
folio_open (int readonly)
{
  return FOLIO_HANDLE;
}

static const char *
folio_export_description (void *handle)
{
  return folio.export->description;
}

static int64_t
folio_get_size (void *handle)
{
  return (int64_t) folio.export->size;
}

static int
folio_block_size (void *handle, uint32_t *minimum, uint32_t *preferred,
                  uint32_t *maximum)
{
  folio_nbdkit_block_size (&folio, minimum, preferred, maximum);
  return 0;
}

static int
folio_can_write (void *handle)
{
  return !folio.export->read_only;
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
  return folio_nbdkit_pread (&folio, buf, count, offset);
}

static int
folio_pwrite (void *handle, const void *buf, uint32_t count, uint64_t offset,
              uint32_t flags)
{
  return folio_nbdkit_pwrite (&folio, buf, count, offset, flags);
}

static int
folio_flush (void *handle, uint32_t flags)
{
  return folio_nbdkit_flush (&folio);
}

static int
folio_trim (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return folio_nbdkit_trim (&folio, count, offset, flags);
}

static int
folio_zero (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return folio_nbdkit_zero (&folio, count, offset, flags);
}

static int
folio_cache (void *handle, uint32_t count, uint64_t offset, uint32_t flags)
{
  return folio_nbdkit_cache (&folio, count, offset);
}

static int
folio_extents (void *handle, uint32_t count, uint64_t offset, uint32_t flags,
               struct nbdkit_extents *extents)
{
  return folio_nbdkit_extents (&folio, count, offset, flags, extents);
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
  plugin.config_help = folio_nbdkit_help (0);
}

NBDKIT_REGISTER_PLUGIN (plugin)
