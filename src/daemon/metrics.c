/* metrics-listen = ADDR:PORT: the statistics over HTTP, for Prometheus.
 *
 * GET (or HEAD) /metrics answers the text of `foliod stats --prometheus`
 * (stats_text, the control socket's code); any other path is 404, any
 * other method 405.  Off unless configured; an address without a host
 * binds 127.0.0.1, since the numbers name the exports and their load.
 *
 * Why libmicrohttpd rather than a few lines of HTTP on the event loop:
 * a scraper is a network client like any other and HTTP parsing is where
 * servers get hurt; a kept library does it.  It runs in its own thread
 * (metrics_thread, driving MHD with MHD_run_wait) so that a slow or
 * hostile scraper costs the event loop nothing, and reads the counters
 * the way the control thread does (atomic loads, the cache lock for
 * cached bytes).
 *
 * Bounds: METRICS_MAX_CONNECTIONS connections at once, at most
 * METRICS_MAX_PER_IP from one address (more are refused at accept),
 * METRICS_TIMEOUT_S of inactivity closes one, METRICS_CONN_MEMORY bytes
 * of request buffer each, and a reply of at most STATS_BUF_SIZE bytes:
 * about 1 MiB in all, whatever the scrapers do.
 *
 * Slowloris: MHD's timeout counts inactivity only, so a client sending
 * a header byte every few seconds would hold its connection for ever.
 * Each request therefore has a total deadline, METRICS_DEADLINE_S from
 * the accept or from the end of the connection's previous request; the
 * thread shuts down the socket of any connection past it (MHD then sees
 * the end of the stream and closes it).  The per-address cap is half the
 * connections, so that clients from two addresses leave room at once,
 * and the deadline frees the rest within METRICS_DEADLINE_S.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "foliod/util.h"
#include "daemon/daemon.h"
#include "foliod/log.h"

#define METRICS_MAX_CONNECTIONS 16
#define METRICS_MAX_PER_IP 4
#define METRICS_TIMEOUT_S 10
#define METRICS_DEADLINE_S 10
#define METRICS_TICK_MS 250      /* deadline checks; stop latency */
#define METRICS_CONN_MEMORY (16 * 1024)
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* One per open connection, its MHD socket context; only the metrics
 * thread touches them (MHD calls back from MHD_run_wait there). */
struct metrics_conn {
  struct metrics_conn *next, **pprev;
  int fd;
  uint64_t deadline_ms;          /* now_ms() past which it is cut */
  bool cut;
};

struct metrics {
  struct MHD_Daemon *mhd;
  struct daemon_export *exports;
  size_t n_exports;
  void *server;
  pthread_t thread;
  atomic_bool stop;
  struct metrics_conn *conns;
};

static enum MHD_Result
metrics_reply (struct MHD_Connection *conn, unsigned status, char *body,
               size_t len)
{
  struct MHD_Response *resp =
    MHD_create_response_from_buffer (len, body, MHD_RESPMEM_MUST_FREE);
  enum MHD_Result r;

  if (resp == NULL) {
    free (body);
    return MHD_NO;               /* MHD closes the connection */
  }
  if (status == MHD_HTTP_OK)
    MHD_add_response_header (resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                             METRICS_CONTENT_TYPE);
  else if (status == MHD_HTTP_METHOD_NOT_ALLOWED)
    MHD_add_response_header (resp, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
  r = MHD_queue_response (conn, status, resp);
  MHD_destroy_response (resp);
  return r;
}

static enum MHD_Result
metrics_reply_text (struct MHD_Connection *conn, unsigned status,
                    const char *text)
{
  char *body = strdup (text);

  if (body == NULL)
    return MHD_NO;
  return metrics_reply (conn, status, body, strlen (body));
}

/* Answered on the first call, before any request body: GET and HEAD
 * have none worth reading (MHD discards it). */
static enum MHD_Result
metrics_request (void *cls, struct MHD_Connection *conn, const char *url,
                 const char *method, const char *version,
                 const char *upload_data, size_t *upload_data_size,
                 void **req_cls)
{
  struct metrics *m = cls;
  size_t len = 0;
  char *body;

  if (strcmp (method, MHD_HTTP_METHOD_GET) != 0 &&
      strcmp (method, MHD_HTTP_METHOD_HEAD) != 0)
    return metrics_reply_text (conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                               "only GET /metrics\n");
  if (strcmp (url, "/metrics") != 0)
    return metrics_reply_text (conn, MHD_HTTP_NOT_FOUND,
                               "not found: try /metrics\n");
  body = stats_text (m->exports, m->n_exports, m->server, 0, &len);
  if (body == NULL)
    return MHD_NO;
  return metrics_reply (conn, MHD_HTTP_OK, body, len);
}

static void
metrics_conn_notify (void *cls, struct MHD_Connection *conn, void **ctx,
                     enum MHD_ConnectionNotificationCode toe)
{
  struct metrics *m = cls;
  struct metrics_conn *mc = *ctx;

  if (toe == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info (conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    /* Without memory or its socket, the connection has no deadline but
     * still the inactivity timeout: as before. */
    if (ci == NULL || (mc = calloc (1, sizeof *mc)) == NULL)
      return;
    mc->fd = ci->connect_fd;
    mc->deadline_ms = now_ms () + METRICS_DEADLINE_S * 1000u;
    mc->next = m->conns;
    if (mc->next)
      mc->next->pprev = &mc->next;
    mc->pprev = &m->conns;
    m->conns = mc;
    *ctx = mc;
  } else if (toe == MHD_CONNECTION_NOTIFY_CLOSED && mc) {
    *mc->pprev = mc->next;
    if (mc->next)
      mc->next->pprev = mc->pprev;
    free (mc);
    *ctx = NULL;
  }
}

/* A request answered: the next one on a kept-alive connection gets a
 * deadline of its own. */
static void
metrics_request_done (void *cls, struct MHD_Connection *conn, void **req_cls,
                      enum MHD_RequestTerminationCode toe)
{
  const union MHD_ConnectionInfo *ci =
    MHD_get_connection_info (conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  struct metrics_conn *mc = ci ? ci->socket_context : NULL;

  if (mc && !mc->cut)
    mc->deadline_ms = now_ms () + METRICS_DEADLINE_S * 1000u;
}

static void
metrics_cut_late (struct metrics *m)
{
  uint64_t now = now_ms ();

  for (struct metrics_conn *mc = m->conns; mc; mc = mc->next)
    if (!mc->cut && now >= mc->deadline_ms) {
      mc->cut = true;
      log_debug ("metrics: a request took over %d s: closing it",
                 METRICS_DEADLINE_S);
      shutdown (mc->fd, SHUT_RDWR);
    }
}

static void *
metrics_thread (void *arg)
{
  struct metrics *m = arg;

  while (!atomic_load (&m->stop)) {
    MHD_run_wait (m->mhd, METRICS_TICK_MS);
    metrics_cut_late (m);
  }
  return NULL;
}

/* At debug level: MHD logs every connection refused over the limits,
 * and a flood of them must not flood the journal (metrics_start logs a
 * failure to listen itself). */
static void
metrics_log (void *cls, const char *fmt, va_list ap)
{
  char msg[512];
  size_t n;

  vsnprintf (msg, sizeof msg, fmt, ap);
  n = strlen (msg);
  if (n > 0 && msg[n - 1] == '\n')
    msg[n - 1] = '\0';
  log_debug ("metrics: %s", msg);
}

struct metrics *
metrics_start (const char *addr, struct daemon_export *ex, size_t n,
               void *server)
{
  struct metrics *m = calloc (1, sizeof *m);
  struct metrics_addr a;
  char err[512];
  unsigned flags = MHD_USE_EPOLL | MHD_USE_ERROR_LOG;
  int rc;

  if (m == NULL)
    return NULL;
  if (metrics_addr_parse (addr, &a, err, sizeof err) == -1) {
    log_error ("metrics-listen: %s", err);
    free (m);
    return NULL;
  }
  if (a.ss.ss_family == AF_INET6)
    flags |= MHD_USE_IPv6;
  m->exports = ex;
  m->n_exports = n;
  m->server = server;
  m->mhd = MHD_start_daemon (flags, 0, NULL, NULL, metrics_request, m,
             MHD_OPTION_EXTERNAL_LOGGER, metrics_log, NULL,
             MHD_OPTION_SOCK_ADDR, (const struct sockaddr *) &a.ss,
             MHD_OPTION_CONNECTION_LIMIT, (unsigned) METRICS_MAX_CONNECTIONS,
             MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned) METRICS_MAX_PER_IP,
             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) METRICS_TIMEOUT_S,
             MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) METRICS_CONN_MEMORY,
             MHD_OPTION_NOTIFY_CONNECTION, metrics_conn_notify, m,
             MHD_OPTION_NOTIFY_COMPLETED, metrics_request_done, m,
             MHD_OPTION_END);
  if (m->mhd == NULL) {
    /* MHD does not promise errno: say what was tried. */
    log_error ("metrics-listen %s: cannot listen (address in use or not "
               "local?)", a.text);
    free (m);
    return NULL;
  }
  rc = thread_start (&m->thread, metrics_thread, m, "metrics");
  if (rc) {
    log_error ("metrics-listen %s: cannot start a thread: %s", a.text,
               strerror (rc));
    MHD_stop_daemon (m->mhd);
    free (m);
    return NULL;
  }
  log_info ("metrics on http://%s/metrics", a.text);
  return m;
}

void
metrics_stop (struct metrics *m)
{
  if (m == NULL)
    return;
  atomic_store (&m->stop, true);
  pthread_join (m->thread, NULL);
  MHD_stop_daemon (m->mhd);     /* closes the rest: notify frees each */
  free (m);
}
