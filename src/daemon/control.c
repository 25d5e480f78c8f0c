/* The control socket: statistics and forced writeback.
 *
 * Why a Unix socket and not HTTP: a storage host's operators want these
 * numbers without opening a port; a socket file is protected by file
 * permissions (0600, the daemon's user and root), like haproxy's stats
 * socket or Ceph's admin socket.  Why Prometheus text format for the
 * answer: it is what monitoring stacks ingest (node_exporter's textfile
 * collector takes `foliod stats --prometheus` output as is), it is plain
 * text a human can read, and it needs no library.
 *
 * Protocol: the client sends one line, the daemon answers and closes.
 *   "stats\n"        -> Prometheus text exposition format
 *   "flush EXPORT\n" -> "OK ...\n" or "ERROR reason\n"
 * One thread serves the clients (a flush can take as long as the dirty
 * data needs and must not stall the event loop).  It waits on none of
 * them: each has its own state (the request line so far, the reply not
 * yet sent) and a deadline, CONTROL_IO_TIMEOUT_S from its connection for
 * the request and again for the reply, and one poll() covers them all,
 * so a client dribbling a byte now and then delays nobody.  At most
 * CONTROL_MAX_CLIENTS at once; one more evicts the oldest.  A flush
 * itself runs in this thread: other clients wait for it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "foliod/util.h"
#include "server/log.h"
#include "server/server.h"

#define CONTROL_IO_TIMEOUT_S 5
#define CONTROL_MAX_CLIENTS 16
#define CONTROL_LINE_MAX 512     /* a request line, '\n' included */
#define CONTROL_STATS_WAIT_S 30  /* the command line's wait for an answer */
#define CONTROL_FLUSH_WAIT_S 3600 /* ... for a flush (writes back first) */
#define STATS_BUF_SIZE (64 * 1024)

/* One control client: reading its line, then sending the reply. */
struct control_client {
  int fd;                    /* -1: slot free */
  uint64_t deadline_ms;
  size_t len;                /* bytes of line */
  char line[CONTROL_LINE_MAX];
  char *out;                 /* the reply; NULL while reading */
  size_t out_len, out_sent;
};

struct control {
  int listen_fd;
  int stop_pipe[2];          /* written by control_stop to wake the thread */
  pthread_t thread;
  char *path;
  struct daemon_export *exports;
  size_t n_exports;
  struct server *server;
  struct control_client clients[CONTROL_MAX_CLIENTS];
};

/* ---- statistics ---------------------------------------------------------- */

enum metric_id {
  M_HITS, M_MISSES, M_CLIENT_READ, M_CLIENT_WRITE, M_WRITEBACK, M_WA,
  M_DIRTY, M_CACHED, M_PASSTHROUGH, M_PT_READ_OPS, M_PT_READ_BYTES,
  M_PT_WRITE_OPS, M_PT_WRITE_BYTES, M_BACKING_READ, M_BACKING_ERRORS,
  M_RECONNECTS, M_RETRIES, M_UNSTABLE, M_EVICTIONS, M_FLUSHES, M_SIZE,
  M_STORE_DIRTY, M_COUNT
};

static const struct {
  const char *name;
  const char *type;
  const char *help;
} metrics[M_COUNT] = {
  [M_HITS] = { "foliod_read_hits_total", "counter",
               "Client reads served from the cache without backing I/O." },
  [M_MISSES] = { "foliod_read_misses_total", "counter",
                 "Client reads that needed backing reads." },
  [M_CLIENT_READ] = { "foliod_client_read_bytes_total", "counter",
                      "Bytes clients read." },
  [M_CLIENT_WRITE] = { "foliod_client_write_bytes_total", "counter",
                       "Bytes clients wrote (NBD_CMD_WRITE payload)." },
  [M_WRITEBACK] = { "foliod_writeback_bytes_total", "counter",
                    "Bytes written to the backing." },
  [M_WA] = { "foliod_write_amplification", "gauge",
             "Backing bytes written / client bytes written (0 before any "
             "write)." },
  [M_DIRTY] = { "foliod_dirty_bytes", "gauge",
                "Bytes in the cache not yet written back." },
  [M_CACHED] = { "foliod_cached_bytes", "gauge",
                 "Folio memory in use." },
  [M_PASSTHROUGH] = { "foliod_passthrough_bytes_total", "counter",
                      "Bytes read or written directly, bypassing the cache "
                      "(cache=none, direct-threshold)." },
  [M_PT_READ_OPS] = { "foliod_passthrough_read_ops_total", "counter",
                      "Client reads that bypassed the cache." },
  [M_PT_READ_BYTES] = { "foliod_passthrough_read_bytes_total", "counter",
                        "Bytes of client reads that bypassed the cache." },
  [M_PT_WRITE_OPS] = { "foliod_passthrough_write_ops_total", "counter",
                       "Client writes that bypassed the cache." },
  [M_PT_WRITE_BYTES] = { "foliod_passthrough_write_bytes_total", "counter",
                         "Bytes of client writes that bypassed the cache." },
  [M_BACKING_READ] = { "foliod_backing_read_bytes_total", "counter",
                       "Bytes read from the backing." },
  [M_BACKING_ERRORS] = { "foliod_backing_errors_total", "counter",
                         "Failed backing reads and writebacks." },
  [M_RECONNECTS] = { "foliod_backing_reconnects_total", "counter",
                     "Reconnections of an nbd: backing." },
  [M_RETRIES] = { "foliod_backing_retries_total", "counter",
                  "Requests an nbd: backing sent again after a reconnect." },
  [M_UNSTABLE] = { "foliod_unstable_bytes", "gauge",
                   "Bytes written to a remote backing, not yet flushed by it." },
  [M_EVICTIONS] = { "foliod_evictions_total", "counter",
                    "Clean folios evicted to make room." },
  [M_FLUSHES] = { "foliod_backing_flushes_total", "counter",
                  "Flushes sent to the backing." },
  [M_SIZE] = { "foliod_export_size_bytes", "gauge", "Size of the export." },
  [M_STORE_DIRTY] = { "foliod_store_dirty_bytes", "gauge",
                      "Dirty bytes kept in a persistent store (pmem): they "
                      "survive a crash (0 with the ram store)." },
};

struct export_values {
  uint64_t v[M_COUNT];
  double wa;
};

static void
export_values (struct export *ex, struct export_values *out)
{
  struct cache_stats st;
  struct backing_stats bst = { 0 };
  // cppcheck-suppress ctuuninitvar ; out is written here, never read
  uint64_t *v = out->v;

  export_get_stats (ex, &st, &bst);
  v[M_HITS] = st.read_hits;
  v[M_MISSES] = st.read_misses;
  v[M_CLIENT_READ] = st.client_read_bytes;
  v[M_CLIENT_WRITE] = st.client_write_bytes;
  v[M_WRITEBACK] = st.backing_write_bytes;
  v[M_DIRTY] = st.dirty_bytes;
  v[M_CACHED] = st.cached_bytes;
  v[M_PASSTHROUGH] = st.direct_read_bytes + st.direct_write_bytes;
  v[M_PT_READ_OPS] = st.direct_read_ops;
  v[M_PT_READ_BYTES] = st.direct_read_bytes;
  v[M_PT_WRITE_OPS] = st.direct_write_ops;
  v[M_PT_WRITE_BYTES] = st.direct_write_bytes;
  v[M_BACKING_READ] = st.backing_read_bytes;
  v[M_BACKING_ERRORS] = st.writeback_errors + st.read_errors + bst.errors;
  v[M_RECONNECTS] = bst.reconnects;
  v[M_RETRIES] = bst.retries;
  v[M_UNSTABLE] = st.unstable_bytes;
  v[M_EVICTIONS] = st.evictions;
  v[M_FLUSHES] = st.backing_flush_ops;
  v[M_SIZE] = ex->size;
  v[M_STORE_DIRTY] = ex->store ? st.dirty_bytes + st.unstable_bytes : 0;
  out->wa = st.client_write_bytes
    ? (double) st.backing_write_bytes / (double) st.client_write_bytes : 0;
}

/* Label value escaping of the text format: backslash, quote, newline. */
static void
label_escape (char *out, size_t outlen, const char *s)
{
  size_t n = 0;

  for (; *s && n + 3 < outlen; s++) {
    if (*s == '\\' || *s == '"' || *s == '\n') {
      out[n++] = '\\';
      out[n++] = *s == '\n' ? 'n' : *s;
    } else
      out[n++] = *s;
  }
  out[n] = '\0';
}

struct outbuf {
  char *buf;
  size_t len, cap;
};

static void __attribute__ ((format (printf, 2, 3)))
out (struct outbuf *o, const char *fmt, ...)
{
  va_list ap;
  int r;

  if (o->len + 1 >= o->cap)
    return;
  va_start (ap, fmt);
  r = vsnprintf (o->buf + o->len, o->cap - o->len, fmt, ap);
  va_end (ap);
  if (r > 0)
    o->len += (size_t) r;
  if (o->len >= o->cap)
    o->len = o->cap - 1;
}

size_t
stats_format (char *buf, size_t buflen, struct daemon_export *ex, size_t n,
              void *server)
{
  struct outbuf o = { buf, 0, buflen };
  struct export_values *vals;
  struct server_stats ss;
  char label[300];

  if (buflen == 0)
    return 0;
  buf[0] = '\0';
  vals = calloc (n ? n : 1, sizeof *vals);
  if (vals == NULL)
    return 0;
  for (size_t i = 0; i < n; i++)
    if (ex[i].ex)
      export_values (ex[i].ex, &vals[i]);
  for (int m = 0; m < M_COUNT; m++) {
    out (&o, "# HELP %s %s\n# TYPE %s %s\n", metrics[m].name, metrics[m].help,
         metrics[m].name, metrics[m].type);
    for (size_t i = 0; i < n; i++) {
      if (ex[i].ex == NULL)
        continue;
      label_escape (label, sizeof label, ex[i].cfg.name);
      if (m == M_WA)
        out (&o, "%s{export=\"%s\"} %.3f\n", metrics[m].name, label,
             vals[i].wa);
      else
        out (&o, "%s{export=\"%s\"} %llu\n", metrics[m].name, label,
             (unsigned long long) vals[i].v[m]);
    }
  }
  free (vals);
  out (&o, "# HELP foliod_store_info Where folio memory lives: kind ram or "
       "pmem, granularity cache-line, byte or page (pmem), flush store or "
       "backing.\n# TYPE foliod_store_info gauge\n");
  for (size_t i = 0; i < n; i++) {
    struct cache_store_info si;
    if (ex[i].ex == NULL)
      continue;
    cache_get_store_info (ex[i].ex->cache, &si);
    label_escape (label, sizeof label, ex[i].cfg.name);
    out (&o, "foliod_store_info{export=\"%s\",kind=\"%s\","
         "granularity=\"%s\",flush=\"%s\"} 1\n", label, si.kind,
         si.granularity ? si.granularity : "none",
         si.flush == CACHE_FLUSH_STORE ? "store" : "backing");
  }
  if (server) {
    /* The server counts connections over all exports. */
    server_get_stats (server, &ss);
    out (&o, "# HELP foliod_connections Client connections open now.\n"
         "# TYPE foliod_connections gauge\nfoliod_connections %llu\n",
         (unsigned long long) ss.connections_now);
    out (&o, "# HELP foliod_connections_accepted_total Client connections "
         "accepted.\n# TYPE foliod_connections_accepted_total counter\n"
         "foliod_connections_accepted_total %llu\n",
         (unsigned long long) ss.connections_total);
    out (&o, "# HELP foliod_connections_refused_total Connections refused "
         "over max-connections.\n# TYPE foliod_connections_refused_total "
         "counter\nfoliod_connections_refused_total %llu\n",
         (unsigned long long) ss.connections_refused);
    out (&o, "# HELP foliod_requests_total NBD requests completed.\n"
         "# TYPE foliod_requests_total counter\nfoliod_requests_total %llu\n",
         (unsigned long long) ss.requests);
    out (&o, "# HELP foliod_request_errors_total NBD requests answered with "
         "an error.\n# TYPE foliod_request_errors_total counter\n"
         "foliod_request_errors_total %llu\n",
         (unsigned long long) ss.request_errors);
  }
  return o.len;
}

void
stats_log (struct daemon_export *ex, size_t n, void *server)
{
  struct server_stats ss = { 0 };

  if (server)
    server_get_stats (server, &ss);
  log_info ("connections: %llu open, %llu accepted, %llu requests",
            (unsigned long long) ss.connections_now,
            (unsigned long long) ss.connections_total,
            (unsigned long long) ss.requests);
  for (size_t i = 0; i < n; i++) {
    struct export_values v;
    if (ex[i].ex == NULL)
      continue;
    export_values (ex[i].ex, &v);
    log_info ("export %s: hits %llu misses %llu client-written %llu "
              "written-back %llu (amplification %.2f) dirty %llu cached %llu "
              "passthrough %llu backing-errors %llu reconnects %llu",
              ex[i].cfg.name, (unsigned long long) v.v[M_HITS],
              (unsigned long long) v.v[M_MISSES],
              (unsigned long long) v.v[M_CLIENT_WRITE],
              (unsigned long long) v.v[M_WRITEBACK], v.wa,
              (unsigned long long) v.v[M_DIRTY],
              (unsigned long long) v.v[M_CACHED],
              (unsigned long long) v.v[M_PASSTHROUGH],
              (unsigned long long) v.v[M_BACKING_ERRORS],
              (unsigned long long) v.v[M_RECONNECTS]);
  }
}

/* ---- the daemon side ------------------------------------------------------ */

static int
write_all (int fd, const char *buf, size_t len)
{
  while (len > 0) {
    ssize_t r = send (fd, buf, len, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    buf += r;
    len -= (size_t) r;
  }
  return 0;
}

/* "flush NAME": write the export back; the answer goes to reply. */
static void
control_flush (struct control *ctl, char *reply, size_t len, const char *name)
{
  for (size_t i = 0; i < ctl->n_exports; i++) {
    struct daemon_export *e = &ctl->exports[i];
    if (strcmp (e->cfg.name, name) != 0 || e->ex == NULL)
      continue;
    struct cache_stats st;
    cache_get_stats (e->ex->cache, &st);
    log_info ("control: flush %s (%llu bytes dirty)", name,
              (unsigned long long) st.dirty_bytes);
    if (cache_write_back (e->ex->cache) == -1)
      snprintf (reply, len, "ERROR flush %.200s: %s\n", name,
                strerror (errno));
    else
      snprintf (reply, len, "OK %.200s: %llu dirty bytes written back\n",
                name, (unsigned long long) st.dirty_bytes);
    return;
  }
  snprintf (reply, len, "ERROR no export named '%.200s'\n", name);
}

/* The reply to one request line, in a malloc'd buffer (*len bytes). */
static char *
control_answer (struct control *ctl, const char *line, size_t *len)
{
  static const char unknown[] = "ERROR unknown command (try 'stats' or "
                                "'flush EXPORT')\n";
  char *buf;

  if (strcmp (line, "stats") == 0) {
    buf = malloc (STATS_BUF_SIZE);
    if (buf)
      *len = stats_format (buf, STATS_BUF_SIZE, ctl->exports,
                           ctl->n_exports, ctl->server);
    return buf;
  }
  buf = malloc (512);
  if (buf == NULL)
    return NULL;
  if (strncmp (line, "flush ", 6) == 0)
    control_flush (ctl, buf, 512, line + 6);
  else
    snprintf (buf, 512, "%s", unknown);
  *len = strlen (buf);
  return buf;
}

static void
client_close (struct control_client *cl)
{
  close (cl->fd);
  free (cl->out);
  cl->fd = -1;
  cl->out = NULL;
}

/* The request line is complete (or the client stopped sending): answer. */
static void
client_request (struct control *ctl, struct control_client *cl)
{
  cl->line[cl->len] = '\0';
  if (cl->len > 0 && cl->line[cl->len - 1] == '\r')
    cl->line[--cl->len] = '\0';
  cl->out = control_answer (ctl, cl->line, &cl->out_len);
  cl->out_sent = 0;
#pragma GCC diagnostic push     /* -fanalyzer: cl->out, freed by client_close */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
  if (cl->out == NULL || cl->out_len == 0) {
#pragma GCC diagnostic pop
    client_close (cl);
    return;
  }
  cl->deadline_ms = now_ms () + CONTROL_IO_TIMEOUT_S * 1000u;
}

/* Read what is there; a full line (or EOF after some) is answered. */
static void
client_read (struct control *ctl, struct control_client *cl)
{
  static const char too_long[] = "ERROR request too long\n";
  ssize_t r = recv (cl->fd, cl->line + cl->len,
                    sizeof cl->line - 1 - cl->len, MSG_DONTWAIT);
  char *nl;

  if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
    return;
  if (r <= 0) {
    if (r == 0 && cl->len > 0)
      client_request (ctl, cl);    /* the last line without '\n' */
    else
      client_close (cl);
    return;
  }
  cl->len += (size_t) r;
  nl = memchr (cl->line, '\n', cl->len);
  if (nl) {
    cl->len = (size_t) (nl - cl->line);
    client_request (ctl, cl);
  } else if (cl->len == sizeof cl->line - 1) {
    if (send (cl->fd, too_long, sizeof too_long - 1,
              MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
      log_debug ("control socket: %m");
    client_close (cl);
  }
}

static void
client_write (struct control_client *cl)
{
  ssize_t r = send (cl->fd, cl->out + cl->out_sent, cl->out_len - cl->out_sent,
                    MSG_NOSIGNAL | MSG_DONTWAIT);

  if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
    return;
  if (r < 0) {
    client_close (cl);
    return;
  }
  cl->out_sent += (size_t) r;
  if (cl->out_sent == cl->out_len)
    client_close (cl);
}

/* A new client takes a free slot, or the oldest one's. */
static void
control_accept (struct control *ctl)
{
  struct control_client *cl = NULL;
  int fd = accept4 (ctl->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

  if (fd < 0)
    return;
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++) {
    struct control_client *c = &ctl->clients[i];
    if (c->fd == -1) {
      cl = c;
      break;
    }
    if (cl == NULL || c->deadline_ms < cl->deadline_ms)
      cl = c;
  }
  if (cl->fd != -1) {
    log_warn ("control socket: %d clients busy, dropping the oldest",
              CONTROL_MAX_CLIENTS);
    client_close (cl);
  }
  cl->fd = fd;
  cl->len = 0;
  cl->deadline_ms = now_ms () + CONTROL_IO_TIMEOUT_S * 1000u;
}

/* Close the clients past their deadline, fill p[2..] with the others
 * (map[i] is the client of p[2 + i]); returns the poll timeout (ms) until
 * the nearest deadline. */
static int
control_poll_set (struct control *ctl, struct pollfd *p,
                  struct control_client **map, nfds_t *n)
{
  uint64_t now = now_ms (), next = UINT64_MAX;

  *n = 2;
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++) {
    struct control_client *cl = &ctl->clients[i];
    if (cl->fd == -1)
      continue;
    if (cl->deadline_ms <= now) {
      log_debug ("control socket: a client timed out");
      client_close (cl);
      continue;
    }
    if (cl->deadline_ms < next)
      next = cl->deadline_ms;
    map[*n - 2] = cl;
    p[*n].fd = cl->fd;
    p[*n].events = cl->out ? POLLOUT : POLLIN;
    p[*n].revents = 0;
    (*n)++;
  }
  return next == UINT64_MAX ? -1 : (int) (next - now);
}

static void *
control_thread (void *arg)
{
  struct control *ctl = arg;
  struct pollfd p[2 + CONTROL_MAX_CLIENTS] = {
    { .fd = ctl->listen_fd, .events = POLLIN },
    { .fd = ctl->stop_pipe[0], .events = POLLIN },
  };
  struct control_client *map[CONTROL_MAX_CLIENTS];

  for (;;) {
    nfds_t n;
    int timeout = control_poll_set (ctl, p, map, &n);

    if (poll (p, n, timeout) == -1) {
      if (errno == EINTR)
        continue;
      log_error ("control socket: poll: %s", strerror (errno));
      break;
    }
    if (p[1].revents)
      break;
    for (nfds_t i = 2; i < n; i++)
      if (p[i].revents && map[i - 2]->out)
        client_write (map[i - 2]);
      else if (p[i].revents)
        client_read (ctl, map[i - 2]);
    if (p[0].revents & POLLIN)
      control_accept (ctl);
  }
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++)
    if (ctl->clients[i].fd != -1)
      client_close (&ctl->clients[i]);
  return NULL;
}

static int
sockaddr_for (const char *path, struct sockaddr_un *sa)
{
  memset (sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (strlen (path) >= sizeof sa->sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy (sa->sun_path, path);
  return 0;
}

/* Refuse to steal the socket of a running daemon; remove a stale one. */
static int
remove_stale (const char *path, const struct sockaddr_un *sa)
{
  struct stat st;
  int fd, r;

  if (lstat (path, &st) == -1)
    return 0;
  if (!S_ISSOCK (st.st_mode)) {
    errno = EEXIST;
    return -1;
  }
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  r = connect (fd, (const struct sockaddr *) sa, sizeof *sa);
  close (fd);
  if (r == 0) {
    errno = EADDRINUSE;
    return -1;
  }
  return unlink (path);
}

static int
control_listen (const char *path)
{
  struct sockaddr_un sa;
  mode_t old;
  int fd, r;

  if (sockaddr_for (path, &sa) == -1 || remove_stale (path, &sa) == -1)
    return -1;
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  old = umask (0177);          /* socket file 0600 */
  r = bind (fd, (struct sockaddr *) &sa, sizeof sa);
  umask (old);
  if (r == -1 || listen (fd, 16) == -1) {
    int e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  return fd;
}

struct control *
control_start (const char *path, struct daemon_export *ex, size_t n,
               void *server)
{
  struct control *ctl = calloc (1, sizeof *ctl);
  int err;

  if (ctl == NULL)
    return NULL;
  ctl->exports = ex;
  ctl->n_exports = n;
  ctl->server = server;
  ctl->stop_pipe[0] = ctl->stop_pipe[1] = -1;
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++)
    ctl->clients[i].fd = -1;
  ctl->path = strdup (path);
  ctl->listen_fd = control_listen (path);
  if (ctl->path == NULL || ctl->listen_fd == -1 ||
      pipe2 (ctl->stop_pipe, O_CLOEXEC) == -1) {
    log_error ("control socket %s: %s", path, strerror (errno));
    goto fail;
  }
  err = pthread_create (&ctl->thread, NULL, control_thread, ctl);
  if (err) {
    log_error ("control socket: thread: %s", strerror (err));
    unlink (path);
    goto fail;
  }
  log_info ("control socket %s", path);
  return ctl;

fail:
  if (ctl->listen_fd >= 0)
    close (ctl->listen_fd);
  if (ctl->stop_pipe[0] >= 0) {
    close (ctl->stop_pipe[0]);
    close (ctl->stop_pipe[1]);
  }
  free (ctl->path);
  free (ctl);
  return NULL;
}

void
control_stop (struct control *ctl)
{
  if (ctl == NULL)
    return;
  if (write (ctl->stop_pipe[1], "x", 1) != 1)
    log_warn ("control socket: cannot wake the thread");
  pthread_join (ctl->thread, NULL);
  close (ctl->listen_fd);
  close (ctl->stop_pipe[0]);
  close (ctl->stop_pipe[1]);
  unlink (ctl->path);
  free (ctl->path);
  free (ctl);
}

/* ---- the client side: foliod stats / foliod flush ------------------------- */

/* "foliod_read_hits_total" -> "read hits" */
static void
pretty_name (char *out, size_t outlen, const char *name, size_t len)
{
  size_t n = 0;

  if (len > 7 && strncmp (name, "foliod_", 7) == 0) {
    name += 7;
    len -= 7;
  }
  if (len > 6 && strncmp (name + len - 6, "_total", 6) == 0)
    len -= 6;
  for (size_t i = 0; i < len && n + 1 < outlen; i++)
    out[n++] = name[i] == '_' ? ' ' : name[i];
  out[n] = '\0';
}

/* Print the Prometheus text grouped by export:
 *   export disk0
 *     read hits                        12
 * Lines without an export label are printed under "server". */
static void
print_table (char *text)
{
  char *save = NULL, *line, *exports[64];
  size_t n_exports = 0;
  char name[128];

  /* The export names, in order of appearance. */
  char *copy = strdup (text);
  if (copy == NULL)
    return;
  for (line = strtok_r (copy, "\n", &save); line;
       line = strtok_r (NULL, "\n", &save)) {
    char *brace = strstr (line, "{export=\""), *end;
    size_t i;
    if (line[0] == '#' || brace == NULL || n_exports == 64)
      continue;
    brace += 9;
    end = strchr (brace, '"');   /* names are escaped: no bare quote */
    if (end == NULL)
      continue;
    *end = '\0';
    for (i = 0; i < n_exports; i++)
      if (strcmp (exports[i], brace) == 0)
        break;
    if (i == n_exports && (exports[i] = strdup (brace)) != NULL)
      n_exports++;
  }
  free (copy);
  for (size_t i = 0; i <= n_exports; i++) {
    copy = strdup (text);
    if (copy == NULL)
      break;
    if (i < n_exports)
      printf ("export %s\n", exports[i]);
    else
      printf ("server\n");
    for (line = strtok_r (copy, "\n", &save); line;
         line = strtok_r (NULL, "\n", &save)) {
      char *brace, *value, *sp;
      if (line[0] == '#' || (value = strrchr (line, ' ')) == NULL)
        continue;
      brace = strchr (line, '{');
      sp = strchr (line, ' ');
      if (i < n_exports) {
        if (brace == NULL)
          continue;
        char want[300], labels[256] = "";
        snprintf (want, sizeof want, "{export=\"%s\"", exports[i]);
        size_t wl = strlen (want);
        if (strncmp (brace, want, wl) != 0 ||
            (brace[wl] != '}' && brace[wl] != ','))
          continue;
        pretty_name (name, sizeof name, line, (size_t) (brace - line));
        if (brace[wl] == ',') {   /* more labels: they are the value */
          size_t n = 0;
          for (const char *q = brace + wl + 1; *q && *q != '}' &&
               n + 1 < sizeof labels; q++)
            if (*q != '"')
              labels[n++] = *q == ',' ? ' ' : *q;
          labels[n] = '\0';
          printf ("  %-28s %s\n", name, labels);
          continue;
        }
      } else {
        if (brace != NULL)
          continue;
        pretty_name (name, sizeof name, line, (size_t) (sp - line));
      }
      printf ("  %-28s %s\n", name, value + 1);
    }
    free (copy);
  }
  for (size_t i = 0; i < n_exports; i++)
    free (exports[i]);
}

int
control_client (const char *path, const char *command, int prometheus)
{
  struct sockaddr_un sa;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int fd, r = -1;

  if (sockaddr_for (path, &sa) == -1 ||
      (fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) == -1) {
    fprintf (stderr, "foliod: %s: %s\n", path, strerror (errno));
    return -1;
  }
  if (connect (fd, (struct sockaddr *) &sa, sizeof sa) == -1) {
    fprintf (stderr, "foliod: cannot connect to the control socket %s: %s\n"
             "(is foliod running? give --control PATH or --config FILE)\n",
             path, strerror (errno));
    goto out;
  }
  /* A daemon that accepts but never answers (stopped, or wedged) must
   * not hang the command: stats answers at once; a flush may write back
   * a lot of data first. */
  struct timeval tv = {
    .tv_sec = strncmp (command, "flush", 5) == 0 ? CONTROL_FLUSH_WAIT_S
                                                 : CONTROL_STATS_WAIT_S,
  };
  if (setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == -1 ||
      setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == -1 ||
      write_all (fd, command, strlen (command)) == -1)
    goto io_error;
  for (;;) {
    if (cap - len < 4096) {
      char *nb = realloc (buf, cap + 65536);
      if (nb == NULL)
        goto io_error;
      buf = nb;
      cap += 65536;
    }
    ssize_t n = recv (fd, buf + len, cap - len - 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      goto io_error;
    if (n == 0)
      break;
    len += (size_t) n;
  }
  buf[len] = '\0';
  if (strncmp (buf, "ERROR", 5) == 0) {
    fprintf (stderr, "foliod: %s", buf + 6);
    goto out;
  }
  if (strncmp (command, "stats", 5) == 0 && !prometheus)
    print_table (buf);
  else
    fputs (buf, stdout);
  r = 0;
  goto out;

io_error:
  fprintf (stderr, "foliod: control socket %s: %s\n", path,
           errno == EAGAIN || errno == EWOULDBLOCK ? "no answer in time"
                                                  : strerror (errno));
out:
  free (buf);
  close (fd);
  return r;
}
