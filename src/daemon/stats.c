/* The statistics: every export's counters and the server's, as the
 * Prometheus text of `foliod stats --prometheus` and of GET /metrics, as
 * the table of `foliod stats`, and as log lines (SIGUSR1).
 *
 * One reading of the counters (export_values) feeds all three forms, so
 * they never disagree about what a number means.  The counters are
 * atomics the I/O threads update (STAT_ADD); any thread may read them,
 * which is what the control and metrics threads do.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/daemon.h"
#include "foliod/log.h"
#include "server/server.h"

enum metric_id {
  M_HITS, M_MISSES, M_CLIENT_READ, M_CLIENT_WRITE, M_WRITEBACK, M_WA,
  M_DIRTY, M_CACHED, M_PASSTHROUGH, M_PT_READ_OPS, M_PT_READ_BYTES,
  M_PT_WRITE_OPS, M_PT_WRITE_BYTES, M_BACKING_READ, M_BACKING_ERRORS,
  M_RECONNECTS, M_RETRIES, M_UNSTABLE, M_EVICTIONS, M_FLUSHES, M_CLIENT_FLUSHES,
  M_FLUSH_PASSES, M_SIZE, M_STORE_DIRTY, M_RA_BYTES, M_RA_WINDOWS,
  M_RA_HITS, M_RA_WASTED, M_BACKING_WRITE_OPS, M_BACKING_WRITE_SECONDS,
  M_BACKING_FLUSH_SECONDS, M_FLUSH_SECONDS, M_DIRTY_BACKGROUND, M_DIRTY_LIMIT,
  M_IN_DOUBT, M_STORE_LOG_USED, M_STORE_LOG_SIZE, M_STORE_RECORDS,
  M_STORE_SYNCS, M_STORE_SYNC_SECONDS, M_STORE_RECLAIMS, M_STORE_RECLAIMED,
  M_STORE_COMPACTIONS, M_PT_UNFLUSHED, M_PT_LOST, M_LOSSES, M_DOUBT_CLEARS,
  M_ABANDONED, M_RELEASED, M_FENCED,
  M_COUNT
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
  [M_ABANDONED] = { "foliod_backing_requests_abandoned_total", "counter",
                    "Requests to an rbd: backing given up on at "
                    "request-timeout (librbd cannot cancel them; it keeps "
                    "their buffers until the cluster answers)." },
  [M_IN_DOUBT] = { "foliod_backing_writes_in_doubt", "gauge",
                   "Writes to an nbd: backing given up on that the remote "
                   "may still carry out (1 for those a previous run left in "
                   "a persistent store): FLUSH fails until 'foliod "
                   "clear-doubt' (foliod(8))." },
  [M_PT_UNFLUSHED] = { "foliod_passthrough_unflushed_writes", "gauge",
                       "Passthrough writes and zeroes the backing has "
                       "acknowledged but not yet flushed." },
  [M_PT_LOST] = { "foliod_passthrough_lost_writes", "gauge",
                  "Passthrough writes the backing may have lost before a "
                  "flush (1 for those a previous run lost, kept in a "
                  "persistent store): not 0, every FLUSH fails with EIO "
                  "until 'foliod clear-doubt' (foliod(8))." },
  [M_LOSSES] = { "foliod_backing_losses_total", "counter",
                 "Times the backing may have lost writes it had acknowledged "
                 "(a remote connection ended, a flush or FUA write failed) "
                 "while some were not flushed: the cache wrote its copies "
                 "again; passthrough ones are counted lost." },
  [M_DOUBT_CLEARS] = { "foliod_doubt_clears_total", "counter",
                       "'foliod clear-doubt' runs that cleared writes in "
                       "doubt." },
  [M_FENCED] = { "foliod_fenced", "gauge",
                 "1: the backing no longer owns its image (its lock was "
                 "broken, the image changed under it), or a previous run's "
                 "store says so: reads, writes and FLUSH fail, nothing is "
                 "written back (foliod(8), Lost lock)." },
  [M_RELEASED] = { "foliod_export_released", "gauge",
                   "1: handed to another host by 'foliod release', served "
                   "read-only; 2: the same, no longer served; 0: not." },
  [M_UNSTABLE] = { "foliod_unstable_bytes", "gauge",
                   "Bytes written to a remote backing, not yet flushed by it." },
  [M_EVICTIONS] = { "foliod_evictions_total", "counter",
                    "Clean folios evicted to make room." },
  [M_FLUSHES] = { "foliod_backing_flushes_total", "counter",
                  "Flushes sent to the backing." },
  [M_CLIENT_FLUSHES] = { "foliod_flushes_total", "counter",
                         "Client flushes that wrote back (FLUSH with "
                         "flush=backing, and FUA without native FUA)." },
  [M_FLUSH_PASSES] = { "foliod_flush_passes_total", "counter",
                       "Writeback passes run for them: concurrent flushes "
                       "share one." },
  [M_SIZE] = { "foliod_export_size_bytes", "gauge", "Size of the export." },
  [M_STORE_DIRTY] = { "foliod_store_dirty_bytes", "gauge",
                      "Dirty bytes kept in a persistent store (pmem): they "
                      "survive a crash (0 with the ram store)." },
  [M_RA_BYTES] = { "foliod_readahead_bytes_total", "counter",
                   "Bytes readahead brought into the cache ahead of "
                   "sequential reads." },
  [M_RA_WINDOWS] = { "foliod_readahead_windows_total", "counter",
                     "Readahead windows issued." },
  [M_RA_HITS] = { "foliod_readahead_hits_total", "counter",
                  "Folios readahead brought that a client then read." },
  [M_RA_WASTED] = { "foliod_readahead_wasted_total", "counter",
                    "Folios readahead brought that were evicted unread." },
  [M_BACKING_WRITE_OPS] = { "foliod_backing_write_ops_total", "counter",
                            "Writes sent to the backing (writeback and "
                            "passthrough)." },
  /* The _seconds_total counters are kept in ns (seconds_metric). */
  [M_BACKING_WRITE_SECONDS] = { "foliod_backing_write_seconds_total",
                                "counter",
                                "Time the backing took for those writes; "
                                "over foliod_backing_write_ops_total, their "
                                "mean latency." },
  [M_BACKING_FLUSH_SECONDS] = { "foliod_backing_flush_seconds_total",
                                "counter",
                                "Time the backing took for its flushes; over "
                                "foliod_backing_flushes_total, their mean "
                                "latency." },
  [M_FLUSH_SECONDS] = { "foliod_flush_seconds_total", "counter",
                        "Time client flushes waited (writeback and the "
                        "backing's flush); over foliod_flushes_total, "
                        "their mean latency." },
  [M_DIRTY_BACKGROUND] = { "foliod_dirty_background_bytes", "gauge",
                           "Dirty bytes above which writeback starts "
                           "(dirty-background, or the whole-export "
                           "minimum)." },
  [M_DIRTY_LIMIT] = { "foliod_dirty_limit_bytes", "gauge",
                      "Dirty bytes above which writers wait for writeback "
                      "(dirty-limit, or the whole-export minimum)." },
  [M_STORE_LOG_USED] = { "foliod_store_log_used_bytes", "gauge",
                         "Bytes of the store's log in use (ssd store; 0 "
                         "for the others)." },
  [M_STORE_LOG_SIZE] = { "foliod_store_log_size_bytes", "gauge",
                         "Size of the store's log (ssd store)." },
  [M_STORE_RECORDS] = { "foliod_store_log_records_total", "counter",
                        "Block records the store appended to its log "
                        "(ssd store)." },
  [M_STORE_RECLAIMS] = { "foliod_store_log_reclaims_total", "counter",
                         "Moves of the start of the store's log (ssd "
                         "store)." },
  [M_STORE_RECLAIMED] = { "foliod_store_log_reclaimed_bytes_total",
                          "counter", "Log bytes those moves freed (ssd "
                          "store)." },
  [M_STORE_COMPACTIONS] = { "foliod_store_log_compactions_total", "counter",
                            "Moves that wrote every dirty block again "
                            "(ssd store)." },
  [M_STORE_SYNCS] = { "foliod_store_syncs_total", "counter",
                      "Syncs of the store that wrote something (ssd "
                      "store)." },
  [M_STORE_SYNC_SECONDS] = { "foliod_store_sync_seconds_total", "counter",
                             "Time those syncs took; over "
                             "foliod_store_syncs_total, their mean "
                             "latency." },
};

/* Kept in nanoseconds, said in seconds. */
static bool
seconds_metric (int m)
{
  return m == M_BACKING_WRITE_SECONDS || m == M_BACKING_FLUSH_SECONDS ||
         m == M_FLUSH_SECONDS || m == M_STORE_SYNC_SECONDS;
}

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
  v[M_IN_DOUBT] = st.writes_in_doubt;
  v[M_UNSTABLE] = st.unstable_bytes;
  v[M_PT_UNFLUSHED] = st.passthrough_unflushed;
  v[M_PT_LOST] = st.passthrough_lost;
  v[M_LOSSES] = st.losses;
  v[M_DOUBT_CLEARS] = st.doubt_clears;
  v[M_ABANDONED] = bst.abandoned;
  v[M_FENCED] = st.fenced;
  v[M_RELEASED] = export_release_state (ex) == EXPORT_STOPPED ? 2
                : export_release_state (ex) == EXPORT_RELEASED ? 1 : 0;
  v[M_EVICTIONS] = st.evictions;
  v[M_FLUSHES] = st.backing_flush_ops;
  v[M_CLIENT_FLUSHES] = st.flush_ops;
  v[M_FLUSH_PASSES] = st.flush_passes;
  v[M_SIZE] = ex->size;
  v[M_STORE_DIRTY] = ex->store ? st.dirty_bytes + st.unstable_bytes : 0;
  v[M_RA_BYTES] = st.readahead_bytes;
  v[M_RA_WINDOWS] = st.readahead_windows;
  v[M_RA_HITS] = st.readahead_hits;
  v[M_RA_WASTED] = st.readahead_wasted;
  v[M_BACKING_WRITE_OPS] = st.backing_write_ops;
  v[M_BACKING_WRITE_SECONDS] = st.backing_write_ns;
  v[M_BACKING_FLUSH_SECONDS] = st.backing_flush_ns;
  v[M_FLUSH_SECONDS] = st.flush_ns;
  v[M_DIRTY_BACKGROUND] = st.dirty_background_bytes;
  v[M_DIRTY_LIMIT] = st.dirty_limit_bytes;
  v[M_STORE_LOG_USED] = st.store.log_used;
  v[M_STORE_LOG_SIZE] = st.store.log_bytes;
  v[M_STORE_RECORDS] = st.store.records;
  v[M_STORE_SYNCS] = st.store.syncs;
  v[M_STORE_SYNC_SECONDS] = st.store.sync_ns;
  v[M_STORE_RECLAIMS] = st.store.reclaims;
  v[M_STORE_RECLAIMED] = st.store.reclaimed_bytes;
  v[M_STORE_COMPACTIONS] = st.store.compactions;
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
      else if (seconds_metric (m))
        out (&o, "%s{export=\"%s\"} %.6f\n", metrics[m].name, label,
             (double) vals[i].v[m] / 1e9);
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
    out (&o, "# HELP foliod_requests_inline_total NBD requests the cache "
         "answered without waiting, on the thread that read them.\n"
         "# TYPE foliod_requests_inline_total counter\n"
         "foliod_requests_inline_total %llu\n",
         (unsigned long long) ss.requests_inline);
    out (&o, "# HELP foliod_requests_parked_total NBD read misses answered "
         "from an asynchronous backing read, without a worker waiting.\n"
         "# TYPE foliod_requests_parked_total counter\n"
         "foliod_requests_parked_total %llu\n",
         (unsigned long long) ss.requests_parked);
    out (&o, "# HELP foliod_loop_connections_accepted_total Client "
         "connections each event loop thread was given.\n"
         "# TYPE foliod_loop_connections_accepted_total counter\n");
    for (unsigned i = 0; i < server_loop_count (server); i++) {
      struct server_loop_stats ls;

      server_get_loop_stats (server, i, &ls);
      out (&o, "foliod_loop_connections_accepted_total{loop=\"%u\"} %llu\n",
           i, (unsigned long long) ls.connections_total);
    }
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

/* 1536 -> "1.5K", 16777216 -> "16M", 100 -> "100" (powers of 1024, as
 * the configuration's sizes). */
void
stats_human_size (char *buf, size_t len, uint64_t v)
{
  static const char units[] = "KMGTPE";
  double d = (double) v;
  int u = -1;

  while (d >= 1024 && u + 1 < (int) sizeof units - 1) {
    d /= 1024;
    u++;
  }
  if (u < 0)
    snprintf (buf, len, "%llu", (unsigned long long) v);
  else if (d < 10 && d != (double) (uint64_t) d)
    snprintf (buf, len, "%.1f%c", d, units[u]);
  else
    snprintf (buf, len, "%.0f%c", d, units[u]);
}

/* hits / (hits + misses) as "66.7%", "-" before any cached read. */
static void
hit_ratio (char *buf, size_t len, const struct export_values *v)
{
  uint64_t reads = v->v[M_HITS] + v->v[M_MISSES];

  if (reads == 0)
    snprintf (buf, len, "-");
  else
    snprintf (buf, len, "%.1f%%", 100.0 * (double) v->v[M_HITS] /
              (double) reads);
}

static const char *const table_head[] = {
  "EXPORT", "SIZE", "CACHED", "DIRTY", "READS", "HIT RATIO", "WRITTEN",
  "WRITTEN BACK", "WRITE AMP", "ERRORS", "READAHEAD",
};
#define TABLE_COLS (sizeof table_head / sizeof table_head[0])
#define TABLE_CELL 32

/* A row: the export's name as it is (any length), the numbers as text. */
struct table_row {
  const char *name;
  char cell[TABLE_COLS][TABLE_CELL];   /* [0] unused: name */
};

/* One export's row: the cells as the head names them.  WRITTEN is what
 * clients wrote, WRITTEN BACK what reached the backing, WRITE AMP the
 * second over the first ("-" before any write), READAHEAD what readahead
 * brought in ahead of sequential readers. */
static void
table_row (struct table_row *row, const char *name,
           const struct export_values *v)
{
  char (*cell)[TABLE_CELL] = row->cell;
  uint64_t reads = v->v[M_HITS] + v->v[M_MISSES];

  row->name = name;
  stats_human_size (cell[1], TABLE_CELL, v->v[M_SIZE]);
  stats_human_size (cell[2], TABLE_CELL, v->v[M_CACHED]);
  stats_human_size (cell[3], TABLE_CELL, v->v[M_DIRTY]);
  snprintf (cell[4], TABLE_CELL, "%llu", (unsigned long long) reads);
  hit_ratio (cell[5], TABLE_CELL, v);
  stats_human_size (cell[6], TABLE_CELL, v->v[M_CLIENT_WRITE]);
  stats_human_size (cell[7], TABLE_CELL, v->v[M_WRITEBACK]);
  if (v->v[M_CLIENT_WRITE])
    snprintf (cell[8], TABLE_CELL, "%.2f", v->wa);
  else
    snprintf (cell[8], TABLE_CELL, "-");
  snprintf (cell[9], TABLE_CELL, "%llu",
            (unsigned long long) v->v[M_BACKING_ERRORS]);
  stats_human_size (cell[10], TABLE_CELL, v->v[M_RA_BYTES]);
}

static const char *
table_cell (const struct table_row *row, size_t c)
{
  return c == 0 ? row->name : row->cell[c];
}

/* The first column left-aligned (names), the others right-aligned. */
static void
table_line (struct outbuf *o, const struct table_row *row, const int *width)
{
  for (size_t c = 0; c < TABLE_COLS; c++)
    out (o, c == 0 ? "%-*s" : "  %*s", width[c], table_cell (row, c));
  out (o, "\n");
}

/* What keeps an export's FLUSH failing, one line each (nothing when all
 * is well): the durability ledger's state (docs/internals.md). */
static void
durability_lines (struct outbuf *o, struct daemon_export *ex, size_t n)
{
  for (size_t i = 0; i < n; i++) {
    struct export_values v;
    if (ex[i].ex == NULL)
      continue;
    export_values (ex[i].ex, &v);
    if (v.v[M_IN_DOUBT])
      out (o, "%s: %llu write%s in doubt: FLUSH fails until 'foliod "
           "clear-doubt %s'\n", ex[i].cfg.name,
           (unsigned long long) v.v[M_IN_DOUBT],
           v.v[M_IN_DOUBT] == 1 ? "" : "s", ex[i].cfg.name);
    if (v.v[M_PT_LOST])
      out (o, "%s: %llu passthrough write%s lost: FLUSH fails until "
           "'foliod clear-doubt %s'\n", ex[i].cfg.name,
           (unsigned long long) v.v[M_PT_LOST],
           v.v[M_PT_LOST] == 1 ? "" : "s", ex[i].cfg.name);
    if (v.v[M_FENCED]) {
      struct cache_stats st;
      cache_get_stats (ex[i].ex->cache, &st);
      out (o, "%s: fenced: %s: reads, writes and FLUSH fail, nothing is "
           "written back (foliod(8), Lost lock)\n", ex[i].cfg.name,
           st.fence_reason ? st.fence_reason : "the image is not ours");
    }
    if (v.v[M_RELEASED])
      out (o, "%s: released to another host (foliod release): %s\n",
           ex[i].cfg.name, v.v[M_RELEASED] == 2 ? "no longer served"
                                               : "served read-only");
  }
}

size_t
stats_table (char *buf, size_t buflen, struct daemon_export *ex, size_t n,
             void *server)
{
  struct outbuf o = { buf, 0, buflen };
  struct table_row *rows;
  int width[TABLE_COLS] = { 0 };
  size_t nrows = 0;
  struct server_stats ss;

  if (buflen == 0)
    return 0;
  buf[0] = '\0';
  rows = calloc (n + 1, sizeof *rows);
  if (rows == NULL)
    return 0;
  rows[0].name = table_head[0];
  for (size_t c = 1; c < TABLE_COLS; c++)
    snprintf (rows[0].cell[c], TABLE_CELL, "%s", table_head[c]);
  for (size_t i = 0; i < n; i++)
    if (ex[i].ex) {
      struct export_values v;
      export_values (ex[i].ex, &v);
      table_row (&rows[++nrows], ex[i].cfg.name, &v);
    }
  for (size_t c = 0; c < TABLE_COLS; c++)
    for (size_t r = 0; r <= nrows; r++)
      if ((int) strlen (table_cell (&rows[r], c)) > width[c])
        width[c] = (int) strlen (table_cell (&rows[r], c));
  for (size_t r = 0; r <= nrows; r++)
    table_line (&o, &rows[r], width);
  free (rows);
  durability_lines (&o, ex, n);
  if (server) {
    server_get_stats (server, &ss);
    out (&o, "\nconnections: %llu open, %llu accepted, %llu refused; "
         "requests: %llu, %llu with errors\n",
         (unsigned long long) ss.connections_now,
         (unsigned long long) ss.connections_total,
         (unsigned long long) ss.connections_refused,
         (unsigned long long) ss.requests,
         (unsigned long long) ss.request_errors);
    /* Which loop serves whom: one line per loop. */
    for (unsigned i = 0; i < server_loop_count (server); i++) {
      struct server_loop_stats ls;

      server_get_loop_stats (server, i, &ls);
      out (&o, "loop %u: %llu open, %llu accepted, %llu requests\n", i,
           (unsigned long long) ls.connections_now,
           (unsigned long long) ls.connections_total,
           (unsigned long long) ls.requests);
    }
  }
  return o.len;
}

char *
stats_text (struct daemon_export *ex, size_t n, void *server, int table,
            size_t *len)
{
  char *buf = malloc (STATS_BUF_SIZE);

  if (buf)
    *len = (table ? stats_table : stats_format) (buf, STATS_BUF_SIZE, ex, n,
                                                server);
  return buf;
}
