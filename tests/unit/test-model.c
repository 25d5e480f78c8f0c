/* Randomized model test: random reads, writes, zeros, trims, flushes,
 * prefetches, block-status calls and direct I/O against the cache over a
 * fake backing, checked against a plain reference buffer.
 *
 * Per seed: a random geometry (folio 4K..128K, block 512..4K), a cache of
 * 8-16 folios (so eviction never stops), a backing of a few MiB with an
 * awkward size, random writeback timing, mode, direct threshold, caps and
 * map() style (ZERO extents, extents cut at odd lengths).  Errors come in
 * phases: clean, transient (each request fails with probability p) and
 * persistent (every request on a range fails).  Clean phases sometimes
 * restart the writeback thread or the whole cache.
 *
 * The reference knows each byte, or knows it is one of two values: a
 * failed write leaves each byte old or new, a failed zero or trim (or a
 * trim the backing cannot do) old or zero.  A successful read or flush
 * tells which, and from then on the cache must stick to it; a byte in
 * doubt twice over becomes unknown until then.  Checked:
 *   - every successful read equals the reference (known bytes);
 *   - after every successful flush the backing equals the reference, and
 *     every backing write since is durable (flushed or FUA);
 *   - a successful FUA (or write-through) write is in the backing;
 *   - a read or write with CACHE_NOWAIT either completes or gives up with
 *     EAGAIN having changed nothing (half the time it is not repeated, so
 *     later reads see a half-applied write);
 *   - block status tiles the range and never calls non-zero data a hole;
 *   - the cache's backing counters match the requests the fake saw;
 *   - when errors stop, a flush succeeds, and at the end the backing and a
 *     fresh read of the whole device equal the reference.
 * The server's paths around the plain calls are ops too:
 *   - pwrite: cache_write_prepare, the folios filled, sometimes another op
 *     in between (it must not see them), then the edges with cache_write
 *     and cache_write_commit (a write of the whole range), or
 *     cache_write_abort (nothing changed, read back at once);
 *   - fetch (a backing with read_async, on most seeds): cache_fetch, then
 *     sometimes a write or direct write over the same range, then
 *     cache_read_fetched: it returns the reference, never the stale
 *     fetched bytes, and caches nothing stale (later reads check);
 *   - stream: sequential reads; on some seeds the backing says it is
 *     remote and readahead fills folios in the background meanwhile.
 * Trim semantics (the cache's contract): whole blocks inside the range read
 * as zeroes afterwards (the fake zeroes what it is asked to trim); the
 * parts of partial blocks are left unchanged; the last block counts as
 * whole when the trim reaches the end of the export.
 *
 * Environment: MODEL_SEED (default: time), MODEL_OPS (default 100000, or
 * 10000 under VALGRIND=1), MODEL_VERBOSE=1 prints the geometry,
 * MODEL_ERRORS=0 keeps every phase clean (no injected errors),
 * MODEL_SLOW_MS=N prints every op that took N ms or more,
 * MODEL_DELAY_US=N makes every backing request sleep N us first.
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

enum op_kind {
  OP_READ, OP_WRITE, OP_ZERO, OP_TRIM, OP_FLUSH, OP_PREFETCH, OP_STATUS,
  OP_DREAD, OP_DWRITE, OP_PWRITE, OP_FETCH, OP_STREAM, OP_RESTART,
  OP_RECOVER, OP_NKINDS
};
static const char *op_names[] = {
  "read", "write", "zero", "trim", "flush", "prefetch", "status",
  "dread", "dwrite", "pwrite", "fetch", "stream", "restart", "recover"
};

#define HIST 48

struct hist {
  uint64_t n;
  enum op_kind kind;
  uint64_t off, len;
  unsigned flags;
  int ret, err;
};

struct model {
  uint64_t seed, rng;
  uint64_t nops, op;
  uint64_t size;
  struct cache_config cfg;
  unsigned caps;
  unsigned delay_us;        /* fake backing delay per request */
  int map_zero;             /* map() says ZERO instead of HOLE */
  uint64_t map_max;         /* map() extent cap (0: none) */
  struct fake_backing *fb;
  struct cache *c;
  uint8_t *ref, *buf, *bbuf;
  uint8_t *zeros;           /* as large as buf, all zero */
  uint8_t *unk;             /* per byte: 0 known, 1 unknown, 2 ref or alt */
  uint8_t *alt;             /* the other possible value when unk == 2 */
  uint64_t nunk;            /* bytes in doubt */
  int phase;                /* 0 clean, 1 transient, 2 persistent */
  uint64_t phase_end;
  struct hist hist[HIST];
  uint64_t ok[OP_NKINDS], failed[OP_NKINDS];
  uint64_t nowait_gave_up;  /* CACHE_NOWAIT calls that would have waited */
  uint64_t flush_checks, phases[3];
  uint64_t slow_ms;         /* MODEL_SLOW_MS: report ops slower than this */
  uint64_t adopted;         /* bytes in doubt resolved by a read/flush */
  int async;                /* the backing offers read_async */
  int ra;                   /* remote, readahead on */
  uint8_t *pbuf, *fbuf;     /* pwrite's data, fetch's buffer */
  uint64_t force_off, force_len; /* the next pick_range, if len != 0 */
  uint64_t stream_pos;
  uint64_t evictions;       /* by the caches restarts destroyed */
  unsigned burst;           /* pwrites for this many ops, after a restart */
  uint64_t burst_off;       /* ... over five folios from here */
  int nested;               /* an op inside pwrite/fetch */
  uint64_t prep_done, prep_refused, prep_aborted, fetch_refused, fetch_raced;
  uint64_t held_flushes, held_reads; /* reads done while a flush wrote */
};

static void
model_dump (struct model *m)
{
  struct cache_stats st;

  fprintf (stderr,
           "MODEL FAILURE: MODEL_SEED=%" PRIu64 " at op %" PRIu64 "\n"
           "  size=%" PRIu64 " folio=%u block=%u cache=%" PRIu64
           " max_io=%u mode=%d direct_threshold=%" PRIu64
           " expire=%ums interval=%ums bg=%u%% limit=%u%% caps=%#x delay=%uus"
           " map_zero=%d map_max=%" PRIu64 " phase=%d"
           " unknown=%" PRIu64 " async=%d readahead=%d\n",
           m->seed, m->op, m->size, m->cfg.folio_size, m->cfg.block_size,
           m->cfg.cache_size, m->cfg.max_io_bytes, (int) m->cfg.mode,
           m->cfg.direct_threshold, m->cfg.dirty_expire_ms,
           m->cfg.writeback_interval_ms, m->cfg.dirty_background_pct,
           m->cfg.dirty_limit_pct, m->caps, m->delay_us, m->map_zero,
           m->map_max, m->phase, m->nunk, m->async, m->ra);
  fprintf (stderr, "  last ops (oldest first):\n");
  for (uint64_t i = m->op >= HIST ? m->op - HIST + 1 : 0; i <= m->op; i++) {
    struct hist *h = &m->hist[i % HIST];
    if (h->n != i)
      continue;
    fprintf (stderr, "    #%" PRIu64 " %-8s off=%" PRIu64 " len=%" PRIu64
             " flags=%#x -> %d%s%s\n", h->n, op_names[h->kind], h->off,
             h->len, h->flags, h->ret, h->ret ? " " : "",
             h->ret ? strerror (h->err) : "");
  }
  if (m->c) {
    cache_get_stats (m->c, &st);
    fprintf (stderr, "  stats: dirty=%" PRIu64 " cached=%" PRIu64
             " evictions=%" PRIu64 " wb_errors=%" PRIu64 "\n",
             st.dirty_bytes, st.cached_bytes, st.evictions,
             st.writeback_errors);
  }
}

#define MFAIL(m, ...) do {                         \
    model_dump (m);                                \
    fprintf (stderr, "  " __VA_ARGS__);            \
    fprintf (stderr, "\n");                        \
    fail_msg ("model failure, seed %" PRIu64, (m)->seed); \
  } while (0)

static uint64_t
rnd (struct model *m, uint64_t n)
{
  return fake_rand_below (&m->rng, n);
}

static int
chance (struct model *m, unsigned percent)
{
  return rnd (m, 100) < percent;
}

/* ---- reference bookkeeping ---- */

/* First byte in [from, to) whose value is in doubt, or to. */
static uint64_t
next_doubt (struct model *m, uint64_t from, uint64_t to)
{
  if (m->nunk == 0)
    return to;
  while (from < to && (from & 7))
    if (m->unk[from++])
      return from - 1;
  while (from + 8 <= to) {
    uint64_t w;
    memcpy (&w, m->unk + from, 8);
    if (w)
      break;
    from += 8;
  }
  while (from < to && !m->unk[from])
    from++;
  return from;
}

static void
ref_set (struct model *m, const uint8_t *src, uint64_t len, uint64_t off)
{
  if (src)
    memcpy (m->ref + off, src, len);
  else
    memset (m->ref + off, 0, len);
  if (next_doubt (m, off, off + len) < off + len) {
    uint64_t n = 0;
    for (uint64_t i = off; i < off + len; i++)
      n += m->unk[i] != 0;
    memset (m->unk + off, 0, len);
    m->nunk -= n;
  }
}

/* A failed or advisory request: each byte now holds its old value or
 * src's (zero when src is NULL).  A byte already in doubt becomes fully
 * unknown. */
static void
ref_maybe (struct model *m, const uint8_t *src, uint64_t len, uint64_t off)
{
  if (src == NULL)
    src = m->zeros;             /* no branch per byte below */
  if (next_doubt (m, off, off + len) == off + len) {
    /* Nothing in doubt yet: a straight (vectorizable) pass. */
    uint64_t n = 0;
    uint8_t *ref = m->ref + off, *unk = m->unk + off, *alt = m->alt + off;
    for (uint64_t i = 0; i < len; i++) {
      uint8_t v = src[i];
      uint8_t d = v != ref[i];
      unk[i] = (uint8_t) (d << 1);
      alt[i] = v;
      n += d;
    }
    m->nunk += n;
    return;
  }
  /* Known bytes that change get the new value as alternative; bytes with
   * an alternative that is neither become unknown (branch-free, so that
   * the compiler vectorizes it). */
  uint64_t n = 0;
  uint8_t *ref = m->ref + off, *unk = m->unk + off, *alt = m->alt + off;
  for (uint64_t i = 0; i < len; i++) {
    uint8_t v = src[i], u = unk[i], a = alt[i];
    uint8_t d = v != ref[i];
    uint8_t known = u == 0;
    uint8_t third = d & (v != a);
    unk[i] = known ? (uint8_t) (d << 1) : u == 2 ? (uint8_t) (2 - third) : 1;
    alt[i] = known ? v : a;
    n += known & d;
  }
  m->nunk += n;
}

static void
mismatch (struct model *m, const uint8_t *got, uint64_t len, uint64_t off,
          uint64_t i, const char *what)
{
  uint64_t p = off + i, j = i;
  while (j < len && !m->unk[off + j] && got[j] != m->ref[off + j])
    j++;
  MFAIL (m, "%s mismatch at byte %" PRIu64 " (range off=%" PRIu64
         " len=%" PRIu64 "): got %#x want %#x%s (alt %#x, doubt %d), %" PRIu64
         " bytes differ from there", what, p, off, len, got[i], m->ref[p],
         m->unk[p] ? " or the alternative" : "", m->alt[p], m->unk[p], j - i);
}

/* Check data read from the cache (or backing, what) against the
 * reference; where in doubt, adopt what the cache holds (from then on
 * it must stick to it). */
static void
ref_check (struct model *m, const uint8_t *got, uint64_t len, uint64_t off,
           const char *what)
{
  uint64_t i = 0;

  while (i < len) {
    uint64_t d = next_doubt (m, off + i, off + len) - off;
    if (d > i && memcmp (got + i, m->ref + off + i, d - i) != 0) {
      while (got[i] == m->ref[off + i])
        i++;
      mismatch (m, got, len, off, i, what);
    }
    i = d;
    for (; i < len && m->unk[off + i]; i++) {
      uint64_t p = off + i;
      if (m->unk[p] == 2 && got[i] != m->ref[p] && got[i] != m->alt[p])
        mismatch (m, got, len, off, i, what);
      m->ref[p] = got[i];
      m->unk[p] = 0;
      m->nunk--;
      m->adopted++;
    }
  }
}

static int
all_zero (const uint8_t *p, uint64_t n)
{
  static const uint8_t z[4096];
  while (n > 0) {
    uint64_t k = n < sizeof z ? n : sizeof z;
    if (memcmp (p, z, k) != 0)
      return 0;
    p += k;
    n -= k;
  }
  return 1;
}

/* After a successful flush the backing must equal the reference. */
static void
check_backing (struct model *m)
{
  if (fake_unflushed (m->fb) != 0)
    MFAIL (m, "flush succeeded but %" PRIu64 " backing writes since the "
           "last backing flush are not durable", fake_unflushed (m->fb));
  const uint64_t chunk = 1 << 20;
  for (uint64_t off = 0; off < m->size; off += chunk) {
    uint64_t n = m->size - off < chunk ? m->size - off : chunk;
    fake_peek (m->fb, m->bbuf, n, off);
    ref_check (m, m->bbuf, n, off, "backing after flush");
  }
  m->flush_checks++;
}

/* ---- random requests ---- */

static void
pick_range (struct model *m, uint64_t *offp, uint64_t *lenp)
{
  uint64_t bs = m->cfg.block_size, fs = m->cfg.folio_size;
  uint64_t off, len;

  if (m->force_len) {
    *offp = m->force_off;
    *lenp = m->force_len;
    m->force_len = 0;
    return;
  }
  switch (rnd (m, 8)) {
  case 0: case 1:           /* small, unaligned */
    len = 1 + rnd (m, bs + bs / 2);
    off = rnd (m, m->size);
    break;
  case 2: case 3:           /* whole blocks */
    len = (1 + rnd (m, 2 * fs / bs + 2)) * bs;
    off = rnd (m, m->size / bs) * bs;
    break;
  case 4:                   /* whole folios */
    len = (1 + rnd (m, 3)) * fs;
    off = rnd (m, m->size / fs + 1) * fs;
    break;
  case 5:                   /* near the end of the export */
    len = 1 + rnd (m, 2 * fs);
    off = m->size > len ? m->size - len : 0;
    if (chance (m, 50)) {
      uint64_t back = rnd (m, bs);
      off = off > back ? off - back : 0;
    }
    break;
  default:                  /* anything up to three folios */
    len = 1 + rnd (m, 3 * fs);
    off = rnd (m, m->size);
    break;
  }
  if (off >= m->size)
    off = m->size - 1;
  if (len > m->size - off)
    len = m->size - off;
  *offp = off;
  *lenp = len;
}

static void
rand_fill (struct model *m, uint8_t *p, uint64_t len)
{
  uint64_t i = 0, v = 0;
  /* Mostly random; sometimes a constant (zeros included). */
  if (chance (m, 10)) {
    memset (p, chance (m, 50) ? 0 : (int) rnd (m, 256), len);
    return;
  }
  for (; i + 8 <= len; i += 8) {
    v = fake_rand (&m->rng);
    memcpy (p + i, &v, 8);
  }
  v = fake_rand (&m->rng);
  for (; i < len; i++, v >>= 8)
    p[i] = (uint8_t) v;
}

/* ---- the operations ---- */

struct status_ctx {
  struct model *m;
  uint64_t pos, end;
  int bad;
};

static int
status_cb (void *opaque, uint64_t off, uint64_t len,
           enum backing_extent_type type)
{
  struct status_ctx *s = opaque;
  struct model *m = s->m;

  if (off != s->pos || len == 0 || off + len > s->end)
    MFAIL (m, "block status extent off=%" PRIu64 " len=%" PRIu64
           " does not continue at %" PRIu64 " inside end %" PRIu64,
           off, len, s->pos, s->end);
  if (type != BACKING_DATA && !(m->nunk == 0 && all_zero (m->ref + off, len))) {
    for (uint64_t i = off; i < off + len; i++)
      if ((m->unk[i] == 0 && m->ref[i] != 0) ||
          (m->unk[i] == 2 && m->ref[i] != 0 && m->alt[i] != 0))
        MFAIL (m, "block status calls %" PRIu64 "+%" PRIu64
               " type %d but byte %" PRIu64 " is %#x", off, len, type, i,
               m->ref[i]);
  }
  s->pos = off + len;
  return 0;
}

/* The whole-block part of a trim, per the cache's contract. */
static void
trim_span (struct model *m, uint64_t off, uint64_t len, uint64_t *s,
           uint64_t *e)
{
  uint64_t bs = m->cfg.block_size, end = off + len;
  *s = (off + bs - 1) / bs * bs;
  *e = end == m->size ? end : end / bs * bs;
  if (*s > *e)
    *e = *s;
}

/* A CACHE_NOWAIT call returned r: true if it gave up and is to be
 * repeated without the flag (as the server does), half of the time.  It
 * may only give up with EAGAIN (it never reaches the backing, so no
 * injected error can reach it). */
static bool
nowait_gave_up (struct model *m, int r, unsigned *flags)
{
  if (!(*flags & CACHE_NOWAIT) || r == 0)
    return false;
  if (errno != EAGAIN)
    MFAIL (m, "a CACHE_NOWAIT call failed with %s", strerror (errno));
  m->nowait_gave_up++;
  if (chance (m, 50))
    return false;
  *flags &= ~CACHE_NOWAIT;
  return true;
}

/* A flush whose backing writes are held at the fake's gate, in a thread:
 * meanwhile reads that do not wait (CACHE_NOWAIT) must still answer from
 * the cache, folios under writeback included, with the reference's
 * bytes.  Returns the flush's result (errno set). */
struct held_flush {
  struct cache *c;
  int r, err;
  atomic_bool done;
};

static void *
held_flush_main (void *arg)
{
  struct held_flush *h = arg;

  h->r = cache_flush (h->c);
  h->err = errno;
  atomic_store (&h->done, true);
  return NULL;
}

static int
held_flush (struct model *m)
{
  struct held_flush h = { .c = m->c };
  pthread_t t;

  fake_gate_close (m->fb, FAKE_M (FAKE_WRITE));
  if (pthread_create (&t, NULL, held_flush_main, &h) != 0) {
    fake_gate_open (m->fb);
    return cache_flush (m->c);
  }
  /* Until a write waits at the gate, or the flush wrote nothing. */
  while (!atomic_load (&h.done) && fake_gate_held (m->fb) == 0)
    usleep (100);
  if (fake_gate_held (m->fb) > 0) {
    m->held_flushes++;
    for (int i = 0; i < 4; i++) {
      uint64_t off, len;
      pick_range (m, &off, &len);
      memset (m->buf, 0xdb, len);
      if (cache_read (m->c, m->buf, len, off, CACHE_NOWAIT) == 0) {
        m->held_reads++;
        ref_check (m, m->buf, len, off, "read during writeback");
      }
    }
  }
  fake_gate_open (m->fb);
  pthread_join (t, NULL);
  errno = h.err;
  return h.r;
}

static void do_op (struct model *m, enum op_kind kind);

/* An op between the two halves of a pwrite or a fetch: over [off,
 * off+len) when overlap (a random piece of it), else anywhere. */
static void
nested_op (struct model *m, uint64_t off, uint64_t len, bool overlap,
           const enum op_kind *kinds, unsigned nkinds)
{
  if (overlap) {
    uint64_t s = rnd (m, len);
    m->force_off = off + s;
    m->force_len = 1 + rnd (m, len - s);
  }
  m->op++;
  m->nested++;
  do_op (m, kinds[rnd (m, nkinds)]);
  m->nested--;
}

static const enum op_kind any_kinds[] = {
  OP_READ, OP_READ, OP_WRITE, OP_WRITE, OP_ZERO, OP_TRIM, OP_FLUSH,
  OP_PREFETCH, OP_STATUS, OP_DREAD, OP_DWRITE
};
#define NKINDS(a) (unsigned) (sizeof (a) / sizeof (a)[0])

/* A piece of a pwrite that goes through cache_write, as the server's
 * edges do. */
static int
pwrite_edge (struct model *m, uint64_t off, uint64_t len, uint64_t eoff,
             uint64_t elen)
{
  const uint8_t *src = m->pbuf + (eoff - off);
  int r = cache_write (m->c, src, elen, eoff, 0);
  if (r == 0)
    ref_set (m, src, elen, eoff);
  else
    ref_maybe (m, src, elen, eoff);
  return r;
}

/* The server's write of whole folios received into folio memory. */
static int
do_pwrite (struct model *m, uint64_t off, uint64_t len, unsigned *flags)
{
  uint64_t fs = m->cfg.folio_size;
  uint64_t ps = (off + fs - 1) / fs * fs, pe = (off + len) / fs * fs;
  struct cache_prep p;
  int r = 0, cr;

  rand_fill (m, m->pbuf, len);
  if (cache_write_prepare (m->c, len, off, &p) == -1) {
    if (errno != EAGAIN)
      MFAIL (m, "cache_write_prepare failed with %s", strerror (errno));
    if (p.n != 0)
      MFAIL (m, "cache_write_prepare failed holding %u folios", p.n);
    m->prep_refused++;
    return pwrite_edge (m, off, len, off, len);
  }
  if (pe <= ps || p.off != ps || p.len != pe - ps || p.n != p.len / fs ||
      p.folio_size != fs)
    MFAIL (m, "cache_write_prepare gave %u folios of %zu at %" PRIu64
           "+%" PRIu64 ", not the whole folios inside", p.n, p.folio_size,
           p.off, p.len);
  for (unsigned i = 0; i < p.n; i++)
    memcpy (p.data[i], m->pbuf + (ps - off) + i * fs, fs);
  m->prep_done++;
  /* Not seen by anyone before the commit. */
  if (chance (m, 30))
    nested_op (m, ps, p.len, chance (m, 50), any_kinds, NKINDS (any_kinds));
  if (chance (m, 15)) {
    cache_write_abort (m->c, &p);
    m->prep_aborted++;
    if (p.n != 0)
      MFAIL (m, "cache_write_abort left %u folios held", p.n);
    /* Nothing changed. */
    if (cache_read (m->c, m->bbuf, pe - ps, ps, 0) == 0)
      ref_check (m, m->bbuf, pe - ps, ps, "read after abort");
    return 0;
  }
  if (ps > off)
    r |= pwrite_edge (m, off, len, off, ps - off);
  if (off + len > pe)
    r |= pwrite_edge (m, off, len, pe, off + len - pe);
  if (chance (m, 30))
    *flags |= CACHE_NOWAIT;
  cr = cache_write_commit (m->c, &p, *flags);
  if (cr == -1 && (*flags & CACHE_NOWAIT)) {
    if (errno != EAGAIN)
      MFAIL (m, "a CACHE_NOWAIT commit failed with %s", strerror (errno));
    if (p.n == 0)
      MFAIL (m, "a commit that gave up let the folios go");
    m->nowait_gave_up++;
    if (chance (m, 50)) {
      cache_write_abort (m->c, &p);   /* the middle stays as it was */
      return r;
    }
    *flags &= ~CACHE_NOWAIT;
    cr = cache_write_commit (m->c, &p, *flags);
  }
  if (p.n != 0)
    MFAIL (m, "cache_write_commit returned %d holding %u folios", cr, p.n);
  if (cr == 0)
    ref_set (m, m->pbuf + (ps - off), pe - ps, ps);
  else
    ref_maybe (m, m->pbuf + (ps - off), pe - ps, ps);
  return r | cr;
}

struct fetch_ctx {
  unsigned called;
  int err;
};

static void
fetch_done (void *opaque, int err)
{
  struct fetch_ctx *x = opaque;
  x->called++;
  x->err = err;
}

/* What overlaps a fetch before its bytes are put in: writes that reach
 * the backing after it served the fetch. */
static const enum op_kind race_kinds[] = {
  OP_DWRITE, OP_DWRITE, OP_WRITE, OP_ZERO, OP_TRIM
};
static const enum op_kind after_race_kinds[] = {
  OP_FLUSH, OP_READ, OP_WRITE, OP_DREAD
};

/* The server's parked read miss. */
static int
do_fetch (struct model *m, uint64_t off, uint64_t len, unsigned *flags)
{
  struct fetch_ctx x = { 0 };
  struct cache_fetched gen;
  int r;

  memset (m->fbuf, 0xdb, len);
  if (cache_fetch (m->c, m->fbuf, len, off, &gen, fetch_done, &x) == -1) {
    if (errno != ENOTSUP && errno != EAGAIN)
      MFAIL (m, "cache_fetch failed with %s", strerror (errno));
    if (x.called)
      MFAIL (m, "cache_fetch failed but its read completed");
    m->fetch_refused++;
    r = cache_read (m->c, m->fbuf, len, off, 0);
  }
  else {
    if (x.called != 1)
      MFAIL (m, "the fake's async read completed %u times", x.called);
    if (chance (m, 40)) {
      m->fetch_raced++;
      nested_op (m, off, len, true, race_kinds, NKINDS (race_kinds));
      if (chance (m, 50))
        nested_op (m, off, len, chance (m, 50), after_race_kinds,
                   NKINDS (after_race_kinds));
    }
    if (x.err)
      r = cache_read (m->c, m->fbuf, len, off, 0);
    else {
      if (chance (m, 30))
        *flags |= CACHE_NOWAIT;
      r = cache_read_fetched (m->c, m->fbuf, len, off, &gen, *flags);
      if (nowait_gave_up (m, r, flags))
        r = cache_read_fetched (m->c, m->fbuf, len, off, &gen, *flags);
    }
  }
  if (r == 0)
    ref_check (m, m->fbuf, len, off, "fetched read");
  return r;
}

/* Sequential reads (readahead follows them on a remote), now and then
 * from a new place. */
static int
do_stream (struct model *m, uint64_t *offp, uint64_t *lenp)
{
  uint64_t fs = m->cfg.folio_size, len = 1 + rnd (m, 2 * fs);
  uint64_t off = m->stream_pos;
  int r;

  if (off >= m->size || chance (m, 2))
    off = rnd (m, m->size / m->cfg.block_size) * m->cfg.block_size;
  if (len > m->size - off)
    len = m->size - off;
  *offp = off;
  *lenp = len;
  memset (m->buf, 0xdb, len);
  r = cache_read (m->c, m->buf, len, off, 0);
  if (r == 0)
    ref_check (m, m->buf, len, off, "stream read");
  m->stream_pos = off + len;
  return r;
}

static void
do_op (struct model *m, enum op_kind kind)
{
  struct hist *h = &m->hist[m->op % HIST];
  uint64_t off = 0, len = 0;
  unsigned flags = 0;
  int r = 0;
  uint64_t t0 = m->slow_ms ? ct_now_ms () : 0;

  if (kind != OP_FLUSH && kind != OP_RECOVER && kind != OP_STREAM)
    pick_range (m, &off, &len);
  if (kind == OP_FETCH && len > m->cfg.max_io_bytes)
    len = m->cfg.max_io_bytes;      /* what the server fetches at most */
  *h = (struct hist) { .n = m->op, .kind = kind, .off = off, .len = len };
  errno = 0;

  switch (kind) {
  case OP_READ:
  case OP_DREAD:
    flags = kind == OP_DREAD ? CACHE_DIRECT : 0;
    if (chance (m, 30))
      flags |= CACHE_NOWAIT;
    memset (m->buf, 0xdb, len);
    r = cache_read (m->c, m->buf, len, off, flags);
    if (nowait_gave_up (m, r, &flags))
      r = cache_read (m->c, m->buf, len, off, flags);
    if (r == 0)
      ref_check (m, m->buf, len, off, op_names[kind]);
    break;

  case OP_WRITE:
  case OP_DWRITE:
    flags = kind == OP_DWRITE ? CACHE_DIRECT : 0;
    if (chance (m, 10))
      flags |= CACHE_FUA;
    if (chance (m, 30))
      flags |= CACHE_NOWAIT;
    rand_fill (m, m->buf, len);
    r = cache_write (m->c, m->buf, len, off, flags);
    /* A write that gave up changed nothing: the reference stays, and
     * when it is not tried again the reads check that. */
    if (nowait_gave_up (m, r, &flags))
      r = cache_write (m->c, m->buf, len, off, flags);
    if (r == 0)
      ref_set (m, m->buf, len, off);
    else if (!(flags & CACHE_NOWAIT))
      ref_maybe (m, m->buf, len, off);
    if (r == 0 && (flags & CACHE_FUA || m->cfg.mode != CACHE_WRITEBACK)) {
      /* FUA (and write-through, and no cache): in the backing now. */
      fake_peek (m->fb, m->bbuf, len, off);
      if (memcmp (m->bbuf, m->buf, len) != 0)
        MFAIL (m, "FUA/write-through write is not in the backing");
    }
    break;

  case OP_ZERO:
    if (chance (m, 50))
      flags |= CACHE_MAY_TRIM;
    if (chance (m, 10))
      flags |= CACHE_FUA;
    if (chance (m, 10))
      flags |= CACHE_FAST_ZERO;
    r = cache_zero (m->c, len, off, flags);
    if (r == 0)
      ref_set (m, NULL, len, off);
    else if (errno == ENOTSUP && (flags & CACHE_FAST_ZERO) &&
             !(m->caps & BACKING_CAN_FAST_ZERO))
      ;  /* refused up front: nothing happened */
    else
      ref_maybe (m, NULL, len, off);
    break;

  case OP_TRIM: {
    uint64_t s, e;
    if (chance (m, 10))
      flags |= CACHE_FUA;
    trim_span (m, off, len, &s, &e);
    r = cache_trim (m->c, len, off, flags);
    if (r == 0 && (m->caps & BACKING_CAN_TRIM))
      ref_set (m, NULL, e - s, s);
    else if (e > s)
      /* Failed, or advisory without a trimming backing: each whole block
       * holds its old data or zeroes; the reads will tell. */
      ref_maybe (m, NULL, e - s, s);
    break;
  }

  case OP_FLUSH:
    r = chance (m, 50) ? held_flush (m) : cache_flush (m->c);
    if (r == 0)
      check_backing (m);
    break;

  case OP_PREFETCH:
    r = cache_prefetch (m->c, len, off);
    break;

  case OP_PWRITE:
    r = do_pwrite (m, off, len, &flags);
    break;

  case OP_FETCH:
    r = do_fetch (m, off, len, &flags);
    break;

  case OP_STREAM:
    r = do_stream (m, &off, &len);
    h->off = off;
    h->len = len;
    break;

  case OP_STATUS: {
    struct status_ctx s = { .m = m, .pos = off, .end = off + len };
    r = cache_block_status (m->c, len, off, status_cb, &s);
    if (r == 0 && s.pos != off + len)
      MFAIL (m, "block status stopped at %" PRIu64 " before %" PRIu64,
             s.pos, off + len);
    break;
  }

  case OP_RESTART:
    /* Clean phases only: stop and restart the writeback thread (as the
     * nbdkit adapter does around fork), or flush, destroy the cache and
     * start a new one, cold. */
    if (chance (m, 50)) {
      cache_stop_writeback (m->c);
      r = cache_start_writeback (m->c);
      if (r == -1)
        MFAIL (m, "cache_start_writeback failed: %s", strerror (errno));
      break;
    }
    if (cache_flush (m->c) == -1)
      MFAIL (m, "cache_flush with a working backing failed: %s",
             strerror (errno));
    struct cache_stats old;
    cache_get_stats (m->c, &old);
    m->evictions += old.evictions;
    r = cache_destroy (m->c);
    m->c = NULL;
    if (r == -1)
      MFAIL (m, "cache_destroy after a good flush dropped data");
    check_backing (m);
    fake_reset_log (m->fb);     /* the new cache counts from zero */
    m->c = ct_cache (m->fb, &m->cfg);
    if (m->c == NULL)
      MFAIL (m, "cache_create again failed");
    m->burst = 8 + (unsigned) rnd (m, 24);
    m->burst_off = rnd (m, m->size / m->cfg.folio_size - 5) *
                   m->cfg.folio_size;
    break;

  case OP_RECOVER:
    /* Errors have stopped: the first flush must succeed. */
    r = cache_flush (m->c);
    if (r == -1)
      MFAIL (m, "flush after errors stopped failed: %s", strerror (errno));
    check_backing (m);
    break;

  default:
    fail ();
  }
  h->flags = flags;
  h->ret = r;
  h->err = r ? errno : 0;
  if (m->slow_ms) {
    uint64_t ms = ct_now_ms () - t0;
    if (ms >= m->slow_ms) {
      struct cache_stats st;
      cache_get_stats (m->c, &st);
      printf ("slow: #%" PRIu64 " %s off=%" PRIu64 " len=%" PRIu64
              " took %" PRIu64 " ms (dirty=%" PRIu64 " cached=%" PRIu64 ")\n",
              m->op, op_names[kind], off, len, ms, st.dirty_bytes,
              st.cached_bytes);
    }
  }
  if (r == 0)
    m->ok[kind]++;
  else
    m->failed[kind]++;
}

static enum op_kind
pick_kind (struct model *m)
{
  unsigned x = (unsigned) rnd (m, 1000);
  /* A cold cache has the free folios that a prepare needs (a full one
   * has none: eviction reuses slots, a commit gives back the folios it
   * replaces): pwrites over a few folios, so that they go on finding
   * room. */
  if (m->burst > 0) {
    uint64_t fs = m->cfg.folio_size;
    uint64_t a = m->burst_off + fs * (1 + rnd (m, 2));  /* whole folios */
    uint64_t end = a + fs * (1 + rnd (m, 2));          /* from a to end */
    m->burst--;
    m->force_off = chance (m, 50) ? a - 1 - rnd (m, fs) : a;
    if (chance (m, 50))
      end += 1 + rnd (m, fs - 1);
    m->force_len = (end < m->size ? end : m->size) - m->force_off;
    return OP_PWRITE;
  }
  if (x < 200) return OP_READ;
  if (x < 250) return OP_FETCH;
  if (x < 300) return OP_STREAM;
  if (x < 540) return OP_WRITE;
  if (x < 630) return OP_PWRITE;
  if (x < 710) return OP_ZERO;
  if (x < 780) return OP_TRIM;
  if (x < 787) return OP_FLUSH;
  if (x < 840) return OP_PREFETCH;
  if (x < 900) return OP_STATUS;
  if (x < 950) return OP_DREAD;
  if (x >= 997 && m->phase == 0 && rnd (m, 2) == 0) return OP_RESTART;
  return OP_DWRITE;
}

/* Error phases: clean, transient, persistent; on leaving an error phase
 * the faults stop and a flush must succeed. */
static void
next_phase (struct model *m)
{
  if (m->phase != 0) {
    fake_clear_faults (m->fb);
    m->op++;
    do_op (m, OP_RECOVER);
  }
  unsigned x = (unsigned) rnd (m, 100);
  m->phase = x < 50 ? 0 : x < 80 ? 1 : 2;
  if (!ct_env_u64 ("MODEL_ERRORS", 1))
    m->phase = 0;
  m->phases[m->phase]++;
  m->phase_end = m->op + 300 + rnd (m, 3000);
  int err = chance (m, 80) ? EIO : chance (m, 50) ? ENOSPC : EROFS;
  if (m->phase == 1) {
    double p = 0.005 + (double) rnd (m, 100) / 1000.0; /* 0.5% .. 10.4% */
    unsigned mask = FAKE_M_DATAIO | FAKE_M (FAKE_FLUSH);
    if (chance (m, 30))
      mask |= FAKE_M (FAKE_MAP);
    fake_fail_random (m->fb, mask, p, fake_rand (&m->rng), err);
  }
  else if (m->phase == 2) {
    unsigned n = 1 + (unsigned) rnd (m, 2);
    for (unsigned i = 0; i < n; i++) {
      uint64_t len = 1 + rnd (m, 2 * (uint64_t) m->cfg.folio_size);
      uint64_t off = rnd (m, m->size - len);
      unsigned mask = chance (m, 50) ? FAKE_M (FAKE_WRITE)
                                     : FAKE_M_DATAIO;
      fake_fail_range (m->fb, mask, off, len, err);
    }
    if (chance (m, 20))
      fake_fail_range (m->fb, FAKE_M (FAKE_FLUSH), 0, 0, err);
  }
}

/* ---- setup ---- */

static void
model_setup (struct model *m)
{
  static const uint32_t folios[] = { 4096, 8192, 16384, 65536, 131072 };
  static const uint32_t blocks[] = { 512, 1024, 2048, 4096 };
  static const unsigned expires[] = { 1, 10, 100, 30000 };
  static const unsigned intervals[] = { 1, 5, 20, 1000 };
  struct cache_config *cfg = &m->cfg;

  cache_config_default (cfg);
  cfg->folio_size = folios[rnd (m, 5)];
  do
    cfg->block_size = blocks[rnd (m, 4)];
  while (cfg->block_size > cfg->folio_size);
  if (chance (m, 10))
    cfg->block_size = cfg->folio_size;     /* no sub-block tracking */
  cfg->cache_size = (8 + rnd (m, 9)) * (uint64_t) cfg->folio_size;
  switch (rnd (m, 4)) {
  case 0: cfg->max_io_bytes = cfg->block_size; break;
  case 1: cfg->max_io_bytes = cfg->folio_size; break;
  case 2: cfg->max_io_bytes = 3 * cfg->folio_size / 2 > cfg->block_size
            ? 3 * cfg->folio_size / 2 / cfg->block_size * cfg->block_size
            : cfg->block_size; break;
  default: cfg->max_io_bytes = 1 << 20; break;
  }
  cfg->dirty_expire_ms = expires[rnd (m, 4)];
  cfg->writeback_interval_ms = intervals[rnd (m, 4)];
  cfg->dirty_background_pct = 5 + (unsigned) rnd (m, 30);
  cfg->dirty_limit_pct = cfg->dirty_background_pct + (unsigned) rnd (m, 50);
  unsigned x = (unsigned) rnd (m, 100);
  cfg->mode = x < 80 ? CACHE_WRITEBACK : x < 93 ? CACHE_WRITETHROUGH
                                                : CACHE_NONE;
  cfg->direct_threshold = chance (m, 20) ? 2 * (uint64_t) cfg->folio_size : 0;

  /* A few MiB, at least four times the cache, awkward tail. */
  m->size = (1 + rnd (m, 3)) << 20;
  if (m->size < 4 * cfg->cache_size)
    m->size = 4 * cfg->cache_size;
  switch (rnd (m, 4)) {
  case 0: break;
  case 1: m->size += 512 * (1 + rnd (m, 100)); break;
  case 2: m->size -= 512 * (1 + rnd (m, 7)); break;
  default: m->size += cfg->block_size * (1 + rnd (m, 10)); break;
  }

  m->caps = FAKE_DEFAULT_CAPS;
  if (chance (m, 15))
    m->caps &= ~BACKING_CAN_MAP;
  if (chance (m, 15))
    m->caps &= ~BACKING_CAN_TRIM;
  if (chance (m, 15))
    m->caps &= ~BACKING_CAN_FAST_ZERO;
  if (chance (m, 15))
    m->caps &= ~BACKING_CAN_FUA;

  m->fb = fake_backing_new (m->size);
  assert_non_null (m->fb);
  fake_set_caps (m->fb, m->caps);
  fake_set_log (m->fb, 0);
  fake_set_torn_writes (m->fb, 1);
  /* On request a slow backing, so that background writeback overlaps the
   * foreground more (too slow for every make check). */
  m->delay_us = (unsigned) ct_env_u64 ("MODEL_DELAY_US", 0);
  /* map() style: holes or zero extents; extents cut short, even across
   * block boundaries. */
  static const uint64_t map_caps[] = { 0, 0, 512, 3000, 4096, 65536 + 512 };
  m->map_zero = chance (m, 30);
  m->map_max = map_caps[rnd (m, 6)];
  fake_set_map_style (m->fb, m->map_zero, m->map_max);
  fake_set_delay_us (m->fb, m->delay_us);
  /* Most seeds: an async read for cache_fetch.  Some: a remote, so that
   * readahead runs (its default window, or a few folios). */
  m->async = chance (m, 70);
  fake_set_async (m->fb, m->async);
  m->ra = chance (m, 40);
  if (m->ra) {
    m->caps |= BACKING_REMOTE;
    fake_set_caps (m->fb, m->caps);
    cfg->readahead_bytes = chance (m, 50) ? CACHE_READAHEAD_AUTO
      : (2 + (uint32_t) rnd (m, 7)) * cfg->folio_size;
  }
  m->ref = calloc (1, m->size);
  m->unk = calloc (1, m->size);
  m->alt = calloc (1, m->size);
  m->buf = malloc (4 * (size_t) cfg->folio_size + 8192);
  m->bbuf = malloc (1 << 20);
  m->zeros = calloc (1, 4 * (size_t) cfg->folio_size + 8192);
  m->pbuf = malloc (4 * (size_t) cfg->folio_size + 8192);
  /* A fetch rounds out to whole blocks (cache_fetch_room). */
  m->fbuf = malloc (6 * (size_t) cfg->folio_size + 8192);
  assert_true (m->ref && m->unk && m->alt && m->buf && m->bbuf && m->zeros &&
               m->pbuf && m->fbuf);
  /* Old data in part of the device, holes elsewhere. */
  for (uint64_t off = 0; off < m->size; off += 65536) {
    uint64_t n = m->size - off < 65536 ? m->size - off : 65536;
    if (chance (m, 60)) {
      fake_fill_pattern (m->fb, n, off, (uint8_t) m->seed);
      fake_peek (m->fb, m->ref + off, n, off);
    }
  }
  m->c = ct_cache (m->fb, cfg);
  if (m->c == NULL)
    MFAIL (m, "cache_create failed");
}

static void
test_model (void **state)
{
  struct model *m = calloc (1, sizeof *m);
  uint64_t t0 = ct_now_ms ();

  assert_non_null (m);
  m->seed = ct_env_u64 ("MODEL_SEED", 0);
  if (m->seed == 0) {
    struct timespec ts;
    clock_gettime (CLOCK_REALTIME, &ts);
    m->seed = (uint64_t) ts.tv_sec * 1000003u ^ (uint64_t) ts.tv_nsec;
  }
  m->nops = ct_env_u64 ("MODEL_OPS", ct_valgrind () ? 10000 : 100000);
  m->rng = m->seed;
  m->slow_ms = ct_env_u64 ("MODEL_SLOW_MS", 0);
  printf ("MODEL_SEED=%" PRIu64 " MODEL_OPS=%" PRIu64 "\n", m->seed, m->nops);
  fflush (stdout);
  model_setup (m);
  if (ct_env_u64 ("MODEL_VERBOSE", 0))
    printf ("size=%" PRIu64 " folio=%u block=%u cache=%" PRIu64 " max_io=%u"
            " mode=%d direct_threshold=%" PRIu64 " expire=%u interval=%u"
            " caps=%#x delay=%uus\n", m->size, m->cfg.folio_size, m->cfg.block_size,
            m->cfg.cache_size, m->cfg.max_io_bytes, (int) m->cfg.mode,
            m->cfg.direct_threshold, m->cfg.dirty_expire_ms,
            m->cfg.writeback_interval_ms, m->caps, m->delay_us);

  m->phase = 0;
  m->phase_end = 200 + rnd (m, 2000);
  for (m->op = 0; m->op < m->nops; m->op++) {
    if (m->op >= m->phase_end)
      next_phase (m);
    do_op (m, pick_kind (m));
  }

  /* Errors stop: flush succeeds; backing and a fresh read equal the
   * reference. */
  fake_clear_faults (m->fb);
  m->op++;
  do_op (m, OP_RECOVER);
  for (uint64_t off = 0; off < m->size; off += 1 << 20) {
    uint64_t n = m->size - off < (1 << 20) ? m->size - off : 1 << 20;
    m->op++;
    struct hist *h = &m->hist[m->op % HIST];
    *h = (struct hist) { .n = m->op, .kind = OP_READ, .off = off, .len = n };
    if (cache_read (m->c, m->bbuf, n, off, 0) == -1)
      MFAIL (m, "final read failed: %s", strerror (errno));
    ref_check (m, m->bbuf, n, off, "final read");
  }
  if (m->nunk != 0)
    MFAIL (m, "%" PRIu64 " bytes still unknown after reading everything",
           m->nunk);

  /* The cache's counters agree with what the backing saw. */
  struct cache_stats st;
  struct fake_totals tot;
  cache_get_stats (m->c, &st);
  fake_get_totals (m->fb, &tot);
  if (st.backing_read_ops != tot.ops[FAKE_READ] ||
      st.backing_write_ops != tot.ops[FAKE_WRITE] ||
      st.backing_zero_ops != tot.ops[FAKE_ZERO] ||
      st.backing_trim_ops != tot.ops[FAKE_TRIM] ||
      st.backing_flush_ops != tot.ops[FAKE_FLUSH] || st.dirty_bytes != 0)
    MFAIL (m, "counters: cache says reads %" PRIu64 " writes %" PRIu64
           " zeros %" PRIu64 " trims %" PRIu64 " flushes %" PRIu64
           " dirty %" PRIu64 "; backing saw %" PRIu64 "/%" PRIu64 "/%" PRIu64
           "/%" PRIu64 "/%" PRIu64, st.backing_read_ops, st.backing_write_ops,
           st.backing_zero_ops, st.backing_trim_ops, st.backing_flush_ops,
           st.dirty_bytes, tot.ops[FAKE_READ], tot.ops[FAKE_WRITE],
           tot.ops[FAKE_ZERO], tot.ops[FAKE_TRIM], tot.ops[FAKE_FLUSH]);
  assert_int_equal (cache_destroy (m->c), 0);
  m->c = NULL;
  check_backing (m);
  fake_get_totals (m->fb, &tot);
  if (tot.bad)
    MFAIL (m, "%" PRIu64 " out-of-range backing requests", tot.bad);

  printf ("ops=%" PRIu64 " in %" PRIu64 " ms; ok/failed:", m->nops,
          ct_now_ms () - t0);
  for (int k = 0; k < OP_RECOVER; k++)
    printf (" %s=%" PRIu64 "/%" PRIu64, op_names[k], m->ok[k], m->failed[k]);
  printf ("\ndoubtful bytes resolved=%" PRIu64 " flush checks=%" PRIu64
          " phases clean/transient/persistent=%" PRIu64 "/%" PRIu64 "/%" PRIu64 " evictions=%" PRIu64
          " backing reads=%" PRIu64 " writes=%" PRIu64 " injected=%" PRIu64
          " throttle_waits=%" PRIu64 " nowait_gave_up=%" PRIu64 "\n", m->adopted, m->flush_checks, m->phases[0], m->phases[1],
          m->phases[2], st.evictions, tot.ops[FAKE_READ], tot.ops[FAKE_WRITE], tot.failed,
          st.throttle_waits, m->nowait_gave_up);
  printf ("async=%d readahead=%d: pwrite prepared/refused/aborted=%" PRIu64
          "/%" PRIu64 "/%" PRIu64
          " fetch refused/raced=%" PRIu64 "/%" PRIu64
          " readahead bytes=%" PRIu64 " hits=%" PRIu64
          " held flushes=%" PRIu64 " reads during them=%" PRIu64 "\n",
          m->async, m->ra,
          m->prep_done, m->prep_refused, m->prep_aborted, m->fetch_refused,
          m->fetch_raced,
          st.readahead_bytes, st.readahead_hits, m->held_flushes,
          m->held_reads);
  /* The cache really was too small (the last restart may have come
   * late: its cache need not have evicted yet). */
  if (m->cfg.mode != CACHE_NONE && m->nops >= 10000)
    assert_true (st.evictions + m->evictions > 0);

  fake_free (m->fb);
  free (m->ref);
  free (m->unk);
  free (m->alt);
  free (m->buf);
  free (m->bbuf);
  free (m->zeros);
  free (m->pbuf);
  free (m->fbuf);
  free (m);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_model),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
