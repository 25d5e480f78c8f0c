/* An export: open its backing and cache; close it without losing data. */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "foliod/export.h"
#include "foliod/log.h"
#include "foliod/util.h"

/* The file a file: backing spec names, or NULL (nbd, rbd). */
static const char *
spec_file_path (const char *spec)
{
  if (strncmp (spec, "file://", 7) == 0)
    return spec + 7;
  if (strncmp (spec, "file:", 5) == 0)
    return spec + 5;
  if (strstr (spec, "://") || strncmp (spec, "rbd:", 4) == 0)
    return NULL;
  return spec;
}

/* The backing's identity, kept in the store's header: its spec (a file as
 * file:REALPATH, so that a relative path or another spelling finds it
 * again), its size, and for a regular file its device and inode (a block
 * device: its device number; its inode in /dev changes across boots). */
static int
export_backing_id (const char *spec, const struct backing *b,
                   const struct stat *pre, struct store_config *sc,
                   char *buf, size_t buflen, char *err, size_t errlen)
{
  const char *path = spec_file_path (spec);
  char real[PATH_MAX];
  struct stat st;

  sc->backing_spec = spec;
  sc->backing_size = b->size;
  if (path == NULL)
    return 0;
  if (realpath (path, real) == NULL || stat (real, &st) == -1) {
    snprintf (err, errlen, "backing %s: %s", path, strerror (errno));
    return -1;
  }
  snprintf (buf, buflen, "file:%s", real);
  sc->backing_spec = buf;
  /* A file's times tell whether it changed while foliod was down: those
   * of before backing_open (opening it may touch them). */
  sc->backing_file = S_ISREG (st.st_mode) ? buf + 5 : NULL;
  if (sc->backing_file && pre->st_dev == st.st_dev &&
      pre->st_ino == st.st_ino) {
    sc->backing_mtime_ns = (uint64_t) pre->st_mtim.tv_sec * 1000000000u +
                           (uint64_t) pre->st_mtim.tv_nsec;
    sc->backing_ctime_ns = (uint64_t) pre->st_ctim.tv_sec * 1000000000u +
                           (uint64_t) pre->st_ctim.tv_nsec;
  }
  sc->backing_dev = S_ISBLK (st.st_mode) ? st.st_rdev : st.st_dev;
  sc->backing_ino = S_ISBLK (st.st_mode) ? 0 : st.st_ino;
  return 0;
}

/* store=KIND:PATH: open (or create) the store for this backing; NULL
 * (no error) for the ram store. */
static int
export_open_store (struct export *e, const struct export_config *cfg,
                   const struct stat *pre, char *err, size_t errlen)
{
  const char *path;
  const struct store_kind *kind = store_kind_parse (cfg->store, &path);
  struct store_config sc = { 0 };
  char spec[PATH_MAX + 8];

  if (kind == NULL)
    return 0;
  sc.path = path;
  sc.folio_size = cfg->cache.folio_size;
  sc.block_size = cfg->cache.block_size;
  sc.nslots = (uint32_t) (cfg->cache.cache_size / cfg->cache.folio_size);
  sc.export_size = e->backing->size;
  if (export_backing_id (cfg->backing, e->backing, pre, &sc, spec,
                         sizeof spec, err, errlen) == -1)
    return -1;
  e->store = kind->open (&sc, err, errlen);
  return e->store ? 0 : -1;
}

/* The export around a backing: b given (the nbdkit filter's), or NULL
 * to open cfg->backing.  b is the export's in every case (closed on
 * failure). */
static struct export *
export_open_with (const struct export_config *cfg, struct backing *b,
                  char *err, size_t errlen)
{
  struct export *e;
  struct backing_opts bo = cfg->bopts;   /* the strings: views of cfg's */
  struct stat pre = { 0 };   /* a file backing, before it is opened */

  if (export_config_check (cfg, err, errlen) == -1) {
    backing_close (b);
    return NULL;
  }
  e = calloc (1, sizeof *e);
  if (e == NULL) {
    snprintf (err, errlen, "out of memory");
    backing_close (b);
    return NULL;
  }
  e->backing = b;
  e->name = strdup (cfg->name ? cfg->name : "");
  e->description = cfg->description ? strdup (cfg->description) : NULL;
  if (e->name == NULL || (cfg->description && e->description == NULL)) {
    snprintf (err, errlen, "out of memory");
    goto fail;
  }
  bo.tls_certificates = cfg->tls_certificates;
  bo.tls_psk_file = cfg->tls_psk_file;
  bo.tls_username = cfg->tls_username;
  bo.ceph_conf = cfg->ceph_conf;
  bo.ceph_id = cfg->ceph_id;
  bo.ceph_keyring = cfg->ceph_keyring;
  bo.read_only = cfg->read_only;
  bo.direct = cfg->cache.mode == CACHE_NONE || cfg->cache.direct_threshold;
  if (b == NULL) {
    if (spec_file_path (cfg->backing) &&
        stat (spec_file_path (cfg->backing), &pre) == -1)
      memset (&pre, 0, sizeof pre);
    e->backing = backing_open (cfg->backing, &bo, err, errlen);
    if (e->backing == NULL)
      goto fail;
  }
  e->read_only = cfg->read_only || (e->backing->caps & BACKING_READ_ONLY);
  e->tls_require = cfg->tls_require;
  e->size = e->backing->size;
  if (export_open_store (e, cfg, &pre, err, errlen) == -1)
    goto fail;
  /* Last: once it exists, its writeback thread uses the backing. */
  e->cache = cache_create (e->backing, e->store, &cfg->cache, err, errlen);
  if (e->cache == NULL) {
    if (e->store) {   /* name the store: the reason may be about it */
      size_t n = strlen (err);
      char why[256];
      snprintf (why, sizeof why, "%.*s", (int) n, err);
      snprintf (err, errlen, "store %s: %s", cfg->store, why);
    }
    goto fail;
  }
  return e;

 fail:
  {
    int saved = errno;       /* EMEDIUMTYPE: the format probe refused */
    store_destroy (e->store); /* closing it unlocks it; nothing is lost */
    if (e->backing)
      backing_close (e->backing);
    free (e->name);
    free (e->description);
    free (e);
    errno = saved;
  }
  return NULL;
}

struct export *
export_open (const struct export_config *cfg, char *err, size_t errlen)
{
  return export_open_with (cfg, NULL, err, errlen);
}

struct export *
export_open_backing (const struct export_config *cfg, struct backing *b,
                     char *err, size_t errlen)
{
  return export_open_with (cfg, b, err, errlen);
}

void
export_flush_done (struct export *e, bool failed, int err)
{
  struct cache_stats st;
  char why[256];
  int saved = errno;      /* the request's answer */

  if (!failed) {
    if (atomic_load (&e->flush_failing) &&
        atomic_exchange (&e->flush_failing, false))
      log_info ("export %s: FLUSH succeeds again", e->name);
    errno = saved;
    return;
  }
  if (atomic_exchange (&e->flush_failing, true)) {
    errno = saved;
    return;
  }
  cache_get_stats (e->cache, &st);
  if (st.fenced)
    snprintf (why, sizeof why, "fenced: %s (foliod(8), Lost lock)",
              st.fence_reason ? st.fence_reason : "the image is not ours");
  else if (st.passthrough_lost)
    snprintf (why, sizeof why, "%llu passthrough write%s lost: every FLUSH "
              "fails until 'foliod clear-doubt %s'",
              (unsigned long long) st.passthrough_lost,
              st.passthrough_lost == 1 ? "" : "s", e->name);
  else if (st.writes_in_doubt)
    snprintf (why, sizeof why, "%llu write%s to the backing in doubt: "
              "every FLUSH fails until 'foliod clear-doubt %s'",
              (unsigned long long) st.writes_in_doubt,
              st.writes_in_doubt == 1 ? "" : "s", e->name);
  else
    snprintf (why, sizeof why, "the backing or the store failed; the "
              "dirty data stays dirty and is written again");
  log_warn ("export %s: FLUSH failed (%s): %s; said once until a FLUSH "
            "succeeds", e->name, strerror (err), why);
  errno = saved;
}

void
export_get_stats (struct export *e, struct cache_stats *cst,
                  struct backing_stats *bst)
{
  cache_get_stats (e->cache, cst);
  backing_get_stats (e->backing, bst);
}

#define EXPORT_CLOSE_ATTEMPTS 5
#define EXPORT_CLOSE_PAUSE_MS 1000

static void
pause_ms (uint64_t ms)
{
  struct timespec ts = { .tv_sec = (time_t) (ms / 1000),
                         .tv_nsec = (long) (ms % 1000) * 1000000 };

  while (nanosleep (&ts, &ts) == -1 && errno == EINTR)
    ;
}

/* Passthrough writes were lost (the ledger's: a backing flush failed
 * after they were sent; the cache had no copy to write again): every
 * flush fails for good, so the stop fails at once, saying why, instead
 * of trying again.  True then. */
static bool
export_pt_lost (struct export *e)
{
  struct cache_stats st;

  cache_get_stats (e->cache, &st);
  if (st.passthrough_lost == 0)
    return false;
  log_error ("export %s: %llu passthrough write%s lost (a backing flush "
             "failed after %s sent, and the cache held no copy): the "
             "backing may hold older data there; every FLUSH has failed "
             "since%s", e->name, (unsigned long long) st.passthrough_lost,
             st.passthrough_lost == 1 ? " was" : "s were",
             st.passthrough_lost == 1 ? "it was" : "they were",
             e->store ? ", and the store keeps the loss for the next start "
                        "(foliod clear-doubt accepts it)" : "");
  return true;
}

/* The shutdown policy, for the daemon and the plugin alike.  No backing
 * request outlives the deadline.  An unreachable backing (a remote that
 * stayed away for its whole reconnect window, or hung) has been waited
 * for once: writing again would only wait again.  Other errors (the
 * remote answered EIO, a full disk) may clear: a few more attempts, a
 * second apart, within the deadline.  0, or -1 with errno. */
static int
export_write_back (struct export *e, uint64_t deadline)
{
  backing_set_deadline (e->backing, deadline);
  cache_stop_writeback (e->cache);
  for (unsigned i = 1;; i++) {
    if (cache_write_back (e->cache) == 0)
      return 0;
    int err = errno;
    if (export_pt_lost (e) || backing_unreachable (err) ||
        i == EXPORT_CLOSE_ATTEMPTS ||
        now_ms () + EXPORT_CLOSE_PAUSE_MS >= deadline) {
      errno = err;
      return -1;
    }
    pause_ms (EXPORT_CLOSE_PAUSE_MS);
  }
}

/* The writeback at close failed, and e has a persistent store.  If the
 * backing holds every cached block, flushed (nothing dirty or unstable
 * left), and the store is what failed (a log whose fdatasync failed can take nothing more): the store
 * is marked clean all the same (the ssd log retires its records), since
 * what it holds is older than the backing and the next start must not
 * write it back over the backing (issue 33 item 14).  0 then.  Else -1,
 * *lost set when the store failed too: it holds older versions of the
 * dirty data, if any, not the data itself. */
static int
export_close_failed_store (struct export *e, uint64_t *lost)
{
  struct cache_stats st;
  int err = errno;

  cache_get_stats (e->cache, &st);
  bool on_backing = st.dirty_bytes + st.unstable_bytes == 0;
  bool store_failed = store_sync (e->store) == -1;
  if (on_backing && store_failed) {
    if (store_mark_clean (e->store) == 0) {
      log_warn ("export %s: the store failed (%s): every block was written "
                "back and the backing flushed; the store is marked clean "
                "(nothing older comes back at the next start)", e->name,
                strerror (err));
      if (st.flush_error == 0)  /* else passthrough writes were lost */
        return 0;
      errno = st.flush_error;
      return -1;
    }
    log_error ("export %s: the store failed (%s) and could not be marked "
               "clean (%s): every block is on the backing, but the next "
               "start would write back what the store holds, which may be "
               "older: remove the store before starting again", e->name,
               strerror (err), strerror (errno));
  } else if (store_failed && lost) {
    *lost = st.dirty_bytes + st.unstable_bytes;
  }
  errno = err;
  return -1;
}

/* Free e once its data is where it must be; r and err: the outcome so
 * far, kept unless the cache reports loss.  Returns r, errno set. */
static int
export_free (struct export *e, int r, int err)
{
  /* After the deadline the backing fails at once: this does not wait. */
  if (cache_destroy (e->cache) == -1 && r == 0) {
    err = errno;
    r = -1;
  }
  store_destroy (e->store);
  backing_close (e->backing);
  free (e->name);
  free (e->description);
  free (e);
  errno = err;
  return r;
}

int
export_close (struct export *e, unsigned timeout_ms, uint64_t *lost)
{
  struct cache_stats st;
  int r = 0, err = 0;

  if (lost)
    *lost = 0;
  if (e == NULL)
    return 0;
  if (export_write_back (e, now_ms () + timeout_ms) == -1) {
    err = errno;
    cache_get_stats (e->cache, &st);
    if (lost && e->store == NULL)   /* a persistent store keeps them */
      *lost = st.dirty_bytes + st.unstable_bytes;
    /* A released export's store stays unclean (below) either way. */
    r = e->store && export_release_state (e) == EXPORT_SERVING
      ? export_close_failed_store (e, lost) : -1;
  } else if (e->store && export_release_state (e) == EXPORT_SERVING &&
             store_mark_clean (e->store) == -1) {
    err = errno;    /* not clean: the next start recovers it all */
    r = -1;
  }
  /* A released export's store is left unclean on purpose: the next host
   * may have written the image since, so the next start here must not
   * trust the warm cache (a clean pmem store's is trusted on a remote or
   * rbd); it recovers the dirty blocks only, and there are none. */
  return export_free (e, r, err);
}

/* Upgrade in place: a persistent store keeps its dirty data for the next
 * process: nothing is written back; the store is synced and marked clean
 * (every bit in it is true: the next process keeps the warm blocks too,
 * and its dirty ones are not "dirtied long ago").  A ram store is handed
 * over whole when ram is given (its memfd stamped, cache_keep_ram),
 * else written back (export_close). */
int
export_close_keep (struct export *e, unsigned timeout_ms, uint64_t *lost,
                   struct store **ram)
{
  int r = 0, err = 0;

  if (ram)
    *ram = NULL;
  if (e && e->store == NULL && ram &&
      export_release_state (e) == EXPORT_SERVING) {
    cache_stop_writeback (e->cache);
    *ram = cache_keep_ram (e->cache, e->name);
    if (*ram) {
      if (lost)
        *lost = 0;
      return export_free (e, 0, 0);
    }
    log_warn ("export %s: cannot hand the ram cache over (%s): writing it "
              "back", e->name, strerror (errno));
  }
  if (e == NULL || e->store == NULL || !store_has (e->store, STORE_DURABLE) ||
      export_release_state (e) != EXPORT_SERVING)
    return export_close (e, timeout_ms, lost);
  if (lost)
    *lost = 0;
  cache_stop_writeback (e->cache);
  if (store_mark_clean (e->store) == -1) {
    err = errno;    /* not clean: recovered as after a crash */
    r = -1;
  }
  return export_free (e, r, err);
}

#define EXPORT_RELEASE_POLL_MS 1

/* Wait for the write-class requests inside the gate to leave it: 0, or
 * -1 (ETIMEDOUT) at the deadline.  A release is rare and short: a poll. */
static int
export_writers_drain (struct export *e, uint64_t deadline)
{
  while (atomic_load (&e->writers) > 0) {
    if (now_ms () >= deadline) {
      errno = ETIMEDOUT;
      return -1;
    }
    pause_ms (EXPORT_RELEASE_POLL_MS);
  }
  return 0;
}

/* The release's steps once writes are refused: drain, write back (the
 * backing's flush and the store's sync included), check that nothing is
 * left to write, release the image.  0, or -1 with errno and msg. */
static int
export_release_steps (struct export *e, uint64_t deadline, uint64_t *dirty,
                      char *msg, size_t msglen)
{
  struct cache_stats st;

  if (export_writers_drain (e, deadline) == -1) {
    snprintf (msg, msglen, "writes in progress did not end in time");
    return -1;
  }
  cache_get_stats (e->cache, &st);
  *dirty = st.dirty_bytes;
  if (!e->read_only && cache_write_back (e->cache) == -1) {
    int err = errno;
    cache_get_stats (e->cache, &st);
    snprintf (msg, msglen, "write back: %s (%llu bytes dirty, %llu "
              "unflushed, kept)", strerror (err),
              (unsigned long long) st.dirty_bytes,
              (unsigned long long) st.unstable_bytes);
    errno = err;
    return -1;
  }
  cache_get_stats (e->cache, &st);
  if (st.dirty_bytes || st.unstable_bytes) {   /* a bug, not a race */
    snprintf (msg, msglen, "%llu bytes still dirty, %llu unflushed after "
              "the write back", (unsigned long long) st.dirty_bytes,
              (unsigned long long) st.unstable_bytes);
    errno = EIO;
    return -1;
  }
  if (backing_release (e->backing) == -1) {
    snprintf (msg, msglen, "releasing the image: %s", strerror (errno));
    return -1;
  }
  return 0;
}

int
export_release (struct export *e, int stop, unsigned timeout_ms, char *msg,
                size_t msglen)
{
  int state = EXPORT_SERVING;
  uint64_t dirty = 0;

  if (!atomic_compare_exchange_strong (&e->release_state, &state,
                                       EXPORT_RELEASING)) {
    snprintf (msg, msglen, state == EXPORT_RELEASING ? "a release is "
              "already running" : "already released");
    errno = state == EXPORT_RELEASING ? EBUSY : EALREADY;
    return -1;
  }
  if (export_release_steps (e, now_ms () + timeout_ms, &dirty, msg,
                            msglen) == -1) {
    int err = errno;
    atomic_store (&e->release_state, EXPORT_SERVING);   /* as it was */
    errno = err;
    return -1;
  }
  atomic_store (&e->release_state, stop ? EXPORT_STOPPED : EXPORT_RELEASED);
  if (e->read_only)
    snprintf (msg, msglen, "read-only export, nothing to write back; "
              "image released; %s", stop ? "no longer served"
                                         : "served read-only");
  else
    snprintf (msg, msglen, "%llu dirty bytes written back, backing "
              "flushed, image released; %s", (unsigned long long) dirty,
              stop ? "no longer served" : "served read-only");
  return 0;
}
