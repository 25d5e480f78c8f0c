/* A fake backing for tests and benches: sparse memory, a request log,
 * a hole map and error injection.
 *
 * Data lives in 4 KiB pages allocated on first write, so a 1 TiB fake
 * costs a few MiB of page-table pointers plus the pages written.  Holes are
 * tracked per 512-byte sector: a never-written sector, or one that a trim
 * or zero covered entirely, is a HOLE (map() says so, reads give zeroes);
 * a sector that any write touched is DATA.
 *
 * Every request the cache makes is counted in the totals and (unless the
 * log is off) appended to the log, failed requests included (entry.err).
 * Test-side accessors (fake_peek, fake_poke, fake_set_hole, ...) never
 * count, never log and never fail.
 *
 * Error injection, checked in this order for each request:
 *   1. a persistent range fault (fake_fail_range) overlapping the request;
 *   2. "fail the next N" (fake_fail_next);
 *   3. random failure with probability p (fake_fail_random, seeded).
 * A failed read fills the caller's buffer with 0xa5 junk (so a cache that
 * trusts it shows up); a failed write changes nothing unless torn writes
 * are on (fake_set_torn_writes), then it stores the first half first.
 *
 * All functions are thread-safe (one mutex per fake).  The struct backing
 * returned by fake_backing_base() is what the cache gets; backing_close()
 * on it frees the fake (as does fake_free()).
 *
 * Typical use:
 *   struct fake_backing *fb = fake_backing_new (4 << 20);
 *   struct cache *c = cache_create (fake_backing_base (fb), NULL, &cfg, ...);
 *   ... fake_reset_log (fb); cache_flush (c);
 *   struct fake_totals t; fake_get_totals (fb, &t); t.write_bytes == 4096
 *   assert_int_equal (cache_destroy (c), 0); fake_free (fb);
 */
#ifndef FOLIOD_TEST_FAKE_BACKING_H
#define FOLIOD_TEST_FAKE_BACKING_H

#include <stddef.h>
#include <stdint.h>

#include "foliod/backing.h"

/* Operation kinds; also bit masks for fault selection (1u << op). */
enum fake_op {
  FAKE_READ = 0,
  FAKE_WRITE,
  FAKE_ZERO,
  FAKE_TRIM,
  FAKE_FLUSH,
  FAKE_MAP,
  FAKE_NOPS
};
#define FAKE_M(op)    (1u << (op))
#define FAKE_M_ALL    ((1u << FAKE_NOPS) - 1)
#define FAKE_M_DATAIO (FAKE_M (FAKE_READ) | FAKE_M (FAKE_WRITE) | \
                       FAKE_M (FAKE_ZERO) | FAKE_M (FAKE_TRIM))

/* Default caps: TRIM | ZERO | FAST_ZERO | FUA | MAP | MULTI_CONN. */
#define FAKE_DEFAULT_CAPS (BACKING_CAN_TRIM | BACKING_CAN_ZERO | \
                           BACKING_CAN_FAST_ZERO | BACKING_CAN_FUA | \
                           BACKING_CAN_MAP | BACKING_CAN_MULTI_CONN)

struct fake_req {
  enum fake_op op;
  uint64_t off, len;   /* 0, 0 for flush */
  unsigned flags;      /* BACKING_FUA etc. as passed */
  int err;             /* 0, or the injected errno */
};

struct fake_totals {
  uint64_t ops[FAKE_NOPS];      /* requests per kind, failed included */
  uint64_t read_bytes, write_bytes, zero_bytes, trim_bytes; /* successful */
  uint64_t fua_writes;          /* writes/zeros/trims with BACKING_FUA */
  uint64_t failed;              /* injected failures */
  uint64_t bad;                 /* out-of-range/zero-length requests (EINVAL) */
  uint64_t log_dropped;         /* entries not logged (log full or off) */
};

struct fake_backing;

/* A fake of size bytes, all hole, caps FAKE_DEFAULT_CAPS.  NULL on ENOMEM. */
struct fake_backing *fake_backing_new (uint64_t size);
/* The base struct to hand to the cache.  Same object: backing_close()
 * on it frees the fake. */
struct backing *fake_backing_base (struct fake_backing *fb);
void fake_free (struct fake_backing *fb);

/* Caps (BACKING_CAN_*).  Without BACKING_CAN_MAP the ops table has no map
 * (everything DATA); without BACKING_CAN_TRIM trim() fails with EOPNOTSUPP. */
void fake_set_caps (struct fake_backing *fb, unsigned caps);

/* Offer read_async (default off): done is called before it returns,
 * with the data of a plain read at the call (failing as injected). */
void fake_set_async (struct fake_backing *fb, int on);

/* --- log and totals --- */
void fake_reset_log (struct fake_backing *fb);   /* log and totals */
void fake_set_log (struct fake_backing *fb, int on); /* default on */
void fake_get_totals (struct fake_backing *fb, struct fake_totals *t);
size_t fake_log_len (struct fake_backing *fb);
/* Entry i (0 = oldest since reset).  0, or -1 if out of range. */
int fake_log_get (struct fake_backing *fb, size_t i, struct fake_req *out);
/* Number of logged requests of kind op since reset. */
size_t fake_log_count (struct fake_backing *fb, enum fake_op op);
/* Print the log to stderr (debugging failed tests). */
void fake_log_dump (struct fake_backing *fb, const char *title);

/* map() answers: report holes as BACKING_ZERO instead of BACKING_HOLE;
 * cut every extent to at most max_len bytes (0: no cap; any value, even
 * one that splits blocks, to stress the caller's extent loop). */
void fake_set_map_style (struct fake_backing *fb, int holes_as_zero,
                         uint64_t max_len);

/* Successful write/zero/trim requests without BACKING_FUA since the last
 * successful flush: what a power cut could still lose.  After the cache
 * says FLUSH succeeded this must be 0. */
uint64_t fake_unflushed (struct fake_backing *fb);

/* --- content and hole map (test side: not logged, never fail) --- */
void fake_peek (struct fake_backing *fb, void *buf, uint64_t len, uint64_t off);
/* Store data and mark the sectors DATA. */
void fake_poke (struct fake_backing *fb, const void *buf, uint64_t len,
                uint64_t off);
/* Fill with a pattern derived from the offset (fake_pattern_byte) and mark
 * DATA: handy "old data" that differs everywhere. */
void fake_fill_pattern (struct fake_backing *fb, uint64_t len, uint64_t off,
                        uint8_t salt);
static inline uint8_t
fake_pattern_byte (uint64_t off, uint8_t salt)
{
  uint64_t x = (off + 1) * 0x9e3779b97f4a7c15ull + salt;
  return (uint8_t) ((x >> 56) ^ (x >> 29) ^ salt) | 1; /* never 0 */
}
/* Zero the range and mark the sectors it covers entirely as HOLE. */
void fake_set_hole (struct fake_backing *fb, uint64_t off, uint64_t len);
/* 1 if the sector holding off is DATA. */
int fake_is_data (struct fake_backing *fb, uint64_t off);

/* --- error injection --- */
/* Fail the next n requests whose kind is in opmask with errno err. */
void fake_fail_next (struct fake_backing *fb, unsigned opmask, unsigned n,
                     int err);
/* Fail requests of kinds in opmask with probability p (0 turns it off). */
void fake_fail_random (struct fake_backing *fb, unsigned opmask, double p,
                       uint64_t seed, int err);
/* Fail every request of kinds in opmask overlapping [off, off+len) until
 * cleared.  Up to 16 ranges.  Returns 0, -1 when full. */
int fake_fail_range (struct fake_backing *fb, unsigned opmask, uint64_t off,
                     uint64_t len, int err);
/* Remove every fault (next-N, random and ranges). */
void fake_clear_faults (struct fake_backing *fb);
/* On a failed write/zero/trim, apply the first half before failing. */
void fake_set_torn_writes (struct fake_backing *fb, int on);

/* Sleep this long (outside the lock) in every read/write/zero/trim. */
void fake_set_delay_us (struct fake_backing *fb, unsigned us);
/* Sleep this long in map() after computing the answer (outside the lock),
 * so that the answer is stale when it arrives: for race tests. */
void fake_set_map_delay_us (struct fake_backing *fb, unsigned us);

/* The gate: requests of the kinds in opmask (reads, writes, zeroes,
 * trims) wait before they start until fake_gate_open, so that a test
 * can hold the cache inside a backing call and look at what else
 * proceeds meanwhile.  fake_gate_wait waits (up to 30 s) until n
 * requests wait at the gate: 0, or -1 if they did not come. */
void fake_gate_close (struct fake_backing *fb, unsigned opmask);
int fake_gate_wait (struct fake_backing *fb, unsigned n);
void fake_gate_open (struct fake_backing *fb);
/* How many requests wait at the gate now. */
unsigned fake_gate_held (struct fake_backing *fb);

/* --- small deterministic RNG shared by the tests --- */
static inline uint64_t
fake_rand (uint64_t *state)   /* splitmix64 */
{
  uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
/* Uniform in [0, n), n > 0. */
static inline uint64_t
fake_rand_below (uint64_t *state, uint64_t n)
{
  return fake_rand (state) % n;
}

#endif /* FOLIOD_TEST_FAKE_BACKING_H */
