/* Export options: one parser for the daemon's --export and config file and
 * for the nbdkit plugin's key=value parameters. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/export.h"
#include "foliod/util.h"

const struct export_key_help export_keys[] = {
  { "backing", "where the data lives: file:PATH, nbd://HOST[:PORT]/NAME, "
               "nbds://..., nbd+unix:///NAME?socket=PATH, "
               "rbd:POOL/IMAGE[@SNAP] (required)" },
  { "format", "file backing: raw serves the bytes as they are; auto "
              "(default) refuses a file that holds a qcow2, vmdk, ... image" },
  { "locking", "file backing: on (default) locks the image as qemu does, "
               "so no other foliod or qemu writes it; off: no locks" },
  { "cache", "writeback (default), writethrough, or none (direct I/O)" },
  { "cache-size", "folio memory, e.g. 1G (default 256M)" },
  { "folio-size", "cache unit, power of two 4K..2M (default 64K)" },
  { "block-size", "dirty/uptodate tracking unit, power of two "
                  "512..folio-size (default 4K)" },
  { "direct-threshold", "requests this large bypass the cache (default 0: off)" },
  { "max-io", "largest backing request the cache sends (default 1M)" },
  { "readahead", "largest readahead window of sequential reads, up to "
                 "64M; 0: off; auto (default): 4M on an nbd backing, off "
                 "on a file" },
  { "dirty-background", "start background writeback at this % of the "
                        "cache (default 10; at least 1G when the cache "
                        "holds the whole export of a file)" },
  { "dirty-limit", "throttle writers at this % of the cache (default 20; "
                   "at least 2G when the cache holds the whole export of a file)" },
  { "dirty-expire", "write back dirty data older than this many ms "
                    "(default 30000)" },
  { "writeback-interval", "writeback thread wake-up period in ms "
                          "(default 1000)" },
  { "read-only", "serve the export read-only (default false)" },
  { "description", "text shown to clients (NBD_INFO_DESCRIPTION)" },
  { "store", "folio memory: ram (default), or pmem:PATH, a file that "
             "keeps dirty data across crashes (cache-size is its data)" },
  { "flush", "what FLUSH and FUA wait for: store (default with a pmem "
             "store) or backing (default with ram)" },
  { "connections", "nbd backing: connections to the remote (default 4)" },
  { "retry-timeout", "nbd backing: how long in ms a request waits for a "
                     "lost remote to come back (default 30000)" },
  { "request-timeout", "nbd and rbd backings: a request the remote does "
                       "not answer in this many ms fails (default 30000)" },
  { "ceph-conf", "rbd backing: the cluster's ceph.conf (default: "
                 "librados' search)" },
  { "ceph-id", "rbd backing: client name without client. (default admin)" },
  { "ceph-keyring", "rbd backing: keyring file (default: the conf's)" },
  { "tls-certificates", "nbds backing: directory with ca-cert.pem etc." },
  { "tls-psk-file", "nbds backing: PSK file" },
  { "tls-username", "nbds backing: PSK user name" },
  { "tls", "per export TLS policy: require, or off to follow the server" },
  { NULL, NULL },
};

int
export_key_is_cache (const char *key)
{
  static const char *const cache_keys[] = {
    "cache", "cache-size", "folio-size", "block-size", "direct-threshold",
    "max-io", "readahead", "dirty-background", "dirty-limit",
    "dirty-expire", "writeback-interval", "store", "flush", NULL,
  };

  for (size_t i = 0; cache_keys[i]; i++)
    if (strcmp (key, cache_keys[i]) == 0)
      return 1;
  return 0;
}

void
export_config_init (struct export_config *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->tls_require = -1;
  cache_config_default (&cfg->cache);
}

void
export_config_free (struct export_config *cfg)
{
  free (cfg->name);
  free (cfg->description);
  free (cfg->backing);
  free (cfg->store);
  free (cfg->tls_certificates);
  free (cfg->tls_psk_file);
  free (cfg->tls_username);
  free (cfg->ceph_conf);
  free (cfg->ceph_id);
  free (cfg->ceph_keyring);
  memset (cfg, 0, sizeof *cfg);
}

static int
set_u32_size (uint32_t *dst, const char *value)
{
  uint64_t v;

  if (parse_size (value, &v) == -1)
    return -1;
  if (v > UINT32_MAX) {
    errno = ERANGE;
    return -1;
  }
  *dst = (uint32_t) v;
  return 0;
}

static int
set_uint (unsigned *dst, const char *value, unsigned max)
{
  char *end;
  unsigned long v;

  errno = 0;
  v = strtoul (value, &end, 10);
  if (errno || end == value || *end || v > max) {
    errno = EINVAL;
    return -1;
  }
  *dst = (unsigned) v;
  return 0;
}

static int
set_readahead (uint32_t *dst, const char *value)
{
  if (strcmp (value, "auto") == 0) {
    *dst = CACHE_READAHEAD_AUTO;
    return 0;
  }
  if (set_u32_size (dst, value) == -1)
    return -1;
  if (*dst == CACHE_READAHEAD_AUTO) {
    errno = ERANGE;
    return -1;
  }
  return 0;
}

static int
set_mode (enum cache_mode *dst, const char *value)
{
  static const char *names[] = { "writeback", "writethrough", "none" };

  for (int i = 0; i < 3; i++)
    if (strcmp (value, names[i]) == 0) {
      *dst = (enum cache_mode) i;
      return 0;
    }
  errno = EINVAL;
  return -1;
}

static int
set_flush (enum cache_flush_mode *dst, const char *value)
{
  if (strcmp (value, "store") == 0) *dst = CACHE_FLUSH_STORE;
  else if (strcmp (value, "backing") == 0) *dst = CACHE_FLUSH_BACKING;
  else { errno = EINVAL; return -1; }
  return 0;
}

static int
set_tls (int *dst, const char *value)
{
  if (strcmp (value, "require") == 0) *dst = 1;
  else if (strcmp (value, "off") == 0 || strcmp (value, "on") == 0) *dst = 0;
  else { errno = EINVAL; return -1; }
  return 0;
}

static int
set_format (int *raw, const char *value)
{
  if (strcmp (value, "raw") == 0) *raw = 1;
  else if (strcmp (value, "auto") == 0) *raw = 0;
  else { errno = EINVAL; return -1; }
  return 0;
}

static int
set_locking (int *off, const char *value)
{
  int on;

  if (parse_bool (value, &on) == -1)
    return -1;
  *off = !on;
  return 0;
}

static int
set_key (struct export_config *cfg, const char *key, const char *value)
{
  struct cache_config *cc = &cfg->cache;
  struct backing_opts *bo = &cfg->bopts;

  if (!strcmp (key, "backing")) return str_replace (&cfg->backing, value);
  if (!strcmp (key, "format")) return set_format (&bo->format_raw, value);
  if (!strcmp (key, "locking")) return set_locking (&bo->no_locking, value);
  if (!strcmp (key, "cache")) return set_mode (&cc->mode, value);
  if (!strcmp (key, "cache-size")) return parse_size (value, &cc->cache_size);
  if (!strcmp (key, "folio-size")) return set_u32_size (&cc->folio_size, value);
  if (!strcmp (key, "block-size")) return set_u32_size (&cc->block_size, value);
  if (!strcmp (key, "direct-threshold"))
    return parse_size (value, &cc->direct_threshold);
  if (!strcmp (key, "max-io")) return set_u32_size (&cc->max_io_bytes, value);
  if (!strcmp (key, "readahead"))
    return set_readahead (&cc->readahead_bytes, value);
  if (!strcmp (key, "dirty-background")) {
    cc->dirty_auto = false;
    return set_uint (&cc->dirty_background_pct, value, 100);
  }
  if (!strcmp (key, "dirty-limit")) {
    cc->dirty_auto = false;
    return set_uint (&cc->dirty_limit_pct, value, 100);
  }
  if (!strcmp (key, "dirty-expire"))
    return set_uint (&cc->dirty_expire_ms, value, 86400000);
  if (!strcmp (key, "writeback-interval"))
    return set_uint (&cc->writeback_interval_ms, value, 3600000);
  if (!strcmp (key, "read-only")) return parse_bool (value, &cfg->read_only);
  if (!strcmp (key, "description"))
    return str_replace (&cfg->description, value);
  if (!strcmp (key, "store")) return str_replace (&cfg->store, value);
  if (!strcmp (key, "flush")) return set_flush (&cc->flush, value);
  if (!strcmp (key, "connections"))
    return set_uint (&bo->connections, value, 64);
  if (!strcmp (key, "retry-timeout"))
    return set_uint (&bo->retry_timeout_ms, value, 86400000);
  if (!strcmp (key, "request-timeout"))
    return set_uint (&bo->request_timeout_ms, value, 86400000);
  if (!strcmp (key, "tls-certificates"))
    return str_replace (&cfg->tls_certificates, value);
  if (!strcmp (key, "tls-psk-file"))
    return str_replace (&cfg->tls_psk_file, value);
  if (!strcmp (key, "tls-username"))
    return str_replace (&cfg->tls_username, value);
  if (!strcmp (key, "tls")) return set_tls (&cfg->tls_require, value);
  if (!strcmp (key, "ceph-conf")) return str_replace (&cfg->ceph_conf, value);
  if (!strcmp (key, "ceph-id")) return str_replace (&cfg->ceph_id, value);
  if (!strcmp (key, "ceph-keyring"))
    return str_replace (&cfg->ceph_keyring, value);
  errno = ENOENT;
  return -1;
}

int
export_config_set (struct export_config *cfg, const char *key,
                   const char *value, char *err, size_t errlen)
{
  if (set_key (cfg, key, value) == 0)
    return 0;
  if (errno == ENOENT)
    snprintf (err, errlen, "unknown export option '%s'", key);
  else
    snprintf (err, errlen, "bad value for %s: '%s'%s", key, value,
              errno == ERANGE ? " (too large)" : "");
  return -1;
}

void
export_err_append (char *err, size_t errlen, const char *msg)
{
  size_t n = strlen (err);

  if (n + 1 < errlen)
    snprintf (err + n, errlen - n, "%s%s", n ? "; " : "", msg);
}

/* The keys cache_config_check judges, in the order a fault of two keys
 * is blamed: the subject of the reason first ("block-size must not exceed
 * folio-size", "cache-size must hold at least 4 folios"). */
#define CACHE_FIELD(k, f) { k, offsetof (struct cache_config, f), \
                            sizeof ((struct cache_config *) 0)->f }
static const struct {
  const char *key;
  size_t off, len;
} cache_fields[] = {
  CACHE_FIELD ("block-size", block_size),
  CACHE_FIELD ("cache-size", cache_size),
  CACHE_FIELD ("max-io", max_io_bytes),
  CACHE_FIELD ("readahead", readahead_bytes),
  CACHE_FIELD ("dirty-background", dirty_background_pct),
  CACHE_FIELD ("dirty-limit", dirty_limit_pct),
  CACHE_FIELD ("writeback-interval", writeback_interval_ms),
  CACHE_FIELD ("cache", mode),
  CACHE_FIELD ("folio-size", folio_size),
};
#define N_CACHE_FIELDS (sizeof cache_fields / sizeof cache_fields[0])

/* cache_config_check names the first broken rule in words only.  The key
 * at fault is the first one whose own value breaks it: put back to its
 * default, the reason goes away.  A key left at its default never is.
 * NULL when no single key is (the rule concerns the export). */
static const char *
cache_fault_key (const struct cache_config *cc, const char *reason)
{
  struct cache_config def, probe;
  char again[256];

  cache_config_default (&def);
  for (size_t i = 0; i < N_CACHE_FIELDS; i++) {
    probe = *cc;
    memcpy ((char *) &probe + cache_fields[i].off,
            (const char *) &def + cache_fields[i].off, cache_fields[i].len);
    if (cache_config_check (&probe, again, sizeof again) == 0 ||
        strcmp (again, reason) != 0)
      return cache_fields[i].key;
  }
  return NULL;
}

int
export_config_check_each (const struct export_config *cfg,
                          export_problem_fn *report, void *arg)
{
  char one[256];
  int n = 0;

  if (cfg->backing == NULL || cfg->backing[0] == '\0') {
    report (arg, NULL, "no backing given (backing=file:PATH or nbd://...)");
    n++;
  }
  if (cfg->store && strcmp (cfg->store, "ram") != 0 &&
      export_store_path (cfg) == NULL) {
    snprintf (one, sizeof one, "unknown store '%s' (ram, pmem:PATH or ssd:PATH)",
              cfg->store);
    report (arg, "store", one);
    n++;
  }
  if (cfg->cache.flush == CACHE_FLUSH_STORE && export_store_path (cfg) == NULL) {
    report (arg, "flush", "flush=store needs a persistent store "
            "(store=pmem:PATH or store=ssd:PATH): the ram store loses its data "
            "with foliod");
    n++;
  }
  if (cache_config_check (&cfg->cache, one, sizeof one) == -1) {
    report (arg, cache_fault_key (&cfg->cache, one), one);
    n++;
  }
  return n;
}

const char *
export_store_path (const struct export_config *cfg)
{
  const char *path;

  return store_kind_parse (cfg->store, &path) ? path : NULL;
}

struct check_text {
  char *err;
  size_t errlen;
};

static void
check_text_add (void *arg, const char *key, const char *msg)
{
  struct check_text *t = arg;

  export_err_append (t->err, t->errlen, msg);
}

int
export_config_check (const struct export_config *cfg, char *err,
                     size_t errlen)
{
  struct check_text t = { err, errlen };

  err[0] = '\0';
  if (export_config_check_each (cfg, check_text_add, &t) == 0)
    return 0;
  errno = EINVAL;
  return -1;
}

int
export_name_check (const char *name, char *err, size_t errlen)
{
  size_t n = strlen (name);

  if (n <= EXPORT_NAME_MAX)
    return 0;
  snprintf (err, errlen, "export name of %zu bytes (\"%.32s...\"): NBD "
            "clients can ask for names of at most %d bytes", n, name,
            EXPORT_NAME_MAX);
  errno = ENAMETOOLONG;
  return -1;
}
