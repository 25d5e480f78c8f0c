/* The server object, the top of src/server: configuration, creation (the
 * worker pool, the loops), shutdown and free, counters.  The export list
 * and the per-client counts are in admit.c. */
#define _GNU_SOURCE /* sched_getaffinity */
#include <assert.h>
#include <errno.h>
#include <sched.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/internal.h"
#include "server/log.h"
#include "server/tls.h"

#define SHUTDOWN_GRACE_S 30 /* then connections are dropped */

void
server_config_default (struct server_config *cfg)
{
  memset (cfg, 0, sizeof *cfg);
  cfg->workers = 16;   /* a miss on a remote holds its worker a round trip */
  cfg->max_connections = 128;
  cfg->handshake_timeout_s = 10;
  cfg->max_inflight = 64;
  /* Enough for every multi-conn client we know (nbdcopy: 4, the kernel:
   * one per CPU) while one source cannot take all max_connections. */
  cfg->max_connections_per_client = 32;
  /* One 64 MiB request, or two 32 MiB ones in flight (one executing
   * while the next arrives): throughput for the largest requests. */
  cfg->max_conn_buffer = 64u << 20;
  cfg->max_buffer_total = 1ull << 30;
  cfg->tls_mode = SERVER_TLS_OFF;
}

static void
server_shutdown_timeout_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct server *s = w->data;

  log_warn ("shutdown: clients still busy after %u s, disconnecting",
            s->cfg.shutdown_grace_s);
  server_shutdown (s, s->shutdown_done, s->shutdown_opaque);
}

static void
server_done_idle_cb (struct ev_loop *loop, ev_idle *w, int revents)
{
  struct server *s = w->data;
  void (*done) (void *) = s->shutdown_done;

  ev_idle_stop (loop, w);
  ev_timer_stop (loop, &s->shutdown_timer);
  s->shutdown_done = NULL;
  /* No connection is left, so the workers are idle: join them now, before
   * the daemon closes the exports, so that per-thread state the cache
   * keeps (bounce buffers) is released while the cache still exists. */
  pool_stop (&s->pool);
  if (done)
    done (s->shutdown_opaque);
}

/* Main thread: a loop lost its last connection during a shutdown. */
static void
server_gone_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct server *s = w->data;

  if (s->shutting_down && s->shutdown_done && loops_all_gone (s))
    ev_idle_start (s->loop, &s->done_idle);
  handover_check (s);
}

/* The default number of loops: one per CPU this process may run on, as
 * a connection keeps a core busy, but not past SERVER_LOOPS_DEFAULT_MAX
 * (beyond that the workers, the cache and the network card are what
 * limit, and each loop costs a thread and a buffer share). */
#define SERVER_LOOPS_DEFAULT_MAX 8

unsigned
server_default_loops (void)
{
  cpu_set_t set;
  int n;

  if (sched_getaffinity (0, sizeof set, &set) != 0)
    return 1;
  n = CPU_COUNT (&set);
  if (n < 1)
    return 1;
  return n > SERVER_LOOPS_DEFAULT_MAX ? SERVER_LOOPS_DEFAULT_MAX
    : (unsigned) n;
}

struct server *
server_new (struct ev_loop *loop, const struct server_config *cfg)
{
  struct server *s = calloc (1, sizeof *s);
  struct server_config def;

  if (!s)
    return NULL;
  server_config_default (&def);
  s->loop = loop;
  s->cfg = *cfg;
  if (!s->cfg.workers)
    s->cfg.workers = def.workers;
  if (!s->cfg.max_connections)
    s->cfg.max_connections = def.max_connections;
  if (!s->cfg.handshake_timeout_s)
    s->cfg.handshake_timeout_s = def.handshake_timeout_s;
  if (!s->cfg.max_inflight)
    s->cfg.max_inflight = def.max_inflight;
  if (!s->cfg.max_connections_per_client)
    s->cfg.max_connections_per_client = def.max_connections_per_client;
  if (!s->cfg.max_conn_buffer)
    s->cfg.max_conn_buffer = def.max_conn_buffer;
  if (!s->cfg.max_buffer_total)
    s->cfg.max_buffer_total = def.max_buffer_total;
  if (!s->cfg.loops)
    s->cfg.loops = server_default_loops ();
  if (!s->cfg.shutdown_grace_s)
    s->cfg.shutdown_grace_s = SHUTDOWN_GRACE_S;

  pthread_mutex_init (&s->clients_lock, NULL);
  pthread_mutex_init (&s->tls_lock, NULL);
  ev_async_init (&s->gone_async, server_gone_cb);
  s->gone_async.data = s;
  ev_async_start (loop, &s->gone_async);
  ev_timer_init (&s->shutdown_timer, server_shutdown_timeout_cb,
                 s->cfg.shutdown_grace_s, 0.);
  s->shutdown_timer.data = s;
  ev_idle_init (&s->done_idle, server_done_idle_cb);
  s->done_idle.data = s;
  handover_init (s);

  if (pool_start (&s->pool, s->cfg.workers, loop_req_done, s) < 0
      || loops_start (s) < 0) {
    int e = errno;
    server_free (s);
    errno = e;
    return NULL;
  }
  return s;
}

void
server_shutdown (struct server *s, void (*done) (void *), void *opaque)
{
  bool force = s->shutting_down; /* the second call drops everyone */

  s->forced |= force;           /* before the post: the loops read it */
  atomic_store (&s->shutting_down, true);
  s->shutdown_done = done;
  s->shutdown_opaque = opaque;
  server_stop_accepting (s);
  if (!force)
    ev_timer_start (s->loop, &s->shutdown_timer);
  log_info ("shutdown%s: %u connection(s) open", force ? " (forced)" : "",
            atomic_load (&s->nconns));
  for (unsigned i = 0; i < s->nloops; i++)
    loop_post (&s->loops[i], LOOP_CMD_SHUTDOWN);
  /* Maybe nobody was connected; else the last loop to empty says so. */
  server_gone_cb (s->loop, &s->gone_async, 0);
}

/* Read misses parked on the backing (no worker holds them) end within
 * the backing's request timeout; their completions come to the done
 * list, which the loop no longer takes: wait for them here, bounded
 * anyway. */
#define SERVER_PARKED_WAIT_MS 120000u

static bool
server_any_parked (struct server *s)
{
  for (unsigned i = 0; i < s->nloops; i++)
    for (struct conn *c = s->loops[i].conns; c; c = c->next)
      if (c->nworker > 0)
        return true;
  return false;
}

static void
server_wait_parked (struct server *s)
{
  struct timespec ms = { 0, 1000000 };

  for (unsigned i = 0; server_any_parked (s); i++) {
    if (i == SERVER_PARKED_WAIT_MS) {
      log_warn ("shutdown: read misses still parked on a backing");
      return;
    }
    nanosleep (&ms, NULL);
    for (unsigned k = 0; k < s->nloops; k++)
      loop_take_done (&s->loops[k]);
  }
}

void
server_free (struct server *s)
{
  if (!s)
    return;
  server_stop_accepting (s);
  /* The loop threads leave first; from here on this thread runs
   * everything.  Workers finish what they hold; their completions are
   * then taken by hand. */
  if (s->loops)
    loops_stop (s);
  pool_stop (&s->pool);
  for (unsigned i = 0; i < s->nloops; i++)
    loop_take_done (&s->loops[i]);
  server_wait_parked (s);
  for (unsigned i = 0; i < s->nloops; i++) {
    struct sloop *lp = &s->loops[i];
    struct conn *c, *next;

    for (c = lp->conns; c; c = next) {
      next = c->next;
      conn_begin_shutdown (c, true);
    }
    conn_flush_pending (lp);
  }
  if (s->loops)
    loops_free (s);
  ev_async_stop (s->loop, &s->gone_async);
  ev_timer_stop (s->loop, &s->shutdown_timer);
  ev_idle_stop (s->loop, &s->done_idle);
  pthread_mutex_destroy (&s->clients_lock);
  pthread_mutex_destroy (&s->tls_lock);
  handover_free (s);
  tls_ctx_free (s->tls_ctx);
  while (s->clients) {
    struct client_count *k = s->clients;
    s->clients = k->next;
    free (k);
  }
  free (s->exports);
  free (s);
}

#define SERVER_SUM(s, field)                                       \
  ({ uint64_t sum_ = 0;                                              \
     for (unsigned i_ = 0; i_ < (s)->nloops; i_++)                   \
       sum_ += STAT_GET (&(s)->loops[i_], field);                    \
     sum_; })

void
server_get_stats (struct server *s, struct server_stats *st)
{
  st->connections_now = SERVER_SUM (s, connections_now);
  st->connections_total = SERVER_SUM (s, connections_total);
  st->connections_refused = SERVER_SUM (s, connections_refused);
  st->handshakes_failed = SERVER_SUM (s, handshakes_failed);
  st->requests = SERVER_SUM (s, requests);
  st->request_errors = SERVER_SUM (s, request_errors);
  st->requests_inline = SERVER_SUM (s, requests_inline);
  st->requests_parked = SERVER_SUM (s, requests_parked);
  st->bytes_read = SERVER_SUM (s, bytes_read);
  st->bytes_written = SERVER_SUM (s, bytes_written);
}

unsigned
server_loop_count (struct server *s)
{
  return s->nloops;
}

void
server_get_loop_stats (struct server *s, unsigned i, struct server_loop_stats *st)
{
  struct sloop *lp = &s->loops[i];

  st->connections_now = STAT_GET (lp, connections_now);
  st->connections_total = STAT_GET (lp, connections_total);
  st->requests = STAT_GET (lp, requests);
}
