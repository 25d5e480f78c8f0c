/* foliod daemon internals: configuration, systemd glue, control socket.
 *
 * The daemon owns everything around the NBD server (src/server): it reads
 * the configuration (command line over config file over built-in
 * defaults), opens the exports, starts the server on its sockets, talks to
 * systemd, answers the control socket and shuts down without losing dirty
 * data.  It picks where log lines go (log_to_file, log_to_syslog of
 * foliod/log.h; the sink itself is src/util/log.c).  No global mutable
 * state except the signal-forced-exit flag (main.c).
 */
#ifndef FOLIOD_DAEMON_H
#define FOLIOD_DAEMON_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>

#include "foliod/export.h"
#include "foliod/log.h"
#include "server/server.h"

#define DEFAULT_PORT "10809"
#define DEFAULT_LISTEN "127.0.0.1:" DEFAULT_PORT

/* One [export NAME] section or --export option. */
struct daemon_export {
  struct export_config cfg;
  char where[300];        /* "FILE:LINE" or "--export NAME": for messages */
  unsigned backing_line;  /* line of its backing key in FILE, 0: none */
  struct export *ex;      /* once opened */
  int from_cli;           /* given with --export */
  uint64_t create_size;   /* create-size: make a sparse file if missing */
  int ublk;               /* ublk = yes: also /dev/ublkbN at start */
  uint64_t doubt_logged;  /* writes in doubt last logged (main.c) */
};

/* The daemon's own ([server]) options.  Paths are as the user wrote them;
 * relative ones resolve against state_dir (the daemon chdirs there). */
struct daemon_config {
  char **listen;            /* "HOST:PORT" strings */
  size_t n_listen;
  char **unix_paths;
  size_t n_unix;
  char *control;            /* control socket path, NULL: none */
  char *metrics_listen;     /* HTTP /metrics address, NULL: none */
  char *state_dir;          /* NULL: current directory */
  char *pidfile;            /* NULL: none */
  char *log_file;           /* log lines once ready; NULL: stderr/syslog */
  enum server_tls_mode tls;
  char *tls_certificates;
  char *tls_psk;            /* PSK file; replaces tls_certificates */
  int tls_verify_peer;
  unsigned workers;         /* 0: server default */
  unsigned loops;           /* 0: server default (one per CPU) */
  unsigned max_connections; /* 0: server default */
  unsigned max_connections_per_client;
  unsigned handshake_timeout_s;
  unsigned idle_timeout_s;
  unsigned shutdown_timeout_s; /* 0: default (60) */
  unsigned max_inflight;
  uint64_t max_conn_buffer;   /* 0: server default */
  uint64_t max_buffer_total;
  int log_level;
  int foreground;

  struct daemon_export *exports;
  size_t n_exports;

  /* Line in the file where each server key was first set (0: not yet),
   * to refuse duplicates; indexed like server_keys[]. */
  unsigned key_line[32];
};

/* [server] keys: also the long command line options --KEY VALUE. */
struct server_key {
  const char *key;
  const char *arg;          /* metavariable in --help */
  const char *help;
  int repeatable;           /* listen, unix: may be given several times */
};
extern const struct server_key server_keys[];

void daemon_config_init (struct daemon_config *c);
void daemon_config_free (struct daemon_config *c);

/* Set one [server] key.  Repeatable keys append.  0, or -1 with a reason. */
int daemon_config_set (struct daemon_config *c, const char *key,
                       const char *value, char *err, size_t errlen);
/* Forget the values of a repeatable key (the command line replaces the
 * file's list rather than adding to it). */
void daemon_config_clear (struct daemon_config *c, const char *key);
int server_key_index (const char *key);

/* Parse an INI file (or, when text is non-NULL, that text, reported as
 * name) into c.  Errors are printed to stderr as "NAME:LINE: reason".
 * Returns 0 or -1. */
int daemon_config_load (struct daemon_config *c, const char *name,
                        const char *text);

/* Add or replace (same name) an export from an --export argument
 * "NAME=BACKING[,key=value...]".  0, or -1 with a reason. */
int daemon_config_add_export_arg (struct daemon_config *c, const char *arg,
                                  char *err, size_t errlen);

/* Daemon-only export key (not known to the plugin): when the backing
 * file does not exist, create it, sparse, of this size. */
#define EXPORT_KEY_CREATE_SIZE "create-size"
/* Daemon-only export key: serve it as /dev/ublkbN too (src/ublk/). */
#define EXPORT_KEY_UBLK "ublk"

/* Create missing backing files of exports with create-size.  0 or -1
 * (logged). */
int exports_create_missing (struct daemon_config *c);

/* Whole-config checks (every export complete, at least one export, no
 * duplicate names).  Prints reasons; returns 0 or -1. */
int daemon_config_check (struct daemon_config *c);

/* --check-config only: the exports start would not serve because their
 * file holds an image format (the probe, see served.c), each reported as
 * start logs it.  Returns how many. */
unsigned daemon_config_check_formats (struct daemon_config *c);

/* The path of a file backing spec (file:PATH, file://PATH or a plain
 * path), NULL for other schemes: the rule of backing_open. */
const char *backing_spec_file_path (const char *spec);

/* served.c: images foliod has served writable, remembered in the state
 * directory, are never probed for an image format again (a client writes
 * what it likes into its disk).  dir is the state directory ("." once the
 * daemon runs in it; NULL: none, nothing is remembered), path the backing
 * path as configured (a relative one lies in dir). */
#define SERVED_DIR "served-writable"
int served_writable_known (const char *dir, const char *path);
/* Remember it, synced.  0, or -1 with a reason in err. */
int served_writable_remember (const char *dir, const char *path, char *err,
                              size_t errlen);

/* listen-addr.c: split "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT".
 * Writes host (may be empty: any address) and port.  0 or -1. */
int parse_listen (const char *s, char *host, size_t hostlen,
                  char *port, size_t portlen);

/* The configuration compiled into the binary (conf/foliod.conf). */
extern const char foliod_default_conf[];

/* Command line: fills c (and what the subcommands need).  Returns 0 to
 * run, 1 to exit 0 (help, version, check-config ok), -1 on error. */
struct cli {
  const char *subcommand;   /* NULL, "stats", "flush", "clear-doubt",
                               "release", "ublk", "upgrade" */
  const char *sub_arg;      /* flush: export name; ublk: its words */
  char sub_buf[300];        /* ublk: "add EXPORT", "del N", "list" */
  int prometheus;           /* stats: Prometheus text, not the table */
  double watch;             /* stats --watch: seconds between reports */
  unsigned count;           /* stats --count: reports (0: no limit) */
  int stop;                 /* release --stop: no longer serve it */
  int lost_only;            /* clear-doubt --lost-only: not a doubt */
  const char *config_file;
  const char *check_config;
};
int cli_parse (int argc, char **argv, struct cli *cli,
               struct daemon_config *c);
/* foliod store SUBCOMMAND ARGS (argv[0] is "store").  0 or -1. */
int cli_store (int argc, char **argv);

/* systemd (systemd.c). */
int sd_notifyf (const char *fmt, ...)
  __attribute__ ((format (printf, 1, 2)));
/* Inherited sockets (LISTEN_FDS).  Returns how many (0: none), filling
 * fds[] and names[] (static strings or NULL), at most max. */
int sd_listen_fds_get (int *fds, const char **names, int max);

/* Control socket (control.c). */
struct control;
struct ublk_set;
/* fd: an inherited listening socket (upgrade), or -1: bind path. */
struct control *control_start (const char *path, int fd,
                               struct daemon_export *ex, size_t n,
                               void *server, struct ublk_set *ublk);
void control_stop (struct control *ctl);
/* "upgrade": fn runs on the control thread and may block; it writes the
 * reply ("OK ...\n" or "ERROR ...\n") to reply. */
void control_set_upgrade (struct control *ctl,
                          void (*fn) (void *arg, char *reply, size_t len),
                          void *arg);
/* The listening socket, for an upgrade; keep_path: control_stop leaves
 * the socket file (the new process serves it). */
int control_fd (struct control *ctl, bool keep_path);
/* "stats\n" (Prometheus text), "stats table\n", "flush EXPORT\n": send
 * command, print the answer.  0 or -1 (said on stderr). */
int control_client (const char *path, const char *command);
/* The same, the answer in *reply (malloc'd) instead of on stdout. */
int control_request (const char *path, const char *command, char **reply);

/* foliod stats --watch (watch.c): every interval seconds, the stats table
 * and the rates over the interval; count reports (0: until killed).
 * 0 or -1 (said on stderr). */
int stats_watch (const char *path, double interval, unsigned count);

/* Statistics (stats.c).  Write those of every export and the server to
 * buf, Prometheus text format or the table of `foliod stats`; return the
 * length (truncated to buflen - 1). */
size_t stats_format (char *buf, size_t buflen, struct daemon_export *ex,
                     size_t n, void *server);
size_t stats_table (char *buf, size_t buflen, struct daemon_export *ex,
                    size_t n, void *server);
/* Either in a malloc'd buffer of at most STATS_BUF_SIZE bytes (*len
 * without the '\0'); NULL when out of memory.  Any thread may call it:
 * the counters are read atomically, as the event loop's threads write
 * them. */
#define STATS_BUF_SIZE (64 * 1024)
char *stats_text (struct daemon_export *ex, size_t n, void *server,
                  int table, size_t *len);
void stats_log (struct daemon_export *ex, size_t n, void *server);
/* 1536 -> "1.5K", 16777216 -> "16M", 100 -> "100" (powers of 1024). */
void stats_human_size (char *buf, size_t len, uint64_t v);

/* The HTTP metrics endpoint (metrics.c). */
struct metrics_addr {
  struct sockaddr_storage ss;
  socklen_t len;
  char text[300];           /* "127.0.0.1:9100", for messages */
};
/* listen-addr.c: "HOST:PORT", "[V6]:PORT", ":PORT" or "PORT" resolved
 * (no host: 127.0.0.1).  0, or -1 with a reason in err. */
int metrics_addr_parse (const char *s, struct metrics_addr *a, char *err,
                        size_t errlen);
struct metrics;
struct metrics *metrics_start (const char *addr, struct daemon_export *ex,
                               size_t n, void *server);
void metrics_stop (struct metrics *m);

/* fdlimit.c: raise the soft RLIMIT_NOFILE to the hard one (at start);
 * warn when the limit cannot hold max_connections besides what is open. */
/* crash.c: a fault or an abort logs where it happened, then kills the
 * process as before. */
void crash_report_install (void);

void fd_limit_raise (void);
void fd_limit_check (unsigned max_connections);

/* upgrade.c: upgrade in place (foliod upgrade).  What the old process
 * hands the new one. */
#define UPGRADE_MAX_LISTEN 64
#define UPGRADE_MAX_RAM 200     /* ram stores handed over: one message */
struct upgrade_handoff {
  int listen_fds[UPGRADE_MAX_LISTEN];
  int n_listen;
  int control_fd;             /* -1: none */
  int detached;               /* the old one logged to syslog */
  struct server_moved *conns; /* plain connections in transmission */
  size_t n_conns;
  int ready_fd;               /* new process: "R" here once serving */
  /* Ram stores handed over whole (their memfds, store_ram_keep), when
   * the new process reads the old one's ram layout (takes_ram). */
  bool takes_ram;
  int ram_fds[UPGRADE_MAX_RAM];
  bool ram_taken[UPGRADE_MAX_RAM];   /* new process: an export adopted it */
  size_t n_ram;
};
/* New process: 1 when started by an upgrade (u filled), 0 when not, -1
 * when what was handed over cannot be read (logged). */
int upgrade_inherited (struct upgrade_handoff *u);
/* New process: tell the old one we serve. */
void upgrade_ready (struct upgrade_handoff *u);
void upgrade_handoff_free (struct upgrade_handoff *u);
/* Old process: the new one it started.  pid is not our child (its
 * parent exited: see upgrade.c), so pidfd is how it is killed and
 * waited for. */
struct upgrade_child {
  pid_t pid;
  int pidfd;
  int sock;                   /* the way to it */
  bool takes_ram;             /* it reads our ram store layout */
};
/* Old process, step 1: start this binary (its path now) with argv and
 * wait up to wait_s until it is loaded (it waits then).  0 with c
 * filled: c->takes_ram says whether it reads this process's ram store
 * layout (STORE_RAM_LAYOUT_VERSION: then the ram stores go over whole,
 * else they are written back); or -1 with a reason in err (it is gone). */
int upgrade_start (char *const *argv, unsigned wait_s,
                   struct upgrade_child *c, char *err, size_t errlen);
/* Step 2: hand it u and wait up to wait_s until it serves.  0, or -1
 * with a reason in err (it is killed and gone).  Closes c either way. */
int upgrade_hand (struct upgrade_child *c, const struct upgrade_handoff *u,
                  unsigned wait_s, char *err, size_t errlen);
/* Give up on a started one (kills it unless err is EPIPE: it exited;
 * waits until it is gone; closes c); the reason goes to msg. */
void upgrade_abandon (struct upgrade_child *c, const char *what, int err,
                      unsigned wait_s, char *msg, size_t msglen);

#endif /* FOLIOD_DAEMON_H */
