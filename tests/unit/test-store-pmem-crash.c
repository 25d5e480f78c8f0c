/* The pmem store under simulated crashes, at cache-line and at page
 * granularity.
 *
 * The store runs over simulated memory: "live" is what the CPU sees,
 * "media" what survives.  A persist copies its 8-byte words to the media;
 * the power goes at a random persist (inside set_index, a header update,
 * a sync, recovery ...): memory as it is then is what the crash sees (the
 * code runs on, but nothing more reaches the media and no reply is sent),
 * and every word written but not persisted keeps its new or its old value
 * at random.  The test plays the cache by the
 * ordering contract of store-pmem.c (writes, slot reuse, writeback with
 * unstable blocks, backing flushes, FLUSHes; the backing loses what it had
 * not flushed), then reopens and recovers, and checks every block of every
 * folio: an acknowledged write is there, exactly; the write in flight at
 * the crash is there or not, per word; nothing else appears.
 * A page store persists only at sync (a FLUSH, or before a slot whose
 * bits may still say dirty on the media takes a new folio: may_reuse),
 * and a crash keeps
 * each unsynced 512-byte sector old or new at random: there every block
 * not written since the last FLUSH must read back exactly, and one written
 * since must read back as one whole version of that block offset of some
 * folio, or zeros (the contract of store-pmem.c: "any data its sectors
 * held").  A quarter of the page run's crashes kill foliod instead: the
 * mapping keeps what it held, the media does not get it, and a power cut
 * may come later (recovery must make what it trusts power-safe).
 * The model's backing holds bytes.
 * STORE_CRASHES=N sets the number of crashes per run (default 10000);
 * STORE_SEED the seed (default: the time; printed, and named by a failure). */
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
#include "store/pmem-layout.h"
#include "lib/pmem-sim.h"
#include "lib/cachetest.h"

#define FOLIO 16384
#define BLOCK 512
#define BPF (FOLIO / BLOCK)      /* 32 blocks: two bitmap words */
#define SLOTS 6
#define NF 12                    /* folios of the export */
#define WORDS (BLOCK / 8)

static struct pmem_layout lay;
static struct pmem_sim_media sim; /* the store's memory (pmem-sim.h) */
static unsigned seed;
static char err[512];
static unsigned store_seed;      /* STORE_SEED, or the time */

static void
sim_commit (const void *p, size_t len)
{
  pmem_sim_media_commit (&sim, p, len);
}

static const struct store_config cfg = {
  .path = "(simulated)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = (uint64_t) NF * FOLIO,
  .backing_spec = "sim", .backing_size = (uint64_t) NF * FOLIO,
};

static struct store *
sim_open (void)
{
  struct pmem_map m;

  pmem_sim_map (&m, sim.live, lay.total_size,
                sim.page_mode ? PMEM2_GRANULARITY_PAGE
                              : PMEM2_GRANULARITY_CACHE_LINE, sim_commit);
  struct store *s = store_pmem_open_map (&m, &cfg, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  return s;
}

/* The model: what the client was told, and what the backing holds. */
static uint32_t acked[NF][BPF];     /* version of the last acknowledged write */
/* The backing holds bytes, as a disk does: a block written back torn, or
 * as version 0 (zeros), is what it flushes. */
static uint64_t backing[NF][BPF][WORDS];     /* what the backing flushed */
static uint64_t unflushed[NF][BPF][WORDS];   /* written, not flushed yet */
static bool has_unflushed[NF][BPF];
static bool since_sync[NF][BPF];    /* page store: written since a FLUSH */
static int slot_of[NF];
static int64_t folio_of[SLOTS];
static uint32_t next_version;
static struct { int f, b; uint32_t v; } inflight;
static struct store *st;

static uint64_t
word_of (int f, int b, uint32_t v, int i)
{
  return v ? (uint64_t) v << 32 | (uint64_t) f << 16 | (uint64_t) b << 8 |
             (uint64_t) i : 0;
}

static uint64_t *
bits_of (int slot)
{
  return st->ops->bitmap (st, (uint32_t) slot);
}

static uint64_t *
block_of (int slot, int b)
{
  return (uint64_t *) ((unsigned char *) st->ops->data (st, (uint32_t) slot) +
                       b * BLOCK);
}

static void
bits_persist (int slot)
{
  st->ops->persist (st, bits_of (slot), st->bitmap_words * 8);
}

static bool
bit (int slot, int plane, int b)
{
  return pmem_plane_test (bits_of (slot), BPF, plane, (uint32_t) b);
}

static void
bit_set (int slot, int plane, int b, bool on)
{
  pmem_plane_assign (bits_of (slot), BPF, plane, (uint32_t) b, on);
}

static bool
slot_clean (int slot)
{
  for (int b = 0; b < BPF; b++)
    if (bit (slot, FP_DIRTY, b) || bit (slot, FP_UNSTABLE, b))
      return false;
  return true;
}

/* Writeback of a slot: the backing gets its dirty blocks, unflushed.  The
 * planes are in different words, which a crash may tear apart: unstable
 * is persisted before dirty is cleared. */
static void
op_writeback (int slot)
{
  int f = (int) folio_of[slot];

  if (f < 0)
    return;
  for (int b = 0; b < BPF; b++)
    if (bit (slot, FP_DIRTY, b)) {
      memcpy (unflushed[f][b], block_of (slot, b), BLOCK);
      has_unflushed[f][b] = true;
      bit_set (slot, FP_UNSTABLE, b, true);
    }
  bits_persist (slot);
  for (int b = 0; b < BPF; b++)
    bit_set (slot, FP_DIRTY, b, false);
  bits_persist (slot);
}

/* The backing flushes; only then do unstable bits go. */
static void
op_backing_flush (void)
{
  if (sim.power_off)
    return;   /* the host died before it asked */
  for (int f = 0; f < NF; f++)
    for (int b = 0; b < BPF; b++)
      if (has_unflushed[f][b]) {
        memcpy (backing[f][b], unflushed[f][b], BLOCK);
        has_unflushed[f][b] = false;
      }
  for (int slot = 0; slot < SLOTS; slot++) {
    for (int b = 0; b < BPF; b++)
      bit_set (slot, FP_UNSTABLE, b, false);
    bits_persist (slot);
  }
}

static void
op_evict (int slot)
{
  if (folio_of[slot] < 0 || !slot_clean (slot))
    return;
  st->ops->set_index (st, (uint32_t) slot, STORE_NO_FOLIO);
  slot_of[folio_of[slot]] = -1;
  folio_of[slot] = -1;
}

/* A slot for folio f: its own, a free one, or a clean one evicted. */
static int
slot_get (int f)
{
  int slot = slot_of[f];

  for (int pass = 0; slot < 0 && pass < 2; pass++) {
    for (int i = 0; i < SLOTS && slot < 0; i++) {
      op_evict (i);
      if (folio_of[i] < 0)
        slot = i;
    }
    if (slot < 0) {   /* all dirty: write everything back first */
      for (int i = 0; i < SLOTS; i++)
        op_writeback (i);
      op_backing_flush ();
    }
  }
  if (slot < 0) {   /* the power went during that writeback */
    assert_true (sim.power_off);
    return -1;
  }
  if (folio_of[slot] < 0) {
    /* A slot whose clear is not synced yet: the cache would take another
     * or have its writeback thread sync; here, sync. */
    if (!store_may_reuse (st, (uint32_t) slot))
      assert_int_equal (store_sync (st), 0);
    assert_true (store_may_reuse (st, (uint32_t) slot));
    st->ops->set_index (st, (uint32_t) slot, (uint64_t) f);
    folio_of[slot] = f;
    slot_of[f] = slot;
  }
  return slot;
}

/* A whole-block write: data persisted, then the bits, then the reply. */
static void
op_write (int f, int b)
{
  uint64_t buf[WORDS];
  int slot = slot_get (f);
  uint32_t v = ++next_version;

  if (slot < 0)
    return;
  for (int i = 0; i < WORDS; i++)
    buf[i] = word_of (f, b, v, i);
  inflight.f = f;
  inflight.b = b;
  inflight.v = v;
  since_sync[f][b] = sim.page_mode;
  store_write (st, block_of (slot, b), buf, BLOCK);
  bit_set (slot, FP_UPTODATE, b, true);
  bit_set (slot, FP_DIRTY, b, true);
  bits_persist (slot);
  if (sim.power_off)
    return;
  acked[f][b] = v;      /* the reply */
  inflight.v = 0;
}

/* A client FLUSH: the store is synced (the backing is not asked). */
static void
op_flush (void)
{
  assert_int_equal (store_sync (st), 0);
  if (!sim.power_off)   /* the reply */
    memset (since_sync, 0, sizeof since_sync);
}

static void
op_random (void)
{
  int r = rand_r (&seed) % 17;

  if (r == 16)
    op_flush ();
  else if (r < 11)
    op_write (rand_r (&seed) % NF, rand_r (&seed) % BPF);
  else if (r < 13)
    op_writeback (rand_r (&seed) % SLOTS);
  else if (r < 15)
    op_backing_flush ();
  else
    op_evict (rand_r (&seed) % SLOTS);
}

static int
recovered (void *arg, uint32_t slot, uint64_t folio, uint64_t *bits)
{
  assert_true (folio < NF);
  assert_int_equal (slot_of[folio], -1);
  slot_of[folio] = (int) slot;
  folio_of[slot] = (int64_t) folio;
  return 0;
}

static long torn_entries;   /* slot entries a crash left torn (crc fails) */

/* Slot entries whose crc fails after a crash: torn inside a set_index. */
static void
count_torn (void)
{
  struct pmem_meta pm = { .l = lay };
  struct pmem_map m = { .base = (unsigned char *) sim.live };

  pm.m = &m;
  for (uint32_t i = 0; i < SLOTS; i++)
    torn_entries += !pmem_layout_slot_sound (&pm, i);
}

/* Reopen and recover; the power may go in there too, and again.  A crash
 * may tear a slot entry (its crc fails), never so that recovery takes it
 * for a damaged one (dirty bits under a failing crc: data written
 * nowhere). */
static void
reopen (long round)
{
  struct store_recovery rec;

  for (;;) {
    for (int f = 0; f < NF; f++)
      slot_of[f] = -1;
    for (int i = 0; i < SLOTS; i++)
      folio_of[i] = -1;
    count_torn ();
    sim.persists_left = rand_r (&seed) % 4 == 0 ? rand_r (&seed) % 6 : -1;
    st = sim_open ();
    assert_int_equal (store_recover (st, recovered, NULL, &rec), 0);
    if (rec.bad_entries)
      fail_msg ("STORE_SEED=%u crash %ld: recovery found %u damaged slot "
                "entries (%llu dirty blocks lost) after a crash", store_seed,
                round, rec.bad_entries, (unsigned long long) rec.lost_blocks);
    if (!sim.power_off)
      break;
    pmem_sim_media_crash (&sim, false);
    store_destroy (st);
  }
  sim.persists_left = -1;
}

#define TORN UINT32_MAX   /* an overwrite cut short: old and new words */

/* What a read of block b of folio f would return. */
static void
read_block (int f, int b, uint64_t *out)
{
  int slot = slot_of[f];

  if (slot < 0 || !bit (slot, FP_UPTODATE, b)) {
    memcpy (out, backing[f][b], BLOCK);
    return;
  }
  assert_true (bit (slot, FP_DIRTY, b));   /* unclean: no others */
  memcpy (out, block_of (slot, b), BLOCK);
}

/* How many words of d are version v's. */
static int
words_of (const uint64_t *d, int f, int b, uint32_t v)
{
  int n = 0;
  for (int i = 0; i < WORDS; i++)
    n += d[i] == word_of (f, b, v, i);
  return n;
}

/* A page store block written since the last FLUSH may come back as any
 * data its sector held (the kernel wrote the bitmap's page, not the
 * data's): one whole version of block b of some folio, or zeros.  Never a
 * sector mixed, nor another block offset's data. */
static void
check_sector (long round, int f, int b, const uint64_t *d)
{
  int of = (int) (d[0] >> 16 & 0xffff);
  uint32_t v = (uint32_t) (d[0] >> 32);

  if (d[0] == 0 ? words_of (d, f, b, 0) != WORDS
                : of >= NF || words_of (d, of, b, v) != WORDS)
    fail_msg ("STORE_SEED=%u crash %ld: folio %d block %d (written since "
              "the last FLUSH) is no sector ever written there (word 0: "
              "%#llx)", store_seed, round, f, b, (unsigned long long) d[0]);
}

/* Every acknowledged block reads back exactly; the block of the write in
 * flight reads old or new per word (a disk would tear per sector), and is
 * not checked again until it is written again if it came back mixed. */
static void
check_all (long round)
{
  uint64_t d[WORDS];

  for (int f = 0; f < NF; f++)
    for (int b = 0; b < BPF; b++) {
      uint32_t a = acked[f][b], v = inflight.v;
      read_block (f, b, d);
      if (since_sync[f][b]) {   /* page store: not power-safe yet */
        check_sector (round, f, b, d);
        v = (uint32_t) (d[0] >> 32);
        acked[f][b] = words_of (d, f, b, v) == WORDS ? v : TORN;
        continue;
      }
      if (!v || inflight.f != f || inflight.b != b) {
        if (a != TORN && words_of (d, f, b, a) != WORDS)
          fail_msg ("STORE_SEED=%u crash %ld: folio %d block %d: %d of %d words are the "
                    "acknowledged version %u (word 0: %#llx)", store_seed,
                    round, f, b,
                    words_of (d, f, b, a), WORDS, a,
                    (unsigned long long) d[0]);
        continue;
      }
      for (int i = 0; i < WORDS && a != TORN; i++)
        if (d[i] != word_of (f, b, a, i) && d[i] != word_of (f, b, v, i))
          fail_msg ("STORE_SEED=%u crash %ld: folio %d block %d word %d was never written",
                    store_seed, round, f, b, i);
      acked[f][b] = words_of (d, f, b, v) == WORDS ? v
                    : a != TORN && words_of (d, f, b, a) == WORDS ? a : TORN;
    }
  inflight.v = 0;
  memset (since_sync, 0, sizeof since_sync);   /* recovery synced */
}

static void
run_crashes (bool page)
{
  const char *e = getenv ("STORE_CRASHES");
  long crashes = e ? atol (e) : 10000;
  long total_ops = 0, kills = 0;
  struct pmem_geometry g = { FOLIO, BLOCK, SLOTS, (uint64_t) NF * FOLIO };

  seed = store_seed;
  next_version = 0;
  memset (acked, 0, sizeof acked);
  memset (backing, 0, sizeof backing);
  memset (has_unflushed, 0, sizeof has_unflushed);
  memset (since_sync, 0, sizeof since_sync);
  inflight.v = 0;
  torn_entries = 0;
  assert_int_equal (pmem_layout_compute (&lay, &g, err, sizeof err), 0);
  assert_int_equal (pmem_sim_media_init (&sim, lay.total_size, &seed), 0);
  sim.page_mode = page;
  /* Only the parts of the store the test uses are torn at a crash:
   * metadata, then the folio data. */
  sim.region[0][0] = 0;
  sim.region[0][1] = lay.bitmaps_off + SLOTS * lay.bitmap_stride;
  sim.region[1][0] = lay.data_off;
  sim.region[1][1] = lay.total_size;
  sim.nregions = 2;
  st = sim_open ();
  for (int f = 0; f < NF; f++)
    slot_of[f] = -1;
  for (int i = 0; i < SLOTS; i++)
    folio_of[i] = -1;
  for (long round = 0; round < crashes; round++) {
    sim.persists_left = rand_r (&seed) % (sim.page_mode ? 8 : 80);
    while (!sim.power_off) {
      op_random ();
      total_ops++;
    }
    store_destroy (st);   /* the power is off: its sync reaches nothing */
    bool kill = sim.page_mode && rand_r (&seed) % 4 == 0;
    /* The power went, or foliod was killed (page store: the shared
     * mapping keeps memory as it was then; the media only what reached
     * it). */
    pmem_sim_media_crash (&sim, kill);
    kills += kill;
    memset (has_unflushed, 0, sizeof has_unflushed);   /* the backing lost them */
    reopen (round);
    check_all (round);
  }
  print_message ("%s: %ld crashes (%ld of them kills), %ld operations, "
                 "%u writes, %ld torn slot entries\n",
                 page ? "page" : "cache-line", crashes, kills, total_ops,
                 next_version, torn_entries);
  /* The case the slot crc must get right did happen (a cache-line store
   * tears the entry's words; a page store writes its sector whole). */
  if (!page && crashes >= 1000)
    assert_true (torn_entries > 0);
  store_destroy (st);
  pmem_sim_media_free (&sim);
}

static void
test_crashes_cache_line (void **state)
{
  run_crashes (false);
}

/* Slot reuse on a page store once let a flushed block come back with the
 * data of the folio the slot took next (the cleared bits had not reached
 * the media; STORE_SEED=14 crash 81). */
static void
test_crashes_page (void **state)
{
  run_crashes (true);
}

int
main (void)
{
  store_seed = (unsigned) ct_env_u64 ("STORE_SEED", 0);
  if (store_seed == 0)
    store_seed = (unsigned) time (NULL) ^ (unsigned) getpid ();
  printf ("STORE_SEED=%u\n", store_seed);
  fflush (stdout);
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_crashes_cache_line),
    cmocka_unit_test (test_crashes_page),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
