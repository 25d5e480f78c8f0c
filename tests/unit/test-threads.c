/* Threads against one cache: writers on disjoint ranges (checked exactly)
 * and on a shared range (checked against every serial order), a flusher
 * and a prober (prefetch, block status, reads), with cached and direct
 * I/O, FUA, zero and trim mixed in, while background
 * writeback (short interval and expiry) and eviction (small cache) run.
 *
 * Shared-range writes are block-aligned runs of one constant byte, so in
 * any serial order each block ends up holding one byte value: the last
 * value some thread wrote to it.  A block mixing two values, or holding a
 * value that is no thread's last write, is a bug.
 *
 * A third of the cached reads and writes are tried with CACHE_NOWAIT
 * first; half of the tries that give up are dropped, and must have
 * written nothing.
 *
 * The server's paths are mixed in too: a quarter of the plain cached
 * writes go through cache_write_prepare / cache_write_commit (the edges
 * with cache_write; some are aborted: nothing written), a third of the
 * writers' cached reads through cache_fetch and, after a pause in which
 * writeback and eviction run, cache_read_fetched (it must never answer
 * or cache bytes older than the writer's own acknowledged writes); on
 * odd seeds the backing says it is remote and a streamer reads the
 * device sequentially, so that readahead fills folios all along.
 *
 * A full cache has no free folios for a prepare (eviction reuses slots),
 * so the third test gives the cache room for the device twice: prepares
 * succeed there, racing with everything but eviction.
 *
 * The second test adds transient backing errors: a failed client write
 * makes its range "maybe" (old or new) until a read or the final flush
 * tells.  When the errors stop, a flush must succeed.
 *
 * THREADS_OPS overrides the ops per writer (default 4000, 400 under
 * VALGRIND=1); THREADS_SEED the seed (default: time).
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "lib/cachetest.h"

#define NW        6                    /* writer threads */
#define REGION    (384 * 1024ull)      /* each writer's own range */
#define SHARED_OFF (NW * REGION)
#define BS        4096u
#define NB        48u                  /* shared blocks */
#define SHARED_LEN ((uint64_t) NB * BS)
#define SIZE      (SHARED_OFF + SHARED_LEN + 3 * 4096 + 512) /* odd tail */

struct cand {
  uint64_t bits[4];  /* byte values this thread may have left in a block */
  int has_ok;        /* a successful write of this thread is among them */
};

struct world {
  struct cache *c;
  struct fake_backing *fb;
  uint64_t seed, ops;
  int errors;                    /* inject transient errors */
  uint64_t block_size;           /* the cache's: trim works in these */
  uint64_t max_io;               /* the cache's: the most one fetch reads */
  atomic_int stop, failed;
  char msg[512];
  pthread_mutex_t msg_lock;
  struct cand cand[NW][NB];
  atomic_uint_fast64_t flushes, flush_failures, writes_failed;
  atomic_uint_fast64_t preps, prep_aborts, fetches, streamed;
};

struct writer {
  struct world *w;
  int id;
  uint64_t rng;
  uint8_t *exp, *unk;            /* own region: expected bytes, unknown */
  uint8_t *buf;
};

static void
report (struct world *w, const char *fmt, ...)
{
  va_list ap;
  pthread_mutex_lock (&w->msg_lock);
  if (!atomic_load (&w->failed)) {
    va_start (ap, fmt);
    vsnprintf (w->msg, sizeof w->msg, fmt, ap);
    va_end (ap);
    atomic_store (&w->failed, 1);
  }
  pthread_mutex_unlock (&w->msg_lock);
  atomic_store (&w->stop, 1);
}

static void
cand_set (struct cand *c, uint8_t v, int ok)
{
  if (ok) {
    memset (c->bits, 0, sizeof c->bits);
    c->has_ok = 1;
  }
  c->bits[v / 64] |= 1ull << (v % 64);
}

static int
cand_has (const struct cand *c, uint8_t v)
{
  return (c->bits[v / 64] >> (v % 64)) & 1;
}

/* Is v a possible final value of shared block b? */
static int
shared_allowed (struct world *w, unsigned b, uint8_t v)
{
  int any_ok = 0;
  for (int t = 0; t < NW; t++) {
    if (cand_has (&w->cand[t][b], v))
      return 1;
    any_ok |= w->cand[t][b].has_ok;
  }
  return !any_ok && v == 0;   /* nobody surely wrote: the initial hole */
}

/* Each block of a shared-range buffer must hold one value. */
static int
check_uniform (struct world *w, const uint8_t *p, uint64_t len, uint64_t off,
               const char *what)
{
  for (uint64_t b = 0; b < len / BS; b++) {
    const uint8_t *q = p + b * BS;
    for (unsigned i = 1; i < BS; i++)
      if (q[i] != q[0]) {
        report (w, "%s: shared block at %" PRIu64 " mixes %#x and %#x "
                "(byte %u)", what, off + b * BS, q[0], q[i], i);
        return -1;
      }
  }
  return 0;
}

/* Compare with the writer's expectation, adopting unknown bytes. */
static int
check_own (struct writer *wr, const uint8_t *p, uint64_t len, uint64_t roff,
           const char *what)
{
  for (uint64_t i = 0; i < len; i++) {
    uint64_t k = roff + i;
    if (wr->unk[k]) {
      wr->exp[k] = p[i];
      wr->unk[k] = 0;
    }
    else if (p[i] != wr->exp[k]) {
      report (wr->w, "%s: writer %d byte %" PRIu64 " is %#x, want %#x",
              what, wr->id, wr->id * REGION + k, p[i], wr->exp[k]);
      return -1;
    }
  }
  return 0;
}

/* Flush (sharing passes with the flusher and the other writers): once it
 * succeeds, every write this writer had acknowledged is in the backing. */
static void
own_flush (struct writer *wr)
{
  struct world *w = wr->w;

  if (cache_flush (w->c) == -1) {
    if (!w->errors)
      report (w, "writer %d: flush failed: %s", wr->id, strerror (errno));
    return;
  }
  fake_peek (w->fb, wr->buf, REGION, wr->id * REGION);
  check_own (wr, wr->buf, REGION, 0, "backing after the writer's flush");
}

/* cache_write (write) or cache_read of wr->buf, tried with CACHE_NOWAIT
 * first one time in three (as the server's loop does).  A try that gives
 * up did nothing, so half of the time it is dropped (returns 1: nothing
 * written, and the checks hold the cache to that); else the call is
 * repeated without the flag.  0 or -1/errno as the call. */
/* wr->buf written as the server does when it receives whole folios into
 * folio memory.  0 or -1 as cache_write; 1: nothing written (prepare
 * refused: the caller writes; or aborted); 2: aborted. */
static int
prep_write (struct writer *wr, uint64_t len, uint64_t off)
{
  struct world *w = wr->w;
  struct cache_prep p;
  int r = 0;

  if (cache_write_prepare (w->c, len, off, &p) == -1) {
    if (errno != EAGAIN)
      report (w, "writer %d: prepare failed: %s", wr->id, strerror (errno));
    return 1;
  }
  for (unsigned i = 0; i < p.n; i++)
    memcpy (p.data[i], wr->buf + (p.off - off) + i * p.folio_size,
            p.folio_size);
  atomic_fetch_add (&w->preps, 1);
  if (fake_rand_below (&wr->rng, 8) == 0) {
    cache_write_abort (w->c, &p);
    atomic_fetch_add (&w->prep_aborts, 1);
    return 2;
  }
  if (p.off > off)
    r |= cache_write (w->c, wr->buf, p.off - off, off, 0);
  if (off + len > p.off + p.len)
    r |= cache_write (w->c, wr->buf + (p.off + p.len - off),
                      off + len - p.off - p.len, p.off + p.len, 0);
  r |= cache_write_commit (w->c, &p, 0);
  return r ? -1 : 0;
}

static void
fetch_done (void *opaque, int err)
{
  *(int *) opaque = err;
}

/* A read miss parked on the backing's async read; the pause lets
 * writeback and eviction (and other threads' writes) run between the
 * fetch and the answer.  0 or -1 as cache_read; 1: not fetched. */
static int
fetch_read (struct writer *wr, uint64_t len, uint64_t off)
{
  struct world *w = wr->w;
  struct cache_fetched gen;
  int err = -1;

  if (len > w->max_io ||
      cache_fetch (w->c, wr->buf, len, off, &gen, fetch_done, &err) == -1)
    return 1;
  if (err == -1)
    report (w, "writer %d: the fake's async read did not complete", wr->id);
  atomic_fetch_add (&w->fetches, 1);
  usleep ((unsigned) fake_rand_below (&wr->rng, 300));
  if (err)
    return cache_read (w->c, wr->buf, len, off, 0);
  return cache_read_fetched (w->c, wr->buf, len, off, &gen, 0);
}

static int
rw_maybe_try (struct writer *wr, bool write, uint64_t len, uint64_t off,
              unsigned flags)
{
  struct world *w = wr->w;

  if (flags == 0 && fake_rand_below (&wr->rng, 4) == 0) {
    int r = write ? prep_write (wr, len, off) : fetch_read (wr, len, off);
    if (r == 2)
      return 1;
    if (r != 1)
      return r;
  }

  if (flags == 0 && fake_rand_below (&wr->rng, 3) == 0) {
    int r = write ? cache_write (w->c, wr->buf, len, off, CACHE_NOWAIT)
                  : cache_read (w->c, wr->buf, len, off, CACHE_NOWAIT);
    if (r == 0)
      return 0;
    if (errno != EAGAIN)
      report (w, "writer %d: a try failed: %s", wr->id, strerror (errno));
    if (fake_rand_below (&wr->rng, 2) == 0)
      return 1;
  }
  return write ? cache_write (w->c, wr->buf, len, off, flags)
               : cache_read (w->c, wr->buf, len, off, flags);
}

static void
own_op (struct writer *wr)
{
  struct world *w = wr->w;
  uint64_t *r = &wr->rng;
  uint64_t len = 1 + fake_rand_below (r, 3 * 16384);
  uint64_t roff = fake_rand_below (r, REGION);
  uint64_t base = wr->id * REGION;
  unsigned x = (unsigned) fake_rand_below (r, 11);

  if (roff + len > REGION)
    len = REGION - roff;
  if (x == 10) {
    own_flush (wr);
    return;
  }
  if (x < 4) {                          /* write */
    unsigned flags = 0;
    switch (fake_rand_below (r, 20)) {
    case 0: flags = CACHE_FUA; break;
    case 1: case 2: flags = CACHE_DIRECT; break;
    }
    for (uint64_t i = 0; i < len; i++)
      wr->buf[i] = (uint8_t) (fake_rand (r) >> 7);
    int rc = rw_maybe_try (wr, true, len, base + roff, flags);
    if (rc == 1)
      ;                                 /* gave up: nothing written */
    else if (rc == 0) {
      memcpy (wr->exp + roff, wr->buf, len);
      memset (wr->unk + roff, 0, len);
    }
    else if (!w->errors)
      report (w, "writer %d: write failed: %s", wr->id, strerror (errno));
    else {
      memset (wr->unk + roff, 1, len);
      atomic_fetch_add (&w->writes_failed, 1);
    }
  }
  else if (x < 8) {                     /* read back */
    unsigned flags = fake_rand_below (r, 10) == 0 ? CACHE_DIRECT : 0;
    int rc = rw_maybe_try (wr, false, len, base + roff, flags);
    if (rc == 0)
      check_own (wr, wr->buf, len, roff, "read");
    else if (rc == -1 && !w->errors)
      report (w, "writer %d: read failed: %s", wr->id, strerror (errno));
  }
  else if (x < 9) {                     /* zero */
    if (cache_zero (w->c, len, base + roff, 0) == 0) {
      memset (wr->exp + roff, 0, len);
      memset (wr->unk + roff, 0, len);
    }
    else if (!w->errors)
      report (w, "writer %d: zero failed: %s", wr->id, strerror (errno));
    else
      memset (wr->unk + roff, 1, len);
  }
  else {                                /* trim: whole blocks only */
    uint64_t bs = w->block_size;
    uint64_t s = (base + roff + bs - 1) / bs * bs, e = (base + roff + len) / bs * bs;
    int ok = cache_trim (w->c, len, base + roff, 0) == 0;
    if (!ok && !w->errors)
      report (w, "writer %d: trim failed: %s", wr->id, strerror (errno));
    if (e > s) {
      memset (wr->exp + (s - base), 0, e - s);
      memset (wr->unk + (s - base), ok ? 0 : 1, e - s);
    }
  }
}

static void
shared_op (struct writer *wr, uint64_t seq)
{
  struct world *w = wr->w;
  uint64_t *r = &wr->rng;
  unsigned b = (unsigned) fake_rand_below (r, NB);
  unsigned n = 1 + (unsigned) fake_rand_below (r, 4);
  unsigned x = (unsigned) fake_rand_below (r, 10);

  if (b + n > NB)
    n = NB - b;
  uint64_t off = SHARED_OFF + (uint64_t) b * BS, len = (uint64_t) n * BS;
  if (x < 5) {
    /* A byte naming the writer and the write; never 0. */
    uint8_t v = (uint8_t) (1 + (wr->id * 42 + seq % 42));
    int ok;
    unsigned flags = 0;
    switch (fake_rand_below (r, 10)) {
    case 0: case 1: flags = CACHE_DIRECT; break;
    case 2: flags = CACHE_FUA; break;
    }
    memset (wr->buf, v, len);
    int rc = rw_maybe_try (wr, true, len, off, flags);
    if (rc == 1)
      return;                           /* gave up: nothing written */
    ok = rc == 0;
    if (!ok && !w->errors)
      report (w, "writer %d: shared write failed: %s", wr->id,
              strerror (errno));
    for (unsigned i = 0; i < n; i++)
      cand_set (&w->cand[wr->id][b + i], v, ok);
  }
  else if (x < 6) {
    int ok;
    if (fake_rand_below (r, 3) == 0)
      ok = cache_trim (w->c, len, off, 0) == 0;
    else
      ok = cache_zero (w->c, len, off,
                       fake_rand_below (r, 2) ? CACHE_MAY_TRIM : 0) == 0;
    if (!ok && !w->errors)
      report (w, "writer %d: shared zero failed: %s", wr->id, strerror (errno));
    for (unsigned i = 0; i < n; i++)
      cand_set (&w->cand[wr->id][b + i], 0, ok);
  }
  else {
    unsigned flags = fake_rand_below (r, 5) == 0 ? CACHE_DIRECT : 0;
    int rc = rw_maybe_try (wr, false, len, off, flags);
    if (rc == 0)
      check_uniform (w, wr->buf, len, off, "shared read");
    else if (rc == -1 && !w->errors)
      report (w, "writer %d: shared read failed: %s", wr->id, strerror (errno));
  }
}

static void *
writer_main (void *arg)
{
  struct writer *wr = arg;
  for (uint64_t i = 0; i < wr->w->ops && !atomic_load (&wr->w->stop); i++) {
    if (fake_rand_below (&wr->rng, 3) == 0)
      shared_op (wr, i);
    else
      own_op (wr);
  }
  return NULL;
}

static void *
flusher_main (void *arg)
{
  struct world *w = arg;
  while (!atomic_load (&w->stop)) {
    if (cache_flush (w->c) == -1) {
      if (!w->errors)
        report (w, "flush failed: %s", strerror (errno));
      atomic_fetch_add (&w->flush_failures, 1);
    }
    atomic_fetch_add (&w->flushes, 1);
    usleep (2000);
  }
  return NULL;
}

static int
status_cb (void *opaque, uint64_t off, uint64_t len,
           enum backing_extent_type type)
{
  uint64_t *pos = opaque;
  if (off != *pos || len == 0)
    return -1;
  *pos = off + len;
  return 0;
}

static void *
prober_main (void *arg)
{
  struct world *w = arg;
  uint64_t rng = w->seed ^ 0x5eed;
  uint8_t *buf = malloc (SHARED_LEN);

  while (!atomic_load (&w->stop)) {
    uint64_t off = fake_rand_below (&rng, SIZE - 1);
    uint64_t len = 1 + fake_rand_below (&rng, 65536);
    if (len > SIZE - off)
      len = SIZE - off;
    switch (fake_rand_below (&rng, 3)) {
    case 0:
      if (cache_prefetch (w->c, len, off) == -1 && !w->errors)
        report (w, "prefetch failed: %s", strerror (errno));
      break;
    case 1: {
      uint64_t pos = off;
      int r = cache_block_status (w->c, len, off, status_cb, &pos);
      if (r == 0 && pos != off + len)
        report (w, "block status did not tile %" PRIu64 "+%" PRIu64,
                off, len);
      else if (r == -1 && !w->errors)
        report (w, "block status failed: %s", strerror (errno));
      break;
    }
    default:
      if (cache_read (w->c, buf, SHARED_LEN, SHARED_OFF, 0) == 0)
        check_uniform (w, buf, SHARED_LEN, SHARED_OFF, "prober read");
      break;
    }
  }
  free (buf);
  return NULL;
}

/* Sequential reads over the whole device (readahead follows on a
 * remote); the shared range must read uniform. */
static void *
streamer_main (void *arg)
{
  struct world *w = arg;
  const uint64_t chunk = 16384;
  uint8_t *buf = malloc (chunk);
  uint64_t pos = 0;

  while (buf && !atomic_load (&w->stop)) {
    uint64_t len = SIZE - pos < chunk ? SIZE - pos : chunk;
    if (cache_read (w->c, buf, len, pos, 0) == 0) {
      uint64_t s = pos > SHARED_OFF ? pos : SHARED_OFF;
      uint64_t e = pos + len < SHARED_OFF + SHARED_LEN
                   ? pos + len : SHARED_OFF + SHARED_LEN;
      if (s < e)
        check_uniform (w, buf + (s - pos), e - s, s, "streamed read");
    }
    else if (!w->errors)
      report (w, "streamed read failed: %s", strerror (errno));
    atomic_fetch_add (&w->streamed, len);
    pos = pos + len >= SIZE ? 0 : pos + len;
    usleep (100);
  }
  free (buf);
  return NULL;
}

static void
run (int errors, bool roomy)
{
  struct world *w = calloc (1, sizeof *w);
  struct writer wr[NW];
  pthread_t wt[NW], ft, pt, st_thread;
  struct cache_config cfg;
  char err[256];

  assert_non_null (w);
  pthread_mutex_init (&w->msg_lock, NULL);
  w->errors = errors;
  w->seed = ct_env_u64 ("THREADS_SEED", 0);
  if (w->seed == 0)
    w->seed = (uint64_t) time (NULL) * 7919 + (uint64_t) errors;
  w->ops = ct_env_u64 ("THREADS_OPS", ct_valgrind () ? 400 : 4000);
  printf ("THREADS_SEED=%" PRIu64 " THREADS_OPS=%" PRIu64 " errors=%d\n",
          w->seed, w->ops, errors);
  fflush (stdout);

  w->fb = fake_backing_new (SIZE);
  assert_non_null (w->fb);
  fake_set_log (w->fb, 0);
  fake_set_async (w->fb, 1);
  fake_fill_pattern (w->fb, SHARED_OFF, 0, 7);   /* old data to merge with */
  bool ra = w->seed & 1;
  if (ra)
    fake_set_caps (w->fb, FAKE_DEFAULT_CAPS | BACKING_REMOTE);

  /* Geometry per seed; the shared 4 KiB units stay whole blocks. */
  static const uint32_t folios[] = { 4096, 16384, 16384, 65536 };
  static const uint32_t blocks[] = { 512, 1024, 4096, 4096 };
  uint64_t g = w->seed;
  cache_config_default (&cfg);
  cfg.folio_size = folios[fake_rand_below (&g, 4)];
  cfg.block_size = blocks[fake_rand_below (&g, 4)];
  cfg.cache_size = 24 * (uint64_t) cfg.folio_size;  /* eviction all the time */
  if (roomy)
    cfg.cache_size = (2 * SIZE / cfg.folio_size) * (uint64_t) cfg.folio_size;
  cfg.max_io_bytes = cfg.folio_size * (1 + (uint32_t) fake_rand_below (&g, 4));
  w->block_size = cfg.block_size;
  w->max_io = cfg.max_io_bytes;
  cfg.dirty_expire_ms = 20;
  cfg.writeback_interval_ms = 5;
  cfg.dirty_background_pct = 10;
  cfg.dirty_limit_pct = 40;
  w->c = cache_create (fake_backing_base (w->fb), NULL, &cfg, err, sizeof err);
  if (w->c == NULL)
    fail_msg ("cache_create: %s", err);
  if (errors)
    fake_fail_random (w->fb, FAKE_M (FAKE_WRITE) | FAKE_M (FAKE_FLUSH) |
                      FAKE_M (FAKE_READ), 0.02, w->seed, EIO);

  for (int t = 0; t < NW; t++) {
    wr[t] = (struct writer) { .w = w, .id = t, .rng = w->seed * 31 + (uint64_t) t };
    wr[t].exp = malloc (REGION);
    wr[t].unk = calloc (1, REGION);
    wr[t].buf = malloc (REGION);      /* >= 3 * 16384: an op's bytes */
    assert_true (wr[t].exp && wr[t].unk && wr[t].buf);
    fake_peek (w->fb, wr[t].exp, REGION, t * REGION);
  }
  uint64_t t0 = ct_now_ms ();
  for (int t = 0; t < NW; t++)
    assert_int_equal (pthread_create (&wt[t], NULL, writer_main, &wr[t]), 0);
  assert_int_equal (pthread_create (&ft, NULL, flusher_main, w), 0);
  assert_int_equal (pthread_create (&pt, NULL, prober_main, w), 0);
  if (ra)
    assert_int_equal (pthread_create (&st_thread, NULL, streamer_main, w), 0);
  for (int t = 0; t < NW; t++)
    pthread_join (wt[t], NULL);
  atomic_store (&w->stop, 1);
  pthread_join (ft, NULL);
  pthread_join (pt, NULL);
  if (ra)
    pthread_join (st_thread, NULL);
  uint64_t ms = ct_now_ms () - t0;
  if (atomic_load (&w->failed))
    fail_msg ("THREADS_SEED=%" PRIu64 ": %s", w->seed, w->msg);

  /* Errors stop: one flush succeeds and the backing holds a serial order. */
  fake_clear_faults (w->fb);
  if (cache_flush (w->c) == -1)
    fail_msg ("THREADS_SEED=%" PRIu64 ": final flush failed: %s", w->seed,
              strerror (errno));
  uint8_t *back = malloc (SIZE), *via = malloc (SIZE);
  assert_true (back && via);
  fake_peek (w->fb, back, SIZE, 0);
  for (int t = 0; t < NW; t++) {
    check_own (&wr[t], back + t * REGION, REGION, 0, "backing after flush");
    if (atomic_load (&w->failed))
      fail_msg ("THREADS_SEED=%" PRIu64 ": %s", w->seed, w->msg);
  }
  check_uniform (w, back + SHARED_OFF, SHARED_LEN, SHARED_OFF, "backing");
  if (atomic_load (&w->failed))
    fail_msg ("THREADS_SEED=%" PRIu64 ": %s", w->seed, w->msg);
  for (unsigned b = 0; b < NB; b++) {
    uint8_t v = back[SHARED_OFF + b * BS];
    if (!shared_allowed (w, b, v))
      fail_msg ("THREADS_SEED=%" PRIu64 ": shared block %u holds %#x, "
                "which is no writer's last write", w->seed, b, v);
  }
  /* The tail nobody wrote is still a hole. */
  for (uint64_t i = SHARED_OFF + SHARED_LEN; i < SIZE; i++)
    assert_int_equal (back[i], 0);
  /* And the cache agrees with the backing. */
  assert_int_equal (cache_read (w->c, via, SIZE, 0, 0), 0);
  assert_memory_equal (via, back, SIZE);

  struct cache_stats st;
  cache_get_stats (w->c, &st);
  printf ("folio=%u block=%u max_io=%u: ", cfg.folio_size, cfg.block_size,
          cfg.max_io_bytes);
  printf ("%" PRIu64 " ms: flushes=%" PRIu64 " (failed %" PRIu64 ")"
          " writes failed=%" PRIu64 " evictions=%" PRIu64
          " backing writes=%" PRIu64 " throttle waits=%" PRIu64
          " flush passes=%" PRIu64 " of %" PRIu64 "\n",
          ms, (uint64_t) w->flushes, (uint64_t) w->flush_failures,
          (uint64_t) w->writes_failed, st.evictions, st.backing_write_ops,
          st.throttle_waits, st.flush_passes, st.flush_ops);
  printf ("prepared=%" PRIu64 " (aborted %" PRIu64 ") fetched=%" PRIu64
          " streamed=%" PRIu64 " readahead bytes=%" PRIu64 "\n",
          (uint64_t) w->preps, (uint64_t) w->prep_aborts,
          (uint64_t) w->fetches, (uint64_t) w->streamed, st.readahead_bytes);
  if (!roomy)
    assert_true (st.evictions > 0);
  else if (cfg.folio_size < 3 * 16384)  /* writes of up to 48 KiB */
    assert_true (w->preps > 0);
  assert_int_equal (st.dirty_bytes, 0);
  assert_int_equal (cache_destroy (w->c), 0);
  fake_free (w->fb);
  for (int t = 0; t < NW; t++) {
    free (wr[t].exp);
    free (wr[t].unk);
    free (wr[t].buf);
  }
  free (back);
  free (via);
  pthread_mutex_destroy (&w->msg_lock);
  free (w);
}

/* ---- Overlap with backing I/O, made deterministic by the fake's gate:
 * a backing call is held inside the cache while the test looks at what
 * else proceeds.  A NOWAIT read gives up (EAGAIN) where it would wait,
 * so "it proceeds" needs no timing. ---- */

#define OV_FOLIO 4096u
#define OV_SIZE  (16ull << 20)         /* 4096 folios: 4 times the stripes */

struct ov {
  struct cache *c;
  enum { OV_FLUSH, OV_WRITE, OV_ZERO, OV_TRIM, OV_READ } op;
  const void *buf;
  uint64_t off, len;
  int r;
};

static void *
ov_main (void *arg)
{
  struct ov *o = arg;

  switch (o->op) {
  case OV_FLUSH: o->r = cache_flush (o->c); break;
  case OV_WRITE: o->r = cache_write (o->c, o->buf, o->len, o->off, 0); break;
  case OV_ZERO: o->r = cache_zero (o->c, o->len, o->off, 0); break;
  case OV_TRIM: o->r = cache_trim (o->c, o->len, o->off, 0); break;
  case OV_READ: o->r = cache_read (o->c, (void *) o->buf, o->len, o->off, 0);
    break;
  }
  return NULL;
}

static struct cache *
ov_cache (struct fake_backing **fb)
{
  struct cache_config cfg;

  *fb = fake_backing_new (OV_SIZE);
  assert_non_null (*fb);
  cache_config_default (&cfg);
  cfg.cache_size = 256 * OV_FOLIO;
  cfg.folio_size = OV_FOLIO;
  cfg.block_size = OV_FOLIO;
  cfg.readahead_bytes = 0;
  struct cache *c = ct_cache (*fb, &cfg);
  assert_non_null (c);
  return c;
}

static uint64_t
ov_dirty (struct cache *c)
{
  struct cache_stats st;

  cache_get_stats (c, &st);
  return st.dirty_bytes;
}

/* A folio under writeback is read from memory meanwhile (its stripe is
 * not held across the backing write); a writer of it waits for the write
 * to end and leaves its block dirty with the new data. */
static void
test_read_during_writeback (void **state)
{
  struct fake_backing *fb;
  struct cache *c = ov_cache (&fb);
  unsigned char a[OV_FOLIO], b[OV_FOLIO], got[OV_FOLIO];
  uint64_t off = 77 * OV_FOLIO;
  pthread_t flusher, writer;

  (void) state;
  memset (a, 0x11, sizeof a);
  memset (b, 0x22, sizeof b);
  assert_int_equal (cache_write (c, a, sizeof a, off, 0), 0);
  fake_gate_close (fb, FAKE_M (FAKE_WRITE));
  struct ov fl = { .c = c, .op = OV_FLUSH };
  assert_int_equal (pthread_create (&flusher, NULL, ov_main, &fl), 0);
  assert_int_equal (fake_gate_wait (fb, 1), 0);   /* the write is in flight */
  assert_int_equal (cache_read (c, got, sizeof got, off, CACHE_NOWAIT), 0);
  assert_memory_equal (got, a, sizeof a);
  /* A try to change it would wait: it gives up, changing nothing. */
  assert_int_equal (cache_write (c, b, sizeof b, off, CACHE_NOWAIT), -1);
  assert_int_equal (errno, EAGAIN);
  struct ov wr = { .c = c, .op = OV_WRITE, .buf = b, .off = off,
                   .len = sizeof b };
  assert_int_equal (pthread_create (&writer, NULL, ov_main, &wr), 0);
  fake_gate_open (fb);
  pthread_join (flusher, NULL);
  pthread_join (writer, NULL);
  assert_int_equal (fl.r, 0);
  assert_int_equal (wr.r, 0);
  /* The flush wrote a, whole; b came after it and is dirty. */
  assert_int_equal (ov_dirty (c), OV_FOLIO);
  fake_peek (fb, got, sizeof got, off);
  assert_true (memcmp (got, a, sizeof a) == 0 || memcmp (got, b, sizeof b) == 0);
  assert_int_equal (cache_read (c, got, sizeof got, off, 0), 0);
  assert_memory_equal (got, b, sizeof b);
  assert_int_equal (cache_flush (c), 0);
  fake_peek (fb, got, sizeof got, off);
  assert_memory_equal (got, b, sizeof b);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

/* A flush whose writeback finds a dirty folio's stripe taken (here by a
 * read filling another block of it from the backing) does not skip it:
 * the walk never waits on a stripe with walk_lock held, so it comes back
 * to the folio, and the flush writes it before it returns. */
static void
test_flush_comes_back_to_busy_folio (void **state)
{
  struct fake_backing *fb;
  struct cache_config cfg;
  unsigned char a[4096], got[4096];
  uint64_t off = 5 * 65536;
  pthread_t reader, flusher;

  (void) state;
  fb = fake_backing_new (OV_SIZE);
  assert_non_null (fb);
  cache_config_default (&cfg);
  cfg.cache_size = 4 << 20;
  cfg.folio_size = 65536;
  cfg.block_size = 4096;
  cfg.readahead_bytes = 0;
  fake_fill_pattern (fb, 1 << 20, 0, 3);      /* data: a fill reads it */
  struct cache *c = ct_cache (fb, &cfg);
  assert_non_null (c);
  memset (a, 0x5c, sizeof a);
  assert_int_equal (cache_write (c, a, sizeof a, off, 0), 0);  /* block 0 */
  fake_gate_close (fb, FAKE_M (FAKE_READ));
  struct ov rd = { .c = c, .op = OV_READ, .buf = got, .off = off + 4096,
                   .len = 4096 };
  assert_int_equal (pthread_create (&reader, NULL, ov_main, &rd), 0);
  assert_int_equal (fake_gate_wait (fb, 1), 0);  /* the fill holds the stripe */
  struct ov fl = { .c = c, .op = OV_FLUSH };
  assert_int_equal (pthread_create (&flusher, NULL, ov_main, &fl), 0);
  /* Give the flush time to meet the busy folio (coverage only: the
   * check below holds however long this is). */
  usleep (50000);
  fake_gate_open (fb);
  pthread_join (reader, NULL);
  pthread_join (flusher, NULL);
  assert_int_equal (rd.r, 0);
  assert_int_equal (fl.r, 0);
  fake_peek (fb, got, sizeof got, off);
  assert_memory_equal (got, a, sizeof a);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

/* A zero or trim over more folios than there are stripes holds only a
 * window's worth at a time: a read of another cached folio proceeds
 * while the backing call is held. */
static void
wide_op_reader (int op, unsigned opmask)
{
  struct fake_backing *fb;
  struct cache *c = ov_cache (&fb);
  unsigned char got[OV_FOLIO];
  uint64_t inside = 3000 * OV_FOLIO, outside = (3072 + 500) * OV_FOLIO;
  pthread_t t;

  assert_int_equal (cache_read (c, got, sizeof got, inside, 0), 0);
  assert_int_equal (cache_read (c, got, sizeof got, outside, 0), 0);
  fake_gate_close (fb, opmask);
  struct ov o = { .c = c, .op = op, .off = 0, .len = 12ull << 20 };
  assert_int_equal (pthread_create (&t, NULL, ov_main, &o), 0);
  assert_int_equal (fake_gate_wait (fb, 1), 0);
  assert_int_equal (cache_read (c, got, sizeof got, outside, CACHE_NOWAIT), 0);
  assert_int_equal (cache_read (c, got, sizeof got, inside, CACHE_NOWAIT), 0);
  fake_gate_open (fb);
  pthread_join (t, NULL);
  assert_int_equal (o.r, 0);
  assert_int_equal (cache_read (c, got, sizeof got, inside, 0), 0);
  for (unsigned i = 0; i < sizeof got; i++)
    assert_int_equal (got[i], 0);
  assert_int_equal (cache_destroy (c), 0);
  fake_free (fb);
}

static void
test_zero_wide_reader (void **state)
{
  (void) state;
  wide_op_reader (OV_ZERO, FAKE_M (FAKE_ZERO));
}

static void
test_trim_wide_reader (void **state)
{
  (void) state;
  wide_op_reader (OV_TRIM, FAKE_M (FAKE_TRIM));
}

static void
test_threads (void **state)
{
  run (0, false);
}

static void
test_threads_with_errors (void **state)
{
  run (1, false);
}

static void
test_threads_roomy (void **state)
{
  run (0, true);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_threads),
    cmocka_unit_test (test_threads_with_errors),
    cmocka_unit_test (test_threads_roomy),
    cmocka_unit_test (test_read_during_writeback),
    cmocka_unit_test (test_flush_comes_back_to_busy_folio),
    cmocka_unit_test (test_zero_wide_reader),
    cmocka_unit_test (test_trim_wide_reader),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
