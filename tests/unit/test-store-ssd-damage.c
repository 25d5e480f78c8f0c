/* The SSD log store (store=ssd:PATH) when one sector of its metadata or
 * data is damaged (a media error, a stray write, a discard), on a disk in
 * memory whose every write is durable at once: a run of the store writes
 * and FLUSHes (sync) blocks, stops (a crash, or a clean stop), one sector
 * is damaged, and the test asserts what the next open and recovery give.
 * The rule: every block a FLUSH acknowledged comes back, or the store is
 * refused with the damage named; never an older version silently.
 *  - the newer superblock copy damaged, after a clean stop and a run that
 *    FLUSHed, and after a checkpoint whose old log start was written over
 *    (issue 33 item 9); the epoch the next run takes is above every one
 *    in the log; the ledger's facts (doubt, fenced, passthrough writes
 *    lost) kept through the same damage;
 *  - a batch header in the flushed part of the log (item 10), and one
 *    sector of the last commit's header (its copy in the next sector);
 *  - a record of an earlier run's last commit (item 13a), against a torn
 *    last commit of the newest run (dropped: nothing of it was
 *    acknowledged);
 *  - both superblocks blank over a log (item 13c);
 *  - the store's path is the backing image (item 13d), and a log file
 *    made beforehand with truncate is allocated at open (item 12);
 *  - a commit that runs out of memory (item 15): that FLUSH fails, the
 *    next one succeeds and the data comes back after a crash. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"
#include "lib/ssd-disk.h"

#define FOLIO 16384
#define BLOCK 4096
#define BPF (FOLIO / BLOCK)
#define SLOTS 4
#define LOG_BYTES (2u << 20)     /* over 6 compactions: a reclaim moves
                                  * the start by more than one */
#define DISK (SSD_LOG_OFF + LOG_BYTES)

static unsigned char *disk;
static char err[1024];

/* Out of memory on demand: realloc (the commit's record lists) fails
 * while fail_realloc is set.  Not under a sanitizer, whose allocator
 * this would bypass. */
#if !defined __SANITIZE_ADDRESS__ && !defined __SANITIZE_THREAD__
#define REALLOC_FAULTS 1
extern void *__libc_realloc (void *p, size_t n);
static bool fail_realloc;

void *realloc (void *p, size_t n);
void *
realloc (void *p, size_t n)
{
  if (fail_realloc) {
    errno = ENOMEM;
    return NULL;
  }
  return __libc_realloc (p, n);
}
#endif

static const struct store_config cfg = {
  .path = "(memory)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = (uint64_t) SLOTS * FOLIO,
  .backing_spec = "none", .backing_size = (uint64_t) SLOTS * FOLIO,
};

/* The store on the disk, or NULL (err says why). */
static struct store *
try_open (void)
{
  static struct ssd_disk k;

  k = (struct ssd_disk) { .bytes = disk, .size = DISK };
  return ssd_disk_open (&k, &cfg, err, sizeof err);
}

/* What a recovery handed back: the version of each block it holds dirty
 * (0: none); and which slot holds which folio (the export has as many
 * folios as the cache has slots: none is ever evicted). */
static uint32_t got[SLOTS][BPF];
static int slot_of[SLOTS], folio_in[SLOTS];

static int
recovered (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct store *s = arg;

  assert_true (fi < SLOTS && slot < SLOTS);
  slot_of[fi] = (int) slot;
  folio_in[slot] = (int) fi;
  for (uint32_t b = 0; b < BPF; b++) {
    uint32_t i = FP_DIRTY * BPF + b;
    if (bits[i / 64] & (1ull << (i % 64)))
      memcpy (&got[fi][b], (unsigned char *) s->ops->data (s, slot) +
              (size_t) b * BLOCK, 4);
  }
  return 0;
}

static struct store *
open_recover (struct store_recovery *rec)
{
  struct store *s = try_open ();

  if (s == NULL)
    fail_msg ("open: %s", err);
  memset (got, 0, sizeof got);
  for (uint32_t k = 0; k < SLOTS; k++)
    slot_of[k] = folio_in[k] = -1;
  assert_int_equal (store_recover (s, recovered, s, rec), 0);
  return s;
}

/* The slot of folio fi (a free one the first time). */
static uint32_t
slot (struct store *s, uint32_t fi)
{
  for (uint32_t k = 0; slot_of[fi] < 0 && k < SLOTS; k++)
    if (folio_in[k] < 0) {
      s->ops->set_index (s, k, fi);
      slot_of[fi] = (int) k;
      folio_in[k] = (int) fi;
    }
  assert_true (slot_of[fi] >= 0);
  return (uint32_t) slot_of[fi];
}

static uint64_t *
bits_of (struct store *s, uint32_t fi)
{
  return s->ops->bitmap (s, slot (s, fi));
}

/* Block b of folio fi written with version v: data, persist, bits,
 * persist (store.h's protocol). */
static void
wblock (struct store *s, uint32_t fi, uint32_t b, uint32_t v)
{
  unsigned char *p = (unsigned char *) s->ops->data (s, slot (s, fi)) +
                     (size_t) b * BLOCK;
  uint64_t *bits = bits_of (s, fi);

  for (size_t i = 0; i < BLOCK; i += 4)
    memcpy (p + i, &v, 4);
  s->ops->persist (s, p, BLOCK);
  for (int plane = FP_UPTODATE; plane <= FP_DIRTY; plane++) {
    uint32_t i = (uint32_t) plane * BPF + b;
    bits[i / 64] |= 1ull << (i % 64);
  }
  s->ops->persist (s, bits, s->bitmap_words * 8);
}

/* Every block written back and the backing flushed: dirty bits clear. */
static void
clean_all (struct store *s)
{
  for (uint32_t fi = 0; fi < SLOTS; fi++) {
    if (slot_of[fi] < 0)
      continue;
    uint64_t *bits = bits_of (s, fi);
    for (uint32_t b = 0; b < BPF; b++) {
      uint32_t i = FP_DIRTY * BPF + b;
      bits[i / 64] &= ~(1ull << (i % 64));
    }
    s->ops->persist (s, bits, s->bitmap_words * 8);
  }
}

static void
flush (struct store *s)
{
  assert_int_equal (store_sync (s), 0);
}

static void
new_disk (void)
{
  free (disk);
  disk = calloc (1, DISK);
  assert_non_null (disk);
}

/* One sector of the disk at off overwritten with garbage. */
static void
damage (uint64_t off)
{
  memset (disk + off, 0xa5, 512);
}

static const struct ssd_super *
copy (int i)
{
  return (const struct ssd_super *) (disk + (size_t) i * SSD_SUPER_COPY);
}

/* The newer superblock copy (both sound here). */
static int
newer_copy (void)
{
  return copy (0)->seq > copy (1)->seq ? 0 : 1;
}

/* The device offset of the batch header with sequence seq (the log has
 * one), found by its magic. */
static uint64_t
batch_off (uint64_t seq)
{
  for (uint64_t off = SSD_LOG_OFF; off < DISK; off += SSD_ALIGN) {
    const struct ssd_batch *h = (const struct ssd_batch *) (disk + off);
    if (memcmp (h->magic, SSD_BATCH_MAGIC, 8) == 0 && h->seq == seq &&
        h->crc == ssd_batch_crc (h))
      return off;
  }
  fail_msg ("no batch %" PRIu64, seq);
  return 0;
}

/* The highest epoch any batch header on the disk carries. */
static uint64_t
log_epoch_max (void)
{
  uint64_t e = 0;

  for (uint64_t off = SSD_LOG_OFF; off < DISK; off += SSD_ALIGN) {
    const struct ssd_batch *h = (const struct ssd_batch *) (disk + off);
    if (memcmp (h->magic, SSD_BATCH_MAGIC, 8) == 0 &&
        h->crc == ssd_batch_crc (h) && h->epoch > e)
      e = h->epoch;
  }
  return e;
}

/* The store refuses the disk, naming the damage, and writes nothing. */
static void
assert_refused (const char *why)
{
  unsigned char *before = malloc (DISK);

  assert_non_null (before);
  memcpy (before, disk, DISK);
  struct store *s = try_open ();
  if (s != NULL)
    fail_msg ("the store opened over %s", why);
  if (strstr (err, why) == NULL)
    fail_msg ("refused, but not for %s: %s", why, err);
  assert_memory_equal (before, disk, DISK);
  free (before);
}

/* A new store that FLUSHed version v of block b of folio fi (open). */
static struct store *
new_store_with (uint32_t fi, uint32_t b, uint32_t v)
{
  struct store_recovery rec;
  struct store *s;

  new_disk ();
  s = open_recover (&rec);
  wblock (s, fi, b, v);
  flush (s);
  return s;
}

/* Item 9: a clean stop, then a run that FLUSHes two writes and crashes;
 * one sector of the newer superblock copy (that run's, saying "in use")
 * damaged.  The older copy says "clean, replay nothing": the FLUSHed
 * writes must come back all the same, and the next run's epoch must be
 * above theirs (else its log would continue with their leftovers). */
static void
test_newer_super_after_clean_stop (void **state)
{
  struct store_recovery rec;
  struct store *s;

  (void) state;
  s = new_store_with (0, 0, 11);
  clean_all (s);
  assert_int_equal (store_mark_clean (s), 0);
  store_destroy (s);

  s = open_recover (&rec);
  assert_int_equal (rec.dirty_blocks, 0);
  wblock (s, 1, 0, 21);
  flush (s);
  wblock (s, 2, 1, 22);
  flush (s);
  store_destroy (s);                       /* a crash */
  uint64_t run2_epoch = log_epoch_max ();

  damage ((uint64_t) newer_copy () * SSD_SUPER_COPY);
  s = open_recover (&rec);
  assert_int_equal (got[1][0], 21);
  assert_int_equal (got[2][1], 22);
  assert_int_equal (got[0][0], 0);         /* written back before the stop */
  assert_int_equal (rec.lost_blocks, 0);
  /* The new epoch (in the copy written over the damaged one) is above
   * every epoch in the log. */
  assert_true (copy (newer_copy ())->epoch > run2_epoch);
  store_destroy (s);
}

/* The ledger's facts (writes in doubt, a lost image, lost passthrough
 * writes) outlive one damaged sector of the newer superblock copy: set,
 * a crash, the newer copy damaged; the next open still finds each one.
 * (Before: the fact was in the newer copy only, and the older one gave
 * a store that had forgotten it, whose FLUSHes then succeeded.) */
static void
test_fact_survives_damaged_super (void **state)
{
  static const char *names[] = { "doubt", "fenced", "pt_lost" };
  struct store_recovery rec;
  struct store_info info;
  struct store *s;

  (void) state;
  for (int f = 0; f < 3; f++) {
    s = new_store_with (0, 0, 11);
    int r = f == 0 ? s->ops->set_doubt (s, true)
          : f == 1 ? s->ops->set_fenced (s, true)
          : s->ops->set_pt_lost (s, true);
    assert_int_equal (r, 0);
    store_destroy (s);                     /* a crash */
    damage ((uint64_t) newer_copy () * SSD_SUPER_COPY);
    s = open_recover (&rec);
    memset (&info, 0, sizeof info);
    s->ops->info (s, &info);
    bool kept = f == 0 ? info.doubt : f == 1 ? info.fenced : info.pt_lost;
    if (!kept)
      fail_msg ("the %s fact was lost with the newer superblock copy",
                names[f]);
    assert_int_equal (got[0][0], 11);
    store_destroy (s);
  }
}

/* Item 9 again: the newer copy is a checkpoint that moved the log's
 * start, and later commits of the same run have written over the old
 * start (the older copy's).  Every FLUSHed block must come back. */
static void
test_newer_super_checkpoint (void **state)
{
  struct store_recovery rec;
  uint32_t want[SLOTS][BPF] = { { 0 } };
  unsigned seed = 7;
  bool over = false;
  struct store *s;

  (void) state;
  new_disk ();
  s = open_recover (&rec);
  for (uint32_t round = 1; round < 200000 && !over; round++) {
    uint32_t fi = (uint32_t) rand_r (&seed) % SLOTS;
    uint32_t b = (uint32_t) rand_r (&seed) % BPF;
    wblock (s, fi, b, round);
    want[fi][b] = round;
    flush (s);
    /* Stop once the older copy's start is written over by this lap (the
     * header there names another lsn), no superblock write since. */
    const struct ssd_super *o = copy (1 - newer_copy ());
    const struct ssd_batch *h = (const struct ssd_batch *)
      (disk + SSD_LOG_OFF + o->tail_lsn % LOG_BYTES);
    over = o->epoch == copy (newer_copy ())->epoch &&
           o->tail_lsn != copy (newer_copy ())->tail_lsn &&
           memcmp (h->magic, SSD_BATCH_MAGIC, 8) == 0 &&
           h->lsn != o->tail_lsn;
  }
  assert_true (over);
  store_destroy (s);                       /* a crash */
  damage ((uint64_t) newer_copy () * SSD_SUPER_COPY + 512);
  s = open_recover (&rec);
  assert_memory_equal (got, want, sizeof got);
  assert_int_equal (rec.lost_blocks, 0);
  store_destroy (s);
}

/* The newer superblock copy damaged twice, at two restarts: the open
 * after the first writes the new epoch (above every epoch it found, one
 * more than the older copy's plus the one it may have missed) over the
 * damaged copy only; the older copy is left two epochs behind.  A run
 * that then FLUSHes and crashes before any other superblock write, its
 * copy damaged too: its commits must come back, though they carry an
 * epoch two above the only sound copy's. */
static void
test_newer_super_twice (void **state)
{
  struct store_recovery rec;
  struct store *s;

  (void) state;
  s = new_store_with (0, 0, 1);
  store_destroy (s);                       /* a crash */
  damage ((uint64_t) newer_copy () * SSD_SUPER_COPY);
  s = open_recover (&rec);
  assert_int_equal (got[0][0], 1);
  wblock (s, 0, 0, 2);
  wblock (s, 1, 2, 3);
  flush (s);
  store_destroy (s);                       /* a crash */
  uint64_t run_epoch = log_epoch_max ();
  damage ((uint64_t) newer_copy () * SSD_SUPER_COPY);
  s = open_recover (&rec);
  assert_int_equal (got[0][0], 2);
  assert_int_equal (got[1][2], 3);
  assert_int_equal (rec.lost_blocks, 0);
  assert_true (copy (newer_copy ())->epoch > run_epoch);
  store_destroy (s);
}

/* A new store whose log holds two commits of block (0, 0), versions 1
 * and 2: batches *seq0 and *seq0 + 1.  The store stays open. */
static struct store *
two_versions (uint64_t *seq0)
{
  struct store *s;

  s = new_store_with (0, 0, 1);
  *seq0 = copy (newer_copy ())->tail_seq;  /* its first batch's */
  wblock (s, 0, 0, 2);
  flush (s);
  return s;
}

/* Item 10: three commits, the second's header damaged.  One sector:
 * its copy in the next sector stands for it, every version comes back.
 * Both (the header's whole 4 KiB page lost): the third's header says
 * the log was flushed past it, so the store is refused, naming the
 * damage, rather than bring back the first commit's older version (and
 * drop the third silently). */
static void
test_damaged_header (void **state)
{
  struct store_recovery rec;
  uint64_t seq0;
  struct store *s;

  (void) state;
  for (int sector = 0; sector < 2; sector++) {
    s = two_versions (&seq0);
    wblock (s, 1, 3, 5);
    flush (s);                             /* seq0 + 2 */
    store_destroy (s);
    damage (batch_off (seq0 + 1) + (uint64_t) sector * 512);
    s = open_recover (&rec);
    assert_int_equal (got[0][0], 2);
    assert_int_equal (got[1][3], 5);
    assert_int_equal (rec.lost_blocks, 0);
    store_destroy (s);
  }
  s = two_versions (&seq0);
  wblock (s, 1, 3, 5);
  flush (s);
  store_destroy (s);
  uint64_t off = batch_off (seq0 + 1);
  damage (off);
  damage (off + 512);
  assert_refused ("batch headers unreadable");
}

/* The same damage in the last commit, FLUSHed (seed 1796489011 of the
 * fault model, FAULT_PENDING=1): no later header says it was flushed,
 * but the header's copy in its second sector is sound: the newer
 * version comes back, not the older one silently.  Either sector. */
static void
test_damaged_last_header (void **state)
{
  struct store_recovery rec;
  uint64_t seq0;

  (void) state;
  for (int sector = 0; sector < 2; sector++) {
    struct store *s = two_versions (&seq0);
    store_destroy (s);
    damage (batch_off (seq0 + 1) + (uint64_t) sector * 512);
    s = open_recover (&rec);
    assert_int_equal (got[0][0], 2);
    assert_int_equal (rec.lost_blocks, 0);
    store_destroy (s);
  }
}

/* A torn write of the last commit's header (neither sector written,
 * nothing after it says it was flushed, so its sync never returned):
 * the log ends there, the older version stands. */
static void
test_torn_last_header (void **state)
{
  struct store_recovery rec;
  uint64_t seq0;
  struct store *s = two_versions (&seq0);

  (void) state;
  store_destroy (s);
  memset (disk + batch_off (seq0 + 1), 0, SSD_ALIGN);
  s = open_recover (&rec);
  assert_int_equal (got[0][0], 1);
  assert_int_equal (rec.lost_blocks, 0);
  store_destroy (s);
}

/* Item 13a: run 1's last commit FLUSHed block (0, 0) version 2, run 2
 * recovered it and FLUSHed another block; then that record is damaged.
 * It is not a torn write (run 2's commit follows it): refused, never
 * version 1 back silently. */
static void
test_damaged_record_earlier_run (void **state)
{
  struct store_recovery rec;
  uint64_t seq0;
  struct store *s = two_versions (&seq0);   /* seq0 + 1: run 1's last */

  (void) state;
  store_destroy (s);
  s = open_recover (&rec);
  assert_int_equal (got[0][0], 2);
  wblock (s, 1, 0, 7);
  flush (s);
  store_destroy (s);
  damage (batch_off (seq0 + 1) + SSD_ALIGN);   /* the record's data */
  assert_refused ("records fail their data checksum");
}

/* A torn last commit of the newest run (its record's data damaged,
 * nothing after it): dropped whole, the versions before it come back,
 * and the next run writes over it. */
static void
test_torn_last_commit (void **state)
{
  struct store_recovery rec;
  uint64_t seq0;
  struct store *s = two_versions (&seq0);

  (void) state;
  wblock (s, 0, 0, 3);
  wblock (s, 1, 0, 3);
  flush (s);                               /* batch seq0 + 2 */
  store_destroy (s);
  damage (batch_off (seq0 + 2) + SSD_ALIGN);
  s = open_recover (&rec);
  assert_int_equal (got[0][0], 2);
  assert_int_equal (got[1][0], 0);
  assert_int_equal (rec.lost_blocks, 0);
  wblock (s, 2, 2, 9);
  flush (s);
  store_destroy (s);
  /* Not damage now, nor later: the new run's commit is the log's end. */
  s = open_recover (&rec);
  assert_int_equal (got[0][0], 2);
  assert_int_equal (got[2][2], 9);
  store_destroy (s);
}

/* Item 13c: both superblocks wiped over a log holding FLUSHed data:
 * refused, not formatted over. */
static void
test_blank_superblocks (void **state)
{
  struct store *s;

  (void) state;
  s = new_store_with (0, 0, 1);
  store_destroy (s);
  memset (disk, 0, SSD_LOG_OFF);
  assert_refused ("holds a foliod log");
}

static char tmpl[] = "/tmp/test-store-ssd-damage.XXXXXX";

/* A file of size bytes made with truncate (sparse, zeros) in the
 * test's directory. */
static char *
sparse_file (const char *name, off_t size)
{
  static char path[256];
  int fd;

  snprintf (path, sizeof path, "%s/%s", tmpl, name);
  fd = open (path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  assert_true (fd >= 0);
  assert_int_equal (ftruncate (fd, size), 0);
  close (fd);
  return path;
}

static bool
all_zeros (const char *path, off_t size)
{
  FILE *f = fopen (path, "r");
  bool z = true;
  int c;

  assert_non_null (f);
  for (off_t i = 0; i < size && z; i++)
    z = (c = getc (f)) == 0;
  fclose (f);
  return z;
}

/* Item 13d: store=ssd: naming the backing image itself (a new image,
 * zeros: it would be taken for a blank store and formatted). */
static void
test_log_is_backing (void **state)
{
  const off_t size = 8 << 20;
  char *path = sparse_file ("img", size);
  struct store_config c = cfg;
  struct stat st;

  (void) state;
  assert_int_equal (stat (path, &st), 0);
  c.path = path;
  c.backing_spec = path;
  c.backing_size = (uint64_t) size;
  c.export_size = (uint64_t) SLOTS * FOLIO;
  c.backing_dev = st.st_dev;
  c.backing_ino = st.st_ino;
  struct store *s = store_ssd_open (&c, err, sizeof err);
  if (s != NULL) {
    store_destroy (s);
    fail_msg ("the backing image was taken as its own store");
  }
  assert_int_equal (errno, EINVAL);
  assert_non_null (strstr (err, "the backing itself"));
  assert_true (all_zeros (path, size));
  unlink (path);
}

/* Item 12: a log file made beforehand with truncate is allocated whole
 * at open, so that a filling file system fails the open, not a commit. */
static void
test_sparse_log_allocated (void **state)
{
  const off_t size = 4 << 20;
  char *path = sparse_file ("log", size);
  struct store_config c = cfg;
  struct stat st;

  (void) state;
  c.path = path;
  struct store *s = store_ssd_open (&c, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  assert_int_equal (stat (path, &st), 0);
  store_destroy (s);
  if ((off_t) st.st_blocks * 512 < size)
    fail_msg ("the log has holes: %lld of %lld bytes allocated",
              (long long) st.st_blocks * 512, (long long) size);
  unlink (path);
}

/* Item 15: a commit that cannot allocate its record list fails that
 * FLUSH (ENOMEM) and changes nothing: the next FLUSH commits the same
 * writes, and they come back after a crash. */
static void
test_commit_enomem (void **state)
{
  (void) state;
#ifdef REALLOC_FAULTS
  struct store_recovery rec;
  struct store *s;

  new_disk ();
  s = open_recover (&rec);
  wblock (s, 0, 1, 4);
  wblock (s, 3, 2, 5);
  fail_realloc = true;
  int r = store_sync (s), e = errno;
  fail_realloc = false;
  assert_int_equal (r, -1);
  assert_int_equal (e, ENOMEM);
  flush (s);                    /* not sticky */
  wblock (s, 1, 0, 6);
  flush (s);
  store_destroy (s);            /* a crash */
  s = open_recover (&rec);
  assert_int_equal (got[0][1], 4);
  assert_int_equal (got[3][2], 5);
  assert_int_equal (got[1][0], 6);
  store_destroy (s);
#else
  skip ();
#endif
}

static int
setup (void **state)
{
  (void) state;
  return mkdtemp (tmpl) ? 0 : -1;
}

static int
teardown (void **state)
{
  (void) state;
  free (disk);
  return rmdir (tmpl);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_newer_super_after_clean_stop),
    cmocka_unit_test (test_newer_super_checkpoint),
    cmocka_unit_test (test_newer_super_twice),
    cmocka_unit_test (test_fact_survives_damaged_super),
    cmocka_unit_test (test_damaged_header),
    cmocka_unit_test (test_damaged_last_header),
    cmocka_unit_test (test_torn_last_header),
    cmocka_unit_test (test_damaged_record_earlier_run),
    cmocka_unit_test (test_torn_last_commit),
    cmocka_unit_test (test_blank_superblocks),
    cmocka_unit_test (test_log_is_backing),
    cmocka_unit_test (test_sparse_log_allocated),
    cmocka_unit_test (test_commit_enomem),
  };
  return cmocka_run_group_tests (tests, setup, teardown);
}
