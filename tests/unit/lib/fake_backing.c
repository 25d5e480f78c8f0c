/* The fake backing: sparse pages, request log, hole map, error injection.
 * See fake_backing.h for the contract. */
#include <assert.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "fake_backing.h"

#define FPAGE        4096u
#define FSECT        512u
#define SECT_PER_PAGE (FPAGE / FSECT)  /* 8: one byte of datamap */
#define CHUNK_PAGES  512u              /* 2 MiB per chunk */
#define CHUNK_BYTES  ((uint64_t) FPAGE * CHUNK_PAGES)
#define LOG_MAX      (1u << 20)        /* entries kept; later ones dropped */
#define MAX_RANGES   16

struct fpage {
  uint8_t data[FPAGE];
  uint8_t datamap;      /* bit s: sector s is DATA; HOLE sectors are zero */
};

struct fchunk {
  struct fpage *pages[CHUNK_PAGES];
};

struct fault_range {
  unsigned mask;
  uint64_t off, len;
  int err;
};

struct fake_backing {
  struct backing base;  /* first: the cache sees only this */
  pthread_mutex_t lock; /* protects everything below */
  uint64_t nchunks;
  struct fchunk **chunks;

  struct fake_req *log;
  size_t log_len, log_cap;
  int log_on;
  struct fake_totals tot;

  unsigned next_mask, next_n;
  int next_err;
  unsigned rnd_mask;
  double rnd_p;
  uint64_t rnd_state;
  int rnd_err;
  struct fault_range ranges[MAX_RANGES];
  unsigned nranges;
  int torn;
  unsigned delay_us, map_delay_us;
  int async;                   /* ops with read_async */
  uint64_t unflushed;   /* see fake_unflushed() */
  int holes_as_zero;
  uint64_t map_max;
  /* The gate (fake_gate_close): requests of kinds in gate_mask wait on
   * gate_cv; gate_held counts them. */
  pthread_cond_t gate_cv;
  unsigned gate_mask, gate_held;
};

static void
lock (struct fake_backing *fb)
{
  int r = pthread_mutex_lock (&fb->lock);
  assert (r == 0);
  (void) r;
}

static void
unlock (struct fake_backing *fb)
{
  int r = pthread_mutex_unlock (&fb->lock);
  assert (r == 0);
  (void) r;
}

/* ---- sparse storage (lock held) ---- */

static struct fpage *
page_get (struct fake_backing *fb, uint64_t pidx, int create)
{
  uint64_t ci = pidx / CHUNK_PAGES;
  struct fchunk *ch = fb->chunks[ci];

  if (ch == NULL) {
    if (!create)
      return NULL;
    ch = calloc (1, sizeof *ch);
    if (ch == NULL)
      abort ();
    fb->chunks[ci] = ch;
  }
  struct fpage *p = ch->pages[pidx % CHUNK_PAGES];
  if (p == NULL && create) {
    p = calloc (1, sizeof *p);
    if (p == NULL)
      abort ();
    ch->pages[pidx % CHUNK_PAGES] = p;
  }
  return p;
}

static void
page_free_if_hole (struct fake_backing *fb, uint64_t pidx)
{
  struct fchunk *ch = fb->chunks[pidx / CHUNK_PAGES];
  struct fpage *p = ch ? ch->pages[pidx % CHUNK_PAGES] : NULL;

  if (p && p->datamap == 0) {
    free (p);
    ch->pages[pidx % CHUNK_PAGES] = NULL;
  }
}

/* Sector bits of [start, end) inside a page: touched (any byte) or
 * covered (every byte). */
static uint8_t
sect_bits (uint32_t start, uint32_t end, int whole)
{
  uint8_t bits = 0;
  for (unsigned s = 0; s < SECT_PER_PAGE; s++) {
    uint32_t ss = s * FSECT, se = ss + FSECT;
    int touch = start < se && end > ss;
    int cover = start <= ss && end >= se;
    if (whole ? cover : touch)
      bits |= (uint8_t) (1u << s);
  }
  return bits;
}

static void
store_bytes (struct fake_backing *fb, const void *buf, uint64_t len,
             uint64_t off)
{
  const uint8_t *src = buf;
  while (len > 0) {
    uint64_t pidx = off / FPAGE;
    uint32_t po = off % FPAGE;
    uint32_t n = len < FPAGE - po ? (uint32_t) len : FPAGE - po;
    struct fpage *p = page_get (fb, pidx, 1);
    memcpy (p->data + po, src, n);
    p->datamap |= sect_bits (po, po + n, 0);
    src += n; off += n; len -= n;
  }
}

static void
zero_bytes (struct fake_backing *fb, uint64_t len, uint64_t off)
{
  while (len > 0) {
    uint64_t pidx = off / FPAGE;
    uint32_t po = off % FPAGE;
    uint32_t n = len < FPAGE - po ? (uint32_t) len : FPAGE - po;
    struct fpage *p = page_get (fb, pidx, 0);
    if (p) {
      memset (p->data + po, 0, n);
      p->datamap &= (uint8_t) ~sect_bits (po, po + n, 1);
      page_free_if_hole (fb, pidx);
    }
    off += n; len -= n;
  }
}

static void
load_bytes (struct fake_backing *fb, void *buf, uint64_t len, uint64_t off)
{
  uint8_t *dst = buf;
  while (len > 0) {
    uint64_t pidx = off / FPAGE;
    uint32_t po = off % FPAGE;
    uint32_t n = len < FPAGE - po ? (uint32_t) len : FPAGE - po;
    struct fpage *p = page_get (fb, pidx, 0);
    if (p)
      memcpy (dst, p->data + po, n);
    else
      memset (dst, 0, n);
    dst += n; off += n; len -= n;
  }
}

static int
sector_is_data (struct fake_backing *fb, uint64_t off)
{
  struct fpage *p = page_get (fb, off / FPAGE, 0);
  return p && (p->datamap >> ((off % FPAGE) / FSECT)) & 1;
}

/* ---- request bookkeeping (lock held) ---- */

static void
log_add (struct fake_backing *fb, enum fake_op op, uint64_t off,
         uint64_t len, unsigned flags, int err)
{
  if (!fb->log_on || fb->log_len >= LOG_MAX) {
    fb->tot.log_dropped++;
    return;
  }
  if (fb->log_len == fb->log_cap) {
    size_t cap = fb->log_cap ? fb->log_cap * 2 : 256;
    struct fake_req *l = realloc (fb->log, cap * sizeof *l);
    if (l == NULL) {
      fb->tot.log_dropped++;
      return;
    }
    fb->log = l;
    fb->log_cap = cap;
  }
  fb->log[fb->log_len++] = (struct fake_req) {
    .op = op, .off = off, .len = len, .flags = flags, .err = err };
}

/* Which errno, if any, an injected fault gives this request. */
static int
fault_for (struct fake_backing *fb, enum fake_op op, uint64_t off,
           uint64_t len)
{
  unsigned m = FAKE_M (op);

  for (unsigned i = 0; i < fb->nranges; i++) {
    struct fault_range *r = &fb->ranges[i];
    if (!(r->mask & m))
      continue;
    if (op == FAKE_FLUSH || (off < r->off + r->len && off + len > r->off))
      return r->err;
  }
  if (fb->next_n > 0 && (fb->next_mask & m)) {
    fb->next_n--;
    return fb->next_err;
  }
  if (fb->rnd_p > 0 && (fb->rnd_mask & m)) {
    double x = (double) (fake_rand (&fb->rnd_state) >> 11) / (double) (1ull << 53);
    if (x < fb->rnd_p)
      return fb->rnd_err;
  }
  return 0;
}

/* Validate, count, inject and log one request.  Returns 0 to go ahead or
 * the errno to fail with. */
static int
request_begin (struct fake_backing *fb, enum fake_op op, uint64_t off,
               uint64_t len, unsigned flags)
{
  int err = 0;

  fb->tot.ops[op]++;
  if (op != FAKE_FLUSH &&
      (len == 0 || off > fb->base.size || len > fb->base.size - off)) {
    fb->tot.bad++;
    err = EINVAL;
  }
  else if (op != FAKE_MAP && op != FAKE_READ && op != FAKE_FLUSH &&
           (fb->base.caps & BACKING_READ_ONLY))
    err = EROFS;
  else if (op == FAKE_ZERO && (flags & BACKING_FAST_ZERO) &&
           !(fb->base.caps & BACKING_CAN_FAST_ZERO))
    err = ENOTSUP;
  else if (op == FAKE_TRIM && !(fb->base.caps & BACKING_CAN_TRIM))
    err = EOPNOTSUPP;
  else {
    err = fault_for (fb, op, off, len);
    if (err)
      fb->tot.failed++;
  }
  if (err == 0 && (flags & BACKING_FUA))
    fb->tot.fua_writes++;
  if (err == 0 && op == FAKE_FLUSH)
    fb->unflushed = 0;
  else if (err == 0 && !(flags & BACKING_FUA) &&
           (op == FAKE_WRITE || op == FAKE_ZERO || op == FAKE_TRIM))
    fb->unflushed++;
  log_add (fb, op, off, len, flags, err);
  return err;
}

/* Wait at the gate while it is closed for op (the request has not
 * started: it neither counts nor takes effect until it passes). */
static void
gate (struct fake_backing *fb, enum fake_op op)
{
  lock (fb);
  if (fb->gate_mask & FAKE_M (op)) {
    fb->gate_held++;
    pthread_cond_broadcast (&fb->gate_cv);
    while (fb->gate_mask & FAKE_M (op))
      pthread_cond_wait (&fb->gate_cv, &fb->lock);
    fb->gate_held--;
  }
  unlock (fb);
}

static void
delay (struct fake_backing *fb, enum fake_op op)
{
  unsigned us;
  gate (fb, op);
  lock (fb);
  us = fb->delay_us;
  unlock (fb);
  if (us)
    usleep (us);
}

/* ---- backing ops ---- */

static int
fake_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  int err;

  delay (fb, FAKE_READ);
  lock (fb);
  err = request_begin (fb, FAKE_READ, off, len, 0);
  if (err == 0) {
    load_bytes (fb, buf, len, off);
    fb->tot.read_bytes += len;
  }
  else if (err != EINVAL)
    memset (buf, 0xa5, len);
  unlock (fb);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* Store buf (NULL: zeroes) over [off, off+len) for request op, counting
 * into *total.  A torn failure stores the first half first. */
static int
fake_modify (struct backing *b, enum fake_op op, const void *buf,
             uint64_t len, uint64_t off, unsigned flags, uint64_t *total)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  int err;

  delay (fb, op);
  lock (fb);
  err = request_begin (fb, op, off, len, flags);
  uint64_t n = err == 0 ? len : 0;
  if (err != 0 && fb->torn && err != EINVAL && err != EROFS &&
      err != ENOTSUP && err != EOPNOTSUPP)
    n = len / 2;
  if (n > 0) {
    if (buf)
      store_bytes (fb, buf, n, off);
    else
      zero_bytes (fb, n, off);
  }
  if (err == 0)
    *total += len;
  unlock (fb);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

static int
fake_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
            unsigned flags)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  return fake_modify (b, FAKE_WRITE, buf, len, off, flags,
                      &fb->tot.write_bytes);
}

static int
fake_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  return fake_modify (b, FAKE_ZERO, NULL, len, off, flags,
                      &fb->tot.zero_bytes);
}

/* Advisory in general; this fake always zeroes the whole range. */
static int
fake_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  return fake_modify (b, FAKE_TRIM, NULL, len, off, flags,
                      &fb->tot.trim_bytes);
}

static int
fake_flush (struct backing *b)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  int err;

  lock (fb);
  err = request_begin (fb, FAKE_FLUSH, 0, 0, 0);
  unlock (fb);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* The extent at off (lock held). */
static void
map_locked (struct fake_backing *fb, uint64_t off, uint64_t len,
            struct backing_extent *ext)
{
  int data = sector_is_data (fb, off);
  uint64_t end = off + len;
  uint64_t pos = (off / FSECT + 1) * FSECT;   /* next sector */
  while (pos < end) {
    /* Skip absent chunks and pages in one step when scanning holes. */
    if (!data && fb->chunks[pos / CHUNK_BYTES] == NULL) {
      pos = (pos / CHUNK_BYTES + 1) * CHUNK_BYTES;
      continue;
    }
    if (!data && page_get (fb, pos / FPAGE, 0) == NULL) {
      pos = (pos / FPAGE + 1) * FPAGE;
      continue;
    }
    if (data && pos % FPAGE == 0) {
      struct fpage *p = page_get (fb, pos / FPAGE, 0);
      if (p && p->datamap == 0xff) {
        pos += FPAGE;
        continue;
      }
    }
    if (sector_is_data (fb, pos) != data)
      break;
    pos += FSECT;
  }
  if (pos > end)
    pos = end;
  if (fb->map_max && pos - off > fb->map_max)
    pos = off + fb->map_max;
  ext->offset = off;
  ext->length = pos - off;
  ext->type = data ? BACKING_DATA
                   : fb->holes_as_zero ? BACKING_ZERO : BACKING_HOLE;
}

static int
fake_map (struct backing *b, uint64_t off, uint64_t len,
          struct backing_extent *ext)
{
  struct fake_backing *fb = (struct fake_backing *) b;
  int err;

  lock (fb);
  err = request_begin (fb, FAKE_MAP, off, len, 0);
  if (err == 0)
    map_locked (fb, off, len, ext);
  unsigned us = fb->map_delay_us;
  unlock (fb);
  if (us)
    usleep (us);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* As a remote's extent cache that knows the whole map: no request, no
 * fault, no delay (what map_cached may cost: nothing). */
static int
fake_map_cached (struct backing *b, uint64_t off, uint64_t len,
                 struct backing_extent *ext)
{
  struct fake_backing *fb = (struct fake_backing *) b;

  lock (fb);
  map_locked (fb, off, len, ext);
  unlock (fb);
  return 0;
}

static void
fake_close (struct backing *b)
{
  fake_free ((struct fake_backing *) b);
}

/* An async read done at once: a plain read (counted, logged, failing as
 * injected), then done on the caller's thread.  The data is the backing's
 * at the call, so what the caller does before cache_read_fetched is the
 * race of a remote that answered before a write reached it. */
static int
fake_read_async (struct backing *b, void *buf, uint64_t len, uint64_t off,
                 void (*done) (void *opaque, int err), void *opaque)
{
  int err = fake_read (b, buf, len, off) == -1 ? errno : 0;
  done (opaque, err);
  return 0;
}

static const struct backing_ops fake_ops_map = {
  .name = "fake", .read = fake_read, .write = fake_write, .zero = fake_zero,
  .trim = fake_trim, .flush = fake_flush, .map = fake_map,
  .stats = NULL, .close = fake_close,
};

static const struct backing_ops fake_ops_nomap = {
  .name = "fake-nomap", .read = fake_read, .write = fake_write,
  .zero = fake_zero, .trim = fake_trim, .flush = fake_flush, .map = NULL,
  .stats = NULL, .close = fake_close,
};

static const struct backing_ops fake_ops_map_async = {
  .name = "fake-async", .read = fake_read, .read_async = fake_read_async,
  .write = fake_write, .zero = fake_zero, .trim = fake_trim,
  .flush = fake_flush, .map = fake_map, .map_cached = fake_map_cached,
  .stats = NULL, .close = fake_close,
};

static const struct backing_ops fake_ops_nomap_async = {
  .name = "fake-nomap-async", .read = fake_read,
  .read_async = fake_read_async, .write = fake_write, .zero = fake_zero,
  .trim = fake_trim, .flush = fake_flush, .map = NULL, .stats = NULL,
  .close = fake_close,
};

static const struct backing_ops *
fake_ops_for (unsigned caps, int async)
{
  if (caps & BACKING_CAN_MAP)
    return async ? &fake_ops_map_async : &fake_ops_map;
  return async ? &fake_ops_nomap_async : &fake_ops_nomap;
}

/* ---- public API ---- */

struct fake_backing *
fake_backing_new (uint64_t size)
{
  struct fake_backing *fb = calloc (1, sizeof *fb);
  if (fb == NULL)
    return NULL;
  fb->nchunks = (size + CHUNK_BYTES - 1) / CHUNK_BYTES;
  fb->chunks = calloc (fb->nchunks ? fb->nchunks : 1, sizeof *fb->chunks);
  if (fb->chunks == NULL) {
    free (fb);
    return NULL;
  }
  pthread_mutex_init (&fb->lock, NULL);
  pthread_cond_init (&fb->gate_cv, NULL);
  fb->base.ops = &fake_ops_map;
  fb->base.size = size;
  fb->base.caps = FAKE_DEFAULT_CAPS;
  fb->base.io_align = 1;
  fb->base.direct = 0;
  fb->log_on = 1;
  return fb;
}

struct backing *
fake_backing_base (struct fake_backing *fb)
{
  return &fb->base;
}

void
fake_free (struct fake_backing *fb)
{
  if (fb == NULL)
    return;
  for (uint64_t ci = 0; ci < fb->nchunks; ci++) {
    struct fchunk *ch = fb->chunks[ci];
    if (ch == NULL)
      continue;
    for (unsigned i = 0; i < CHUNK_PAGES; i++)
      free (ch->pages[i]);
    free (ch);
  }
  free (fb->chunks);
  free (fb->log);
  pthread_mutex_destroy (&fb->lock);
  pthread_cond_destroy (&fb->gate_cv);
  free (fb);
}

void
fake_set_caps (struct fake_backing *fb, unsigned caps)
{
  lock (fb);
  fb->base.caps = caps;
  fb->base.ops = fake_ops_for (caps, fb->async);
  unlock (fb);
}

void
fake_set_async (struct fake_backing *fb, int on)
{
  lock (fb);
  fb->async = on;
  fb->base.ops = fake_ops_for (fb->base.caps, on);
  unlock (fb);
}

void
fake_reset_log (struct fake_backing *fb)
{
  lock (fb);
  fb->log_len = 0;
  memset (&fb->tot, 0, sizeof fb->tot);
  unlock (fb);
}

void
fake_set_log (struct fake_backing *fb, int on)
{
  lock (fb);
  fb->log_on = on;
  unlock (fb);
}

void
fake_get_totals (struct fake_backing *fb, struct fake_totals *t)
{
  lock (fb);
  *t = fb->tot;
  unlock (fb);
}

size_t
fake_log_len (struct fake_backing *fb)
{
  size_t n;
  lock (fb);
  n = fb->log_len;
  unlock (fb);
  return n;
}

int
fake_log_get (struct fake_backing *fb, size_t i, struct fake_req *out)
{
  int r = -1;
  lock (fb);
  if (i < fb->log_len) {
    *out = fb->log[i];
    r = 0;
  }
  unlock (fb);
  return r;
}

size_t
fake_log_count (struct fake_backing *fb, enum fake_op op)
{
  size_t n = 0;
  lock (fb);
  for (size_t i = 0; i < fb->log_len; i++)
    n += fb->log[i].op == op;
  unlock (fb);
  return n;
}

void
fake_log_dump (struct fake_backing *fb, const char *title)
{
  static const char *names[] = { "read", "write", "zero", "trim", "flush",
                                 "map" };
  lock (fb);
  fprintf (stderr, "fake backing log (%s): %zu entries\n", title ? title : "",
           fb->log_len);
  for (size_t i = 0; i < fb->log_len; i++) {
    const struct fake_req *r = &fb->log[i];
    fprintf (stderr, "  %4zu %-5s off=%llu len=%llu flags=%#x%s%s\n", i,
             names[r->op], (unsigned long long) r->off,
             (unsigned long long) r->len, r->flags, r->err ? " err=" : "",
             r->err ? strerror (r->err) : "");
  }
  unlock (fb);
}

void
fake_peek (struct fake_backing *fb, void *buf, uint64_t len, uint64_t off)
{
  lock (fb);
  assert (off <= fb->base.size && len <= fb->base.size - off);
  load_bytes (fb, buf, len, off);
  unlock (fb);
}

void
fake_poke (struct fake_backing *fb, const void *buf, uint64_t len,
           uint64_t off)
{
  lock (fb);
  assert (off <= fb->base.size && len <= fb->base.size - off);
  store_bytes (fb, buf, len, off);
  unlock (fb);
}

void
fake_fill_pattern (struct fake_backing *fb, uint64_t len, uint64_t off,
                   uint8_t salt)
{
  uint8_t buf[FPAGE];
  while (len > 0) {
    uint64_t n = len < FPAGE ? len : FPAGE;
    for (uint64_t i = 0; i < n; i++)
      buf[i] = fake_pattern_byte (off + i, salt);
    fake_poke (fb, buf, n, off);
    off += n; len -= n;
  }
}

void
fake_set_hole (struct fake_backing *fb, uint64_t off, uint64_t len)
{
  lock (fb);
  assert (off <= fb->base.size && len <= fb->base.size - off);
  zero_bytes (fb, len, off);
  unlock (fb);
}

int
fake_is_data (struct fake_backing *fb, uint64_t off)
{
  int r;
  lock (fb);
  r = sector_is_data (fb, off);
  unlock (fb);
  return r;
}

void
fake_fail_next (struct fake_backing *fb, unsigned opmask, unsigned n, int err)
{
  lock (fb);
  fb->next_mask = opmask;
  fb->next_n = n;
  fb->next_err = err;
  unlock (fb);
}

void
fake_fail_random (struct fake_backing *fb, unsigned opmask, double p,
                  uint64_t seed, int err)
{
  lock (fb);
  fb->rnd_mask = opmask;
  fb->rnd_p = p;
  fb->rnd_state = seed;
  fb->rnd_err = err;
  unlock (fb);
}

int
fake_fail_range (struct fake_backing *fb, unsigned opmask, uint64_t off,
                 uint64_t len, int err)
{
  int r = -1;
  lock (fb);
  if (fb->nranges < MAX_RANGES) {
    fb->ranges[fb->nranges++] = (struct fault_range) {
      .mask = opmask, .off = off, .len = len, .err = err };
    r = 0;
  }
  unlock (fb);
  return r;
}

void
fake_clear_faults (struct fake_backing *fb)
{
  lock (fb);
  fb->next_n = 0;
  fb->rnd_p = 0;
  fb->nranges = 0;
  unlock (fb);
}

void
fake_set_torn_writes (struct fake_backing *fb, int on)
{
  lock (fb);
  fb->torn = on;
  unlock (fb);
}

void
fake_set_delay_us (struct fake_backing *fb, unsigned us)
{
  lock (fb);
  fb->delay_us = us;
  unlock (fb);
}

void
fake_set_map_delay_us (struct fake_backing *fb, unsigned us)
{
  lock (fb);
  fb->map_delay_us = us;
  unlock (fb);
}

uint64_t
fake_unflushed (struct fake_backing *fb)
{
  uint64_t n;
  lock (fb);
  n = fb->unflushed;
  unlock (fb);
  return n;
}

void
fake_set_map_style (struct fake_backing *fb, int holes_as_zero,
                    uint64_t max_len)
{
  lock (fb);
  fb->holes_as_zero = holes_as_zero;
  fb->map_max = max_len;
  unlock (fb);
}

void
fake_gate_close (struct fake_backing *fb, unsigned opmask)
{
  lock (fb);
  fb->gate_mask = opmask;
  unlock (fb);
}

int
fake_gate_wait (struct fake_backing *fb, unsigned n)
{
  struct timespec end;
  int r = 0;

  clock_gettime (CLOCK_REALTIME, &end);
  end.tv_sec += 30;
  lock (fb);
  while (fb->gate_held < n && r == 0)
    r = pthread_cond_timedwait (&fb->gate_cv, &fb->lock, &end);
  r = fb->gate_held >= n ? 0 : -1;
  unlock (fb);
  return r;
}

void
fake_gate_open (struct fake_backing *fb)
{
  lock (fb);
  fb->gate_mask = 0;
  pthread_cond_broadcast (&fb->gate_cv);
  unlock (fb);
}

unsigned
fake_gate_held (struct fake_backing *fb)
{
  unsigned n;

  lock (fb);
  n = fb->gate_held;
  unlock (fb);
  return n;
}
