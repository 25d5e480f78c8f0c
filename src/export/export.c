/* An export: open its backing and cache; close it without losing data. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/export.h"

struct export *
export_open (const struct export_config *cfg, char *err, size_t errlen)
{
  struct export *e;
  struct backing_opts bo = cfg->bopts;

  if (export_config_check (cfg, err, errlen) == -1)
    return NULL;
  e = calloc (1, sizeof *e);
  if (e == NULL) {
    snprintf (err, errlen, "out of memory");
    return NULL;
  }
  bo.read_only = cfg->read_only;
  bo.direct = cfg->cache.mode == CACHE_NONE || cfg->cache.direct_threshold;
  e->backing = backing_open (cfg->backing, &bo, err, errlen);
  if (e->backing == NULL)
    goto fail;
  e->name = strdup (cfg->name ? cfg->name : "");
  e->description = cfg->description ? strdup (cfg->description) : NULL;
  e->read_only = cfg->read_only || (e->backing->caps & BACKING_READ_ONLY);
  e->tls_require = cfg->tls_require;
  e->size = e->backing->size;
  e->cache = cache_create (e->backing, NULL, &cfg->cache, err, errlen);
  if (e->cache == NULL || e->name == NULL)
    goto fail;
  return e;

 fail:
  backing_close (e->backing);
  free (e->name);
  free (e->description);
  free (e);
  return NULL;
}

int
export_close (struct export *e)
{
  int r = 0;

  if (e == NULL)
    return 0;
  /* Retry for a while: a remote may be restarting.  Dirty data that still
   * cannot be written is reported by the return value. */
  if (cache_shutdown (e->cache, 5) == -1)
    r = -1;
  if (cache_destroy (e->cache) == -1)
    r = -1;
  backing_close (e->backing);
  free (e->name);
  free (e->description);
  free (e);
  return r;
}
