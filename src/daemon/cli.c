/* The command line: options, subcommands, --help.
 *
 * Precedence: command line > --config FILE (or the built-in default
 * configuration when neither --config nor --export is given) > defaults.
 * Every [server] key KEY is also the option --KEY VALUE, so the two stay
 * in step by construction; only the options below are command-line only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <ev.h>
#include <libnbd.h>
#include <microhttpd.h>
#include <openssl/crypto.h>

#include "daemon/daemon.h"
#include "foliod/store.h"

#ifndef FOLIOD_VERSION
#error "FOLIOD_VERSION is set by the Makefile (VERSION)"
#endif

enum {
  OPT_CHECK_CONFIG = 256, OPT_PROMETHEUS, OPT_FOREGROUND_LONG, OPT_WATCH,
  OPT_COUNT, OPT_STOP, OPT_LOST_ONLY,
  OPT_SERVER_KEY = 512,     /* + index in server_keys[] */
};

/* Options that are not [server] keys. */
static const struct {
  const char *name;
  int has_arg;
  int val;
  const char *arg;
  const char *help;
} cli_only[] = {
  { "config", 1, 'c', "FILE", "read the configuration from FILE (default: "
    "the built-in one, unless --export is given)" },
  { "export", 1, 'e', "NAME=BACKING[,KEY=VALUE...]", "serve BACKING "
    "(file:PATH or nbd://...) as export NAME (repeatable)" },
  { "foreground", 0, 'f', NULL, "do not detach (always the case under "
    "systemd)" },
  { "check-config", 1, OPT_CHECK_CONFIG, "FILE", "check FILE and exit" },
  { "prometheus", 0, OPT_PROMETHEUS, NULL, "stats: print every counter "
    "as Prometheus text instead of the table" },
  { "watch", 2, OPT_WATCH, "[=SECONDS]", "stats: print the table again "
    "every SECONDS (default 1), with the rates over each interval" },
  { "count", 1, OPT_COUNT, "N", "stats --watch: stop after N reports" },
  { "stop", 0, OPT_STOP, NULL, "release: no longer serve the export once "
    "released (default: serve it read-only)" },
  { "lost-only", 0, OPT_LOST_ONLY, NULL, "clear-doubt: only accept the "
    "passthrough writes counted lost; writes in doubt stay in doubt" },
  { "help", 0, 'h', NULL, "print this help and exit" },
  { "version", 0, 'V', NULL, "print the version (and the libraries') and exit" },
};
#define N_CLI_ONLY (sizeof cli_only / sizeof cli_only[0])

/* Short forms of some [server] keys. */
static int
server_key_short (const char *key)
{
  if (strcmp (key, "listen") == 0) return 'l';
  if (strcmp (key, "unix") == 0) return 'u';
  if (strcmp (key, "workers") == 0) return 'w';
  if (strcmp (key, "pidfile") == 0) return 'p';
  return 0;
}

#define HELP_COL 31      /* where option descriptions start */
#define HELP_WIDTH 79

/* Print left (an option or key), then text wrapped at word boundaries
 * into the column HELP_COL..HELP_WIDTH. */
static void
print_entry (const char *left, const char *text)
{
  int col = printf ("%s", left);

  if (col >= HELP_COL) {
    putchar ('\n');
    col = 0;
  }
  while (*text) {
    int n = (int) strcspn (text, " ");
    if (col > HELP_COL && col + 1 + n > HELP_WIDTH) {
      putchar ('\n');
      col = 0;
    }
    if (col < HELP_COL) {
      col += printf ("%*s", HELP_COL - col, "");
    } else
      col += printf (" ");
    col += printf ("%.*s", n, text);
    text += n;
    text += strspn (text, " ");
  }
  putchar ('\n');
}

static void
print_opt (int shortopt, const char *name, const char *arg, const char *help)
{
  char left[80];

  /* An optional argument ("[=SECONDS]") sticks to the option. */
  const char *sep = arg && arg[0] != '[' ? " " : "";

  if (shortopt)
    snprintf (left, sizeof left, "  -%c, --%s%s%s", shortopt, name, sep,
              arg ? arg : "");
  else
    snprintf (left, sizeof left, "      --%s%s%s", name, sep, arg ? arg : "");
  print_entry (left, help);
}

static void
print_key (const char *key, const char *help)
{
  char left[80];

  snprintf (left, sizeof left, "  %s", key);
  print_entry (left, help);
}

static void
usage (void)
{
  printf ("Usage: foliod [OPTION...]\n"
          "       foliod stats [--control PATH] [--prometheus]\n"
          "       foliod stats --watch[=SECONDS] [--count N] [--control PATH]\n"
          "       foliod flush EXPORT [--control PATH]\n"
          "       foliod clear-doubt EXPORT [--lost-only] [--control PATH]\n"
          "       foliod release EXPORT [--stop] [--control PATH]\n"
          "       foliod ublk add EXPORT | recover EXPORT | del N [force] | list\n"
          "                 [--control PATH]\n"
          "       foliod upgrade [--control PATH]\n"
          "       foliod store inspect PATH\n"
          "       foliod store writeback PATH [KEY=VALUE...]\n"
          "\n"
          "Serve block devices over NBD through a folio cache: writes land\n"
          "in memory, writeback sends only the dirty blocks to the backing.\n"
          "\n"
          "Options:\n");
  for (size_t i = 0; i < N_CLI_ONLY; i++)
    print_opt (cli_only[i].val < 256 ? cli_only[i].val : 0, cli_only[i].name,
               cli_only[i].arg, cli_only[i].help);
  printf ("\nServer options (also [server] keys of the config file):\n");
  for (int i = 0; server_keys[i].key; i++)
    print_opt (server_key_short (server_keys[i].key), server_keys[i].key,
               server_keys[i].arg, server_keys[i].help);
  printf ("\nExport keys (--export NAME=BACKING,KEY=VALUE,... or "
          "[export NAME] sections):\n");
  for (int i = 0; export_keys[i].key; i++)
    print_key (export_keys[i].key, export_keys[i].help);
  print_key (EXPORT_KEY_CREATE_SIZE, "file backing: create a sparse file "
             "of this size if it does not exist (foliod only)");
  print_key (EXPORT_KEY_UBLK, "yes: also serve it as /dev/ublkbN at start "
             "(Linux 6.4+ with ublk_drv; foliod only)");
  printf ("\nWith no --config and no --export, foliod runs the built-in\n"
          "configuration (conf/foliod.conf): export disk0 on %s.\n"
          "See foliod(8) and foliod.conf(5).\n", DEFAULT_LISTEN);
}

/* The libraries are those loaded now, which is what a bug report needs
 * (the headers built against may be older). */
static void
print_version (void)
{
  struct nbd_handle *h = nbd_create ();

  printf ("foliod %s\n", FOLIOD_VERSION);
  printf ("libnbd %s, %s, libev %d.%d, libmicrohttpd %s\n",
          h ? nbd_get_version (h) : "?", OpenSSL_version (OPENSSL_VERSION),
          ev_version_major (), ev_version_minor (), MHD_get_version ());
  nbd_close (h);
}

/* What the command line asked for, applied after the config file. */
struct cli_args {
  const char **keys;             /* [server] keys in order... */
  const char **values;           /* ...and their values */
  size_t n_keys, n_values;
  const char **exports;
  size_t n_exports;
};

static int
push (const char ***v, size_t *n, const char *s)
{
  const char **nv = realloc (*v, (*n + 1) * sizeof *nv);

  if (nv == NULL)
    return -1;
  nv[(*n)++] = s;
  *v = nv;
  return 0;
}

static struct option *
build_longopts (char *shortopts, size_t shortlen)
{
  size_t nkeys = 0, k = 0, s = 0;
  struct option *lo;

  while (server_keys[nkeys].key)
    nkeys++;
  lo = calloc (N_CLI_ONLY + nkeys + 1, sizeof *lo);
  if (lo == NULL)
    return NULL;
  for (size_t i = 0; i < N_CLI_ONLY; i++, k++) {
    lo[k] = (struct option) { cli_only[i].name, cli_only[i].has_arg, NULL,
                              cli_only[i].val };
    if (cli_only[i].val < 256) {
      shortopts[s++] = (char) cli_only[i].val;
      if (cli_only[i].has_arg)
        shortopts[s++] = ':';
    }
  }
  for (size_t i = 0; i < nkeys; i++, k++) {
    int sh = server_key_short (server_keys[i].key);
    lo[k] = (struct option) { server_keys[i].key, 1, NULL,
                              sh ? sh : OPT_SERVER_KEY + (int) i };
    if (sh) {
      shortopts[s++] = (char) sh;
      shortopts[s++] = ':';
    }
  }
  shortopts[s] = '\0';
  (void) shortlen;
  return lo;
}

static int
key_of_short (int c)
{
  for (int i = 0; server_keys[i].key; i++)
    if (server_key_short (server_keys[i].key) == c)
      return i;
  return -1;
}

/* Paths given on the command line are relative to the current directory
 * (the daemon changes into state-dir later). */
static char *
absolute_path (const char *p)
{
  char cwd[PATH_MAX], *out;

  if (p[0] == '/' || getcwd (cwd, sizeof cwd) == NULL)
    return strdup (p);
  if (asprintf (&out, "%s/%s", cwd, p) < 0)
    return NULL;
  return out;
}

static int
is_path_key (const char *key)
{
  return strcmp (key, "unix") == 0 || strcmp (key, "control") == 0 ||
         strcmp (key, "state-dir") == 0 || strcmp (key, "pidfile") == 0 ||
         strcmp (key, "log-file") == 0 ||
         strcmp (key, "tls-certificates") == 0 || strcmp (key, "tls-psk") == 0;
}

static int
apply_args (struct cli_args *a, struct daemon_config *c)
{
  unsigned cleared = 0;
  char err[1024];

  for (size_t i = 0; i < a->n_keys; i++) {
    int k = server_key_index (a->keys[i]);
    char *v = is_path_key (a->keys[i]) ? absolute_path (a->values[i])
                                       : strdup (a->values[i]);
    int r;
    if (v == NULL)
      return -1;
    if (server_keys[k].repeatable && !(cleared & (1u << k))) {
      daemon_config_clear (c, a->keys[i]);
      cleared |= 1u << k;
    }
    r = daemon_config_set (c, a->keys[i], v, err, sizeof err);
    free (v);
    if (r == -1) {
      fprintf (stderr, "foliod: --%s: %s\n", a->keys[i], err);
      return -1;
    }
  }
  for (size_t i = 0; i < a->n_exports; i++)
    if (daemon_config_add_export_arg (c, a->exports[i], err,
                                      sizeof err) == -1) {
      fprintf (stderr, "foliod: --export %s: %s\n", a->exports[i], err);
      return -1;
    }
  return 0;
}

/* Read file.  When it has errors, the whole-config checks run anyway, so
 * that one run reports every problem (a file that could not be read has
 * nothing more to say).  0 or -1. */
static int
config_load (struct daemon_config *c, const char *file)
{
  int r = daemon_config_load (c, file, NULL);

  if (r == -1 && c->n_exports)
    daemon_config_check (c);
  return r;
}

/* FILE with the other options of the command line (--state-dir as the
 * unit gives it), as start would see it: the same errors, and the exports
 * start would refuse to serve (an image format) named as start names them. */
static int
check_config (const char *file, struct cli_args *a)
{
  struct daemon_config c;
  int r;

  daemon_config_init (&c);
  r = config_load (&c, file);
  if (r == 0)
    r = apply_args (a, &c);
  if (r == 0)
    r = daemon_config_check (&c);
  if (r == 0 && daemon_config_check_formats (&c) > 0)
    r = -1;
  if (r == 0)
    printf ("%s: OK (%zu export%s)\n", file, c.n_exports,
            c.n_exports == 1 ? "" : "s");
  daemon_config_free (&c);
  return r == 0 ? 1 : -1;
}

/* --watch[=SECONDS]: 0.1 s to a day; 1 s without a value. */
static int
parse_watch (struct cli *cli, const char *arg)
{
  char *end;

  cli->watch = arg ? strtod (arg, &end) : 1.0;
  if (arg && (end == arg || *end || !(cli->watch >= 0.1 && cli->watch <= 86400))) {
    fprintf (stderr, "foliod: --watch: expected seconds from 0.1 to 86400, "
             "got '%s'\n", arg);
    return -1;
  }
  return 0;
}

/* --count N: 1 to 10^9 reports. */
static int
parse_count (struct cli *cli, const char *arg)
{
  char *end;
  unsigned long n;

  errno = 0;
  n = strtoul (arg, &end, 10);
  if (errno || end == arg || *end || arg[0] == '-' || n < 1 || n > 1000000000) {
    fprintf (stderr, "foliod: --count: expected a number of reports, got "
             "'%s'\n", arg);
    return -1;
  }
  cli->count = (unsigned) n;
  return 0;
}

static int
parse_opts (int argc, char **argv, struct cli *cli, struct cli_args *a,
            struct daemon_config *c)
{
  char shortopts[64];
  struct option *lo = build_longopts (shortopts, sizeof shortopts);
  int opt, k, r = 0;

  if (lo == NULL)
    return -1;
  opterr = 1;
  while (r == 0 && (opt = getopt_long (argc, argv, shortopts, lo, NULL)) != -1) {
    switch (opt) {
    case 'c': cli->config_file = optarg; break;
    case 'e': r = push (&a->exports, &a->n_exports, optarg); break;
    case 'f': c->foreground = 1; break;
    case OPT_CHECK_CONFIG: cli->check_config = optarg; break;
    case OPT_PROMETHEUS: cli->prometheus = 1; break;
    case OPT_WATCH: r = parse_watch (cli, optarg); break;
    case OPT_COUNT: r = parse_count (cli, optarg); break;
    case OPT_STOP: cli->stop = 1; break;
    case OPT_LOST_ONLY: cli->lost_only = 1; break;
    case 'h': usage (); r = 1; break;
    case 'V': print_version (); r = 1; break;
    case '?':
      fprintf (stderr, "Try 'foliod --help'.\n");
      r = -1;
      break;
    default:
      k = opt >= OPT_SERVER_KEY ? opt - OPT_SERVER_KEY : key_of_short (opt);
      if (k < 0) {
        r = -1;
        break;
      }
      r = push (&a->keys, &a->n_keys, server_keys[k].key);
      if (r == 0)
        r = push (&a->values, &a->n_values, optarg);
      break;
    }
  }
  free (lo);
  return r;
}

#define STORE_WRITEBACK_TIMEOUT_MS (10u * 60 * 1000)

/* The export a store belongs to, from its header: backing, geometry;
 * flush=backing; then the KEY=VALUE arguments (tls-*, connections ...). */
static int
store_export_config (struct export_config *cfg, const char *path,
                     int argc, char **argv, char *err, size_t errlen)
{
  struct store_header_info h;
  const struct store_kind *kind = store_kind_probe (path, &h, err, errlen);
  char store[4096];

  if (kind == NULL)
    return -1;
  snprintf (store, sizeof store, "%s:%s", kind->name, path);
  if (export_config_set (cfg, "backing", h.backing_spec, err, errlen) == -1 ||
      export_config_set (cfg, "store", store, err, errlen) == -1 ||
      export_config_set (cfg, "flush", "backing", err, errlen) == -1)
    return -1;
  cfg->cache.folio_size = h.folio_size;
  cfg->cache.block_size = h.block_size;
  cfg->cache.cache_size = (uint64_t) h.nslots * h.folio_size;
  for (int i = 0; i < argc; i++) {
    char *eq = strchr (argv[i], '=');
    if (eq == NULL) {
      snprintf (err, errlen, "expected KEY=VALUE, got '%s'", argv[i]);
      return -1;
    }
    *eq = '\0';
    int r = export_config_set (cfg, argv[i], eq + 1, err, errlen);
    *eq = '=';
    if (r == -1)
      return -1;
  }
  return 0;
}

/* foliod store writeback PATH [KEY=VALUE...]: write the dirty data of a
 * store that no foliod runs on back to the backing its header names,
 * flush it, mark the store clean (export_open recovers, export_close
 * writes back: the daemon's own paths). */
static int
store_writeback (const char *path, int argc, char **argv)
{
  struct export_config cfg;
  struct export *e = NULL;
  struct cache_stats st = { 0 };
  char err[1024] = "";
  uint64_t lost;
  int r = -1;

  export_config_init (&cfg);
  if (store_export_config (&cfg, path, argc, argv, err, sizeof err) == 0)
    e = export_open (&cfg, err, sizeof err);
  if (e == NULL) {
    fprintf (stderr, "foliod: store writeback %s: %s\n", path, err);
    goto out;
  }
  cache_get_stats (e->cache, &st);
  if (export_close (e, STORE_WRITEBACK_TIMEOUT_MS, &lost) == -1) {
    fprintf (stderr, "foliod: store writeback %s: %s: the dirty data stays "
             "in the store, which stays not clean\n", path, strerror (errno));
    goto out;
  }
  printf ("store %s: %llu dirty bytes written back to %s, flushed; the "
          "store is clean\n", path, (unsigned long long) st.dirty_bytes,
          cfg.backing);
  r = 0;
 out:
  export_config_free (&cfg);
  return r;
}

/* foliod store inspect PATH, foliod store writeback PATH: offline, no
 * configuration, no daemon. */
int
cli_store (int argc, char **argv)
{
  char err[1024];

  if (argc >= 3 && strcmp (argv[1], "writeback") == 0)
    return store_writeback (argv[2], argc - 3, argv + 3);
  if (argc != 3 || strcmp (argv[1], "inspect") != 0) {
    fprintf (stderr, "foliod: usage: foliod store inspect PATH\n"
             "       foliod store writeback PATH [KEY=VALUE...]\n");
    return -1;
  }
  struct store_header_info h;
  const struct store_kind *kind = store_kind_probe (argv[2], &h, err,
                                                    sizeof err);
  if (kind == NULL || kind->inspect (argv[2], stdout, err, sizeof err) == -1) {
    fprintf (stderr, "foliod: %s\n", err);
    return -1;
  }
  return 0;
}

/* foliod ublk add EXPORT | recover EXPORT | del N [force] | list: the
 * words after the options, joined into the control command's argument.
 * 0 or -1. */
static int
cli_ublk_args (int argc, char **argv, struct cli *cli)
{
  int n = argc - optind;
  const char *verb = n > 0 ? argv[optind] : "";
  bool ok = ((strcmp (verb, "add") == 0 || strcmp (verb, "recover") == 0)
             && n == 2) ||
    (strcmp (verb, "list") == 0 && n == 1) ||
    (strcmp (verb, "del") == 0 &&
     (n == 2 || (n == 3 && strcmp (argv[optind + 2], "force") == 0)));

  if (!ok) {
    fprintf (stderr, "foliod: usage: foliod ublk add EXPORT | recover "
             "EXPORT | del N [force] | list [--control PATH]\n");
    return -1;
  }
  cli->sub_buf[0] = '\0';
  for (; optind < argc; optind++)
    snprintf (cli->sub_buf + strlen (cli->sub_buf),
              sizeof cli->sub_buf - strlen (cli->sub_buf), "%s%s",
              cli->sub_buf[0] ? " " : "", argv[optind]);
  cli->sub_arg = cli->sub_buf;
  return 0;
}

int
cli_parse (int argc, char **argv, struct cli *cli, struct daemon_config *c)
{
  struct cli_args a = { 0 };
  int r;

  memset (cli, 0, sizeof *cli);
  if (argc > 1 && (strcmp (argv[1], "stats") == 0 ||
                   strcmp (argv[1], "flush") == 0 ||
                   strcmp (argv[1], "clear-doubt") == 0 ||
                   strcmp (argv[1], "release") == 0 ||
                   strcmp (argv[1], "ublk") == 0 ||
                   strcmp (argv[1], "upgrade") == 0)) {
    cli->subcommand = argv[1];
    argc--;
    argv++;
  }
  r = parse_opts (argc, argv, cli, &a, c);
  if (r == 0 && cli->subcommand && strcmp (cli->subcommand, "ublk") == 0)
    r = cli_ublk_args (argc, argv, cli);
  else if (r == 0 && cli->subcommand && strcmp (cli->subcommand, "stats") != 0 &&
           strcmp (cli->subcommand, "upgrade") != 0) {
    if (optind + 1 != argc) {
      fprintf (stderr, "foliod: usage: foliod %s EXPORT [--control PATH]\n",
               cli->subcommand);
      r = -1;
    } else
      cli->sub_arg = argv[optind++];
  }
  if (r == 0 && (cli->watch > 0 || cli->count) &&
      (cli->subcommand == NULL || strcmp (cli->subcommand, "stats") != 0 ||
       cli->prometheus)) {
    fprintf (stderr, "foliod: --watch and --count go with 'foliod stats' "
             "(the table, not --prometheus)\n");
    r = -1;
  }
  if (r == 0 && cli->stop &&
      (cli->subcommand == NULL || strcmp (cli->subcommand, "release") != 0)) {
    fprintf (stderr, "foliod: --stop goes with 'foliod release'\n");
    r = -1;
  }
  if (r == 0 && cli->lost_only &&
      (cli->subcommand == NULL ||
       strcmp (cli->subcommand, "clear-doubt") != 0)) {
    fprintf (stderr, "foliod: --lost-only goes with 'foliod clear-doubt'\n");
    r = -1;
  }
  if (r == 0 && cli->count && cli->watch == 0)
    cli->watch = 1.0;            /* --count N alone: every second */
  if (r == 0 && optind < argc) {
    fprintf (stderr, "foliod: unexpected argument '%s'\nTry 'foliod --help'.\n",
             argv[optind]);
    r = -1;
  }
  if (r == 0 && cli->check_config)
    r = check_config (cli->check_config, &a);
  if (r == 0) {
    if (cli->config_file)
      r = config_load (c, cli->config_file);
    else if (a.n_exports == 0)
      r = daemon_config_load (c, "(built-in foliod.conf)",
                              foliod_default_conf);
  }
  if (r == 0)
    r = apply_args (&a, c);
  if (r == 0 && cli->subcommand == NULL)
    r = daemon_config_check (c);
  free (a.keys);
  free (a.values);
  free (a.exports);
  return r;
}
