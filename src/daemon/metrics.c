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
 * (MHD's internal polling thread) so that a slow or hostile scraper
 * costs the event loop nothing, and reads the counters the way the
 * control thread does (atomic loads, the cache lock for cached bytes).
 *
 * Bounds: METRICS_MAX_CONNECTIONS connections at once, at most
 * METRICS_MAX_PER_IP from one address (more are refused at accept),
 * METRICS_TIMEOUT_S of inactivity closes one, METRICS_CONN_MEMORY bytes
 * of request buffer each, and a reply of at most STATS_BUF_SIZE bytes:
 * about 1 MiB in all, whatever the scrapers do.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <netdb.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include <microhttpd.h>

#include "daemon/daemon.h"
#include "server/log.h"

#define METRICS_MAX_CONNECTIONS 8
#define METRICS_MAX_PER_IP 4
#define METRICS_TIMEOUT_S 10
#define METRICS_CONN_MEMORY (16 * 1024)
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

struct metrics {
  struct MHD_Daemon *mhd;
  struct daemon_export *exports;
  size_t n_exports;
  void *server;
};

int
metrics_addr_parse (const char *s, struct metrics_addr *a, char *err,
                    size_t errlen)
{
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_NUMERICSERV };
  struct addrinfo *res;
  char host[256], port[16];
  int r;

  if (parse_listen (s, host, sizeof host, port, sizeof port) == -1) {
    snprintf (err, errlen, "bad address '%s': expected HOST:PORT, "
              "[IPV6]:PORT or :PORT", s);
    return -1;
  }
  if (host[0] == '\0')
    strcpy (host, "127.0.0.1");
  r = getaddrinfo (host, port, &hints, &res);
  if (r != 0) {
    snprintf (err, errlen, "bad address '%s': %s", s, gai_strerror (r));
    return -1;
  }
  memcpy (&a->ss, res->ai_addr, res->ai_addrlen);
  a->len = res->ai_addrlen;
  snprintf (a->text, sizeof a->text, "%s%s%s:%s",
            res->ai_family == AF_INET6 ? "[" : "", host,
            res->ai_family == AF_INET6 ? "]" : "", port);
  freeaddrinfo (res);
  return 0;
}

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
  sigset_t all, old;
  unsigned flags = MHD_USE_AUTO_INTERNAL_THREAD | MHD_USE_ERROR_LOG;

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
  /* MHD's thread inherits a full signal mask: signals belong to the
   * event loop (thread_start's policy, which MHD's own pthread_create
   * cannot use).  MHD names its thread itself: "MHD-single". */
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  m->mhd = MHD_start_daemon (flags, 0, NULL, NULL, metrics_request, m,
             MHD_OPTION_EXTERNAL_LOGGER, metrics_log, NULL,
             MHD_OPTION_SOCK_ADDR, (const struct sockaddr *) &a.ss,
             MHD_OPTION_CONNECTION_LIMIT, (unsigned) METRICS_MAX_CONNECTIONS,
             MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned) METRICS_MAX_PER_IP,
             MHD_OPTION_CONNECTION_TIMEOUT, (unsigned) METRICS_TIMEOUT_S,
             MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t) METRICS_CONN_MEMORY,
             MHD_OPTION_END);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (m->mhd == NULL) {
    log_error ("metrics-listen %s: cannot listen: %s", a.text,
               strerror (errno));
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
  MHD_stop_daemon (m->mhd);
  free (m);
}
