/* The server object: configuration, exports, the done list (executed
 * requests back to the loop), shutdown, counters. */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "foliod/export.h"
#include "server/internal.h"
#include "server/log.h"
#include "server/tls.h"

#define SHUTDOWN_GRACE_S 30.0 /* then connections are dropped */

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

  log_warn ("shutdown: clients still busy after %.0f s, disconnecting",
            SHUTDOWN_GRACE_S);
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

/* Worker side (the pool's done callback): hand an executed request back
 * to the loop thread. */
static void
server_req_done (void *opaque, struct req *r)
{
  struct server *s = opaque;

  r->next = NULL;
  lock_or_die (&s->done_lock);
  if (s->done_tail)
    s->done_tail->next = r;
  else
    s->done_head = r;
  s->done_tail = r;
  unlock_or_die (&s->done_lock);
  ev_async_send (s->loop, &s->done_async);
}

/* Loop side: take every executed request and queue its reply (or drop it
 * if its connection is gone), then send. */
static void
server_done_cb (struct ev_loop *loop, ev_async *w, int revents)
{
  struct server *s = w->data;
  struct req *r, *next;

  lock_or_die (&s->done_lock);
  r = s->done_head;
  s->done_head = s->done_tail = NULL;
  unlock_or_die (&s->done_lock);

  for (; r; r = next) {
    struct conn *c = r->conn;

    next = r->next;
    /* A parked miss whose data came: answer it from them here if the
     * cache lets us without waiting, else on a worker (which also reads
     * again after a failed fetch, with the backing's retries). */
    if (r->fetch == REQ_FETCHED && c->state != CONN_DEAD &&
        !(r->fetch_err == 0 && req_try_execute (r))) {
      if (s->pool.workers) {
        pool_submit (&s->pool, r);
        continue;
      }
      r->error = NBD_EIO;       /* server_free: no workers any more */
      r->errmsg = NULL;
      req_build_reply (r);
    }
    if (r->fetch == REQ_FETCHED && c->state != CONN_DEAD)
      STAT_ADD (s, requests_parked, 1);
    r->fetch = REQ_FETCH_NONE;
    assert (c->nworker > 0);
    c->nworker--;
    if (c->state == CONN_DEAD) {
      conn_req_put (c, r);
      conn_maybe_free (c);
    }
    else
      conn_queue_reply (c, r);
  }
  if (s->pool.workers)
    pool_submit_flush (&s->pool);
  conn_flush_pending (s);
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

  pthread_mutex_init (&s->done_lock, NULL);
  ev_async_init (&s->done_async, server_done_cb);
  s->done_async.data = s;
  ev_async_start (loop, &s->done_async);
  ev_timer_init (&s->shutdown_timer, server_shutdown_timeout_cb,
                 SHUTDOWN_GRACE_S, 0.);
  s->shutdown_timer.data = s;
  ev_idle_init (&s->done_idle, server_done_idle_cb);
  s->done_idle.data = s;

  if (pool_start (&s->pool, s->cfg.workers, server_req_done, s) < 0) {
    int e = errno;
    ev_async_stop (loop, &s->done_async);
    pthread_mutex_destroy (&s->done_lock);
    free (s);
    errno = e;
    return NULL;
  }
  return s;
}

int
server_add_export (struct server *s, struct export *e)
{
  struct export **n;

  for (size_t i = 0; i < s->nexports; i++)
    if (strcmp (s->exports[i]->name, e->name) == 0) {
      errno = EEXIST;
      return -1;
    }
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  n = realloc (s->exports, (s->nexports + 1) * sizeof *n);
  if (!n)
    return -1;
  s->exports = n;
  s->exports[s->nexports++] = e;
  return 0;
}

struct export *
server_find_export (struct server *s, const char *name)
{
  if (!*name)
    return s->nexports ? s->exports[0] : NULL; /* the default export */
  for (size_t i = 0; i < s->nexports; i++)
    if (strcmp (s->exports[i]->name, name) == 0)
      return s->exports[i];
  return NULL;
}

/* ---- connections per client (max_connections_per_client) ---------------- */

static struct client_count *
server_client_find (struct server *s, const char *key)
{
  for (struct client_count *k = s->clients; k; k = k->next)
    if (strcmp (k->key, key) == 0)
      return k;
  return NULL;
}

unsigned
server_client_count (struct server *s, const char *key)
{
  struct client_count *k = server_client_find (s, key);

  return k ? k->n : 0;
}

/* Count c under key until server_client_gone.  0 or -1 (no memory). */
int
server_client_add (struct server *s, struct conn *c, const char *key)
{
  struct client_count *k = server_client_find (s, key);

  if (!k) {
    if (!(k = calloc (1, sizeof *k)))
      return -1;
    snprintf (k->key, sizeof k->key, "%s", key);
    k->next = s->clients;
    s->clients = k;
  }
  k->n++;
  snprintf (c->client_key, sizeof c->client_key, "%s", key);
  c->client_key_set = true;
  return 0;
}

void
server_client_gone (struct conn *c)
{
  struct server *s = c->srv;
  struct client_count **p = &s->clients, *k;

  if (!c->client_key_set)
    return;
  c->client_key_set = false;
  while ((k = *p) && strcmp (k->key, c->client_key) != 0)
    p = &k->next;
  if (k && --k->n == 0) {
    *p = k->next;
    free (k);
  }
}

/* A connection was freed: maybe the shutdown is complete. */
void
server_conn_gone (struct server *s)
{
  if (s->shutting_down && !s->conns && s->shutdown_done)
    ev_idle_start (s->loop, &s->done_idle);
}

void
server_shutdown (struct server *s, void (*done) (void *), void *opaque)
{
  struct conn *c, *next;
  bool force = s->shutting_down; /* the second call drops everyone */

  s->shutting_down = true;
  s->forced |= force;
  s->shutdown_done = done;
  s->shutdown_opaque = opaque;
  server_stop_accepting (s);
  if (!force)
    ev_timer_start (s->loop, &s->shutdown_timer);
  log_info ("shutdown%s: %u connection(s) open", force ? " (forced)" : "",
            s->nconns);
  for (c = s->conns; c; c = next) {
    next = c->next;
    conn_begin_shutdown (c, force);
  }
  conn_flush_pending (s);
  server_conn_gone (s); /* maybe nobody was connected */
}

/* Read misses parked on the backing (no worker holds them) end within
 * the backing's request timeout; their completions come to the done
 * list, which the loop no longer takes: wait for them here, bounded
 * anyway. */
#define SERVER_PARKED_WAIT_MS 120000u

static bool
server_any_parked (struct server *s)
{
  for (struct conn *c = s->conns; c; c = c->next)
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
    server_done_cb (s->loop, &s->done_async, 0);
  }
}

void
server_free (struct server *s)
{
  struct conn *c, *next;

  if (!s)
    return;
  server_stop_accepting (s);
  /* Workers finish what they hold; their completions are then taken
   * by hand since the loop no longer runs. */
  pool_stop (&s->pool);
  server_done_cb (s->loop, &s->done_async, 0);
  server_wait_parked (s);
  for (c = s->conns; c; c = next) {
    next = c->next;
    conn_begin_shutdown (c, true);
  }
  conn_flush_pending (s);
  ev_async_stop (s->loop, &s->done_async);
  ev_timer_stop (s->loop, &s->shutdown_timer);
  ev_idle_stop (s->loop, &s->done_idle);
  pthread_mutex_destroy (&s->done_lock);
  tls_ctx_free (s->tls_ctx);
  while (s->clients) {
    struct client_count *k = s->clients;
    s->clients = k->next;
    free (k);
  }
  free (s->exports);
  free (s);
}

void
server_get_stats (struct server *s, struct server_stats *st)
{
  st->connections_now = STAT_GET (s, connections_now);
  st->connections_total = STAT_GET (s, connections_total);
  st->connections_refused = STAT_GET (s, connections_refused);
  st->handshakes_failed = STAT_GET (s, handshakes_failed);
  st->requests = STAT_GET (s, requests);
  st->request_errors = STAT_GET (s, request_errors);
  st->requests_inline = STAT_GET (s, requests_inline);
  st->requests_parked = STAT_GET (s, requests_parked);
  st->bytes_read = STAT_GET (s, bytes_read);
  st->bytes_written = STAT_GET (s, bytes_written);
}
