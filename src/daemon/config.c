/* The daemon's configuration: [server] keys, the INI file, --export.
 *
 * Per-export keys are not parsed here: they go to export_config_set, the
 * parser shared with the nbdkit plugin.  This file only splits sections,
 * lines and --export arguments, and parses the [server] keys.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "foliod/util.h"
#include "daemon/daemon.h"

enum {
  K_LISTEN, K_UNIX, K_CONTROL, K_METRICS_LISTEN, K_STATE_DIR, K_PIDFILE, K_WORKERS, K_LOOPS,
  K_MAX_CONNECTIONS, K_MAX_CONNECTIONS_PER_CLIENT, K_MAX_INFLIGHT,
  K_MAX_CONN_BUFFER, K_MAX_BUFFER_TOTAL, K_HANDSHAKE_TIMEOUT,
  K_IDLE_TIMEOUT, K_TLS,
  K_TLS_CERTIFICATES, K_TLS_VERIFY_PEER, K_TLS_PSK, K_LOG_LEVEL, K_LOG_FILE,
  K_SHUTDOWN_TIMEOUT, K_COUNT
};

/* Order must match the enum above. */
const struct server_key server_keys[] = {
  { "listen", "HOST:PORT", "listen on TCP (repeatable; [::1]:10809 for IPv6)", 1 },
  { "unix", "PATH", "listen on a Unix socket (repeatable)", 1 },
  { "control", "PATH", "control socket for 'foliod stats' and 'foliod flush'", 0 },
  { "metrics-listen", "HOST:PORT", "serve Prometheus metrics over HTTP at /metrics (default: off; no HOST: 127.0.0.1)", 0 },
  { "state-dir", "DIR", "directory relative paths of the config resolve in", 0 },
  { "pidfile", "PATH", "write the daemon's pid to PATH", 0 },
  { "workers", "N", "worker threads running requests (default 16)", 0 },
  { "loops", "N", "event loop threads serving connections (default: one per CPU, at most 8)", 0 },
  { "max-connections", "N", "connections served at once (default 128)", 0 },
  { "max-connections-per-client", "N", "connections per client address or uid (default 32)", 0 },
  { "max-inflight", "N", "requests in flight per connection (default 64)", 0 },
  { "max-conn-buffer", "SIZE", "request buffers one connection may hold (default 64M)", 0 },
  { "max-buffer-total", "SIZE", "request buffers of all connections (default 1G)", 0 },
  { "handshake-timeout", "SECONDS", "drop clients slower than this to handshake (default 10)", 0 },
  { "idle-timeout", "SECONDS", "close connections idle this long (default 0: never)", 0 },
  { "tls", "off|on|require", "TLS for clients (default off)", 0 },
  { "tls-certificates", "DIR", "directory with server-cert.pem, server-key.pem, ca-cert.pem", 0 },
  { "tls-verify-peer", "BOOL", "require client certificates (default no)", 0 },
  { "tls-psk", "FILE", "pre-shared keys (username:hexkey lines) instead of certificates", 0 },
  { "log-level", "LEVEL", "error, warn, info or debug (default info)", 0 },
  { "log-file", "PATH", "once ready, append log lines to PATH (default: stderr; syslog when detached)", 0 },
  { "shutdown-timeout", "SECONDS", "after SIGTERM, give up writing back after this long and exit 1 (default 60)", 0 },
  { NULL, NULL, NULL, 0 },
};

_Static_assert (K_COUNT <= 32, "key_line[] too small");

void
daemon_config_init (struct daemon_config *c)
{
  memset (c, 0, sizeof *c);
  c->log_level = LOG_LVL_INFO;
}

static void
strv_free (char **v, size_t n)
{
  for (size_t i = 0; i < n; i++)
    free (v[i]);
  free (v);
}

void
daemon_config_free (struct daemon_config *c)
{
  strv_free (c->listen, c->n_listen);
  strv_free (c->unix_paths, c->n_unix);
  free (c->control);
  free (c->metrics_listen);
  free (c->log_file);
  free (c->state_dir);
  free (c->pidfile);
  free (c->tls_certificates);
  free (c->tls_psk);
  for (size_t i = 0; i < c->n_exports; i++)
    export_config_free (&c->exports[i].cfg);
  free (c->exports);
  memset (c, 0, sizeof *c);
}

int
server_key_index (const char *key)
{
  for (int i = 0; server_keys[i].key; i++)
    if (strcmp (server_keys[i].key, key) == 0)
      return i;
  return -1;
}

/* -fanalyzer (gcc 12) loses *v through ini_line's callers and calls the
 * copy stored in it a leak at the return. */
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
static int
strv_push (char ***v, size_t *n, const char *s)
{
  char **nv = realloc (*v, (*n + 1) * sizeof **v);
  char *copy = strdup (s);

  if (nv == NULL || copy == NULL) {
    free (copy);
    if (nv)
      *v = nv;
    return -1;
  }
  nv[(*n)++] = copy;
  *v = nv;
  return 0;
}
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic pop
#endif

/* Seconds in [min, max]: "10" or "10s". */
static int
parse_seconds (const char *s, unsigned min, unsigned max, unsigned *out)
{
  char buf[32];
  size_t len = strlen (s);

  if (len > 1 && len < sizeof buf && s[len - 1] == 's') {
    memcpy (buf, s, len - 1);
    buf[len - 1] = '\0';
    return parse_uint (buf, min, max, out);
  }
  return parse_uint (s, min, max, out);
}

/* A buffer budget: at least 1M (below that large requests would only
 * ever run one at a time), at most 1T. */
static int
parse_buffer_size (const char *value, uint64_t *out)
{
  uint64_t v;

  if (parse_size (value, &v) == -1 || v < (1u << 20) || v > (1ull << 40))
    return -1;
  *out = v;
  return 0;
}

static int
set_listen (struct daemon_config *c, const char *value, char *err,
            size_t errlen)
{
  char host[256], port[16];

  if (parse_listen (value, host, sizeof host, port, sizeof port) == -1) {
    snprintf (err, errlen, "bad address '%s': expected HOST:PORT, "
              "[IPV6]:PORT or :PORT", value);
    return -1;
  }
  return strv_push (&c->listen, &c->n_listen, value);
}

/* Resolved here, so that a bad address is an error at its line. */
static int
set_metrics_listen (struct daemon_config *c, const char *value, char *err,
                    size_t errlen)
{
  struct metrics_addr a;

  if (metrics_addr_parse (value, &a, err, errlen) == -1)
    return -1;
  return str_replace (&c->metrics_listen, value);
}

static int
set_tls (struct daemon_config *c, const char *value)
{
  int b;

  if (strcasecmp (value, "require") == 0)
    c->tls = SERVER_TLS_REQUIRE;
  else if (parse_bool (value, &b) == 0)
    c->tls = b ? SERVER_TLS_ON : SERVER_TLS_OFF;
  else
    return -1;
  return 0;
}

int
daemon_config_set (struct daemon_config *c, const char *key,
                   const char *value, char *err, size_t errlen)
{
  int k = server_key_index (key);
  int r = -1;

  err[0] = '\0';
  switch (k) {
  case K_LISTEN: return set_listen (c, value, err, errlen);
  case K_UNIX:
    r = *value ? strv_push (&c->unix_paths, &c->n_unix, value) : -1;
    break;
  case K_CONTROL: r = str_replace (&c->control, value); break;
  case K_METRICS_LISTEN: return set_metrics_listen (c, value, err, errlen);
  case K_STATE_DIR: r = str_replace (&c->state_dir, value); break;
  case K_PIDFILE: r = str_replace (&c->pidfile, value); break;
  case K_WORKERS: r = parse_uint (value, 1, 1024, &c->workers); break;
  case K_LOOPS: r = parse_uint (value, 1, 64, &c->loops); break;
  case K_MAX_CONNECTIONS:
    r = parse_uint (value, 1, 1000000, &c->max_connections);
    break;
  case K_MAX_INFLIGHT: r = parse_uint (value, 1, 4096, &c->max_inflight); break;
  case K_MAX_CONNECTIONS_PER_CLIENT:
    r = parse_uint (value, 1, 1000000, &c->max_connections_per_client);
    break;
  case K_MAX_CONN_BUFFER: r = parse_buffer_size (value, &c->max_conn_buffer); break;
  case K_MAX_BUFFER_TOTAL: r = parse_buffer_size (value, &c->max_buffer_total); break;
  case K_HANDSHAKE_TIMEOUT:
    r = parse_seconds (value, 1, 3600, &c->handshake_timeout_s);
    break;
  case K_IDLE_TIMEOUT: r = parse_seconds (value, 0, 7 * 86400,
                                             &c->idle_timeout_s); break;
  case K_TLS: r = set_tls (c, value); break;
  case K_TLS_CERTIFICATES: r = str_replace (&c->tls_certificates, value); break;
  case K_TLS_VERIFY_PEER: r = parse_bool (value, &c->tls_verify_peer); break;
  case K_TLS_PSK: r = str_replace (&c->tls_psk, value); break;
  case K_LOG_LEVEL: r = log_level_parse (value, &c->log_level); break;
  case K_LOG_FILE: r = str_replace (&c->log_file, value); break;
  case K_SHUTDOWN_TIMEOUT:
    r = parse_uint (value, 1, 86400, &c->shutdown_timeout_s);
    break;
  default:
    snprintf (err, errlen, "unknown key '%s'", key);
    return -1;
  }
  if (r == -1 && err[0] == '\0')
    snprintf (err, errlen, "bad value '%s' for %s (expected %s)", value, key,
              server_keys[k].arg);
  return r;
}

void
daemon_config_clear (struct daemon_config *c, const char *key)
{
  switch (server_key_index (key)) {
  case K_LISTEN:
    strv_free (c->listen, c->n_listen);
    c->listen = NULL;
    c->n_listen = 0;
    break;
  case K_UNIX:
    strv_free (c->unix_paths, c->n_unix);
    c->unix_paths = NULL;
    c->n_unix = 0;
    break;
  }
}

static struct daemon_export *
find_export (struct daemon_config *c, const char *name)
{
  for (size_t i = 0; i < c->n_exports; i++)
    if (strcmp (c->exports[i].cfg.name, name) == 0)
      return &c->exports[i];
  return NULL;
}

static struct daemon_export *
new_export (struct daemon_config *c, const char *name)
{
  struct daemon_export *nv;

  nv = realloc (c->exports, (c->n_exports + 1) * sizeof *nv);
  if (nv == NULL)
    return NULL;
  c->exports = nv;
  nv = &c->exports[c->n_exports];
  memset (nv, 0, sizeof *nv);
  export_config_init (&nv->cfg);
  nv->cfg.name = strdup (name);
#pragma GCC diagnostic push     /* -fanalyzer: it is kept in c->exports */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
  if (nv->cfg.name == NULL) {
#pragma GCC diagnostic pop
    export_config_free (&nv->cfg);
    return NULL;
  }
  c->n_exports++;
  return nv;
}

/* Keys may be written folio_size or folio-size. */
static void
normalize_key (char *key)
{
  for (char *p = key; *p; p++) {
    *p = (char) tolower ((unsigned char) *p);
    if (*p == '_')
      *p = '-';
  }
}

/* Keys already given for one export, to refuse duplicates. */
struct seen_keys {
  char key[64][32];
  unsigned where[64];       /* line in the file, or item of --export */
  unsigned n;
};

/* Where key was given before, 0 if it was not. */
static unsigned
seen_keys_find (const struct seen_keys *s, const char *key)
{
  for (unsigned i = 0; i < s->n; i++)
    if (strcmp (s->key[i], key) == 0)
      return s->where[i];
  return 0;
}

/* Keys longer than a slot are unknown keys, refused before they get here;
 * more keys than slots means duplicates, refused on the way. */
static void
seen_keys_add (struct seen_keys *s, const char *key, unsigned where)
{
  if (s->n < 64 && strlen (key) < sizeof s->key[0]) {
    strcpy (s->key[s->n], key);
    s->where[s->n++] = where;
  }
}

/* One export key: create-size (daemon only) or a key of the shared
 * parser.  0, or -1 with a reason in err. */
static int
export_key_set (struct daemon_export *e, const char *key, const char *value,
                char *err, size_t errlen)
{
  if (strcmp (key, EXPORT_KEY_UBLK) == 0) {
    if (parse_bool (value, &e->ublk) == -1) {
      snprintf (err, errlen, "bad value for %s: '%s'", key, value);
      return -1;
    }
    return 0;
  }
  if (strcmp (key, EXPORT_KEY_CREATE_SIZE) != 0)
    return export_config_set (&e->cfg, key, value, err, errlen);
  if (parse_size (value, &e->create_size) == -1 || e->create_size == 0) {
    snprintf (err, errlen, "bad value for %s: '%s'", key, value);
    return -1;
  }
  return 0;
}

/* ---- the INI file ---------------------------------------------------- */

struct ini {
  struct daemon_config *c;
  const char *name;         /* file name for messages */
  unsigned line;
  int errors;
  enum { SEC_NONE, SEC_SERVER, SEC_EXPORT, SEC_BAD } sec;
  size_t exp;               /* index of the current export */
  unsigned exp_line;        /* its [export] line */
  struct seen_keys seen;    /* keys of the current [export] section */
};

static void __attribute__ ((format (printf, 2, 3)))
ini_error (struct ini *in, const char *fmt, ...)
{
  va_list ap;

  fprintf (stderr, "foliod: %s:%u: ", in->name, in->line);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
  in->errors++;
}

static char *
trim (char *s)
{
  char *e;

  while (isspace ((unsigned char) *s))
    s++;
  e = s + strlen (s);
  while (e > s && isspace ((unsigned char) e[-1]))
    *--e = '\0';
  return s;
}

/* "value" -> value (lets a value keep leading/trailing spaces or be ""). */
static char *
unquote (char *s)
{
  size_t n = strlen (s);

  if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
    s[n - 1] = '\0';
    return s + 1;
  }
  return s;
}

/* A problem of the whole export, reported at the line of the key at
 * fault, or of the [export] header when no key is. */
static void
ini_export_problem (void *arg, const char *key, const char *msg)
{
  struct ini *in = arg;
  unsigned save = in->line, at = key ? seen_keys_find (&in->seen, key) : 0;

  in->line = at ? at : in->exp_line;
  ini_error (in, "export '%s': %s", in->c->exports[in->exp].cfg.name, msg);
  in->line = save;
}

static void
ini_end_export (struct ini *in)
{
  struct daemon_export *e;

  /* Also after a bad key: every error of the export is reported at once
   * (a bad value leaves the default, so what is checked is still real). */
  if (in->sec != SEC_EXPORT)
    return;
  e = &in->c->exports[in->exp];
  export_config_check_each (&e->cfg, ini_export_problem, in);
  e->backing_line = seen_keys_find (&in->seen, "backing");
}

static void
ini_section (struct ini *in, char *s)
{
  size_t n = strlen (s);
  char *inner, *name, err[256];
  struct daemon_export *e;

  ini_end_export (in);
  in->sec = SEC_BAD;          /* until the header proves good */
  if (s[n - 1] != ']') {
    ini_error (in, "missing ']' in section header");
    return;
  }
  s[n - 1] = '\0';
  inner = trim (s + 1);
  if (strcmp (inner, "server") == 0) {
    in->sec = SEC_SERVER;
    return;
  }
  if (strncmp (inner, "export", 6) != 0 ||
      (inner[6] != '\0' && !isspace ((unsigned char) inner[6]))) {
    ini_error (in, "unknown section [%s] (expected [server] or "
               "[export NAME])", inner);
    return;
  }
  name = trim (inner + 6);
  if (*name == '\0') {
    ini_error (in, "export section without a name: write [export NAME]");
    return;
  }
  name = unquote (name);
  if (export_name_check (name, err, sizeof err) == -1) {
    ini_error (in, "%s", err);
    return;
  }
  e = find_export (in->c, name);
  if (e) {
    ini_error (in, "duplicate export '%s' (first defined at %s)", name,
               e->where);
    return;
  }
#pragma GCC diagnostic push     /* -fanalyzer: it is kept in in->c->exports */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
  e = new_export (in->c, name);
  if (e == NULL) {
#pragma GCC diagnostic pop
    ini_error (in, "out of memory");
    return;
  }
  snprintf (e->where, sizeof e->where, "%s:%u", in->name, in->line);
  in->sec = SEC_EXPORT;
  in->exp = (size_t) (e - in->c->exports);
  in->exp_line = in->line;
  in->seen.n = 0;
}

static void
ini_server_key (struct ini *in, const char *key, const char *value)
{
  struct daemon_config *c = in->c;
  int k = server_key_index (key);
  char err[256];

  if (k < 0) {
    ini_error (in, "unknown key '%s' in [server]", key);
    return;
  }
  if (!server_keys[k].repeatable && c->key_line[k]) {
    ini_error (in, "duplicate key '%s' (first set at line %u)", key,
               c->key_line[k]);
    return;
  }
  if (daemon_config_set (c, key, value, err, sizeof err) == -1) {
    ini_error (in, "%s", err);
    return;
  }
  c->key_line[k] = in->line;
}

static void
ini_export_key (struct ini *in, const char *key, const char *value)
{
  struct daemon_export *e = &in->c->exports[in->exp];
  unsigned first = seen_keys_find (&in->seen, key);
  char err[256];

  if (first) {
    ini_error (in, "duplicate key '%s' (first set at line %u)", key, first);
    return;
  }
  if (export_key_set (e, key, value, err, sizeof err) == -1) {
    ini_error (in, "export '%s': %s", e->cfg.name, err);
    return;
  }
  seen_keys_add (&in->seen, key, in->line);
}

static void
ini_line (struct ini *in, char *s)
{
  char *eq, *key, *value;

  s = trim (s);
  if (*s == '\0' || *s == '#' || *s == ';')
    return;
  if (*s == '[') {
    ini_section (in, s);
    return;
  }
  eq = strchr (s, '=');
  if (eq == NULL) {
    ini_error (in, "expected 'key = value', '[server]' or '[export NAME]'");
    return;
  }
  *eq = '\0';
  key = trim (s);
  value = unquote (trim (eq + 1));
  if (*key == '\0') {
    ini_error (in, "missing key before '='");
    return;
  }
  normalize_key (key);
  switch (in->sec) {
  case SEC_SERVER: ini_server_key (in, key, value); break;
  case SEC_EXPORT: ini_export_key (in, key, value); break;
  case SEC_NONE:
    ini_error (in, "'%s' outside a section: put it under [server] or "
               "[export NAME]", key);
    break;
  case SEC_BAD:               /* the section header was already refused */
    break;
  }
}

static char *
read_file (const char *path)
{
  FILE *f = fopen (path, "re");
  char *buf = NULL;
  size_t len = 0, cap = 0, n;

  if (f == NULL)
    return NULL;
  do {
    if (cap - len < 4096) {
      char *nb = realloc (buf, cap + 65536);
      if (nb == NULL) {
        free (buf);
        fclose (f);
        errno = ENOMEM;
        return NULL;
      }
      buf = nb;
      cap += 65536;
    }
    n = fread (buf + len, 1, cap - len - 1, f);
    len += n;
  } while (n > 0);
  if (ferror (f)) {
    int e = errno;
    free (buf);
    fclose (f);
    errno = e;
    return NULL;
  }
  fclose (f);
  buf[len] = '\0';
  return buf;
}

int
daemon_config_load (struct daemon_config *c, const char *name,
                    const char *text)
{
  struct ini in = { .c = c, .name = name };
  char *buf, *p, *nl;

  buf = text ? strdup (text) : read_file (name);
  if (buf == NULL) {
    fprintf (stderr, "foliod: %s: %s\n", name, strerror (errno));
    return -1;
  }
  for (p = buf; *p; p = nl + 1) {
    nl = strchr (p, '\n');
    in.line++;
    if (nl)
      *nl = '\0';
    ini_line (&in, p);
    if (nl == NULL)
      break;
  }
  ini_end_export (&in);
  free (buf);
  return in.errors ? -1 : 0;
}

/* ---- --export NAME=BACKING[,key=value...] ---------------------------- */

const char *
backing_spec_file_path (const char *spec)
{
  const char *sep;

  if (strncmp (spec, "file://", 7) == 0)
    return spec + 7;
  if (strncmp (spec, "file:", 5) == 0)
    return spec + 5;
  if (strncmp (spec, "rbd:", 4) == 0)
    return NULL;
  sep = strstr (spec, "://");
  return sep && strchr (spec, '/') > sep ? NULL : spec;
}

/* A relative file path on the command line means relative to the current
 * directory, even though the daemon later changes into state-dir. */
static char *
absolute_backing (const char *spec)
{
  const char *path = backing_spec_file_path (spec);
  char cwd[PATH_MAX], *out;

  if (path == NULL || path[0] == '/' || getcwd (cwd, sizeof cwd) == NULL)
    return strdup (spec);
  if (asprintf (&out, "%.*s%s/%s", (int) (path - spec), spec, cwd, path) < 0)
    return NULL;
  return out;
}

/* Item n of an --export: the backing (n == 0) or key=value. */
static int
export_arg_item (struct daemon_export *e, struct seen_keys *seen, char *item,
                 unsigned n, char *err, size_t errlen)
{
  char *eq = strchr (item, '='), *backing;
  int r;

  if (n == 0) {
    backing = absolute_backing (item);
    if (backing == NULL) {
      snprintf (err, errlen, "out of memory");
      return -1;
    }
    seen_keys_add (seen, "backing", 1);
    r = export_config_set (&e->cfg, "backing", backing, err, errlen);
    free (backing);
    return r;
  }
  if (eq == NULL) {
    snprintf (err, errlen, "'%s': expected key=value", item);
    return -1;
  }
  *eq = '\0';
  normalize_key (item);
  if (seen_keys_find (seen, item)) {
    snprintf (err, errlen, "duplicate key '%s'", item);
    return -1;
  }
  seen_keys_add (seen, item, n + 1);
  return export_key_set (e, item, eq + 1, err, errlen);
}

static int
export_arg_items (struct daemon_export *e, char *rest, char *err,
                  size_t errlen)
{
  struct seen_keys seen = { .n = 0 };
  char *save = NULL, *item, one[1024];
  unsigned n = 0;

  err[0] = '\0';
  for (item = strtok_r (rest, ",", &save); item;
       item = strtok_r (NULL, ",", &save), n++)
    if (export_arg_item (e, &seen, item, n, one, sizeof one) == -1)
      export_err_append (err, errlen, one);
  if (n == 0) {
    snprintf (err, errlen, "no backing: expected NAME=BACKING[,key=value...]");
    return -1;
  }
  if (export_config_check (&e->cfg, one, sizeof one) == -1)
    export_err_append (err, errlen, one);
  return err[0] ? -1 : 0;
}

int
daemon_config_add_export_arg (struct daemon_config *c, const char *arg,
                              char *err, size_t errlen)
{
  const char *eq = strchr (arg, '=');
  struct daemon_export *e, *old;
  char *name, *rest;
  int r;

  if (eq == NULL || eq[1] == '\0') {
    snprintf (err, errlen, "'%s': expected NAME=BACKING[,key=value...]", arg);
    return -1;
  }
  name = strndup (arg, (size_t) (eq - arg));
  rest = strdup (eq + 1);
  if (name == NULL || rest == NULL) {
    free (name);
    free (rest);
    return -1;
  }
  if (export_name_check (name, err, errlen) == -1) {
    free (name);
    free (rest);
    return -1;
  }
  e = new_export (c, name);
  r = e ? export_arg_items (e, rest, err, errlen) : -1;
  if (e) {
    snprintf (e->where, sizeof e->where, "--export %s", name);
    e->from_cli = 1;
  }
  free (rest);
  if (r == -1) {
    if (e) {
      export_config_free (&e->cfg);
      c->n_exports--;
    }
    free (name);
    return -1;
  }
  /* The command line overrides a file export of the same name. */
  old = NULL;
  for (size_t i = 0; i + 1 < c->n_exports; i++)
    if (strcmp (c->exports[i].cfg.name, name) == 0)
      old = &c->exports[i];
  if (old && old->from_cli) {
    snprintf (err, errlen, "duplicate export '%s'", name);
    free (name);
    export_config_free (&c->exports[--c->n_exports].cfg);
    return -1;
  }
  free (name);
  if (old) {
    export_config_free (&old->cfg);
    *old = c->exports[--c->n_exports];
  }
  return 0;
}

int
exports_create_missing (struct daemon_config *c)
{
  for (size_t i = 0; i < c->n_exports; i++) {
    struct daemon_export *e = &c->exports[i];
    const char *path = backing_spec_file_path (e->cfg.backing);
    int fd;
    if (e->create_size == 0 || path == NULL)
      continue;
    fd = open (path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd == -1 && errno == EEXIST)
      continue;
    if (fd == -1 || ftruncate (fd, (off_t) e->create_size) == -1) {
      log_error ("export %s: create %s: %s", e->cfg.name, path,
                 strerror (errno));
      if (fd >= 0) {
        close (fd);
        unlink (path);
      }
      return -1;
    }
    close (fd);
    log_info ("export %s: created %s (%llu bytes, sparse)", e->cfg.name, path,
              (unsigned long long) e->create_size);
  }
  return 0;
}

/* ---- whole-configuration checks -------------------------------------- */

/* About the backing: "foliod: FILE:LINE: export 'NAME': ", LINE that of
 * the backing key, or "foliod: --export NAME: ". */
static void __attribute__ ((format (printf, 2, 3)))
export_report (const struct daemon_export *e, const char *fmt, ...)
{
  const char *colon = strrchr (e->where, ':');
  va_list ap;

  if (e->from_cli || e->backing_line == 0 || colon == NULL)
    fprintf (stderr, "foliod: %s: ", e->where);
  else
    fprintf (stderr, "foliod: %.*s:%u: ", (int) (colon - e->where), e->where,
             e->backing_line);
  if (!e->from_cli)
    fprintf (stderr, "export '%s': ", e->cfg.name);
  va_start (ap, fmt);
  vfprintf (stderr, fmt, ap);
  va_end (ap);
  fputc ('\n', stderr);
}

/* A file backing must be a regular file or a block device: a directory
 * opens read-only and only fails at start, and a FIFO or character device
 * has no size.  A missing file is an error unless create-size makes it.
 * Relative paths resolve in state-dir, as the daemon will see them. */
static int
export_check_file (const struct daemon_config *c, const struct daemon_export *e)
{
  const char *path = e->cfg.backing ? backing_spec_file_path (e->cfg.backing) : NULL;
  char *full = NULL;
  struct stat st;
  int r = 0;

  if (path == NULL || *path == '\0')
    return 0;
  if (path[0] != '/' && c->state_dir &&
      asprintf (&full, "%s/%s", c->state_dir, path) < 0)
    return -1;
  if (stat (full ? full : path, &st) == -1) {
    if (errno != ENOENT || e->create_size == 0) {
      export_report (e, "file backing %s: %s%s", full ? full : path,
                     strerror (errno), errno == ENOENT ?
                     " (create it, or set create-size)" : "");
      r = -1;
    }
  } else if (!S_ISREG (st.st_mode) && !S_ISBLK (st.st_mode)) {
    export_report (e, "file backing %s is %s: expected a regular file "
                   "or a block device", full ? full : path,
                   S_ISDIR (st.st_mode) ? "a directory" : "a special file");
    r = -1;
  }
  free (full);
  return r;
}

unsigned
daemon_config_check_formats (struct daemon_config *c)
{
  unsigned refused = 0;

  for (size_t i = 0; i < c->n_exports; i++) {
    const struct daemon_export *e = &c->exports[i];
    const char *path = backing_spec_file_path (e->cfg.backing);
    char *full = NULL, err[1024];
    if (path == NULL || e->cfg.bopts.format_raw ||
        served_writable_known (c->state_dir, path))
      continue;
    if (path[0] != '/' && c->state_dir &&
        asprintf (&full, "%s/%s", c->state_dir, path) < 0)
      continue;
    /* A file that cannot be read: export_check_file said why, or start
     * will (it cannot open it either). */
    if (backing_file_probe (full ? full : path, err, sizeof err) == 1) {
      export_report (e, "not served%s: %s", c->n_exports > 1 ?
                     " (the other exports are)" : "", err);
      refused++;
    }
    free (full);
  }
  return refused;
}

/* Physical memory and swap of this host in bytes (ram 0: unknown). */
static void
host_memory (uint64_t *ram, uint64_t *swap)
{
  long pages = sysconf (_SC_PHYS_PAGES), psize = sysconf (_SC_PAGESIZE);
  unsigned long long kib;
  char line[256];
  FILE *f;

  *ram = pages > 0 && psize > 0 ? (uint64_t) pages * (uint64_t) psize : 0;
  *swap = 0;
  f = fopen ("/proc/meminfo", "re");
  if (f == NULL)
    return;
  while (fgets (line, sizeof line, f))
    if (sscanf (line, "SwapTotal: %llu kB", &kib) == 1) {
      *swap = (uint64_t) kib * 1024;
      break;
    }
  fclose (f);
}

/* "1.5 GiB" */
static const char *
size_text (uint64_t v, char *buf, size_t len)
{
  static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB",
                                      "PiB", "EiB" };
  double d = (double) v;
  int i = 0;

  while (d >= 1024 && i < 6) {
    d /= 1024;
    i++;
  }
  snprintf (buf, len, i ? "%.1f %s" : "%.0f %s", d, unit[i]);
  return buf;
}

/* cache-size is memory promised: the ram store fills up to it and cannot
 * give it back (anonymous memory, dirty data in it).  Above RAM + swap the
 * kernel kills foliod once the caches fill, and with it every acknowledged
 * write still dirty: refuse to start.  Above RAM alone it works, slowly,
 * out of swap: warn.  -1 when refused. */
static int
exports_check_memory (const struct daemon_config *c)
{
  uint64_t ram, swap, sum = 0;
  char list[512] = "", a[32], b[32], s[32];

  host_memory (&ram, &swap);
  for (size_t i = 0; i < c->n_exports; i++) {
    const struct daemon_export *e = &c->exports[i];
    uint64_t v = e->cfg.cache.cache_size;
    size_t n = strlen (list);
    if (export_store_path (&e->cfg))
      continue;      /* a mapped file: its pages go back to it, not swap */
    sum = sum + v < sum ? UINT64_MAX : sum + v;
    snprintf (list + n, sizeof list - n, "%s%.64s %s", n ? ", " : "",
              e->cfg.name, size_text (v, s, sizeof s));
  }
  if (ram == 0 || sum <= ram)
    return 0;
  size_text (sum, s, sizeof s);
  size_text (ram, a, sizeof a);
  size_text (swap, b, sizeof b);
  if (sum - ram > swap) {
    fprintf (stderr, "foliod: cache-size of all exports adds up to %s (%s), "
             "more than this host's memory, %s RAM + %s swap: foliod would "
             "be killed once the caches fill, with their dirty data; lower "
             "cache-size\n", s, list, a, b);
    return -1;
  }
  fprintf (stderr, "foliod: warning: cache-size of all exports adds up to "
           "%s (%s), more than this host's %s of RAM: the caches will be "
           "swapped out\n", s, list, a);
  return 0;
}

/* Every problem is reported, not only the first. */
int
daemon_config_check (struct daemon_config *c)
{
  int errors = 0;

  if (c->n_exports == 0) {
    fprintf (stderr, "foliod: no exports: give --export NAME=BACKING or "
             "an [export NAME] section in --config FILE\n");
    errors++;
  }
  if (c->tls != SERVER_TLS_OFF && c->tls_certificates == NULL &&
      c->tls_psk == NULL) {
    fprintf (stderr, "foliod: tls = %s needs tls-certificates (or tls-psk)\n",
             c->tls == SERVER_TLS_ON ? "on" : "require");
    errors++;
  }
  for (size_t i = 0; i < c->n_exports; i++)
    if (export_check_file (c, &c->exports[i]) == -1)
      errors++;
  if (exports_check_memory (c) == -1)
    errors++;
  return errors ? -1 : 0;
}
