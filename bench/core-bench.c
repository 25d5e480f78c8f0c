/* core-bench: the cache alone, no network (issue: folio cache core).
 *
 * 4096 random 4 KiB-aligned writes of 4 KiB over a 1 GiB range, into
 * folios that are already uptodate, then one flush.  Prints the write
 * amplification (bytes the backing got / bytes the client wrote) with
 * per-block dirty tracking, the same without it (block size = folio size,
 * as before the iomap series), and the rate of the cache calls.  Then the
 * rate of sequential writes through a cache smaller than the data, over a
 * real file (see run_file).  Then the core's scaling (see run_threads):
 * 4 KiB hits and 4 KiB writes from 1 and 2 threads, on disjoint and on
 * shared folios, ops/s per thread, and the waits on each lock class.
 *
 *   build/bench/core-bench [writes] [folio_size] [block_size]
 *
 * CORE_THREADS_MS (500) and CORE_THREADS_REGION_MIB (1; fractions in
 * 64 KiB steps, 0.25 is four folios a thread, the two threads' folios
 * then neighbours in every structure) set the threads rows' length and
 * working set a thread; CORE_THREADS_ONLY=1 runs only them (for perf);
 * CORE_THREADS_READAHEAD=1 turns readahead on, as on a remote backing.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "foliod/cache.h"
#include "foliod/util.h"
#include "lib/fake_backing.h"

#define RANGE (1ull << 30)

struct result {
  double wa;            /* write amplification */
  double write_ops_s;   /* cache_write calls per second */
  double flush_ms;
};

static uint64_t
xorshift (uint64_t *s)
{
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static int
run (unsigned writes, uint32_t folio, uint32_t block, struct result *res)
{
  struct fake_backing *fb = fake_backing_new (RANGE);
  struct cache_config cfg;
  struct fake_totals t;
  char err[256], buf[4096];
  uint64_t seed = 0x9e3779b97f4a7c15ull, *offs;
  struct cache *c;

  cache_config_default (&cfg);
  cfg.folio_size = folio;
  cfg.block_size = block;
  cfg.cache_size = 512ull << 20;        /* holds every touched folio */
  cfg.dirty_limit_pct = cfg.dirty_background_pct = 100;
  cfg.dirty_expire_ms = 3600000;        /* only the flush writes back */
  offs = malloc (writes * sizeof *offs);
  if (fb == NULL || offs == NULL)
    return -1;
  fake_set_log (fb, 0);
  fake_fill_pattern (fb, RANGE, 0, 7);   /* data everywhere: no holes */
  c = cache_create (fake_backing_base (fb), NULL, &cfg, err, sizeof err);
  if (c == NULL) {
    fprintf (stderr, "core-bench: %s\n", err);
    return -1;
  }
  for (unsigned i = 0; i < writes; i++) {
    offs[i] = (xorshift (&seed) % (RANGE / 4096)) * 4096;
    for (unsigned j = 0; j < i; j++)     /* distinct blocks: no overwrites */
      if (offs[j] == offs[i]) {
        offs[i] = (xorshift (&seed) % (RANGE / 4096)) * 4096;
        j = (unsigned) -1;
      }
    if (cache_prefetch (c, folio, offs[i] & ~(uint64_t) (folio - 1)) == -1)
      return -1;                        /* make the folio uptodate */
  }
  memset (buf, 0x5a, sizeof buf);
  fake_reset_log (fb);
  uint64_t t0 = now_ns ();
  for (unsigned i = 0; i < writes; i++)
    if (cache_write (c, buf, sizeof buf, offs[i], 0) == -1)
      return -1;
  uint64_t t1 = now_ns ();
  if (cache_flush (c) == -1)
    return -1;
  uint64_t t2 = now_ns ();
  fake_get_totals (fb, &t);
  res->wa = (double) t.write_bytes / ((double) writes * sizeof buf);
  res->write_ops_s = writes / ((t1 - t0) / 1e9);
  res->flush_ms = (t2 - t1) / 1e6;
  int r = cache_destroy (c);     /* clean: 0 */
  fake_free (fb);
  free (offs);
  return r;
}

/* The cache over a real file (in $TMPDIR, else /var/tmp), smaller than
 * what is written: 128 MiB of sequential 64 KiB writes through 32 MiB,
 * then a flush.  Written-back blocks stay unstable until the backing
 * flushes (a file's fdatasync can fail and forget), so writers waiting for
 * room wait for an fdatasync too: the rate shows what that costs. */
static int
run_file (double *mib_s, uint64_t *flushes)
{
  const char *dir = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/var/tmp";
  const uint64_t total = 128ull << 20;
  static char buf[65536];
  struct backing_opts o = { 0 };
  struct cache_config cfg;
  struct cache_stats st;
  char path[4096], err[256];
  struct backing *b;
  struct cache *c;
  int fd;

  snprintf (path, sizeof path, "%s/core-bench-XXXXXX", dir);
  fd = mkstemp (path);
  if (fd == -1 || ftruncate (fd, (off_t) total) == -1)
    return -1;
  close (fd);
  b = backing_file_open (path, &o, err, sizeof err);
  unlink (path);
  if (b == NULL) {
    fprintf (stderr, "core-bench: %s\n", err);
    return -1;
  }
  cache_config_default (&cfg);
  cfg.cache_size = 32u << 20;
  c = cache_create (b, NULL, &cfg, err, sizeof err);
  if (c == NULL) {
    fprintf (stderr, "core-bench: %s\n", err);
    return -1;
  }
  memset (buf, 0x5a, sizeof buf);
  uint64_t t0 = now_ns ();
  for (uint64_t off = 0; off < total; off += sizeof buf)
    if (cache_write (c, buf, sizeof buf, off, 0) == -1)
      return -1;
  if (cache_flush (c) == -1)
    return -1;
  uint64_t t1 = now_ns ();
  cache_get_stats (c, &st);
  *mib_s = (double) (total >> 20) / ((t1 - t0) / 1e9);
  *flushes = st.backing_flush_ops;
  if (cache_destroy (c) == -1)
    return -1;
  backing_close (b);
  return 0;
}

/* ---- scaling: threads against one cache, everything cached ---- */

/* A thread's working set.  16 MiB (256 folios) a thread overflows the
 * CPU caches at two threads on small machines (32 MiB of L3 shared), so
 * the rows then measure DRAM bandwidth more than the cache core: the
 * default 1 MiB (16 folios) keeps the copies in L2, and
 * CORE_THREADS_REGION_MIB=16 shows the memory-bound case. */
static uint64_t T_REGION = 1ull << 20;
#define T_MAX 2

struct tctx {
  struct cache *c;
  bool write, shared;
  unsigned id;
  atomic_bool *stop;
  uint64_t ops, cpu_ns;
};

static uint64_t
thread_cpu_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_THREAD_CPUTIME_ID, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

static void *
t_main (void *arg)
{
  struct tctx *t = arg;
  uint64_t seed = 0x12345678u + t->id * 7919u, base;
  char buf[4096];

  memset (buf, 0x33 + (int) t->id, sizeof buf);
  base = t->shared ? 0 : t->id * T_REGION;
  uint64_t cpu0 = thread_cpu_ns ();
  while (!atomic_load_explicit (t->stop, memory_order_relaxed)) {
    for (int i = 0; i < 64; i++) {
      uint64_t off = base + (xorshift (&seed) % (T_REGION / 4096)) * 4096;
      int r = t->write ? cache_write (t->c, buf, sizeof buf, off, 0)
                       : cache_read (t->c, buf, sizeof buf, off, 0);
      if (r == -1)
        abort ();
    }
    t->ops += 64;
  }
  t->cpu_ns = thread_cpu_ns () - cpu0;
  return NULL;
}

/* Ops/s of each of n threads for ms milliseconds; *cpu_ns the CPU time
 * per op (on a loaded machine the threads may not all run at once: CPU
 * per op still shows what sharing costs, lines bouncing between cores). */
static double
t_run (struct cache *c, bool write, bool shared, unsigned n, unsigned ms,
       double *cpu_ns)
{
  uint64_t cpu = 0;
  struct tctx t[T_MAX];
  pthread_t th[T_MAX];
  atomic_bool stop = false;
  uint64_t total = 0;

  for (unsigned i = 0; i < n; i++) {
    t[i] = (struct tctx) { .c = c, .write = write, .shared = shared,
                           .id = i, .stop = &stop };
    if (pthread_create (&th[i], NULL, t_main, &t[i]) != 0)
      abort ();
  }
  uint64_t t0 = now_ns ();
  usleep (ms * 1000);
  atomic_store (&stop, true);
  for (unsigned i = 0; i < n; i++) {
    pthread_join (th[i], NULL);
    total += t[i].ops;
    cpu += t[i].cpu_ns;
  }
  *cpu_ns = (double) cpu / (double) total;
  return (double) total / ((now_ns () - t0) / 1e9) / n;
}

static int
run_threads (unsigned ms)
{
  struct fake_backing *fb = fake_backing_new (T_MAX * T_REGION);
  struct cache_config cfg;
  struct cache_stats st;
  char err[256];

  cache_config_default (&cfg);
  cfg.cache_size = 2 * T_MAX * T_REGION;  /* no eviction */
  cfg.dirty_limit_pct = cfg.dirty_background_pct = 100;
  cfg.dirty_expire_ms = 3600000;          /* no writeback meanwhile */
  /* CORE_THREADS_READAHEAD=1: readahead on, as on a remote backing
   * (its lock was taken by every client read; now by misses and reads
   * that may continue a stream only). */
  cfg.readahead_bytes = getenv ("CORE_THREADS_READAHEAD") ? 1u << 20 : 0;
  if (fb == NULL)
    return -1;
  fake_set_log (fb, 0);
  struct cache *c = cache_create (fake_backing_base (fb), NULL, &cfg, err,
                                  sizeof err);
  if (c == NULL) {
    fprintf (stderr, "core-bench: %s\n", err);
    return -1;
  }
  if (cache_prefetch (c, T_MAX * T_REGION, 0) == -1)
    return -1;
  for (int w = 0; w < 2; w++)
    for (int sh = 0; sh < 2; sh++) {
      double cpu1, cpu2;
      double one = t_run (c, w, sh, 1, ms, &cpu1);
      double two = t_run (c, w, sh, 2, ms, &cpu2);
      printf ("core_threads op=%s folios=%s ops_per_s_per_thread: "
              "1_thread=%.0f 2_threads=%.0f scaling_2_vs_1=%.2f "
              "cpu_ns_per_op: 1_thread=%.0f 2_threads=%.0f\n",
              w ? "write4k" : "hit4k", sh ? "shared" : "disjoint", one, two,
              2 * two / one, cpu1, cpu2);
    }
  cache_get_stats (c, &st);
  printf ("core_threads lock waits (contended acquisitions): index=%" PRIu64
          " of %" PRIu64 " taken, stripe=%" PRIu64 " walk=%" PRIu64
          " throttle=%" PRIu64 "\n",
          st.lock_waits_index, st.lock_taken_index, st.lock_waits_stripe,
          st.lock_waits_walk, st.throttle_waits);
  if (cache_flush (c) == -1 || cache_destroy (c) == -1)
    return -1;
  fake_free (fb);
  return 0;
}

int
main (int argc, char **argv)
{
  unsigned writes = argc > 1 ? (unsigned) atoi (argv[1]) : 4096;
  uint32_t folio = argc > 2 ? (uint32_t) atoi (argv[2]) : 65536;
  uint32_t block = argc > 3 ? (uint32_t) atoi (argv[3]) : 4096;
  struct result sub, nosub;

  if (getenv ("CORE_THREADS_ONLY") != NULL)     /* for profiles of them */
    goto threads;
  if (run (writes, folio, block, &sub) == -1 ||
      run (writes, folio, folio, &nosub) == -1) {
    fprintf (stderr, "core-bench: run failed\n");
    return 1;
  }
  printf ("core-bench: %u random 4K writes over 1 GiB, folio %" PRIu32
          " block %" PRIu32 ", into uptodate folios, then flush\n",
          writes, folio, block);
  printf ("write_amplification=%.2f\n", sub.wa);
  printf ("write_amplification_nosubblock=%.2f\n", nosub.wa);
  printf ("cache_write_ops_per_s=%.0f flush_ms=%.1f "
          "(nosubblock: %.0f ops/s, flush %.1f ms)\n",
          sub.write_ops_s, sub.flush_ms, nosub.write_ops_s, nosub.flush_ms);
  double mib_s;
  uint64_t flushes;
  if (run_file (&mib_s, &flushes) == -1) {
    fprintf (stderr, "core-bench: file run failed\n");
    return 1;
  }
  printf ("file_write_mib_s=%.0f backing_flushes=%" PRIu64
          " (128 MiB of 64K writes through a 32 MiB cache to a file, "
          "then flush)\n", mib_s, flushes);
 threads:;
  const char *tms = getenv ("CORE_THREADS_MS");
  const char *treg = getenv ("CORE_THREADS_REGION_MIB");
  if (treg != NULL && atof (treg) >= 1.0 / 16)
    T_REGION = ((uint64_t) (atof (treg) * 16) << 16);
  if (run_threads (tms ? (unsigned) atoi (tms) : 500) == -1) {
    fprintf (stderr, "core-bench: threads run failed\n");
    return 1;
  }
  return 0;
}
