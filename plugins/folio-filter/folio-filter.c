/* nbdkit-folio-filter: foliod's folio cache in front of any nbdkit plugin.
 *
 * The same adapter as the plugin (plugins/common/folio-nbdkit.c: every
 * data callback is a cache_*() call on the one export all connections
 * share); only the backing differs: here it is a struct backing over a
 * context of the next plugin that the filter opens itself, independent
 * of client connections (nbdkit >= 1.28: nbdkit_next_context_open), so
 * that the cache, its writeback thread and every connection use one.
 *
 * Lifecycle (nbdkit 1.32):
 *   config           -> the cache's keys (export_key_is_cache) to
 *                       export_config_set; every other key to the plugin
 *   config_complete  -> export_config_check
 *   get_ready        -> remember nbdkit's thread model
 *   after_fork       -> open and prepare the shared context of the next
 *                       plugin (after the plugin's own after_fork), wrap
 *                       it as a backing, export_open_backing: the cache's
 *                       writeback thread starts here, after the fork
 *   open             -> a connection does not open the plugin: the cache
 *                       talks to it through the shared context only
 *   cleanup          -> write back all dirty data, close the export and
 *                       the context (before the plugin's cleanup)
 *
 * The plugin's thread model: a model below parallel means the plugin may
 * not be called from two threads at once; the backing then serialises
 * its calls (the cache's writeback thread calls it besides the
 * connections' threads).  The filter itself is parallel.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nbdkit-filter.h>

#include "foliod/backing.h"
#include "foliod/cache.h"
#include "foliod/export.h"

#include "../common/folio-nbdkit.h"

#define THREAD_MODEL NBDKIT_THREAD_MODEL_PARALLEL

/* The backing's name in a persistent store's header (store=pmem:, ssd:):
 * the next plugin has no spec of ours, so only the size identifies it. */
#define FOLIO_FILTER_SPEC "nbdkit://next"

/* Largest single call to the plugin (its block_size maximum if smaller). */
#define NEXT_MAX_CALL (32u * 1024 * 1024)

static struct folio_nbdkit folio;   /* the export, its configuration */
static int folio_thread_model = NBDKIT_THREAD_MODEL_PARALLEL;

/* ---- a backing over the next plugin ---------------------------------- */

struct next_backing {
  struct backing base;
  nbdkit_next *next;
  int serialise;           /* the plugin is not parallel */
  pthread_mutex_t lock;    /* held around each call when serialise */
  uint32_t max_call;       /* bytes per pread/pwrite/zero/trim call */
  int can_fua;             /* NBDKIT_FUA_* */
  int can_zero;            /* NBDKIT_ZERO_* */
  int can_flush;
};

#define NB(b) ((struct next_backing *) (b))

static void
nb_lock (struct next_backing *nb)
{
  if (nb->serialise)
    pthread_mutex_lock (&nb->lock);
}

static void
nb_unlock (struct next_backing *nb)
{
  if (nb->serialise)
    pthread_mutex_unlock (&nb->lock);
}

/* A failed call: errno from the plugin (EIO when it gave none). */
static int
nb_fail (int err)
{
  errno = err ? err : EIO;
  return -1;
}

static uint32_t
nb_chunk (const struct next_backing *nb, uint64_t len)
{
  return len < nb->max_call ? (uint32_t) len : nb->max_call;
}

static int
nb_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  struct next_backing *nb = NB (b);
  char *p = buf;
  int err = 0, r = 0;

  while (len > 0 && r == 0) {
    uint32_t n = nb_chunk (nb, len);
    nb_lock (nb);
    r = nb->next->pread (nb->next, p, n, off, 0, &err);
    nb_unlock (nb);
    p += n, off += n, len -= n;
  }
  return r == -1 ? nb_fail (err) : 0;
}

static int nb_flush (struct backing *b);

/* FUA the plugin lacks: the op, then a flush. */
static int
nb_fua_after (struct backing *b, unsigned flags, int r)
{
  if (r == 0 && (flags & BACKING_FUA) && NB (b)->can_fua == NBDKIT_FUA_NONE)
    return nb_flush (b);
  return r;
}

static uint32_t
nb_flags (const struct next_backing *nb, unsigned flags)
{
  uint32_t f = 0;

  if ((flags & BACKING_FUA) && nb->can_fua != NBDKIT_FUA_NONE)
    f |= NBDKIT_FLAG_FUA;
  if (flags & BACKING_MAY_TRIM)
    f |= NBDKIT_FLAG_MAY_TRIM;
  if (flags & BACKING_FAST_ZERO)
    f |= NBDKIT_FLAG_FAST_ZERO;
  return f;
}

static int
nb_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
          unsigned flags)
{
  struct next_backing *nb = NB (b);
  const char *p = buf;
  int err = 0, r = 0;

  while (len > 0 && r == 0) {
    uint32_t n = nb_chunk (nb, len);
    nb_lock (nb);
    r = nb->next->pwrite (nb->next, p, n, off,
                          nb_flags (nb, flags & BACKING_FUA), &err);
    nb_unlock (nb);
    p += n, off += n, len -= n;
  }
  if (r == -1)
    return nb_fail (err);
  return nb_fua_after (b, flags, 0);
}

/* Zero (zero != 0) or trim the range, a call per max_call bytes: 0, or
 * -1 with the plugin's error in *err. */
static int
nb_no_data (struct next_backing *nb, int zero, uint64_t len, uint64_t off,
            uint32_t nflags, int *err)
{
  int r = 0;

  while (len > 0 && r == 0) {
    uint32_t n = nb_chunk (nb, len);
    nb_lock (nb);
    r = zero ? nb->next->zero (nb->next, n, off, nflags, err)
             : nb->next->trim (nb->next, n, off, nflags, err);
    nb_unlock (nb);
    off += n, len -= n;
  }
  return r;
}

static int
nb_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct next_backing *nb = NB (b);
  int err = 0, r = 0;

  if (nb->can_zero == NBDKIT_ZERO_NONE) {
    /* The plugin has no zero at all: write zeroes (never fast). */
    static const char zeroes[65536];
    if (flags & BACKING_FAST_ZERO)
      return nb_fail (ENOTSUP);
    while (len > 0) {
      uint64_t n = len < sizeof zeroes ? len : sizeof zeroes;
      if (nb_write (b, zeroes, n, off, flags & ~BACKING_FUA) == -1)
        return -1;
      off += n, len -= n;
    }
    return nb_fua_after (b, flags, 0);
  }
  if ((flags & BACKING_FAST_ZERO) &&
      !(b->caps & BACKING_CAN_FAST_ZERO))
    return nb_fail (ENOTSUP);
  r = nb_no_data (nb, 1, len, off, nb_flags (nb, flags), &err);
  if (r == -1) {
    if ((flags & BACKING_FAST_ZERO) && (err == ENOTSUP || err == EOPNOTSUPP))
      return nb_fail (ENOTSUP);
    return nb_fail (err);
  }
  return nb_fua_after (b, flags, 0);
}

static int
nb_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct next_backing *nb = NB (b);
  int err = 0;
  int r = nb_no_data (nb, 0, len, off, nb_flags (nb, flags & BACKING_FUA),
                      &err);

  if (r == -1)
    return nb_fail (err);
  return nb_fua_after (b, flags, 0);
}

static int
nb_flush (struct backing *b)
{
  struct next_backing *nb = NB (b);
  int err = 0, r;

  if (!nb->can_flush)   /* nothing volatile below to make durable */
    return 0;
  nb_lock (nb);
  r = nb->next->flush (nb->next, 0, &err);
  nb_unlock (nb);
  /* Writes acknowledged before may be gone (a failed fsync forgets
   * them): the cache's ledger alone makes that a loss (its rule for a
   * failed flush) and writes its unstable blocks again. */
  return r == -1 ? nb_fail (err) : 0;
}

static int
nb_map (struct backing *b, uint64_t off, uint64_t len,
        struct backing_extent *ext)
{
  struct next_backing *nb = NB (b);
  struct nbdkit_extents *exts;
  struct nbdkit_extent e;
  uint32_t n = nb_chunk (nb, len);
  int err = 0, r;

  exts = nbdkit_extents_new (off, off + n);
  if (exts == NULL)
    return nb_fail (errno);
  nb_lock (nb);
  r = nb->next->extents (nb->next, n, off, NBDKIT_FLAG_REQ_ONE, exts, &err);
  nb_unlock (nb);
  if (r == -1 || nbdkit_extents_count (exts) == 0) {
    nbdkit_extents_free (exts);
    return nb_fail (r == -1 ? err : EIO);
  }
  e = nbdkit_get_extent (exts, 0);
  nbdkit_extents_free (exts);
  ext->offset = off;
  ext->length = e.offset + e.length - off;
  if (ext->length > len)
    ext->length = len;
  if ((e.type & NBDKIT_EXTENT_HOLE) && (e.type & NBDKIT_EXTENT_ZERO))
    ext->type = BACKING_HOLE;
  else if (e.type & NBDKIT_EXTENT_ZERO)
    ext->type = BACKING_ZERO;
  else
    ext->type = BACKING_DATA;
  return 0;
}

static void
nb_close (struct backing *b)
{
  struct next_backing *nb = NB (b);

  nb->next->finalize (nb->next);
  nbdkit_next_context_close (nb->next);
  pthread_mutex_destroy (&nb->lock);
  free (nb);
}

static const struct backing_ops next_backing_ops = {
  .name       = "nbdkit",
  .read       = nb_read,
  .write      = nb_write,
  .zero       = nb_zero,
  .trim       = nb_trim,
  .flush      = nb_flush,
  .map        = nb_map,
  .close      = nb_close,
};

/* Open the shared context of the next plugin and wrap it.  NULL
 * (reported) on failure. */
static struct backing *
next_backing_open (nbdkit_backend *backend)
{
  struct next_backing *nb;
  nbdkit_next *next;
  int64_t size;
  uint32_t min = 0, pref = 0, max = 0;
  int can_write;

  next = nbdkit_next_context_open (backend, 0, "", 1);
  if (next == NULL)   /* a read-only plugin (nbdkit -r, a read-only file) */
    next = nbdkit_next_context_open (backend, 1, "", 1);
  if (next == NULL) {
    nbdkit_error ("folio: cannot open the plugin below");
    return NULL;
  }
  if (next->prepare (next) == -1)
    goto fail;
  size = next->get_size (next);
  can_write = next->can_write (next);
  if (size == -1 || can_write == -1 ||
      next->block_size (next, &min, &pref, &max) == -1)
    goto fail;
  nb = calloc (1, sizeof *nb);
  if (nb == NULL) {
    nbdkit_error ("folio: calloc: %m");
    goto fail;
  }
  nb->next = next;
  nb->serialise = folio_thread_model < NBDKIT_THREAD_MODEL_PARALLEL;
  pthread_mutex_init (&nb->lock, NULL);
  nb->max_call = (max > 0 && max < NEXT_MAX_CALL) ? max : NEXT_MAX_CALL;
  nb->base.ops = &next_backing_ops;
  nb->base.size = (uint64_t) size;
  nb->base.io_align = 1;
  nb->base.caps = BACKING_CAN_MULTI_CONN | BACKING_VOLATILE;
  /* Every can_* once: nbdkit keeps the answers, and asserts a call only
   * after the matching one. */
  nb->can_flush = next->can_flush (next) == 1;
  if (!can_write)
    nb->base.caps |= BACKING_READ_ONLY;
  else {
    nb->can_fua = next->can_fua (next);
    nb->can_zero = next->can_zero (next);
    if (nb->can_fua == -1 || nb->can_zero == -1)
      goto fail_nb;
    if (nb->can_fua == NBDKIT_FUA_NATIVE)
      nb->base.caps |= BACKING_CAN_FUA;
    if (nb->can_zero == NBDKIT_ZERO_NATIVE)
      nb->base.caps |= BACKING_CAN_ZERO;
    if (nb->can_zero != NBDKIT_ZERO_NONE && next->can_fast_zero (next) == 1)
      nb->base.caps |= BACKING_CAN_FAST_ZERO;
    if (next->can_trim (next) == 1)
      nb->base.caps |= BACKING_CAN_TRIM;
  }
  if (next->can_extents (next) == 1)
    nb->base.caps |= BACKING_CAN_MAP;
  return &nb->base;

 fail_nb:
  pthread_mutex_destroy (&nb->lock);
  free (nb);
 fail:
  next->finalize (next);
  nbdkit_next_context_close (next);
  return NULL;
}

/* ---- the filter ------------------------------------------------------- */

static void
folio_load (void)
{
  folio_nbdkit_load (&folio);
}

static void
folio_unload (void)
{
  /* nbdkit frees the plugin before it unloads a filter: the export can
   * no longer be written back here (cleanup did it, if nbdkit got that
   * far), and closing it would call into the plugin. */
  if (folio.export) {
    nbdkit_error ("folio: unloaded without cleanup: dirty data in the "
                  "cache not written back");
    folio.export = NULL;
  }
  folio_nbdkit_unload (&folio);
}

/* The cache's keys are ours; everything else is the plugin's (file=,
 * size=, uri=, tls=, ...). */
static int
folio_config (nbdkit_next_config *next, nbdkit_backend *nxdata,
              const char *key, const char *value)
{
  if (export_key_is_cache (key))
    return folio_nbdkit_config (&folio, key, value);
  return next (nxdata, key, value);
}

static int
folio_config_complete (nbdkit_next_config_complete *next,
                       nbdkit_backend *nxdata)
{
  /* The backing is the plugin below: cfg.backing only names it. */
  if (folio.cfg.backing == NULL &&
      export_config_set (&folio.cfg, "backing", FOLIO_FILTER_SPEC,
                         (char[64]) { 0 }, 64) == -1) {
    nbdkit_error ("folio: %m");
    return -1;
  }
  if (folio_nbdkit_config_complete (&folio) == -1)
    return -1;
  return next (nxdata);
}

static int
folio_get_ready (int thread_model)
{
  folio_thread_model = thread_model;
  return 0;
}

static int
folio_after_fork (nbdkit_backend *backend)
{
  char err[1024] = "";
  struct backing *b = next_backing_open (backend);

  if (b == NULL)
    return -1;
  folio.export = export_open_backing (&folio.cfg, b, err, sizeof err);
  if (folio.export == NULL) {
    nbdkit_error ("folio: %s", err[0] ? err : strerror (errno));
    return -1;
  }
  folio_nbdkit_opened (&folio);
  /* The cache's writeback thread started with it (after the fork). */
  if (cache_populate (folio.export->cache, NULL, NULL) == -1)
    nbdkit_debug ("folio: cannot populate the cache in the background: %m");
  return 0;
}

static void
folio_cleanup (nbdkit_backend *backend)
{
  folio_nbdkit_cleanup (&folio);
}

/* A connection does not open the plugin (the cache has the shared
 * context); the handle only has to be non-NULL. */
static void *
folio_open (nbdkit_next_open *next, nbdkit_context *context, int readonly,
            const char *exportname, int is_tls)
{
  return &folio;
}

static const char *
folio_export_description (nbdkit_next *next, void *handle)
{
  return folio.export->description;
}

static int64_t
folio_get_size (nbdkit_next *next, void *handle)
{
  return (int64_t) folio.export->size;
}

static int
folio_block_size (nbdkit_next *next, void *handle, uint32_t *minimum,
                  uint32_t *preferred, uint32_t *maximum)
{
  folio_nbdkit_block_size (&folio, minimum, preferred, maximum);
  return 0;
}

static int
folio_can_write (nbdkit_next *next, void *handle)
{
  return !folio.export->read_only;
}

/* Flush, trim, zero, fast zero, extents, multi-conn: the cache answers
 * them whatever the plugin has (it emulates what the plugin lacks, and
 * every connection sees the one cache). */
static int
folio_can_true (nbdkit_next *next, void *handle)
{
  return 1;
}

static int
folio_is_rotational (nbdkit_next *next, void *handle)
{
  return 0;
}

static int
folio_can_zero (nbdkit_next *next, void *handle)
{
  return NBDKIT_ZERO_NATIVE;
}

static int
folio_can_fua (nbdkit_next *next, void *handle)
{
  return NBDKIT_FUA_NATIVE;
}

static int
folio_can_cache (nbdkit_next *next, void *handle)
{
  return NBDKIT_CACHE_NATIVE;
}

/* A filter returns its errno in *err (nbdkit_set_error is the plugins'). */
static int
folio_err (int r, int *err)
{
  if (r == -1)
    *err = errno ? errno : EIO;
  return r;
}

static int
folio_pread (nbdkit_next *next, void *handle, void *buf, uint32_t count,
             uint64_t offset, uint32_t flags, int *err)
{
  return folio_err (folio_nbdkit_pread (&folio, buf, count, offset), err);
}

static int
folio_pwrite (nbdkit_next *next, void *handle, const void *buf,
              uint32_t count, uint64_t offset, uint32_t flags, int *err)
{
  return folio_err (folio_nbdkit_pwrite (&folio, buf, count, offset, flags), err);
}

static int
folio_flush (nbdkit_next *next, void *handle, uint32_t flags, int *err)
{
  return folio_err (folio_nbdkit_flush (&folio), err);
}

static int
folio_trim (nbdkit_next *next, void *handle, uint32_t count, uint64_t offset,
            uint32_t flags, int *err)
{
  return folio_err (folio_nbdkit_trim (&folio, count, offset, flags), err);
}

static int
folio_zero (nbdkit_next *next, void *handle, uint32_t count, uint64_t offset,
            uint32_t flags, int *err)
{
  return folio_err (folio_nbdkit_zero (&folio, count, offset, flags), err);
}

static int
folio_extents (nbdkit_next *next, void *handle, uint32_t count,
               uint64_t offset, uint32_t flags,
               struct nbdkit_extents *extents, int *err)
{
  return folio_err (folio_nbdkit_extents (&folio, count, offset, flags, extents), err);
}

static int
folio_cache (nbdkit_next *next, void *handle, uint32_t count,
             uint64_t offset, uint32_t flags, int *err)
{
  return folio_err (folio_nbdkit_cache (&folio, count, offset), err);
}

static struct nbdkit_filter filter = {
  .name               = "folio",
  .longname           = "foliod folio cache filter",
  .load               = folio_load,
  .unload             = folio_unload,
  .config             = folio_config,
  .config_complete    = folio_config_complete,
  .config_help        = NULL, /* filled by folio_init_help */
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
  .can_zero           = folio_can_zero,
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
};

__attribute__((constructor)) static void
folio_init_help (void)
{
  filter.config_help = folio_nbdkit_help (1);
}

NBDKIT_REGISTER_FILTER (filter)
