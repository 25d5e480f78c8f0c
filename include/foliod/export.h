/* Exports: one named device = one backing + one cache + a policy.
 *
 * The daemon and the nbdkit plugin both build exports from the same
 * key=value options (export_config_set) and call the cache through the
 * same struct export, so neither adapter holds any cache or backing logic.
 */
#ifndef FOLIOD_EXPORT_H
#define FOLIOD_EXPORT_H

#include <errno.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "foliod/attr.h"
#include "foliod/backing.h"
#include "foliod/cache.h"
#include "foliod/store.h"

struct export_config {
  char *name;              /* export name clients ask for */
  char *description;       /* NBD_INFO_DESCRIPTION, may be NULL */
  char *backing;           /* backing spec, see backing_open() */
  char *store;             /* "ram" (default) or "pmem:PATH" */
  int read_only;
  int tls_require;         /* -1: server default, 0 off, 1 require */
  struct cache_config cache;
  struct backing_opts bopts; /* numbers only: export_open points its
                              * strings at the ones below */
  char *tls_certificates;  /* nbds backing, may be NULL */
  char *tls_psk_file;
  char *tls_username;
  char *ceph_conf;         /* rbd backing, may be NULL */
  char *ceph_id;
  char *ceph_keyring;
};

/* Defaults: no name, no backing, ram store, cache_config_default(). */
void export_config_init (struct export_config *cfg) FOLIOD_NONNULL (1);
void export_config_free (struct export_config *cfg) FOLIOD_NONNULL (1);

/* Set one option by its user-facing key (the same keys in foliod --export,
 * foliod.conf [export NAME] sections and the nbdkit plugin):
 *   backing, cache (writeback|writethrough|none), cache-size, folio-size,
 *   block-size, direct-threshold, max-io, dirty-background, dirty-limit,
 *   dirty-expire, read-only, description, store (ram|pmem:PATH), flush
 *   (store|backing), connections, retry-timeout,
 *   tls-certificates, tls-psk-file, tls-username, tls, ceph-conf,
 *   ceph-id, ceph-keyring.
 * Sizes take K, M, G, T suffixes (powers of 1024).  Returns 0, or -1 with
 * a reason in err (unknown key, bad value). */
int export_config_set (struct export_config *cfg, const char *key,
                       const char *value, char *err, size_t errlen)
  FOLIOD_NONNULL (1, 2, 3) FOLIOD_WUR;

/* The keys above, NULL-terminated, with a one-line help each. */
struct export_key_help { const char *key; const char *help; };
extern const struct export_key_help export_keys[];

/* 1 when key configures the cache and its store, not the backing (the
 * keys the nbdkit filter takes; the rest belong to the plugin below). */
int export_key_is_cache (const char *key) FOLIOD_NONNULL (1);

/* Check the whole configuration (backing given, sizes coherent).  Every
 * problem found goes into err, separated by "; ".  0 or -1. */
int export_config_check (const struct export_config *cfg, char *err,
                         size_t errlen) FOLIOD_NONNULL (1) FOLIOD_WUR;

/* The same check, one call of report per problem, so that a config file
 * can point at the line of the key at fault: key is that key, NULL when
 * the export as a whole is (no backing).  Returns the number of problems. */
typedef void export_problem_fn (void *arg, const char *key, const char *msg);
int export_config_check_each (const struct export_config *cfg,
                              export_problem_fn *report, void *arg);

/* Append msg to err, "; " between reasons: a check reports every problem,
 * not the first only. */
void export_err_append (char *err, size_t errlen, const char *msg)
  FOLIOD_NONNULL (1, 3);

/* The PATH of store=KIND:PATH (pmem:PATH), or NULL (the ram store). */
const char *export_store_path (const struct export_config *cfg)
  FOLIOD_NONNULL (1);

/* The NBD protocol caps strings, export names included, at 4096 bytes: a
 * longer name could never be asked for.  "" is the default export. */
#define EXPORT_NAME_MAX 4096

/* 0, or -1 with a reason in err when no client could ask for name. */
int export_name_check (const char *name, char *err, size_t errlen)
  FOLIOD_NONNULL (1) FOLIOD_WUR;

struct export {
  char *name;
  char *description;
  int read_only;
  int tls_require;
  uint64_t size;           /* bytes, from the backing */
  struct backing *backing;
  struct store *store;
  struct cache *cache;
  unsigned workers_busy;   /* server: pool workers on its requests (the
                            * pool's lock) */
  /* Hand-over to another host (export_release): the gate every
   * write-class request passes (export_write_begin/_end), as a freeze of
   * a file system: writers count themselves in, then look at the state;
   * the release sets the state, then waits for the count to drain.  Both
   * sequentially consistent, so one of the two always sees the other. */
  _Atomic int release_state;   /* enum export_release_state */
  _Atomic unsigned writers;    /* write-class requests inside the gate */
  /* A client's FLUSH (or FUA) failed, and no FLUSH succeeded since: the
   * log said why once (export_flush_done). */
  _Atomic bool flush_failing;
};

enum export_release_state {
  EXPORT_SERVING = 0,      /* writable (if not read-only) */
  EXPORT_RELEASING,        /* writes refused; a release is running */
  EXPORT_RELEASED,         /* written back, image released: read-only */
  EXPORT_STOPPED,          /* the same, and no longer served at all */
};

/* The state above, for the server: a released export is read-only (new
 * connections see NBD_FLAG_READ_ONLY), a stopped one is not found. */
static inline int
export_release_state (const struct export *e)
{
  return atomic_load (&e->release_state);
}

/* A write-class request (write, zero, trim) enters: 0, or -1 with errno
 * EROFS once a release began (as a read-only export answers).  Every 0
 * is paired with one export_write_end when the request is done with the
 * cache. */
static inline int
export_write_begin (struct export *e)
{
  atomic_fetch_add (&e->writers, 1);
  if (atomic_load (&e->release_state) != EXPORT_SERVING) {
    atomic_fetch_sub (&e->writers, 1);
    errno = EROFS;
    return -1;
  }
  return 0;
}

static inline void
export_write_end (struct export *e)
{
  atomic_fetch_sub (&e->writers, 1);
}

/* Hand the image to another host: refuse writes from now on, wait (at
 * most timeout_ms) for those inside the gate, write back every dirty
 * block, flush the backing and sync the store, then release the image
 * (backing_release: the file's locks, the rbd exclusive lock).  stop: no
 * longer serve the export at all (else: read-only).  Returns 0 with what
 * was done in msg, or -1 with errno and the reason in msg; then nothing
 * was given up: dirty data, the lock and writes are as before. */
/* A client's FLUSH on e ended (failed: it failed with
 * err).  The first failure after a success is logged with what the
 * durability ledger says keeps FLUSH failing; the first success after
 * failures too.  A client flushing in a loop logs nothing more. */
void export_flush_done (struct export *e, bool failed, int err)
  FOLIOD_NONNULL (1);

int export_release (struct export *e, int stop, unsigned timeout_ms,
                    char *msg, size_t msglen) FOLIOD_NONNULL (1, 4) FOLIOD_WUR;

/* Open the backing, the store and the cache.  NULL with a reason in err;
 * errno EMEDIUMTYPE when the file backing holds an image format (its
 * probe refused it: see format=raw). */
struct export *export_open (const struct export_config *cfg, char *err,
                            size_t errlen) FOLIOD_NONNULL (1) FOLIOD_WUR;

/* The same around a backing the caller opened (the nbdkit filter's: the
 * next plugin); cfg->backing only names it (kept in a persistent store's
 * header).  b becomes the export's: closed by export_close, or here on
 * failure. */
struct export *export_open_backing (const struct export_config *cfg,
                                    struct backing *b, char *err,
                                    size_t errlen)
  FOLIOD_NONNULL (1, 2) FOLIOD_WUR;

/* The export's counters: its cache's, and its backing's. */
void export_get_stats (struct export *e, struct cache_stats *cst,
                       struct backing_stats *bst) FOLIOD_NONNULL (1, 2, 3);

/* Write back all dirty data, then free everything: the one shutdown
 * policy of the daemon and the plugin.  The writeback ends within
 * timeout_ms: a remote that is down is waited for once (its reconnect
 * window), other errors are retried a few times, a second apart.
 * Returns 0, or -1 with errno if dirty data could not be written back;
 * then *lost (may be NULL) is the bytes not known to be written (dirty,
 * or written but never flushed): with the ram store they are gone. */
int export_close (struct export *e, unsigned timeout_ms, uint64_t *lost)
  FOLIOD_WUR;

/* The same for an upgrade in place: with a persistent store nothing is
 * written back (the store is synced and closed; the next process's
 * export_open recovers its dirty data).  With the ram store: if ram is
 * not NULL (the new process reads this ram layout), nothing is written
 * back either: *ram is the store, handed over whole and the caller's
 * now (cache_keep_ram; NULL if that failed and it was written back);
 * else as export_close.  0, or -1 with errno. */
int export_close_keep (struct export *e, unsigned timeout_ms, uint64_t *lost,
                       struct store **ram) FOLIOD_WUR;

#endif /* FOLIOD_EXPORT_H */
