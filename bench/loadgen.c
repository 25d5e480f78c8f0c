/* loadgen: a small libnbd aio load generator for the foliod benches.
 *
 * Why it exists: fio's --fsync=N at iodepth > 1 does not send one flush per
 * N writes (counted on a server it sends one every 2-8 writes), so a
 * "flush every 32 writes" workload needs a client that counts exactly.
 * loadgen keeps a fixed queue of aio requests in flight on each connection
 * and, with --flush-every N, sends exactly one NBD_CMD_FLUSH after every N
 * writes of that connection.
 *
 * By default a flush is a barrier, as fsync is for a filesystem: the writes
 * of the group are completed first (the NBD flush only covers completed
 * writes), then the flush is sent and awaited, then the next group starts.
 * --no-barrier sends the flush into the pipeline without draining.
 *
 * Output: one line of key=value fields on stdout, e.g.
 *   ops=123 writes=120 reads=0 flushes=3 expected_flushes=3 seconds=1.00
 *   ops_per_s=123 mb_per_s=0.48 lat_us_mean=... flush_lat_us_mean=...
 * Exit status 0, or 1 on any error (an I/O error or a flush count that is
 * not exactly writes/N on every connection).
 */

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <libnbd.h>

#include "bench-util.h"

enum lg_mode { LG_RANDREAD, LG_RANDWRITE, LG_RANDRW, LG_SEQREAD, LG_SEQWRITE };

/* Options shared read-only by every connection thread. */
struct lg_opts {
  const char *uri;
  enum lg_mode mode;
  uint64_t bs_bytes;           /* request size */
  unsigned qd;                 /* requests in flight per connection */
  unsigned conns;              /* connections (one thread each) */
  uint64_t flush_every;        /* one flush per this many writes; 0 = none */
  bool barrier;                /* drain the group's writes before the flush */
  double seconds;              /* run time, when ops_total == 0 */
  uint64_t ops_total;          /* total requests over all connections */
  uint64_t offset_bytes;       /* start of the range used */
  uint64_t size_bytes;         /* length of the range used; 0 = to the end */
  uint64_t seed;
  bool fua;                    /* writes with NBD_CMD_FLAG_FUA */
  bool flush_only;             /* connect, send one flush, exit */
  bool once;                   /* random modes: each block once per pass */
  unsigned read_pct;           /* randrw: percentage of reads */
};

struct lg_conn;

/* One in-flight slot: its buffer and the time it was issued. */
struct lg_slot {
  struct lg_conn *conn;
  char *buf;
  uint64_t start_ns;
  bool is_flush;
  bool busy;
};

/* Per-connection state, owned by its thread. */
struct lg_conn {
  const struct lg_opts *o;
  unsigned id;
  struct nbd_handle *h;
  struct lg_slot *slots;       /* qd data slots, then one flush slot */
  uint64_t rng;
  uint64_t range_off, range_len;
  uint64_t seq_next;           /* next offset, sequential modes */
  uint64_t ops_budget;         /* 0 = unlimited (time based) */
  uint64_t deadline_ns;
  unsigned inflight;
  uint64_t issued;             /* data requests issued */
  uint64_t group_writes;       /* writes issued since the last flush */
  bool flush_pending;          /* a flush is due before more writes */
  bool flush_inflight;
  /* results */
  uint64_t reads, writes, flushes, errors;
  uint64_t bytes;
  uint64_t lat_ns_sum, flush_lat_ns_sum;
  uint64_t lat_ns_max;
  int failed;                  /* set on a setup or I/O error */
};

static bool
mode_is_random(enum lg_mode m)
{
  return m == LG_RANDREAD || m == LG_RANDWRITE || m == LG_RANDRW;
}

static uint64_t
conn_next_offset(struct lg_conn *c)
{
  const struct lg_opts *o = c->o;
  uint64_t nblocks = c->range_len / o->bs_bytes;
  uint64_t off;

  if (mode_is_random(o->mode) && o->once) {
    /* i -> i * P + salt mod n is a bijection when P is prime to n: every
     * block once per pass, in a scattered order. */
    uint64_t i = c->id + (uint64_t) o->conns * c->issued;
    off = (uint64_t) (((unsigned __int128) i * 2654435761u + o->seed)
                      % nblocks) * o->bs_bytes;
  }
  else if (mode_is_random(o->mode))
    off = (rng_next(&c->rng) % nblocks) * o->bs_bytes;
  else {
    off = c->seq_next;
    c->seq_next += o->bs_bytes;
    if (c->seq_next + o->bs_bytes > c->range_len)
      c->seq_next = 0;
  }
  return c->range_off + off;
}

/* Completion callback: runs inside nbd_poll of the owning thread. */
static int
slot_done(void *user_data, int *error)
{
  struct lg_slot *s = user_data;
  struct lg_conn *c = s->conn;
  uint64_t lat = now_ns() - s->start_ns;

  if (*error) {
    fprintf(stderr, "loadgen: conn %u: %s failed: %s\n", c->id,
            s->is_flush ? "flush" : "request", strerror(*error));
    c->errors++;
    c->failed = 1;
  }
  if (s->is_flush) {
    c->flushes++;
    c->flush_lat_ns_sum += lat;
    c->flush_inflight = false;
  } else {
    c->lat_ns_sum += lat;
    if (lat > c->lat_ns_max)
      c->lat_ns_max = lat;
    c->inflight--;
  }
  s->busy = false;
  return 1;   /* retire the command */
}

static bool
conn_more_allowed(const struct lg_conn *c)
{
  if (c->failed)
    return false;
  if (c->ops_budget)
    return c->issued < c->ops_budget;
  return now_ns() < c->deadline_ns;
}

static int
conn_issue_flush(struct lg_conn *c)
{
  struct lg_slot *s = &c->slots[c->o->qd];
  nbd_completion_callback cb = { .callback = slot_done, .user_data = s };

  s->busy = true;
  s->is_flush = true;
  s->start_ns = now_ns();
  if (nbd_aio_flush(c->h, cb, 0) == -1) {
    fprintf(stderr, "loadgen: conn %u: flush: %s\n", c->id, nbd_get_error());
    s->busy = false;
    return -1;
  }
  c->flush_inflight = true;
  c->flush_pending = false;
  c->group_writes = 0;
  return 0;
}

static int
conn_issue_data(struct lg_conn *c, struct lg_slot *s)
{
  const struct lg_opts *o = c->o;
  nbd_completion_callback cb = { .callback = slot_done, .user_data = s };
  uint64_t off = conn_next_offset(c);
  int64_t r;

  s->busy = true;
  s->is_flush = false;
  s->start_ns = now_ns();
  bool is_write = o->mode == LG_RANDWRITE || o->mode == LG_SEQWRITE ||
    (o->mode == LG_RANDRW && rng_next(&c->rng) % 100 >= o->read_pct);
  if (is_write) {
    /* Change the first word so every write carries new data. */
    uint64_t v = rng_next(&c->rng);
    memcpy(s->buf, &v, sizeof v < o->bs_bytes ? sizeof v : o->bs_bytes);
    r = nbd_aio_pwrite(c->h, s->buf, o->bs_bytes, off, cb,
                       o->fua ? LIBNBD_CMD_FLAG_FUA : 0);
    c->writes++;
    c->group_writes++;
    if (o->flush_every && c->group_writes == o->flush_every)
      c->flush_pending = true;
  } else {
    r = nbd_aio_pread(c->h, s->buf, o->bs_bytes, off, cb, 0);
    c->reads++;
  }
  if (r == -1) {
    fprintf(stderr, "loadgen: conn %u: %s\n", c->id, nbd_get_error());
    s->busy = false;
    return -1;
  }
  c->inflight++;
  c->issued++;
  c->bytes += o->bs_bytes;
  return 0;
}

/* Fills the queue as far as the flush rule allows. */
static int
conn_fill(struct lg_conn *c)
{
  const struct lg_opts *o = c->o;

  for (;;) {
    if (c->flush_pending) {
      if (c->flush_inflight)
        return 0;                   /* no-barrier: one flush at a time */
      if (o->barrier && c->inflight > 0)
        return 0;                   /* wait for the group's writes */
      if (conn_issue_flush(c) == -1)
        return -1;
      if (o->barrier)
        return 0;                   /* wait for the flush itself */
    }
    if (o->barrier && c->flush_inflight)
      return 0;
    if (c->inflight >= o->qd || !conn_more_allowed(c))
      return 0;
    struct lg_slot *s = NULL;
    for (unsigned i = 0; i < o->qd; i++)
      if (!c->slots[i].busy) {
        s = &c->slots[i];
        break;
      }
    if (s == NULL)
      return 0;
    if (conn_issue_data(c, s) == -1)
      return -1;
  }
}

static int
conn_setup(struct lg_conn *c)
{
  const struct lg_opts *o = c->o;

  c->h = nbd_create();
  /* Allow tls-certificates= and tls-psk-file= in the URI: the benches
   * measure TLS with certificates made in their temp dir. */
  if (c->h != NULL)
    nbd_set_uri_allow_local_file(c->h, true);
  if (c->h == NULL || nbd_connect_uri(c->h, o->uri) == -1) {
    fprintf(stderr, "loadgen: connect %s: %s\n", o->uri, nbd_get_error());
    return -1;
  }
  int64_t size = nbd_get_size(c->h);
  if (size < 0) {
    fprintf(stderr, "loadgen: size: %s\n", nbd_get_error());
    return -1;
  }
  if (o->offset_bytes >= (uint64_t) size) {
    fprintf(stderr, "loadgen: offset beyond export size %" PRIi64 "\n", size);
    return -1;
  }
  c->range_off = o->offset_bytes;
  c->range_len = o->size_bytes ? o->size_bytes : (uint64_t) size - o->offset_bytes;
  if (c->range_off + c->range_len > (uint64_t) size)
    c->range_len = (uint64_t) size - c->range_off;
  if (c->range_len < o->bs_bytes) {
    fprintf(stderr, "loadgen: range smaller than the block size\n");
    return -1;
  }
  /* Sequential connections start at different places in the range. */
  c->seq_next = (c->range_len / o->bs_bytes / o->conns) * c->id * o->bs_bytes;

  c->slots = calloc(o->qd + 1, sizeof *c->slots);
  if (c->slots == NULL)
    return -1;
  for (unsigned i = 0; i <= o->qd; i++) {
    c->slots[i].conn = c;
    if (i == o->qd)
      continue;                     /* the flush slot has no buffer */
    if (posix_memalign((void **) &c->slots[i].buf, 4096, o->bs_bytes) != 0)
      return -1;
    for (uint64_t j = 0; j < o->bs_bytes; j += sizeof(uint64_t)) {
      uint64_t v = rng_next(&c->rng);
      memcpy(c->slots[i].buf + j, &v,
             o->bs_bytes - j < sizeof v ? o->bs_bytes - j : sizeof v);
    }
  }
  return 0;
}

static void *
conn_run(void *arg)
{
  struct lg_conn *c = arg;

  for (;;) {
    if (conn_fill(c) == -1) {
      c->failed = 1;
      break;
    }
    if (c->inflight == 0 && !c->flush_inflight &&
        !(c->flush_pending && !c->failed) && !conn_more_allowed(c))
      break;
    if (nbd_poll(c->h, -1) == -1) {
      fprintf(stderr, "loadgen: conn %u: poll: %s\n", c->id, nbd_get_error());
      c->failed = 1;
      break;
    }
  }
  return NULL;
}

/* One synchronous flush, for the benches' "flush between workloads". */
static int
flush_only(const char *uri)
{
  struct nbd_handle *h = nbd_create();
  int rc = 0;

  if (h == NULL)
    return 1;
  nbd_set_uri_allow_local_file(h, true);
  if (nbd_connect_uri(h, uri) == -1 || nbd_flush(h, 0) == -1) {
    fprintf(stderr, "loadgen: %s\n", nbd_get_error());
    rc = 1;
  }
  nbd_shutdown(h, 0);
  nbd_close(h);
  return rc;
}

static void
usage(FILE *f)
{
  fprintf(f,
"usage: loadgen [options] URI\n"
"  --mode randwrite|randread|randrw|seqwrite|seqread   (default randwrite)\n"
"  --read-pct N         randrw: percentage of reads (default 50)\n"
"  --bs SIZE            request size (default 4k)\n"
"  --qd N               requests in flight per connection (default 16)\n"
"  --conns N            connections, one thread each (default 1)\n"
"  --flush-every N      exactly one flush per N writes per connection\n"
"  --no-barrier         do not drain the writes before each flush\n"
"  --fua                set FUA on every write\n"
"  --seconds S          run time (default 10)\n"
"  --ops N              total requests instead of a time limit\n"
"  --offset SIZE --size SIZE   range of the export used (default all)\n"
"  --seed N\n"
"  --once               random modes: each block of the range once, in a\n"
"                       scattered order (default --ops: one pass)\n"
"  --flush-only         connect, send one flush and exit (no output)\n");
}

static int
parse_args(int argc, char **argv, struct lg_opts *o)
{
  static const struct option longopts[] = {
    { "mode", required_argument, NULL, 'm' },
    { "bs", required_argument, NULL, 'b' },
    { "qd", required_argument, NULL, 'q' },
    { "conns", required_argument, NULL, 'c' },
    { "flush-every", required_argument, NULL, 'f' },
    { "no-barrier", no_argument, NULL, 'B' },
    { "fua", no_argument, NULL, 'F' },
    { "seconds", required_argument, NULL, 's' },
    { "ops", required_argument, NULL, 'n' },
    { "offset", required_argument, NULL, 'o' },
    { "size", required_argument, NULL, 'S' },
    { "seed", required_argument, NULL, 'r' },
    { "flush-only", no_argument, NULL, 'X' },
    { "once", no_argument, NULL, 'O' },
    { "read-pct", required_argument, NULL, 'R' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int ch;

  *o = (struct lg_opts) { .mode = LG_RANDWRITE, .bs_bytes = 4096, .qd = 16,
                          .conns = 1, .barrier = true, .seconds = 10,
                          .seed = 1, .read_pct = 50 };
  while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (ch) {
    case 'm':
      if (!strcmp(optarg, "randwrite")) o->mode = LG_RANDWRITE;
      else if (!strcmp(optarg, "randread")) o->mode = LG_RANDREAD;
      else if (!strcmp(optarg, "randrw")) o->mode = LG_RANDRW;
      else if (!strcmp(optarg, "seqwrite") || !strcmp(optarg, "write"))
        o->mode = LG_SEQWRITE;
      else if (!strcmp(optarg, "seqread") || !strcmp(optarg, "read"))
        o->mode = LG_SEQREAD;
      else { fprintf(stderr, "loadgen: bad --mode %s\n", optarg); return -1; }
      break;
    case 'b': o->bs_bytes = parse_size(optarg); break;
    case 'q': o->qd = (unsigned) atoi(optarg); break;
    case 'c': o->conns = (unsigned) atoi(optarg); break;
    case 'f': o->flush_every = strtoull(optarg, NULL, 10); break;
    case 'B': o->barrier = false; break;
    case 'F': o->fua = true; break;
    case 's': o->seconds = atof(optarg); break;
    case 'n': o->ops_total = strtoull(optarg, NULL, 10); break;
    case 'o': o->offset_bytes = parse_size(optarg); break;
    case 'S': o->size_bytes = parse_size(optarg); break;
    case 'r': o->seed = strtoull(optarg, NULL, 10); break;
    case 'X': o->flush_only = true; break;
    case 'O': o->once = true; break;
    case 'R': o->read_pct = (unsigned) atoi(optarg); break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return -1;
  }
  o->uri = argv[optind];
  if (o->bs_bytes == 0 || o->qd == 0 || o->qd > 4096 || o->conns == 0 ||
      o->conns > 256 || (o->ops_total == 0 && o->seconds <= 0)) {
    fprintf(stderr, "loadgen: bad option value\n");
    return -1;
  }
  return 0;
}

int
main(int argc, char **argv)
{
  struct lg_opts o;
  if (parse_args(argc, argv, &o) == -1)
    return 2;

  if (o.flush_only)
    return flush_only(o.uri);

  struct lg_conn *conns = calloc(o.conns, sizeof *conns);
  pthread_t *tids = calloc(o.conns, sizeof *tids);
  if (conns == NULL || tids == NULL)
    return 1;

  int rc = 0;
  for (unsigned i = 0; i < o.conns; i++) {
    struct lg_conn *c = &conns[i];
    c->o = &o;
    c->id = i;
    c->rng = (o.seed + 1) * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL;
    if (c->rng == 0)
      c->rng = 1;
    if (conn_setup(c) == -1)
      return 1;
  }
  if (o.once && o.ops_total == 0)
    o.ops_total = conns[0].range_len / o.bs_bytes;
  for (unsigned i = 0; i < o.conns; i++)
    if (o.ops_total)
      conns[i].ops_budget = o.ops_total / o.conns + (i < o.ops_total % o.conns);

  uint64_t t0 = now_ns();
  for (unsigned i = 0; i < o.conns; i++) {
    conns[i].deadline_ns = t0 + (uint64_t) (o.seconds * 1e9);
    if (pthread_create(&tids[i], NULL, conn_run, &conns[i]) != 0) {
      fprintf(stderr, "loadgen: pthread_create failed\n");
      return 1;
    }
  }
  for (unsigned i = 0; i < o.conns; i++)
    pthread_join(tids[i], NULL);
  double secs = (double) (now_ns() - t0) / 1e9;

  uint64_t reads = 0, writes = 0, flushes = 0, expect = 0, bytes = 0;
  uint64_t lat = 0, flat = 0, lmax = 0, errors = 0;
  for (unsigned i = 0; i < o.conns; i++) {
    struct lg_conn *c = &conns[i];
    reads += c->reads;
    writes += c->writes;
    flushes += c->flushes;
    bytes += c->bytes;
    lat += c->lat_ns_sum;
    flat += c->flush_lat_ns_sum;
    errors += c->errors;
    if (c->lat_ns_max > lmax)
      lmax = c->lat_ns_max;
    uint64_t e = o.flush_every ? c->writes / o.flush_every : 0;
    expect += e;
    if (c->failed || c->flushes != e)
      rc = 1;
    nbd_shutdown(c->h, 0);
    nbd_close(c->h);
  }
  uint64_t ops = reads + writes;
  printf("ops=%" PRIu64 " reads=%" PRIu64 " writes=%" PRIu64
         " flushes=%" PRIu64 " expected_flushes=%" PRIu64
         " errors=%" PRIu64 " seconds=%.3f ops_per_s=%.0f mb_per_s=%.2f"
         " lat_us_mean=%.1f lat_us_max=%.1f flush_lat_us_mean=%.1f\n",
         ops, reads, writes, flushes, expect, errors, secs,
         (double) ops / secs, (double) bytes / secs / 1e6,
         ops ? (double) lat / ops / 1e3 : 0.0, (double) lmax / 1e3,
         flushes ? (double) flat / flushes / 1e3 : 0.0);
  if (flushes != expect)
    fprintf(stderr, "loadgen: flush count %" PRIu64 " != expected %" PRIu64
            "\n", flushes, expect);
  return rc;
}
