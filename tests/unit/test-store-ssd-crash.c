/* The SSD log store (store=ssd:PATH) under simulated power cuts.
 *
 * The store runs over a simulated disk: a write goes to the disk's
 * volatile cache, a flush makes every write before it durable.  The power
 * goes at a random write or flush (inside a commit, a compaction, the
 * superblock update of an open, a recovery ...): the write in progress and
 * every write since the last completed flush keep, per 512-byte sector,
 * their new or their old content at random; later calls fail.  The test
 * plays the cache by the protocol of store.h: whole-block writes (data,
 * persist, dirty bits, persist), FLUSH (sync), writeback with unstable
 * blocks and a backing that loses what it has not flushed, eviction
 * through may_reuse (the writeback thread's sync when it refuses), and
 * writes, zeroes and trims that go to the backing directly (the cached
 * copy follows and its dirty bits clear: the log must not write an old
 * version over them).  Then it reopens and recovers, and checks every
 * block: one not written since the last FLUSH reads back exactly; one
 * written since reads one of its versions since that FLUSH (a block is
 * logged whole, with its checksum).  Each round goes on from what was
 * recovered, so that recovery runs over logs that recoveries and
 * compactions left.
 * STORE_CRASHES=N sets the number of power cuts (default 10000);
 * STORE_SEED the seed (default: the time; printed, and named by a
 * failure). */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"

#define FOLIO 16384
#define BLOCK 512
#define BPF (FOLIO / BLOCK)      /* 32 blocks */
#define SLOTS 6
#define NF 12                    /* folios of the export */
#define NB (NF * BPF)
#define LOG_BYTES (512u << 10)   /* a little over two compactions */
#define DISK (SSD_LOG_OFF + LOG_BYTES)
#define SECTOR 512
#define MAXV 64                  /* versions of a block between FLUSHes */

static unsigned seed, store_seed;
static char err[512];

/* --- the disk --- */

struct pending { uint64_t off; size_t len; };
static unsigned char *durable, *visible;   /* what survives; what reads see */
static struct pending *pend;
static size_t npend, cappend;
static long ops_left;          /* the power goes at the op finding 0 */
static bool power_off;
static unsigned long nflushes, nwrites;

static void
cut_now (void)
{
  /* Each sector written since the last flush: new or old, at random. */
  for (size_t i = 0; i < npend; i++)
    for (uint64_t o = pend[i].off; o < pend[i].off + pend[i].len; o += SECTOR)
      if (rand_r (&seed) & 1)
        memcpy (durable + o, visible + o, SECTOR);
  npend = 0;
  power_off = true;
}

static bool
op_power (void)
{
  if (power_off)
    return false;
  if (ops_left == 0) {
    cut_now ();
    return false;
  }
  if (ops_left > 0)
    ops_left--;
  return true;
}

static int
sim_pwrite (struct ssd_dev *d, const void *buf, size_t len, uint64_t off)
{
  (void) d;
  assert_true (off + len <= DISK && off % SECTOR == 0 && len % SECTOR == 0);
  if (power_off) { errno = EIO; return -1; }
  memcpy (visible + off, buf, len);
  if (npend == cappend) {
    cappend = cappend ? 2 * cappend : 64;
    pend = realloc (pend, cappend * sizeof *pend);
    assert_non_null (pend);
  }
  pend[npend++] = (struct pending) { off, len };
  nwrites++;
  if (!op_power ()) { errno = EIO; return -1; }   /* torn with the rest */
  return 0;
}

static int
sim_pread (struct ssd_dev *d, void *buf, size_t len, uint64_t off)
{
  (void) d;
  assert_true (off + len <= DISK);
  if (power_off) { errno = EIO; return -1; }
  memcpy (buf, visible + off, len);
  return 0;
}

static int
sim_flush (struct ssd_dev *d)
{
  (void) d;
  if (!op_power ()) { errno = EIO; return -1; }
  for (size_t i = 0; i < npend; i++)
    memcpy (durable + pend[i].off, visible + pend[i].off, pend[i].len);
  npend = 0;
  nflushes++;
  return 0;
}

static void
sim_close (struct ssd_dev *d)
{
  free (d);
}

static const struct ssd_dev_ops sim_ops = {
  sim_pwrite, sim_pread, sim_flush, sim_close,
};

/* After a cut: the disk holds what survived, the power is back. */
static void
sim_restart (void)
{
  if (!power_off)
    cut_now ();
  memcpy (visible, durable, DISK);
  power_off = false;
  ops_left = -1;
}

static const struct store_config cfg = {
  .path = "(simulated)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = (uint64_t) NF * FOLIO,
  .backing_spec = "sim", .backing_size = (uint64_t) NF * FOLIO,
};

static struct store *
sim_open (void)
{
  struct ssd_dev *d = calloc (1, sizeof *d);

  assert_non_null (d);
  d->ops = &sim_ops;
  d->size = DISK;
  return store_ssd_open_dev (&cfg, d, err, sizeof err);
}

/* --- the model --- */

/* Block content: version v of block b, every 8 bytes saying so (0: zeros,
 * the backing's first content and what a zero or trim leaves). */
static void
fill (unsigned char *p, uint32_t b, uint32_t v)
{
  uint64_t w = v ? ((uint64_t) v << 32) | b : 0;
  for (int i = 0; i < BLOCK; i += 8)
    memcpy (p + i, &w, 8);
}

/* The version p holds for block b, or -1: not one whole version of it. */
static long
version_of (const unsigned char *p, uint32_t b)
{
  uint64_t w;
  memcpy (&w, p, 8);
  for (int i = 8; i < BLOCK; i += 8)
    if (memcmp (p + i, &w, 8) != 0)
      return -1;
  if (w == 0)
    return 0;
  if ((uint32_t) w != b)
    return -1;
  return (long) (w >> 32);
}

static struct {
  uint32_t required;        /* acknowledged by a FLUSH: must come back */
  uint32_t since[MAXV];     /* versions written since (the last is now) */
  uint32_t nsince;
} blk[NB];
static uint32_t bk_volatile[NB], bk_durable[NB];   /* the backing */
static uint32_t next_version = 1;
static int64_t slot_folio[SLOTS];
static int folio_slot[NF];
static struct store *st;
static bool up;                 /* the store answers (the power is on) */
static bool direct_unsynced;    /* the backing holds unflushed direct I/O */
static unsigned long n_recovered, n_lost_checked;
static uint64_t n_reclaims, n_compactions;

/* The store goes: its reclaims counted first. */
static void
close_store (void)
{
  struct store_stats ss;

  store_get_stats (st, &ss);
  n_reclaims += ss.reclaims;
  n_compactions += ss.compactions;
  store_destroy (st);
  st = NULL;
}

static uint64_t *
bits_of (uint32_t slot)
{
  return st->ops->bitmap (st, slot);
}

static bool
ptest (uint32_t slot, int plane, uint32_t b)
{
  uint32_t i = (uint32_t) plane * BPF + b;
  return bits_of (slot)[i / 64] & (1ull << (i % 64));
}

static void
pset (uint32_t slot, int plane, uint32_t b, bool on)
{
  uint32_t i = (uint32_t) plane * BPF + b;
  if (on)
    bits_of (slot)[i / 64] |= 1ull << (i % 64);
  else
    bits_of (slot)[i / 64] &= ~(1ull << (i % 64));
}

static unsigned char *
data_of (uint32_t slot, uint32_t b)
{
  return (unsigned char *) st->ops->data (st, slot) + (size_t) b * BLOCK;
}

static void
persist_bits (uint32_t slot)
{
  st->ops->persist (st, bits_of (slot), st->bitmap_words * 8);
}

/* The version the cache answers for block gb now. */
static uint32_t
now_version (uint32_t gb)
{
  return blk[gb].nsince ? blk[gb].since[blk[gb].nsince - 1] : blk[gb].required;
}

static void
note_version (uint32_t gb, uint32_t v)
{
  if (blk[gb].nsince == MAXV) {  /* keep the first and the newest ones */
    memmove (&blk[gb].since[1], &blk[gb].since[2], (MAXV - 2) * 4);
    blk[gb].nsince--;
  }
  blk[gb].since[blk[gb].nsince++] = v;
}

/* A FLUSH: the store's sync (flush=store); the backing is flushed too when
 * direct writes went to it (the cache's passthrough_unsynced). */
static bool
model_flush (void)
{
  if (store_sync (st) == -1) {
    assert_true (power_off);
    up = false;
    return false;
  }
  if (direct_unsynced)
    memcpy (bk_durable, bk_volatile, sizeof bk_durable);
  direct_unsynced = false;
  for (uint32_t gb = 0; gb < NB; gb++) {
    blk[gb].required = now_version (gb);
    blk[gb].nsince = 0;
  }
  return true;
}

static bool
slot_dirty (uint32_t s)
{
  for (uint32_t b = 0; b < BPF; b++)
    if (ptest (s, FP_DIRTY, b) || ptest (s, FP_UNSTABLE, b))
      return true;
  return false;
}

/* Writeback of slot s: backing write, unstable, dirty cleared; the
 * backing flush and the clear of unstable now or (flush_now false) left
 * for a later pass. */
static void
writeback (uint32_t s, bool flush_now)
{
  uint32_t fi = (uint32_t) slot_folio[s];
  bool any = false;

  for (uint32_t b = 0; b < BPF; b++)
    if (ptest (s, FP_DIRTY, b)) {
      long v = version_of (data_of (s, b), fi * BPF + b);
      assert_true (v >= 0);
      bk_volatile[fi * BPF + b] = (uint32_t) v;
      pset (s, FP_UNSTABLE, b, true);
      any = true;
    }
  if (any) {
    persist_bits (s);
    for (uint32_t b = 0; b < BPF; b++)
      pset (s, FP_DIRTY, b, false);
    persist_bits (s);
  }
  if (!flush_now)
    return;
  memcpy (bk_durable, bk_volatile, sizeof bk_durable);   /* backing flush */
  for (uint32_t b = 0; b < BPF; b++)
    pset (s, FP_UNSTABLE, b, false);
  persist_bits (s);
}

/* A slot for folio fi: its own, a free one, or an evicted clean one that
 * may_reuse allows (else the writeback thread syncs and tries again). */
static int
slot_get (uint32_t fi)
{
  if (folio_slot[fi] >= 0)
    return folio_slot[fi];
  for (int tries = 0; tries < 3; tries++) {
    int victim = -1;
    for (uint32_t s = 0; s < SLOTS && victim < 0; s++)
      if (slot_folio[s] < 0 && store_may_reuse (st, s))
        victim = (int) s;
    for (uint32_t k = 0; k < SLOTS && victim < 0; k++) {
      uint32_t s = (uint32_t) rand_r (&seed) % SLOTS;
      if (slot_folio[s] >= 0 && !slot_dirty (s)) {
        /* evict: bits cleared and persisted, set_index free */
        memset (bits_of (s), 0, st->bitmap_words * 8);
        persist_bits (s);
        st->ops->set_index (st, s, STORE_NO_FOLIO);
        folio_slot[slot_folio[s]] = -1;
        slot_folio[s] = -1;
        if (store_may_reuse (st, s))
          victim = (int) s;
      }
    }
    if (victim >= 0) {
      memset (bits_of ((uint32_t) victim), 0, st->bitmap_words * 8);
      st->ops->set_index (st, (uint32_t) victim, fi);
      slot_folio[victim] = fi;
      folio_slot[fi] = victim;
      /* a read fill: the folio's blocks as the cache answers for them */
      for (uint32_t b = 0; b < BPF; b++) {
        fill (data_of ((uint32_t) victim, b), fi * BPF + b,
              now_version (fi * BPF + b));
        pset ((uint32_t) victim, FP_UPTODATE, b, true);
      }
      st->ops->persist (st, st->ops->data (st, (uint32_t) victim), FOLIO);
      persist_bits ((uint32_t) victim);
      return victim;
    }
    /* No clean slot: write one back; none reusable: sync. */
    uint32_t s = (uint32_t) rand_r (&seed) % SLOTS;
    if (slot_folio[s] >= 0 && slot_dirty (s))
      writeback (s, true);
    if (store_sync (st) == -1) {
      up = false;
      return -1;
    }
  }
  return -1;
}

static void
op_write (void)
{
  uint32_t fi = (uint32_t) rand_r (&seed) % NF;
  int s = slot_get (fi);
  if (s < 0)
    return;
  uint32_t b0 = (uint32_t) rand_r (&seed) % BPF;
  uint32_t n = 1 + (uint32_t) rand_r (&seed) % 6;
  if (b0 + n > BPF)
    n = BPF - b0;
  for (uint32_t b = b0; b < b0 + n; b++) {
    uint32_t v = next_version++;
    fill (data_of ((uint32_t) s, b), fi * BPF + b, v);
    note_version (fi * BPF + b, v);
  }
  st->ops->persist (st, data_of ((uint32_t) s, b0), (size_t) n * BLOCK);
  for (uint32_t b = b0; b < b0 + n; b++) {
    pset ((uint32_t) s, FP_UPTODATE, b, true);
    pset ((uint32_t) s, FP_DIRTY, b, true);
  }
  persist_bits ((uint32_t) s);
}

/* A write or zero straight to the backing (direct I/O, WRITE_ZEROES,
 * trim): the backing first, then the cached copy follows and its dirty
 * bits clear (direct.c's fix), so the log's older records of the block
 * die: a "clean" record, which recovery must honour.  The backing has it
 * durably here (FUA): a clean record may reach the log before the next
 * FLUSH, and one that outlived a backing's lost write would bring back a
 * block older than the last FLUSH (the cache's order to keep, not the
 * store's: direct.c syncs the store after a FUA one, test-ssd-direct.sh). */
static void
op_direct (void)
{
  uint32_t fi = (uint32_t) rand_r (&seed) % NF;
  uint32_t b = (uint32_t) rand_r (&seed) % BPF, gb = fi * BPF + b;
  uint32_t v = rand_r (&seed) % 2 ? next_version++ : 0;
  int s = folio_slot[fi];

  bk_volatile[gb] = v;
  bk_durable[gb] = v;
  direct_unsynced = true;
  note_version (gb, v);
  if (s >= 0) {
    fill (data_of ((uint32_t) s, b), gb, v);
    st->ops->persist (st, data_of ((uint32_t) s, b), BLOCK);
    pset ((uint32_t) s, FP_UPTODATE, b, true);
    pset ((uint32_t) s, FP_DIRTY, b, false);
    pset ((uint32_t) s, FP_UNSTABLE, b, false);
    persist_bits ((uint32_t) s);
  }
}

/* The backing flush of a writeback pass that left unstable blocks. */
static void
op_backing_flush (void)
{
  memcpy (bk_durable, bk_volatile, sizeof bk_durable);
  for (uint32_t s = 0; s < SLOTS; s++) {
    bool any = false;
    if (slot_folio[s] < 0)
      continue;
    for (uint32_t b = 0; b < BPF; b++)
      if (ptest (s, FP_UNSTABLE, b)) {
        pset (s, FP_UNSTABLE, b, false);
        any = true;
      }
    if (any)
      persist_bits (s);
  }
}

static int
recovered_one (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  (void) arg;
  assert_true (fi < NF && slot < SLOTS && bits == bits_of (slot));
  assert_true (slot_folio[slot] < 0 && folio_slot[fi] < 0);
  slot_folio[slot] = (int64_t) fi;
  folio_slot[fi] = (int) slot;
  n_recovered++;
  return 0;
}

/* Open (the power may go meanwhile) and recover; false if it went. */
static bool
reopen (void)
{
  struct store_recovery rec;

  for (uint32_t s = 0; s < SLOTS; s++)
    slot_folio[s] = -1;
  for (uint32_t f = 0; f < NF; f++)
    folio_slot[f] = -1;
  st = sim_open ();
  if (st == NULL) {
    assert_true (power_off);   /* a real error: err says */
    return false;
  }
  if (store_recover (st, recovered_one, NULL, &rec) != 0) {
    assert_true (power_off);
    store_destroy (st);
    st = NULL;
    return false;
  }
  assert_int_equal (rec.lost_blocks, 0);
  up = true;
  return true;
}

/* Every block as the cache would answer it after the recovery. */
static void
check (unsigned long crash)
{
  for (uint32_t gb = 0; gb < NB; gb++) {
    uint32_t fi = gb / BPF, b = gb % BPF;
    int s = folio_slot[fi];
    long v;
    if (s >= 0 && ptest ((uint32_t) s, FP_DIRTY, b))
      v = version_of (data_of ((uint32_t) s, b), gb);
    else
      v = bk_durable[gb];
    bool ok = v == (long) blk[gb].required;
    for (uint32_t k = 0; k < blk[gb].nsince && !ok; k++)
      ok = v == (long) blk[gb].since[k];
    if (!ok) {
      print_error ("STORE_SEED=%u: crash %lu: folio %" PRIu32 " block %"
                   PRIu32 ": version %ld, acknowledged %" PRIu32
                   " (%" PRIu32 " written since)%s\n", store_seed, crash,
                   fi, b, v, blk[gb].required, blk[gb].nsince,
                   s >= 0 ? " (in a slot)" : "");
      fail ();
    }
    /* What came back is what the cache answers for from now on; the
     * backing's unflushed writes are gone. */
    blk[gb].required = (uint32_t) v;
    blk[gb].nsince = 0;
  }
  memcpy (bk_volatile, bk_durable, sizeof bk_volatile);
  direct_unsynced = false;
  n_lost_checked += NB;
}

static void
test_power_cuts (void **state)
{
  const char *e = getenv ("STORE_CRASHES");
  const char *sd = getenv ("STORE_SEED");
  unsigned long crashes = e ? strtoul (e, NULL, 10) : 10000;

  (void) state;
  store_seed = sd ? (unsigned) strtoul (sd, NULL, 10) : (unsigned) time (NULL);
  seed = store_seed;
  printf ("STORE_SEED=%u, %lu power cuts\n", store_seed, crashes);
  durable = calloc (1, DISK);
  visible = calloc (1, DISK);
  assert_non_null (durable);
  assert_non_null (visible);
  ops_left = -1;
  assert_true (reopen ());
  for (unsigned long c = 0; c < crashes; c++) {
    /* The power goes at the k-th write or flush from now. */
    ops_left = 1 + rand_r (&seed) % 60;
    for (int i = 0; up && i < 400 && !power_off; i++) {
      int op = rand_r (&seed) % 100;
      if (op < 55)
        op_write ();
      else if (op < 67)
        model_flush ();
      else if (op < 80) {
        uint32_t s = (uint32_t) rand_r (&seed) % SLOTS;
        if (slot_folio[s] >= 0)
          writeback (s, rand_r (&seed) % 3 != 0);
      } else if (op < 88)
        op_backing_flush ();
      else if (op < 95)
        op_direct ();
      else if (store_sync (st) == -1)    /* the writeback thread's sync */
        up = false;
    }
    /* A clean stop now and then: everything written back, flushed,
     * marked clean; nothing may be replayed after it. */
    if (!power_off && up && rand_r (&seed) % 8 == 0) {
      for (uint32_t s = 0; s < SLOTS; s++)
        if (slot_folio[s] >= 0)
          writeback (s, true);
      if (model_flush () && store_mark_clean (st) == 0) {
        /* the clean stop's own promise: the backing has it all */
        for (uint32_t gb = 0; gb < NB; gb++)
          assert_int_equal (bk_durable[gb], now_version (gb));
      }
    }
    close_store ();
    sim_restart ();
    /* Recovery itself may lose the power, once in a while. */
    while (ops_left = rand_r (&seed) % 4 == 0 ? rand_r (&seed) % 3 : -1,
           !reopen ())
      sim_restart ();
    ops_left = -1;
    check (c);
  }
  close_store ();
  printf ("%lu recovered folios, %lu device flushes, %lu writes, %" PRIu64
          " reclaims (%" PRIu64 " of them compactions)\n", n_recovered,
          nflushes, nwrites, n_reclaims, n_compactions);
  /* The power went in the middle of reclaims (the log fills about once
   * per round): segment by segment, a whole-log compaction only now and
   * then. */
  if (crashes >= 100)
    assert_true (n_reclaims > 2 * n_compactions);
  free (durable);
  free (visible);
  free (pend);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_power_cuts),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
