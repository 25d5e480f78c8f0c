/* The SSD log store's reclaim under a long overwrite workload, on a disk
 * in memory that counts what is written to it.
 *
 * Every block of the cache is dirty and stays dirty (nothing is ever
 * written back: the log is as full of live data as it can be), and
 * random blocks are overwritten, a FLUSH (sync) after each few.  Every
 * sync must succeed (a full log makes a commit reclaim first, never
 * fail) and the log's used space stays within its size, with a log of
 * three times the cache and with the smallest the store accepts.  With
 * the former reclaim works segment by segment: what the store writes to
 * the disk is a small multiple of what the clients wrote (2.2 times; a
 * whole-log compaction rewrote the whole cache each time the log filled:
 * 5.5 times).  Then a reopen recovers every block's last version. */
#include <errno.h>
#include <inttypes.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <malloc.h>
#include <cmocka.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"
#include "lib/ssd-disk.h"

#define FOLIO 65536
#define BLOCK 4096
#define BPF (FOLIO / BLOCK)
#define SLOTS 16
#define NB (SLOTS * BPF)

static unsigned char *disk;
static uint64_t disk_size;
static char err[512];

/* The kill of test_restart_keeps_room: the disk as a kill leaves it in
 * the middle of the snap_at-th compaction's write (the first half of its
 * batches written, whole), and the versions the blocks had at the last
 * completed sync and have now. */
static unsigned char *snap;
static int snap_at, comps_seen;
static uint32_t version[NB], synced[NB];
static uint32_t snap_synced[NB], snap_version[NB];

static void
kill_in (const unsigned char *buf, size_t len, uint64_t off)
{
  const struct ssd_batch *h = (const struct ssd_batch *) buf;
  size_t at = 0;

  if (memcmp (h->magic, SSD_BATCH_MAGIC, sizeof h->magic) != 0 ||
      !(h->flags & SSD_BATCH_FIRST) || ++comps_seen != snap_at)
    return;
  while (at < len / 2) {        /* whole batches: no torn record */
    h = (const struct ssd_batch *) (buf + at);
    at += SSD_ALIGN + ((size_t) h->ndata * BLOCK + SSD_ALIGN - 1) /
          SSD_ALIGN * SSD_ALIGN;
  }
  assert_true (at < len);       /* its last batch not written */
  memcpy (snap, disk, disk_size);
  memcpy (snap + off, buf, at);
  memcpy (snap_synced, synced, sizeof synced);
  memcpy (snap_version, version, sizeof version);
}

static void
watch_write (struct ssd_disk *k, const void *buf, size_t len, uint64_t off)
{
  (void) k;
  if (snap && off >= SSD_LOG_OFF)
    kill_in (buf, len, off);
}

static const struct store_config cfg = {
  .path = "(memory)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = (uint64_t) SLOTS * FOLIO,
  .backing_spec = "none", .backing_size = (uint64_t) SLOTS * FOLIO,
};

/* The disk: disk, disk_size bytes (dk.written counts what the store
 * writes to it). */
static struct ssd_disk dk;

static struct store *
open_store (void)
{
  dk.bytes = disk;
  dk.size = disk_size;
  dk.before_write = watch_write;
  struct store *s = ssd_disk_open (&dk, &cfg, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  return s;
}

static void
fill (struct store *s, uint32_t gb, uint32_t v)
{
  uint32_t *p = (uint32_t *) ((unsigned char *) s->ops->data (s, gb / BPF) +
                              (size_t) (gb % BPF) * BLOCK);
  for (size_t i = 0; i < BLOCK / 4; i++)
    p[i] = v ^ (uint32_t) i;
  version[gb] = v;
}

/* Block gb written (version v): data, persist, dirty bits, persist. */
static void
write_block (struct store *s, uint32_t gb, uint32_t v)
{
  uint32_t slot = gb / BPF, b = gb % BPF;
  uint64_t *bits = s->ops->bitmap (s, slot);

  fill (s, gb, v);
  s->ops->persist (s, (unsigned char *) s->ops->data (s, slot) +
                   (size_t) b * BLOCK, BLOCK);
  for (int plane = FP_UPTODATE; plane <= FP_DIRTY; plane++) {
    uint32_t i = (uint32_t) plane * BPF + b;
    bits[i / 64] |= 1ull << (i % 64);
  }
  s->ops->persist (s, bits, s->bitmap_words * 8);
}

static int
recovered (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct store *s = arg;

  assert_int_equal (slot, fi);    /* folio order, one slot each */
  for (uint32_t b = 0; b < BPF; b++) {
    const uint32_t *p = (const uint32_t *) ((unsigned char *)
                          s->ops->data (s, slot) + (size_t) b * BLOCK);
    uint32_t i = FP_DIRTY * BPF + b;
    assert_true (bits[i / 64] & (1ull << (i % 64)));
    assert_int_equal (p[0], version[fi * BPF + b]);
  }
  return 0;
}

/* s dies (a crash: no mark_clean), the store on dk opens again (config
 * c) and recovers every one of its folios with fn, none lost; the disk
 * is freed. */
static void
crash_recover (struct store *s, const struct store_config *c,
               store_recover_fn fn, uint32_t folios)
{
  struct store_recovery rec = { 0 };

  store_destroy (s);
  s = ssd_disk_open (&dk, c, err, sizeof err);
  if (s == NULL)
    fail_msg ("reopen: %s", err);
  assert_int_equal (store_recover (s, fn, s, &rec), 0);
  assert_int_equal (rec.folios, folios);
  assert_int_equal (rec.lost_blocks, 0);
  store_destroy (s);
  free (disk);
}

static void
overwrite (uint64_t log, double max_amplification)
{
  unsigned seed = 1;
  uint64_t client = 0;
  struct store_stats ss;

  disk_size = SSD_LOG_OFF + log;
  disk = calloc (1, disk_size);
  assert_non_null (disk);
  struct store *s = open_store ();
  for (uint32_t slot = 0; slot < SLOTS; slot++)
    s->ops->set_index (s, slot, slot);
  for (uint32_t gb = 0; gb < NB; gb++)      /* every block dirty */
    write_block (s, gb, gb + 1);
  assert_int_equal (store_sync (s), 0);
  dk.written = 0;
  for (uint32_t round = 0; round < 20000; round++) {
    uint32_t n = 1 + (uint32_t) rand_r (&seed) % 8;
    for (uint32_t k = 0; k < n; k++) {
      uint32_t gb = (uint32_t) rand_r (&seed) % NB;
      write_block (s, gb, (round + 1) << 16 | k);
      client += BLOCK;
    }
    /* A full log: the commit makes room, it never fails. */
    assert_int_equal (store_sync (s), 0);
    store_get_stats (s, &ss);
    assert_true (ss.log_used <= ss.log_bytes);
  }
  printf ("log %" PRIu64 " bytes for a cache of %u; clients wrote %" PRIu64
          ", the store %" PRIu64 " (%.2fx); %" PRIu64 " reclaims, %" PRIu64
          " compactions\n", log, SLOTS * FOLIO, client, dk.written,
          (double) dk.written / (double) client, ss.reclaims, ss.compactions);
  if (max_amplification > 0)
    assert_true (dk.written <= max_amplification * client);
  crash_recover (s, &cfg, recovered, SLOTS);
}

static void
test_overwrite_bounded (void **state)
{
  (void) state;
  /* Each 4 KiB record has a 4 KiB header at worst (a FLUSH per write):
   * twice the data; reclaim's copies add a fraction of it. */
  overwrite (3 * SLOTS * FOLIO, 3);
}

static void
test_overwrite_smallest_log (void **state)
{
  uint64_t cmax = ssd_compaction_max (SLOTS, FOLIO, BLOCK);

  (void) state;
  overwrite ((2 * cmax + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN, 0);
}

/* Restart after the kill: every block reads its version at the last
 * completed sync, or its newer one; the model follows. */
static int
recovered_after_kill (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct store *s = arg;

  assert_int_equal (slot, fi);
  for (uint32_t b = 0; b < BPF; b++) {
    uint32_t gb = (uint32_t) fi * BPF + b;
    const uint32_t *p = (const uint32_t *) ((unsigned char *)
                          s->ops->data (s, slot) + (size_t) b * BLOCK);
    uint32_t i = FP_DIRTY * BPF + b;
    assert_true (bits[i / 64] & (1ull << (i % 64)));
    if (p[0] != snap_synced[gb] && p[0] != snap_version[gb])
      fail_msg ("block %" PRIu32 ": version %" PRIu32 ", synced %" PRIu32,
                gb, p[0], snap_synced[gb]);
    version[gb] = p[0];
  }
  return 0;
}

/* issue 33 item 16: foliod killed in the middle of a compaction's
 * batches (the smallest log: every reclaim is one) leaves the log from
 * its start to the batches written, with no room for the next
 * compaction.  Recovery must give back the room every commit keeps (the
 * unfinished commit was never acknowledged), or a later commit writes
 * over the log's start (an assertion; without it, the oldest live
 * records).  Restarts after kills, the whole export dirty. */
static void
test_restart_keeps_room (void **state)
{
  uint64_t cmax = ssd_compaction_max (SLOTS, FOLIO, BLOCK);
  uint64_t log = (2 * cmax + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
  unsigned seed = 7;
  struct store_stats ss;
  struct store_recovery rec;

  (void) state;
  disk_size = SSD_LOG_OFF + log;
  disk = calloc (1, disk_size);
  snap = calloc (1, disk_size);
  assert_non_null (disk);
  assert_non_null (snap);
  snap_at = 10;
  comps_seen = 0;
  struct store *s = open_store ();
  for (uint32_t slot = 0; slot < SLOTS; slot++)
    s->ops->set_index (s, slot, slot);
  for (uint32_t gb = 0; gb < NB; gb++)      /* every block dirty */
    write_block (s, gb, gb + 1);
  assert_int_equal (store_sync (s), 0);
  memcpy (synced, version, sizeof synced);
  for (uint32_t round = 0; comps_seen < snap_at; round++) {
    for (uint32_t k = 0; k < 1 + round % 8; k++)
      write_block (s, (uint32_t) rand_r (&seed) % NB, (round + 1) << 16 | k);
    assert_int_equal (store_sync (s), 0);
    memcpy (synced, version, sizeof synced);
  }
  store_destroy (s);
  memcpy (disk, snap, disk_size);           /* the kill */
  free (snap);
  snap = NULL;

  for (int restart = 0; restart < 3; restart++) {
    s = open_store ();
    assert_int_equal (store_recover (s, restart ? recovered
                                                : recovered_after_kill,
                                     s, &rec), 0);
    assert_int_equal (rec.folios, SLOTS);
    store_get_stats (s, &ss);
    printf ("restart %d: log used %" PRIu64 " of %" PRIu64 " (a compaction "
            "needs %" PRIu64 ")\n", restart, ss.log_used, ss.log_bytes, cmax);
    assert_true (ss.log_used + cmax <= ss.log_bytes);
    for (uint32_t round = 0; round < 500; round++) {
      for (uint32_t k = 0; k < 1 + round % 8; k++)
        write_block (s, (uint32_t) rand_r (&seed) % NB,
                     (uint32_t) (restart + 1) << 24 | (round + 1) << 8 | k);
      assert_int_equal (store_sync (s), 0);
    }
    store_destroy (s);          /* killed again: no mark_clean */
  }
  free (disk);
}

/* Folio fi (1..SLOTS-1) back in slot fi - 1, its last versions. */
static int
recovered_shifted (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct store *s = arg;

  (void) bits;
  assert_int_equal (slot + 1, fi);
  for (uint32_t b = 0; b < BPF; b++)
    assert_int_equal (*(const uint32_t *) ((unsigned char *)
                        s->ops->data (s, slot) + (size_t) b * BLOCK),
                      version[fi * BPF + b]);
  return 0;
}

/* issue 33 item 16: recovery's memory follows the folios the log holds
 * data of, not every folio it ever named.  One slot takes folio after
 * folio (each written, committed, written back: a clean record, then
 * evicted), the other slots stay dirty; after a crash, what the open
 * keeps for recovery is measured (the heap before and after it). */
static void
test_recovery_memory (void **state)
{
  const uint32_t folios = 5000;            /* a 64 MiB log holds them all */
  struct store_recovery rec = { 0 };

  (void) state;
  disk_size = SSD_LOG_OFF + (64u << 20);
  disk = calloc (1, disk_size);
  assert_non_null (disk);
  struct store *s = open_store ();
  for (uint32_t slot = 0; slot < SLOTS; slot++)
    s->ops->set_index (s, slot, slot);
  for (uint32_t gb = BPF; gb < NB; gb++)    /* slots 1..: dirty */
    write_block (s, gb, gb + 1);
  uint64_t *bits = s->ops->bitmap (s, 0);
  for (uint32_t k = 0; k < folios; k++) {
    write_block (s, 0, k + 1);              /* folio k in slot 0 */
    assert_int_equal (store_sync (s), 0);
    memset (bits, 0, s->bitmap_words * 8);  /* written back, flushed */
    s->ops->persist (s, bits, s->bitmap_words * 8);
    assert_int_equal (store_sync (s), 0);
    assert_true (store_may_reuse (s, 0));
    s->ops->set_index (s, 0, STORE_NO_FOLIO);
    s->ops->set_index (s, 0, SLOTS + k);    /* the next folio */
  }
  store_destroy (s);                        /* a crash */

  struct mallinfo2 m0 = mallinfo2 ();
  s = open_store ();
  struct mallinfo2 m1 = mallinfo2 ();
  size_t kept = (m1.uordblks + m1.hblkhd) - (m0.uordblks + m0.hblkhd);
  printf ("the log named %" PRIu32 " folios; the open keeps %zu bytes "
          "(its write buffer %u)\n", folios + SLOTS, kept, 4u << 20);
  /* The write buffer, the slot state, and a table for a few folios:
   * not 24 bytes per block of every folio named (1.9 MB here). */
  assert_true (kept < (4u << 20) + (512u << 10));
  assert_int_equal (store_recover (s, recovered_shifted, s, &rec), 0);
  assert_int_equal (rec.folios, SLOTS - 1);
  store_destroy (s);
  free (disk);
}

/* A cache of many small slots (one block each), its log full of live
 * data: the commits that reclaim look at every slot, and every client
 * write waits for the store's lock meanwhile.  A commit holds it over a
 * bounded number of slots at a time, whatever the cache's size (issue
 * 33 item 15, review F8: a reclaim scanned every slot and block in one
 * hold, tens of ms at a million slots); the data survives as before. */
#define WIDE 2048

static const struct store_config wide_cfg = {
  .path = "(memory)", .nslots = WIDE, .folio_size = BLOCK,
  .block_size = BLOCK, .export_size = (uint64_t) WIDE * BLOCK,
  .backing_spec = "none", .backing_size = (uint64_t) WIDE * BLOCK,
};

static uint32_t wide_v[WIDE];   /* the version each slot's block holds */

static void
wide_write (struct store *s, uint32_t slot, uint32_t v)
{
  unsigned char *d = s->ops->data (s, slot);
  uint64_t *bits = s->ops->bitmap (s, slot);

  memcpy (d, &v, sizeof v);
  wide_v[slot] = v;
  s->ops->persist (s, d, BLOCK);
  bits[0] |= 1ull << FP_UPTODATE | 1ull << FP_DIRTY;
  s->ops->persist (s, bits, s->bitmap_words * 8);
}

static int
wide_recovered (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct store *s = arg;
  uint32_t v;

  assert_true (fi < WIDE);
  assert_true (bits[0] & 1ull << FP_DIRTY);
  memcpy (&v, s->ops->data (s, slot), sizeof v);
  assert_int_equal (v, wide_v[fi]);     /* the last version synced */
  return 0;
}

static void
test_reclaim_holds_bounded (void **state)
{
  unsigned seed = 7;
  struct store_stats ss = { 0 };
  struct ssd_stats st;

  (void) state;
  disk_size = SSD_LOG_OFF + 3ull * WIDE * BLOCK;
  disk = calloc (1, disk_size);
  assert_non_null (disk);
  dk = (struct ssd_disk) { .bytes = disk, .size = disk_size };
  struct store *s = ssd_disk_open (&dk, &wide_cfg, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  for (uint32_t slot = 0; slot < WIDE; slot++) {
    s->ops->set_index (s, slot, slot);
    wide_write (s, slot, 0);
    if (slot % 256 == 255)      /* commits of 256 slots */
      assert_int_equal (store_sync (s), 0);
  }
  for (uint32_t round = 0; round < 100000 && ss.reclaims < 3; round++) {
    for (int k = 0; k < 4; k++)
      wide_write (s, (uint32_t) rand_r (&seed) % WIDE, round + 1);
    assert_int_equal (store_sync (s), 0);
    store_get_stats (s, &ss);
  }
  assert_true (ss.reclaims >= 3);
  store_ssd_get_stats (s, &st);
  printf ("%u slots, %" PRIu64 " reclaims: at most %" PRIu64 " slots per "
          "hold of the lock (bound %u)\n", WIDE, ss.reclaims,
          st.hold_slots_max, SSD_HOLD_BLOCKS);
  assert_true (st.hold_slots_max > 0);
  if (st.hold_slots_max > SSD_HOLD_BLOCKS)
    fail_msg ("a commit looked at %" PRIu64 " slots in one hold of the "
              "store's lock", st.hold_slots_max);
  crash_recover (s, &wide_cfg, wide_recovered, WIDE);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_overwrite_bounded),
    cmocka_unit_test (test_overwrite_smallest_log),
    cmocka_unit_test (test_restart_keeps_room),
    cmocka_unit_test (test_recovery_memory),
    cmocka_unit_test (test_reclaim_holds_bounded),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
