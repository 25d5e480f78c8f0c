/* foliod: the daemon around the NBD server.
 *
 * Life: parse the configuration, (detach), bind and listen, open the
 * exports, tell systemd READY=1 (a detached foliod then logs to log-file
 * or syslog, no longer to the terminal), populate the ram caches in the
 * background, run the loop.  Binding comes first so that a second
 * instance on a busy port fails before it opens or creates an image;
 * clients that connect before READY wait in the listen backlog.  SIGTERM/SIGINT: stop accepting,
 * let in-flight requests finish (server_shutdown), write back every dirty
 * block and flush the backing (export_close), exit 0.  All that ends
 * within shutdown-timeout: what cannot be written back by then (a remote
 * that is down or hung) is logged per export, and foliod exits 1.  A
 * second signal exits at once (dirty data is lost; we say how much).
 * SIGUSR1 logs the counters; SIGHUP reloads the TLS certificates.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ev.h>

#include "foliod/lock.h"
#include "foliod/util.h"
#include "daemon/daemon.h"
#include "foliod/log.h"
#include "foliod/store.h"
#include "server/server.h"
#include "ublk/ublk.h"

#define MAX_LISTEN_FDS 64
#define DEFAULT_SHUTDOWN_TIMEOUT_S 60
#define STATUS_INTERVAL_S 10.0

struct daemon {
  struct daemon_config *cfg;
  struct ev_loop *loop;
  struct server *server;
  struct control *ctl;
  struct ublk_set *ublk;     /* ublk devices (src/ublk/) */
  struct metrics *metrics;
  ev_signal sig_term, sig_int, sig_usr1, sig_hup;
  ev_timer status_timer;     /* refreshes systemd's STATUS= line */
  int stopping;              /* first SIGTERM/SIGINT seen */
  uint64_t stop_deadline;    /* now_ms(): writeback ends by then (0: none) */
  int ready_fd;              /* detaching: tells the parent we are up */
  int pidfile_written;
  size_t refused;            /* exports not served: an image format */
  char where[1024];          /* "127.0.0.1:10809, /run/foliod.sock" */

  /* Upgrade in place (foliod upgrade; the section "upgrade" below). */
  char **argv;               /* ours: the new binary gets the same */
  struct upgrade_handoff inherit; /* what an old process handed us */
  int inherited;             /* started by an upgrade */
  ev_async upgrade_async;    /* the control thread asks the loop */
  pthread_mutex_t upgrade_lock; /* upgrade_* below; a leaf */
  pthread_cond_t upgrade_cond;
  int upgrade_state;         /* 0 idle, 1 asked, 2 answered */
  char upgrade_reply[512];
  uint64_t upgrade_start_ms;
  struct export **upgrade_old; /* exports closed for the hand-over */
  struct store **upgrade_ram; /* per export: its ram store, kept for
                              * the new process (store_ram_kept_fd) */
  struct upgrade_child upgrade;   /* the new process, loaded, waiting */
  pid_t upgraded_to;         /* the new process is ready: exit */
  int upgrade_fatal;         /* failed and cannot serve on: exit 1 */
};

/* Dirty bytes over every export, for messages. */
static uint64_t
dirty_bytes_total (struct daemon_config *cfg)
{
  uint64_t sum = 0;

  for (size_t i = 0; i < cfg->n_exports; i++)
    if (cfg->exports[i].ex) {
      struct cache_stats st;
      cache_get_stats (cfg->exports[i].ex->cache, &st);
      sum += st.dirty_bytes;
    }
  return sum;
}

static void
where_add (struct daemon *d, const char *s)
{
  size_t n = strlen (d->where);

  snprintf (d->where + n, sizeof d->where - n, "%s%.200s", n ? ", " : "", s);
}

static void
update_status (struct daemon *d)
{
  struct server_stats ss;

  server_get_stats (d->server, &ss);
  sd_notifyf ("STATUS=Serving %zu export%s on %s; %llu connection%s; "
              "%llu KiB dirty%s", d->cfg->n_exports,
              d->cfg->n_exports == 1 ? "" : "s", d->where,
              (unsigned long long) ss.connections_now,
              ss.connections_now == 1 ? "" : "s",
              (unsigned long long) dirty_bytes_total (d->cfg) / 1024,
              d->refused ? "; some exports NOT served (see the log)" : "");
}

/* Writes in doubt (backing_ops.clear_doubt) stop every flush of their
 * export until an operator acts: say so, loudly, whenever their number
 * grows. */
static void
log_doubt (struct daemon *d)
{
  for (size_t i = 0; i < d->cfg->n_exports; i++) {
    struct daemon_export *e = &d->cfg->exports[i];
    struct cache_stats st;
    if (!e->ex)
      continue;
    cache_get_stats (e->ex->cache, &st);
    uint64_t n = st.writes_in_doubt - st.doubt_inherited; /* logged at start */
    if (n > e->doubt_logged)
      log_error ("export %s: %llu write%s to the backing in doubt (abandoned "
                 "after request-timeout; the remote may still carry %s out): "
                 "every FLUSH fails with EIO until 'foliod clear-doubt %s' "
                 "(a persistent store keeps the doubt across a restart), "
                 "see foliod(8)", e->cfg.name,
                 (unsigned long long) n, n == 1 ? "" : "s",
                 n == 1 ? "it" : "them", e->cfg.name);
    e->doubt_logged = n;
  }
}

static void
on_status_timer (struct ev_loop *loop, ev_timer *w, int revents)
{
  update_status (w->data);
  log_doubt (w->data);
}

/* ---- shutdown ---------------------------------------------------------- */

/* When the first SIGTERM/SIGINT arrived (CLOCK_MONOTONIC ns).  A repeat
 * within FORCE_DEBOUNCE_NS is the same request delivered twice (timeout(1)
 * and shells signal the child and then its whole process group), not a
 * user insisting; only a later one forces the exit. */
#define FORCE_DEBOUNCE_NS 1000000000ull
static _Atomic uint64_t first_stop_ns; /* read by force_exit, a handler */

static int
is_repeat_of_first (void)
{
  return now_ns () - first_stop_ns < FORCE_DEBOUNCE_NS;
}

/* Signal handler while writing back (the loop has stopped): no locks,
 * no stdio, just say what happens and go. */
static void
force_exit (int sig)
{
  static const char msg[] = "foliod: second signal during writeback: "
                            "exiting now, dirty data is lost\n";

  if (is_repeat_of_first ())
    return;
  if (write (STDERR_FILENO, msg, sizeof msg - 1) < 0)
    _exit (1);
  _exit (1);
}

static void
on_shutdown_done (void *opaque)
{
  struct daemon *d = opaque;

  log_info ("all connections closed");
  ev_break (d->loop, EVBREAK_ALL);
}

/* Start the shutdown-timeout clock: from now on no backing request,
 * in flight or in the final writeback, waits past it. */
static void
stop_deadline_set (struct daemon *d)
{
  unsigned s = d->cfg->shutdown_timeout_s ? d->cfg->shutdown_timeout_s
                                          : DEFAULT_SHUTDOWN_TIMEOUT_S;

  if (d->stop_deadline)
    return;
  d->stop_deadline = now_ms () + (uint64_t) s * 1000;
  for (size_t i = 0; i < d->cfg->n_exports; i++)
    if (d->cfg->exports[i].ex)
      backing_set_deadline (d->cfg->exports[i].ex->backing, d->stop_deadline);
}

static void
on_stop_signal (struct ev_loop *loop, ev_signal *w, int revents)
{
  struct daemon *d = w->data;

  if (d->stopping && is_repeat_of_first ()) {
    log_debug ("%s again within 1 s: same stop request", strsignal (w->signum));
    return;
  }
  if (d->stopping) {
    log_error ("%s again: exiting now, dirty data is lost (%llu bytes)",
               strsignal (w->signum),
               (unsigned long long) dirty_bytes_total (d->cfg));
    _exit (1);
  }
  d->stopping = 1;
  first_stop_ns = now_ns ();
  stop_deadline_set (d);
  log_info ("%s: stopping: finishing requests in flight, then writing back "
            "%llu bytes of dirty data", strsignal (w->signum),
            (unsigned long long) dirty_bytes_total (d->cfg));
  sd_notifyf ("STOPPING=1\nSTATUS=Stopping: writing back dirty data");
  ev_timer_stop (loop, &d->status_timer);
  server_stop_accepting (d->server);
  server_shutdown (d->server, on_shutdown_done, d);
}

static void
on_usr1 (struct ev_loop *loop, ev_signal *w, int revents)
{
  struct daemon *d = w->data;

  stats_log (d->cfg->exports, d->cfg->n_exports, d->server);
}

static void
on_hup (struct ev_loop *loop, ev_signal *w, int revents)
{
  struct daemon *d = w->data;
  char err[512];

  /* A bad new set keeps the old one: the server stays up. */
  if (server_tls_reload (d->server, err, sizeof err) == -1)
    log_error ("SIGHUP: TLS reload failed, keeping the old certificates: "
               "%s", err);
  else
    log_info ("SIGHUP: TLS certificates reloaded (if TLS is in use)");
}

static void
signals_start (struct daemon *d)
{
  struct { ev_signal *w; int sig; void (*cb) (struct ev_loop *, ev_signal *,
                                                int); } s[] = {
    { &d->sig_term, SIGTERM, on_stop_signal },
    { &d->sig_int, SIGINT, on_stop_signal },
    { &d->sig_usr1, SIGUSR1, on_usr1 },
    { &d->sig_hup, SIGHUP, on_hup },
  };

  signal (SIGPIPE, SIG_IGN);
  for (size_t i = 0; i < sizeof s / sizeof s[0]; i++) {
    ev_signal_init (s[i].w, s[i].cb, s[i].sig);
    s[i].w->data = d;
    ev_signal_start (d->loop, s[i].w);
  }
}

/* After the loop: no watcher runs, so a plain handler turns a later
 * signal into an immediate exit while we write back.  sigaction replaces
 * libev's handler in one step; stopping the watchers first would leave
 * SIG_DFL in between, and a duplicate SIGTERM there would kill us before
 * the writeback. */
static void
signals_stop (struct daemon *d)
{
  struct sigaction sa = { .sa_handler = force_exit };

  sigemptyset (&sa.sa_mask);
  sigaction (SIGTERM, &sa, NULL);
  sigaction (SIGINT, &sa, NULL);
}

/* Closing one export, in a thread of its own: one export whose remote
 * is hung must not eat the others' share of shutdown-timeout. */
struct closer {
  struct daemon_export *e;
  unsigned timeout_ms;
  pthread_t thread;
  int started, r, err;
  int kept;                  /* a pmem store keeps what is not written back */
  uint64_t lost, dirty;
};

static void *
closer_main (void *arg)
{
  struct closer *k = arg;

  k->r = export_close (k->e->ex, k->timeout_ms, &k->lost);
  k->err = errno;
  k->e->ex = NULL;
  return NULL;
}

static void
closer_start (struct closer *k, struct daemon_export *e, uint64_t deadline)
{
  struct cache_stats st;
  uint64_t now = now_ms ();

  k->e = e;
  k->timeout_ms = deadline > now ? (unsigned) (deadline - now) : 0;
  k->kept = e->ex->store != NULL;
  cache_get_stats (e->ex->cache, &st);
  k->dirty = st.dirty_bytes + st.unstable_bytes;
  if (st.dirty_bytes)
    log_info ("export %s: writing back %llu bytes", e->cfg.name,
              (unsigned long long) st.dirty_bytes);
  k->started = thread_start (&k->thread, closer_main, k, "closer") == 0;
  if (!k->started)
    closer_main (k);
}

/* Join k; 0, or -1 (logged loudly) if its dirty data was lost. */
static int
closer_finish (struct closer *k)
{
  if (k->started)
    pthread_join (k->thread, NULL);
  if (k->r == 0)
    return 0;
  if (k->kept && k->lost == 0) {
    if (k->dirty)
      log_error ("export %s: writeback at shutdown failed (%s): dirty data "
                 "(up to %llu bytes) kept in store %s for the next start; "
                 "the store is not marked clean", k->e->cfg.name,
                 strerror (k->err), (unsigned long long) k->dirty,
                 k->e->cfg.store);
    else
      log_error ("export %s: the stop failed (%s): store %s is not marked "
                 "clean, the next start recovers it", k->e->cfg.name,
                 strerror (k->err), k->e->cfg.store);
    return -1;
  }
  if (k->lost == 0) {   /* what was lost is said above (export_close) */
    log_error ("export %s: the stop failed (%s): no dirty data was lost "
               "at the stop", k->e->cfg.name, strerror (k->err));
    return -1;
  }
  log_error ("export %s: DIRTY DATA LOST: dirty data could not be written "
             "back: %llu bytes lost (%s)", k->e->cfg.name,
             (unsigned long long) k->lost, strerror (k->err));
  return -1;
}

/* Write back and close every export, all at once, by the stop deadline.
 * 0, or -1 if any dirty data could not be written back (it is logged). */
static int
exports_close (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  struct closer one, *k = calloc (cfg->n_exports + 1, sizeof *k);
  int r = 0;

  stop_deadline_set (d);
  for (size_t i = 0; i < cfg->n_exports; i++) {
    // cppcheck-suppress uninitvar ; closer_start sets every field of one
    struct closer *ki = k ? &k[i] : &one;  /* no memory: one by one */
    if (cfg->exports[i].ex == NULL)
      continue;
    closer_start (ki, &cfg->exports[i], d->stop_deadline);
    if (!k && closer_finish (ki) == -1)
      r = -1;
  }
  for (size_t i = 0; k && i < cfg->n_exports; i++)
    if (k[i].e && closer_finish (&k[i]) == -1)
      r = -1;
  free (k);
  return r;
}

/* A process started by an upgrade fails before it serves: the old one
 * takes its exports back, so nothing is written back here (a persistent
 * store is marked clean, a ram store left as it is for the old process
 * to adopt again), as the old process did for us. */
static void
exports_hand_back (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;

  for (size_t i = 0; i < cfg->n_exports; i++) {
    struct daemon_export *e = &cfg->exports[i];
    struct store *ram = NULL;
    if (e->ex == NULL)
      continue;
    if (export_close_keep (e->ex, 1000, NULL, &ram) == -1)
      log_warn ("export %s: %s", e->cfg.name, strerror (errno));
    e->ex = NULL;
    store_destroy (ram);
  }
}

/* ---- start-up ---------------------------------------------------------- */

/* Fork into the background; the parent exits when the child reports
 * ready (0) or dies (1).  Returns in the child only. */
static int
detach (struct daemon *d)
{
  int pfd[2];
  pid_t pid;
  char c;

  if (pipe2 (pfd, O_CLOEXEC) == -1)
    return -1;
  pid = fork ();
  if (pid == -1)
    return -1;
  if (pid > 0) {
    close (pfd[1]);
    _exit (read (pfd[0], &c, 1) == 1 ? 0 : 1);
  }
  close (pfd[0]);
  d->ready_fd = pfd[1];
  if (setsid () == -1)
    return -1;
  int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
  if (null >= 0) {
    dup2 (null, STDIN_FILENO);
    dup2 (null, STDOUT_FILENO);
    close (null);
  }
  return 0;
}

/* Say once how a file backing that was asked for direct I/O (cache=none,
 * direct-threshold) does it: O_DIRECT, or buffered where the file system
 * refuses O_DIRECT (tmpfs) and the page cache then holds a second copy. */
static void
log_direct (const struct daemon_export *e)
{
  const struct backing *b = e->ex->backing;

  if ((e->cfg.cache.mode != CACHE_NONE && !e->cfg.cache.direct_threshold) ||
      !(b->caps & BACKING_CAN_DIRECT))
    return;
  if (b->direct)
    log_info ("export %s: O_DIRECT, alignment %u bytes", e->cfg.name,
              (unsigned) b->io_align);
  else
    log_warn ("export %s: the file system refuses O_DIRECT; direct "
              "requests use buffered I/O", e->cfg.name);
}

/* What a previous process left for the durability ledger (a persistent
 * store across a restart, the ram cache across an upgrade), said of
 * what and name: each keeps FLUSH failing until the operator's word. */
static void
log_store_facts (const struct daemon_export *e,
                 const struct cache_store_info *si, const char *what,
                 const char *name)
{
  if (si->doubt)
    log_error ("export %s: %s%s: a previous run left writes to the "
               "backing in doubt (the remote may still carry them out over "
               "newer data): the store's data is not reported durable on "
               "the backing, and every FLUSH that needs the backing fails "
               "with EIO, until 'foliod clear-doubt %s', see foliod(8)",
               e->cfg.name, what, name, e->cfg.name);
  if (si->fenced)
    log_error ("export %s: %s%s was written under an image lock that "
               "was lost (another client took the image over): its dirty "
               "data is never written back, and reads, writes and FLUSH "
               "fail, until 'foliod clear-doubt %s' (write it over the "
               "image as it is now) or the store is removed (throw it "
               "away), see foliod(8), Lost lock", e->cfg.name,
               what, name, e->cfg.name);
  if (si->pt_lost)
    log_error ("export %s: %s%s: a previous run lost writes that "
               "bypassed the cache (direct I/O, zero: the backing dropped "
               "them before a flush, and the cache had no copy to write "
               "again): every FLUSH fails with EIO until 'foliod "
               "clear-doubt %s' (the operator's word that the loss is "
               "known), see foliod(8)", e->cfg.name, what, name,
               e->cfg.name);
}

/* Say which persistence a store got (the store names its mechanism), and
 * what it brought back. */
static void
log_store (const struct daemon_export *e)
{
  struct cache_store_info si;
  struct cache_stats st;

  cache_get_store_info (e->ex->cache, &si);
  if (e->ex->store == NULL && si.was_clean)
    log_info ("export %s: ram cache handed over: %u folios, %llu bytes, "
              "%llu dirty bytes, taken in %llu ms", e->cfg.name,
              (unsigned) si.recovered_folios,
              (unsigned long long) si.recovered_bytes,
              (unsigned long long) si.recovered_dirty_bytes,
              (unsigned long long) si.recover_ms);
  if (e->ex->store == NULL && si.was_clean)
    log_store_facts (e, &si, "the ram cache handed over", "");
  if (e->ex->store == NULL)
    return;
  cache_get_stats (e->ex->cache, &st);
  log_info ("export %s: store %s granularity=%s (%s) power-safe %s; "
            "flush=%s", e->cfg.name, e->cfg.store, si.granularity,
            si.mechanism,
            si.power_safe_per_write ? "at each write" : "at FLUSH/FUA",
            si.flush == CACHE_FLUSH_STORE ? "store" : "backing");
  if (si.formatted)
    log_info ("export %s: store %s: new, %llu bytes of data", e->cfg.name,
              e->cfg.store, (unsigned long long) e->cfg.cache.cache_size);
  else
    log_info ("export %s: store %s: last shutdown %s; recovered %u folios, "
              "%llu bytes, %llu dirty bytes in %llu ms%s", e->cfg.name,
              e->cfg.store, si.was_clean ? "clean"
              : si.warm_dropped ? "clean, but the backing changed"
              : "NOT clean (crash)",
              (unsigned) si.recovered_folios,
              (unsigned long long) si.recovered_bytes,
              (unsigned long long) si.recovered_dirty_bytes,
              (unsigned long long) si.recover_ms,
              !si.was_clean ? " (only dirty blocks trusted)"
              : si.recovered_folios ? " (warm: every block kept)"
              : " (nothing to replay)");
  log_store_facts (e, &si, "store ", e->cfg.store);
  if (si.warm_dropped)
    log_warn ("export %s: store %s: shut down cleanly, but the warm cache "
              "is dropped: %s", e->cfg.name, e->cfg.store, si.warm_dropped);
  if (si.bad_entries)
    log_error ("export %s: store %s: %u damaged slot entries (checksum): "
               "their %llu dirty bytes belong to no known offset and are "
               "written nowhere (DATA LOST)", e->cfg.name, e->cfg.store,
               (unsigned) si.bad_entries,
               (unsigned long long) si.lost_bytes);
  else if (si.lost_bytes)
    log_error ("export %s: store %s: %llu dirty bytes failed their checksum "
               "and are written nowhere (DATA LOST; 'foliod store inspect' "
               "lists their ranges)", e->cfg.name, e->cfg.store,
               (unsigned long long) si.lost_bytes);
}

/* The index of the export that answers the empty name: the one named "",
 * else the first (server_add_exports adds them in that order). */
static size_t
default_export (const struct daemon_config *cfg)
{
  for (size_t i = 0; i < cfg->n_exports; i++)
    if (cfg->exports[i].cfg.name[0] == '\0')
      return i;
  return 0;
}

/* An image foliod served writable is never probed for a format again
 * (served.c): open it as format=raw.  1 when it is one of those. */
static int
served_before (const struct daemon_config *cfg, struct daemon_export *e,
               const char *path)
{
  if (path == NULL || cfg->state_dir == NULL ||
      !served_writable_known (".", path))
    return 0;
  if (!e->cfg.bopts.format_raw)
    log_info ("export %s: %s was served writable before: not probed for an "
              "image format (its client writes what it likes into it)",
              e->cfg.name, path);
  e->cfg.bopts.format_raw = 1;
  return 1;
}

/* Writable from now on: remember it before any client can write. */
static void
served_remember (const struct daemon_config *cfg, struct daemon_export *e,
                 const char *path)
{
  char err[512];

  if (path == NULL || e->ex->read_only)
    return;
  if (cfg->state_dir == NULL) {
    log_debug ("export %s: no state-dir: foliod cannot remember serving %s "
               "writable (a header a client writes into it would be "
               "refused at the next start)", e->cfg.name, path);
    return;
  }
  if (served_writable_remember (".", path, err, sizeof err) == -1)
    log_warn ("export %s: cannot remember in the state directory that %s "
              "is served writable (%s): if a client writes an image header "
              "into it, the next start will refuse it (then serve it with "
              "format=raw)", e->cfg.name, path, err);
}

/* A ram export of a process started by an upgrade: the ram store the old
 * process kept for it, if any (its memfd, matched by the export name in
 * its header), is adopted by export_open.  Returns its index in the
 * hand-over, or -1. */
static int
upgrade_ram_for (struct daemon *d, struct daemon_export *e)
{
  struct upgrade_handoff *u = &d->inherit;
  const char *path;
  char name[EXPORT_NAME_MAX + 1], err[256];

  if (!d->inherited || store_kind_parse (e->cfg.store, &path) != NULL)
    return -1;
  for (size_t i = 0; i < u->n_ram; i++) {
    if (u->ram_fds[i] < 0)
      continue;
    if (store_ram_handed_name (u->ram_fds[i], name, sizeof name, err,
                               sizeof err) == -1) {
      log_error ("upgrade: a ram cache handed over: %s", err);
      continue;
    }
    if (strcmp (name, e->cfg.name) == 0) {
      e->cfg.cache.ram_adopt = true;
      e->cfg.cache.ram_memfd = u->ram_fds[i];
      return (int) i;
    }
  }
  return -1;
}

/* After exports_open in a process started by an upgrade: close the
 * memfds handed over (the stores map their own); one that no export
 * took holds a cache nobody serves, its dirty data with it: the start
 * fails, so that the old process serves on with it.  0 or -1. */
static int
upgrade_ram_unclaimed (struct daemon *d)
{
  struct upgrade_handoff *u = &d->inherit;
  char name[EXPORT_NAME_MAX + 1], err[256];
  int r = 0;

  for (size_t i = 0; i < u->n_ram; i++) {
    if (!u->ram_taken[i]) {
      if (store_ram_handed_name (u->ram_fds[i], name, sizeof name, err,
                                 sizeof err) == -1)
        snprintf (name, sizeof name, "? (%s)", err);
      log_error ("upgrade: the ram cache of export %s was handed over, but "
                 "no export here takes it (its export is gone, or not on "
                 "the ram store): not starting, the old process serves on",
                 name);
      r = -1;
    }
    close (u->ram_fds[i]);
    u->ram_fds[i] = -1;
  }
  u->n_ram = 0;
  return r;
}

/* Open every export.  One whose file holds an image format (the probe
 * refused it) is not served, loudly, and the others are: that refusal
 * must not take down every other client's disk.  Any other failure stops
 * the start.  0, or -1 (logged). */
static int
exports_open (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  size_t n = cfg->n_exports, def = default_export (cfg), kept = 0, i;
  char err[1024];
  int r = 0;

  for (i = 0; i < n; i++) {
    struct daemon_export *e = &cfg->exports[i];
    const char *path = backing_spec_file_path (e->cfg.backing);
    int known = served_before (cfg, e, path);
    int ram = upgrade_ram_for (d, e);
    e->ex = export_open (&e->cfg, err, sizeof err);
    e->cfg.cache.ram_adopt = false;
    if (e->ex && ram >= 0)
      d->inherit.ram_taken[ram] = true;
    if (e->ex == NULL && errno == EMEDIUMTYPE) {
      log_error ("export %s (%s): not served%s: %s", e->cfg.name, e->where,
                 n > 1 ? " (the other exports are)" : "", err);
      if (i == def)
        server_no_default_export (d->server);
      export_config_free (&e->cfg);
      d->refused++;
      continue;
    }
    if (e->ex == NULL) {
      log_error ("export %s (%s): %s", e->cfg.name, e->where, err);
      r = -1;
      break;
    }
    if (!known)
      served_remember (cfg, e, path);
    log_info ("export %s: %s, %llu bytes%s", e->cfg.name, e->cfg.backing,
              (unsigned long long) e->ex->size,
              e->ex->read_only ? ", read-only" : "");
    log_store (e);
    log_direct (e);
    cfg->exports[kept++] = *e;
  }
  /* Those not reached stay, to be freed with the rest. */
  for (; i < n; i++)
    cfg->exports[kept++] = cfg->exports[i];
  cfg->n_exports = kept;
  if (r == 0 && kept == 0) {
    log_error ("no export can be served");
    r = -1;
  }
  return r;
}

/* "listen ADDR: ERR"; err names the address it tried, so when that is
 * addr as configured, the address is said once. */
static void
log_listen_error (const char *what, const char *addr, const char *err)
{
  size_t n = strlen (addr);

  if (strncmp (err, addr, n) == 0 && strncmp (err + n, ": ", 2) == 0)
    log_error ("%s %s", what, err);
  else
    log_error ("%s %s: %s", what, addr, err);
}

static int
listen_all (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  int fds[MAX_LISTEN_FDS];
  const char *names[MAX_LISTEN_FDS];
  char err[512], host[256], port[16], buf[300];
  int n = 0;

  if (d->inherited) {          /* upgrade: the old process's sockets */
    for (; n < d->inherit.n_listen && n < MAX_LISTEN_FDS; n++) {
      fds[n] = d->inherit.listen_fds[n];
      names[n] = "(upgrade)";
    }
  } else
    n = sd_listen_fds_get (fds, names, MAX_LISTEN_FDS);
  if (n > 0) {
    /* Socket activation: the unit's sockets replace listen/unix. */
    for (int i = 0; i < n; i++) {
      if (server_add_listen_fd (d->server, fds[i]) == -1) {
        log_error ("inherited socket %d: %s", fds[i], strerror (errno));
        return -1;
      }
      snprintf (buf, sizeof buf, "fd %d%s%s", fds[i], names[i] ? " " : "",
                names[i] ? names[i] : "");
      where_add (d, buf);
    }
    log_info ("%s: %d inherited socket%s", d->inherited ? "upgrade"
              : "socket activation", n, n > 1 ? "s" : "");
    return 0;
  }
  if (cfg->n_listen == 0 && cfg->n_unix == 0)
    daemon_config_set (cfg, "listen", DEFAULT_LISTEN, err, sizeof err);
  for (size_t i = 0; i < cfg->n_listen; i++) {
    /* Checked when the configuration was read. */
    parse_listen (cfg->listen[i], host, sizeof host, port, sizeof port);
    if (server_listen_tcp (d->server, host, port, err, sizeof err) == -1) {
      log_listen_error ("listen", cfg->listen[i], err);
      return -1;
    }
    where_add (d, cfg->listen[i]);
  }
  for (size_t i = 0; i < cfg->n_unix; i++) {
    if (server_listen_unix (d->server, cfg->unix_paths[i], err,
                            sizeof err) == -1) {
      log_listen_error ("unix", cfg->unix_paths[i], err);
      return -1;
    }
    where_add (d, cfg->unix_paths[i]);
  }
  return 0;
}

static unsigned
max_connections (const struct daemon_config *cfg)
{
  struct server_config sc;

  server_config_default (&sc);
  return cfg->max_connections ? cfg->max_connections : sc.max_connections;
}

/* The server and its listening sockets, before any export is open. */
static int
server_start (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  struct server_config sc;

  server_config_default (&sc);
  if (cfg->workers) sc.workers = cfg->workers;
  if (cfg->loops) sc.loops = cfg->loops;
  if (cfg->max_connections) sc.max_connections = cfg->max_connections;
  if (cfg->handshake_timeout_s) sc.handshake_timeout_s = cfg->handshake_timeout_s;
  if (cfg->max_inflight) sc.max_inflight = cfg->max_inflight;
  if (cfg->max_connections_per_client)
    sc.max_connections_per_client = cfg->max_connections_per_client;
  sc.idle_timeout_s = cfg->idle_timeout_s;
  /* Clients still busy get the first half of shutdown-timeout; then they
   * are dropped (with what they queued) and the writeback has the rest. */
  sc.shutdown_grace_s = (cfg->shutdown_timeout_s ? cfg->shutdown_timeout_s
                         : DEFAULT_SHUTDOWN_TIMEOUT_S) / 2;
  if (sc.shutdown_grace_s == 0)
    sc.shutdown_grace_s = 1;
  if (cfg->max_conn_buffer) sc.max_conn_buffer = cfg->max_conn_buffer;
  if (cfg->max_buffer_total) sc.max_buffer_total = cfg->max_buffer_total;
  sc.tls_mode = cfg->tls;
  sc.tls_certificates = cfg->tls_certificates;
  sc.tls_psk_file = cfg->tls_psk;
  sc.tls_verify_peer = cfg->tls_verify_peer;
  d->server = server_new (d->loop, &sc);
  if (d->server == NULL) {
    log_error ("cannot start the server: %s", strerror (errno));
    return -1;
  }
  return listen_all (d);
}

/* The opened exports, then TLS (which needs to know whether any export
 * requires it). */
static int
server_add_exports (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  char err[512];

  /* The server's first export answers the empty name: an export named ""
   * goes first, else the first one configured. */
  for (int pass = 0; pass < 2; pass++)
    for (size_t i = 0; i < cfg->n_exports; i++) {
      struct daemon_export *e = &cfg->exports[i];
      if ((e->cfg.name[0] == '\0') != (pass == 0))
        continue;
      if (server_add_export (d->server, e->ex) == -1) {
        log_error ("export %s: %s", e->cfg.name, strerror (errno));
        return -1;
      }
    }
  if (server_tls_reload (d->server, err, sizeof err) == -1) {
    log_error ("TLS: %s", err);
    return -1;
  }
  return 0;
}

static int
pidfile_write (const char *path)
{
  FILE *f = fopen (path, "we");
  int err = 0;

  if (f == NULL)
    err = errno;
  else {
    if (fprintf (f, "%d\n", (int) getpid ()) < 0)
      err = errno;
    if (fclose (f) != 0 && err == 0)  /* closed even when fprintf failed */
      err = errno;
  }
  if (err) {
    log_error ("pidfile %s: %s", path, strerror (err));
    return -1;
  }
  return 0;
}

/* From the ready line on, log lines go to log-file if set; a detached
 * foliod writes them to syslog otherwise and lets go of the terminal
 * (start-up errors before this went to it, for whoever started us). */
static int
log_redirect (struct daemon *d)
{
  int detached = d->ready_fd >= 0 || (d->inherited && d->inherit.detached);

  if (d->cfg->log_file) {
    if (log_to_file (d->cfg->log_file) == -1) {
      log_error ("log-file %s: %s", d->cfg->log_file, strerror (errno));
      return -1;
    }
  } else if (detached)
    log_to_syslog ();
  if (detached) {
    int null = open ("/dev/null", O_RDWR | O_CLOEXEC);
    if (null >= 0) {
      dup2 (null, STDERR_FILENO);
      close (null);
    }
  }
  return 0;
}

/* The populating thread of an export's ram cache is done. */
static void
on_populated (void *arg, int err, uint64_t bytes, uint64_t ms)
{
  const struct daemon_export *e = arg;

  if (err == EINVAL)
    log_info ("export %s: kernel without MADV_POPULATE_WRITE: cache memory "
              "is faulted in by the requests that first touch it",
              e->cfg.name);
  else if (err)
    log_warn ("export %s: cache memory: only %llu of %llu bytes could be "
              "populated (%s): cache-size is more than this host can give",
              e->cfg.name, (unsigned long long) bytes,
              (unsigned long long) e->cfg.cache.cache_size, strerror (err));
  else
    log_info ("export %s: cache populated: %llu bytes in %llu ms",
              e->cfg.name, (unsigned long long) bytes,
              (unsigned long long) ms);
}

/* After the ready line: each ram cache's memory is faulted in by a
 * background thread (store_ram_populate), not before listening. */
static void
exports_populate (struct daemon_config *cfg)
{
  for (size_t i = 0; i < cfg->n_exports; i++) {
    struct daemon_export *e = &cfg->exports[i];
    if (cache_populate (e->ex->cache, on_populated, e) == -1)
      log_warn ("export %s: cannot populate the cache in the background "
                "(%s): its memory is faulted in on demand", e->cfg.name,
                strerror (errno));
  }
}

static int
announce_ready (struct daemon *d)
{
  log_info ("ready: %zu export%s on %s", d->cfg->n_exports,
            d->cfg->n_exports == 1 ? "" : "s", d->where);
  if (d->refused)
    log_error ("%zu export%s NOT served: %s holds an image format (see "
               "above)", d->refused, d->refused == 1 ? "" : "s",
               d->refused == 1 ? "its file" : "their files");
  sd_notifyf ("READY=1\nMAINPID=%d", (int) getpid ());
  update_status (d);
  if (log_redirect (d) == -1)
    return -1;
  if (d->ready_fd >= 0) {
    if (write (d->ready_fd, "1", 1) != 1)
      log_warn ("cannot tell the parent process we are ready");
    close (d->ready_fd);
    d->ready_fd = -1;
  }
  ev_timer_init (&d->status_timer, on_status_timer, STATUS_INTERVAL_S,
                 STATUS_INTERVAL_S);
  d->status_timer.data = d;
  ev_timer_start (d->loop, &d->status_timer);
  return 0;
}

/* Take back every ublk device a dead or upgraded foliod left waiting for
 * one of our exports (user recovery).  An export with ublk = yes whose
 * device cannot be taken back fails (when fatal): a second device beside
 * the waiting one would hide it.  0 or -1 (logged). */
static int
ublk_recover_exports (struct daemon *d, bool fatal)
{
  char err[400];

  for (size_t i = 0; i < d->cfg->n_exports; i++) {
    struct daemon_export *e = &d->cfg->exports[i];
    if (e->ex == NULL || export_release_state (e->ex) != EXPORT_SERVING)
      continue;
    if (ublk_recover (d->ublk, e->ex, err, sizeof err) < 0 &&
        errno != ENOENT) {
      log_error ("export %s: ublk: %s", e->cfg.name, err);
      if (fatal && e->ublk)
        return -1;
    }
  }
  return 0;
}

/* The ublk set, the devices left to us (ublk_recover_exports), and
 * /dev/ublkbN for each export with ublk = yes that has none yet: one that
 * cannot be made stops the start (the configuration asked for it).  0 or
 * -1 (logged). */
static int
ublk_start (struct daemon *d)
{
  char err[400];

  d->ublk = ublk_set_new ();
  if (d->ublk == NULL) {
    log_error ("ublk: out of memory");
    return -1;
  }
  if (ublk_recover_exports (d, true) == -1)
    return -1;
  for (size_t i = 0; i < d->cfg->n_exports; i++) {
    struct daemon_export *e = &d->cfg->exports[i];
    if (e->ublk && e->ex && !ublk_serves (d->ublk, e->ex) &&
        ublk_add (d->ublk, e->ex, err, sizeof err) < 0) {
      log_error ("export %s: ublk = yes: %s", e->cfg.name, err);
      return -1;
    }
  }
  return 0;
}

/* ---- upgrade in place (foliod upgrade) -------------------------------- */

/* The new process gets this long to say it serves (its exports opened,
 * a persistent store recovered), else the old one serves on. */
#define UPGRADE_READY_S 30

static void
upgrade_answer (struct daemon *d, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

/* Give the control thread its reply. */
static void
upgrade_answer (struct daemon *d, const char *fmt, ...)
{
  va_list ap;

  lock_or_die (&d->upgrade_lock);
  va_start (ap, fmt);
  vsnprintf (d->upgrade_reply, sizeof d->upgrade_reply, fmt, ap);
  va_end (ap);
  d->upgrade_state = 2;
  pthread_cond_signal (&d->upgrade_cond);
  unlock_or_die (&d->upgrade_lock);
}

/* Does export i's ram store go over whole (the new process reads our
 * ram layout, and it is one of the first UPGRADE_MAX_RAM ram exports)?
 * While every export is open (upgrade_close_exports counts its own). */
static bool
upgrade_keeps_ram (struct daemon *d, size_t i)
{
  size_t before = 0;

  if (!d->upgrade.takes_ram || d->cfg->exports[i].ex == NULL ||
      d->cfg->exports[i].ex->store != NULL)
    return false;
  for (size_t k = 0; k < i; k++)
    before += d->cfg->exports[k].ex && d->cfg->exports[k].ex->store == NULL;
  return before < UPGRADE_MAX_RAM;
}

/* Close every export for the new process: a persistent store keeps its
 * dirty data (export_close_keep), a ram one too when the new process
 * takes it whole (the store in upgrade_ram), else it is written
 * back.  The closed ones are remembered in upgrade_old to reopen on
 * failure. */
static void
upgrade_close_exports (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  unsigned timeout_ms = (d->cfg->shutdown_timeout_s ? d->cfg->shutdown_timeout_s
                         : DEFAULT_SHUTDOWN_TIMEOUT_S) * 1000u;
  size_t n_ram = 0;         /* ram stores kept so far (upgrade_keeps_ram) */

  for (size_t i = 0; i < cfg->n_exports; i++) {
    struct daemon_export *e = &cfg->exports[i];
    uint64_t lost = 0;
    bool keep_ram = d->upgrade.takes_ram && e->ex && e->ex->store == NULL &&
                    n_ram++ < UPGRADE_MAX_RAM;
    d->upgrade_old[i] = e->ex;
    d->upgrade_ram[i] = NULL;
    if (e->ex == NULL)
      continue;
    e->ex = NULL;   /* the status timer and stats look no more */
    if (export_close_keep (d->upgrade_old[i], timeout_ms, &lost,
                           keep_ram ? &d->upgrade_ram[i] : NULL) == -1)
      log_error ("upgrade: export %s: %s%s", e->cfg.name, strerror (errno),
                 lost ? " (dirty data not written back is LOST)" : "");
  }
}

/* The new process failed: open the exports again and serve on.  0, or
 * -1 when one cannot be opened (then this process must stop). */
static int
upgrade_reopen_exports (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;
  char err[1024];
  int r = 0;

  for (size_t i = 0; i < cfg->n_exports; i++) {
    struct daemon_export *e = &cfg->exports[i];
    if (d->upgrade_old[i] == NULL)
      continue;
    /* Our ram cache, as the new process left it (it ran at most its
     * writeback on it: see src/store/store-ram.c). */
    e->cfg.cache.ram_adopt = d->upgrade_ram[i] != NULL;
    e->cfg.cache.ram_memfd = d->upgrade_ram[i]
                             ? store_ram_kept_fd (d->upgrade_ram[i]) : -1;
    e->ex = export_open (&e->cfg, err, sizeof err);
    e->cfg.cache.ram_adopt = false;
    if (e->ex == NULL) {
      log_error ("upgrade: export %s cannot be opened again: %s",
                 e->cfg.name, err);
      r = -1;
      continue;
    }
    server_replace_export (d->server, d->upgrade_old[i], e->ex);
    log_store (e);
    if (cache_populate (e->ex->cache, on_populated, e) == -1)
      log_warn ("export %s: cache memory is faulted in on demand",
                e->cfg.name);
  }
  return r;
}

/* The ram stores kept for a hand-over that failed: adopted again (the
 * new export maps its own copy). */
static void
upgrade_ram_close (struct daemon *d)
{
  for (size_t i = 0; i < d->cfg->n_exports; i++) {
    store_destroy (d->upgrade_ram[i]);
    d->upgrade_ram[i] = NULL;
  }
}

/* Every plain connection is detached (server_handover): hand everything
 * to a new process, or take it all back. */
static void
upgrade_handed (void *opaque)
{
  struct daemon *d = opaque;
  struct upgrade_handoff u = { .control_fd = -1, .ready_fd = -1 };
  uint64_t quiet_ms = now_ms ();
  char err[512];
  pid_t pid;
  int r;

  u.conns = server_handover_take (d->server, &u.n_conns);
  log_info ("upgrade: %zu connection(s) detached; the last request this "
            "process answers was before now (%llu ms after the upgrade "
            "began)", u.n_conns,
            (unsigned long long) (quiet_ms - d->upgrade_start_ms));
  /* The metrics thread reads the exports: stopped first (its port is
   * bound again by the new process, or by this one if that fails). */
  metrics_stop (d->metrics);
  d->metrics = NULL;
  /* ublk devices wait in the kernel for the new process (or this one). */
  if (d->ublk)
    ublk_set_detach (d->ublk);
  upgrade_close_exports (d);
  u.n_listen = server_listen_fds (d->server, u.listen_fds,
                                  UPGRADE_MAX_LISTEN);
  u.control_fd = d->ctl ? control_fd (d->ctl, false) : -1;
  u.takes_ram = d->upgrade.takes_ram;
  for (size_t i = 0; i < d->cfg->n_exports; i++)
    if (d->upgrade_ram[i] && u.n_ram < UPGRADE_MAX_RAM)
      u.ram_fds[u.n_ram++] = store_ram_kept_fd (d->upgrade_ram[i]);
  u.detached = d->ready_fd >= 0 || getenv ("NOTIFY_SOCKET") != NULL ||
               (d->inherited && d->inherit.detached);
  if (d->cfg->log_file)
    u.detached = 0;
  pid = d->upgrade.pid;
  if (upgrade_hand (&d->upgrade, &u, UPGRADE_READY_S, err, sizeof err) < 0)
    pid = -1;
  if (pid > 0) {
    uint64_t t = now_ms ();
    sd_notifyf ("MAINPID=%d", (int) pid);
    if (d->ctl)
      control_fd (d->ctl, true);   /* the new process serves the path */
    log_info ("upgrade: pid %d serves now: %zu connection(s) handed over; "
              "%llu ms from the last answer here to its ready", (int) pid,
              u.n_conns, (unsigned long long) (t - quiet_ms));
    d->upgraded_to = pid;
    upgrade_answer (d, "OK upgraded: pid %d, %zu connection(s) handed over, "
                    "%llu ms without service%s\n", (int) pid, u.n_conns,
                    (unsigned long long) (t - quiet_ms),
                    u.n_ram ? ", ram cache kept" : "");
    /* Not upgrade_ram_close: unmapping a large ram store takes a while,
     * and this process exits now (the exit unmaps it). */
    upgrade_handoff_free (&u);
    ev_break (d->loop, EVBREAK_ALL);
    return;
  }
  log_error ("upgrade failed: %s; serving on", err);
  r = upgrade_reopen_exports (d);
  upgrade_ram_close (d);
  if (r == -1) {
    upgrade_answer (d, "ERROR upgrade failed (%s), and an export cannot be "
                    "opened again: foliod stops\n", err);
    d->upgrade_fatal = 1;
    upgrade_handoff_free (&u);
    ev_break (d->loop, EVBREAK_ALL);
    return;
  }
  ublk_recover_exports (d, false);
  server_handover_abort (d->server);
  for (size_t i = 0; i < u.n_conns; i++)
    if (server_adopt (d->server, &u.conns[i]) == -1)
      close (u.conns[i].fd);
  if (d->cfg->metrics_listen)
    d->metrics = metrics_start (d->cfg->metrics_listen, d->cfg->exports,
                                d->cfg->n_exports, d->server);
  upgrade_answer (d, "ERROR upgrade failed: %s; pid %d serves on\n", err,
                  (int) getpid ());
  upgrade_handoff_free (&u);
}

/* On the loop: the control thread asked for an upgrade. */
static void
on_upgrade_async (struct ev_loop *loop, ev_async *w, int revents)
{
  struct daemon *d = w->data;
  struct daemon_config *cfg = d->cfg;
  char err[512];

  if (d->stopping) {
    upgrade_answer (d, "ERROR foliod is stopping\n");
    return;
  }
  d->upgrade_start_ms = now_ms ();
  log_info ("upgrade: requested");
  free (d->upgrade_old);
  free (d->upgrade_ram);
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  d->upgrade_old = calloc (cfg->n_exports + 1, sizeof *d->upgrade_old);
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  d->upgrade_ram = calloc (cfg->n_exports + 1, sizeof *d->upgrade_ram);
  if (d->upgrade_old == NULL || d->upgrade_ram == NULL) {
    upgrade_answer (d, "ERROR out of memory\n");
    return;
  }
  /* The new binary starts (exec, libraries, configuration) while this
   * process serves; it waits for the hand-over. */
  if (upgrade_start (d->argv, UPGRADE_READY_S, &d->upgrade, err,
                     sizeof err) < 0) {
    log_error ("upgrade failed: %s; serving on", err);
    upgrade_answer (d, "ERROR upgrade failed: %s; pid %d serves on\n", err,
                    (int) getpid ());
    return;
  }
  /* A ram store that does not go over whole (the new binary reads
   * another ram layout) must be written back before it is closed: most
   * of it now, while clients are still served, so that the stall only
   * covers what they write meanwhile. */
  if (d->upgrade.takes_ram)
    log_info ("upgrade: the new process takes the ram caches as they are");
  for (size_t i = 0; i < cfg->n_exports; i++) {
    struct daemon_export *e = &cfg->exports[i];
    if (e->ex && e->ex->store == NULL && !upgrade_keeps_ram (d, i) &&
        cache_write_back (e->ex->cache) == -1) {
      int werr = errno;
      upgrade_abandon (&d->upgrade, "handed over", EINTR, 0, err,
                       sizeof err);
      upgrade_answer (d, "ERROR export %s: cannot write back before the "
                      "upgrade: %s\n", e->cfg.name, strerror (werr));
      return;
    }
  }
  server_handover (d->server, upgrade_handed, d);
}

/* What an upgrade cannot hand over yet: NULL, or why not (in buf).  A
 * released export's state lives in this process only: the new one
 * would take the image back from the host it was handed to.  A ublk
 * device made without user recovery would be left behind, its I/O
 * failing; the others wait in the kernel for the new process. */
static const char *
upgrade_refusal (struct daemon *d, char *buf, size_t len)
{
  for (size_t i = 0; i < d->cfg->n_exports; i++) {
    struct daemon_export *e = &d->cfg->exports[i];
    if (e->ex && export_release_state (e->ex) != EXPORT_SERVING) {
      snprintf (buf, len, "export %s was released (foliod release): a new "
                "process would take its image back; stop foliod instead",
                e->cfg.name);
      return buf;
    }
  }
  if (d->ublk && !ublk_set_recoverable (d->ublk)) {
    snprintf (buf, len, "a ublk device was made without user recovery "
              "(this kernel has none): remove it first (foliod ublk del N)");
    return buf;
  }
  return NULL;
}

/* Control thread: "upgrade".  Blocks until the loop has an answer. */
static void
upgrade_request (void *arg, char *reply, size_t len)
{
  struct daemon *d = arg;
  char why[300];

  if (upgrade_refusal (d, why, sizeof why)) {
    log_warn ("upgrade refused: %s", why);
    snprintf (reply, len, "ERROR %s\n", why);
    return;
  }
  lock_or_die (&d->upgrade_lock);
  if (d->upgrade_state != 0) {
    unlock_or_die (&d->upgrade_lock);
    snprintf (reply, len, "ERROR an upgrade is already running\n");
    return;
  }
  d->upgrade_state = 1;
  ev_async_send (d->loop, &d->upgrade_async);
  while (d->upgrade_state != 2)
    pthread_cond_wait (&d->upgrade_cond, &d->upgrade_lock);
  snprintf (reply, len, "%s", d->upgrade_reply);
  d->upgrade_state = 0;
  unlock_or_die (&d->upgrade_lock);
}

static void
upgrade_init (struct daemon *d)
{
  pthread_mutex_init (&d->upgrade_lock, NULL);
  pthread_cond_init (&d->upgrade_cond, NULL);
  ev_async_init (&d->upgrade_async, on_upgrade_async);
  d->upgrade_async.data = d;
  ev_async_start (d->loop, &d->upgrade_async);
  if (d->ctl)
    control_set_upgrade (d->ctl, upgrade_request, d);
}

/* New process, once ready: tell the old one, then take its connections
 * (after: a failure in between leaves them to nobody rather than to
 * two processes). */
static void
upgrade_adopt (struct daemon *d)
{
  if (!d->inherited)
    return;
  upgrade_ready (&d->inherit);
  for (size_t i = 0; i < d->inherit.n_conns; i++)
    if (server_adopt (d->server, &d->inherit.conns[i]) == -1)
      close (d->inherit.conns[i].fd);
  log_info ("upgrade: %zu connection(s) taken over", d->inherit.n_conns);
  upgrade_handoff_free (&d->inherit);
}

/* Set up everything; 0 when serving, -1 on any failure (logged). */
static int
daemon_start (struct daemon *d)
{
  struct daemon_config *cfg = d->cfg;

  fd_limit_raise ();
  if (cfg->state_dir) {
    if (chdir (cfg->state_dir) == -1) {
      log_error ("state-dir %s: %s", cfg->state_dir, strerror (errno));
      return -1;
    }
    log_info ("state directory %s", cfg->state_dir);
  }
  d->inherited = upgrade_inherited (&d->inherit);
  if (d->inherited < 0)
    return -1;
  /* Under systemd (NOTIFY_SOCKET) we never detach: Type=notify tracks us;
   * nor when an old foliod starts us (it is detached already). */
  if (!cfg->foreground && getenv ("NOTIFY_SOCKET") == NULL &&
      !d->inherited && detach (d) == -1) {
    log_error ("cannot detach: %s", strerror (errno));
    return -1;
  }
  d->loop = ev_default_loop (EVFLAG_AUTO);
  if (d->loop == NULL) {
    log_error ("cannot create the event loop");
    return -1;
  }
  if (server_start (d) == -1)
    return -1;
  if (exports_create_missing (cfg) == -1 || exports_open (d) == -1 ||
      upgrade_ram_unclaimed (d) == -1 || server_add_exports (d) == -1)
    return -1;
  if (ublk_start (d) == -1)
    return -1;
  if (cfg->control) {
    d->ctl = control_start (cfg->control, d->inherit.control_fd,
                            cfg->exports, cfg->n_exports, d->server, d->ublk);
    if (d->ctl == NULL)
      return -1;
  } else if (d->inherit.control_fd >= 0)
    close (d->inherit.control_fd);    /* no control socket configured now */
  if (cfg->metrics_listen) {
    d->metrics = metrics_start (cfg->metrics_listen, cfg->exports,
                                cfg->n_exports, d->server);
    if (d->metrics == NULL)
      return -1;
  }
  if (cfg->pidfile) {
    if (pidfile_write (cfg->pidfile) == -1)
      return -1;
    d->pidfile_written = 1;
  }
  fd_limit_check (max_connections (cfg));
  signals_start (d);
  upgrade_init (d);
  if (announce_ready (d) == -1)
    return -1;
  upgrade_adopt (d);
  exports_populate (cfg);
  return 0;
}

static int
daemon_run (struct daemon_config *cfg, char **argv)
{
  struct daemon d = { .cfg = cfg, .ready_fd = -1, .argv = argv };
  int r;

  crash_report_install ();
  r = daemon_start (&d);

  if (r == 0) {
    ev_run (d.loop, 0);
    signals_stop (&d);
  }
  if (d.upgraded_to > 0) {
    /* Everything is the new process's now: its sockets stay open there
     * and their files stay; the exports are closed.  Just go (the
     * control thread sends its reply as it stops). */
    control_stop (d.ctl);
    ublk_set_free (d.ublk);      /* empty: ublk_set_detach left its
                                    devices to the new process */
    log_info ("upgrade: exiting; pid %d serves", (int) d.upgraded_to);
    free (d.upgrade_old);
    for (size_t i = 0; d.upgrade_ram && i < cfg->n_exports; i++)
      store_ram_abandon (d.upgrade_ram[i]); /* unmapped by the exit */
    free (d.upgrade_ram);
    return 0;
  }
  metrics_stop (d.metrics);
  /* Started by an upgrade, failed before serving: what we were handed
   * is the old process's again (it takes it back): its control socket
   * file stays, and the caches go back as they are. */
  bool hand_back = r != 0 && d.inherited > 0 && d.inherit.ready_fd >= 0;
  if (hand_back && d.ctl)
    control_fd (d.ctl, true);
  control_stop (d.ctl);
  if (hand_back && d.ublk)       /* devices it recovered: the old
                                    process recovers them again */
    ublk_set_detach (d.ublk);
  ublk_set_free (d.ublk);        /* its devices use the exports */
  if (hand_back)
    exports_hand_back (&d);
  else if (exports_close (&d) == -1 || d.upgrade_fatal)
    r = -1;
  upgrade_handoff_free (&d.inherit); /* a start that failed before
                                        taking the connections over */
  free (d.upgrade_old);
  free (d.upgrade_ram);
  if (d.server)
    server_free (d.server);
  if (d.pidfile_written)
    unlink (cfg->pidfile);
  if (d.loop)
    ev_loop_destroy (d.loop);
  if (r == 0)
    log_info ("stopped: all data written back");
  return r;
}

int
main (int argc, char **argv)
{
  struct daemon_config cfg;
  struct cli cli;
  int r;

  if (argc > 1 && strcmp (argv[1], "store") == 0)
    return cli_store (argc - 1, argv + 1) == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
  daemon_config_init (&cfg);
  r = cli_parse (argc, argv, &cli, &cfg);
  if (r != 0) {
    daemon_config_free (&cfg);
    return r > 0 ? EXIT_SUCCESS : EXIT_FAILURE;
  }
  log_set_level (cfg.log_level);
  if (cli.subcommand) {
    char *path = NULL, cmd[512];
    if (cfg.control == NULL) {
      fprintf (stderr, "foliod: no control socket configured: give "
               "--control PATH\n");
      r = -1;
    } else if (cfg.control[0] != '/' && cfg.state_dir &&
               asprintf (&path, "%s/%s", cfg.state_dir, cfg.control) < 0) {
      r = -1;
    }
    if (r == 0 && cli.watch > 0) {
      r = stats_watch (path ? path : cfg.control, cli.watch, cli.count);
    } else if (r == 0) {
      const char *arg = cli.sub_arg;
      if (strcmp (cli.subcommand, "stats") == 0 && !cli.prometheus)
        arg = "table";
      snprintf (cmd, sizeof cmd, "%s%s%s%s\n", cli.subcommand,
                cli.stop ? "-stop" : cli.lost_only ? "-lost" : "",
                arg ? " " : "", arg ? arg : "");
      r = control_client (path ? path : cfg.control, cmd);
    }
    free (path);
  } else {
    r = daemon_run (&cfg, argv);
  }
  daemon_config_free (&cfg);
  return r == 0 ? EXIT_SUCCESS : EXIT_FAILURE;
}
