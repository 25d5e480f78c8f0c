/* The SSD log store's commit while a writer changes the blocks it copies
 * (issue 33 item 11, review F4), on a disk in memory.
 *
 * A writer thread plays the cache: it writes whole blocks through
 * store_write (as copy_range does), each version with a pattern distinct
 * in every 512-byte sector (version, sector, block in every 8 bytes), and
 * sets the dirty bits; the main thread commits (sync) meanwhile.  Every
 * data record a commit writes is checked as it goes to the disk (a crash
 * right after that commit would bring it back): it must be one version
 * the writer wrote whole, never a mix, within a sector or across them.
 * Then the store is dropped without a clean stop and reopened: recovery
 * must give, for every block, one whole version the writer wrote.
 * Built with TSan (make check-tsan), it is also the concurrent ssd-store
 * test: the committer's reads of the bitmap and the writer's changes. */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"
#include "lib/ssd-mem.h"

#define FOLIO 16384
#define BLOCK 4096
#define SECTOR 512
#define BPF (FOLIO / BLOCK)
#define SLOTS 4
#define NB (SLOTS * BPF)
#define LOG_BYTES (8u << 20)
#define RECORDS 5000            /* data records the commits write */

static unsigned char *disk;
static uint64_t disk_size;
static char err[512];
static uint64_t records, torn;
static _Atomic uint32_t latest[NB];     /* the writer's last version */

/* Version v of block b: every 8 bytes say v, the sector and b. */
static void
pattern (unsigned char *p, uint32_t b, uint32_t v)
{
  for (uint32_t i = 0; i < BLOCK; i += 8) {
    uint64_t w = ((uint64_t) v << 32) | ((uint64_t) (i / SECTOR) << 16) | b;
    memcpy (p + i, &w, 8);
  }
}

/* The version p holds whole for block b, or 0: none (a mix, or junk). */
static uint32_t
version_of (const unsigned char *p, uint32_t b)
{
  uint64_t w0;
  memcpy (&w0, p, 8);
  uint32_t v = (uint32_t) (w0 >> 32);
  for (uint32_t i = 0; i < BLOCK; i += 8) {
    uint64_t w;
    memcpy (&w, p + i, 8);
    if (w != (((uint64_t) v << 32) | ((uint64_t) (i / SECTOR) << 16) | b))
      return 0;
  }
  return v;
}

/* Every data record of the batches a commit writes. */
static void
check_batches (const unsigned char *buf, size_t len)
{
  size_t at = 0;

  while (at + SSD_ALIGN <= len) {
    const struct ssd_batch *h = (const struct ssd_batch *) (buf + at);
    if (memcmp (h->magic, SSD_BATCH_MAGIC, sizeof h->magic) != 0)
      return;
    const struct ssd_entry *e = ssd_batch_entries ((struct ssd_batch *) h);
    const unsigned char *d = buf + at + SSD_ALIGN;
    for (uint32_t i = 0; i < h->nentries; i++, e++) {
      if (e->flags & SSD_ENT_CLEAN)
        continue;
      uint32_t b = (uint32_t) (e->folio * BPF + e->block);
      records++;
      if (b >= NB || version_of (d, b) == 0)
        torn++;
      d += BLOCK;
    }
    at += SSD_ALIGN + ((size_t) h->ndata * BLOCK + SSD_ALIGN - 1) /
          SSD_ALIGN * SSD_ALIGN;
  }
}

/* The memory device (ssd-mem.h), every write checked first. */
static const struct ssd_dev_ops *mem_ops;

static int
check_pwrite (struct ssd_dev *d, const void *buf, size_t len, uint64_t off)
{
  if (off >= SSD_LOG_OFF)
    check_batches (buf, len);
  return mem_ops->pwrite (d, buf, len, off);
}

static int
pass_pread (struct ssd_dev *d, void *buf, size_t len, uint64_t off)
{
  return mem_ops->pread (d, buf, len, off);
}

static int pass_flush (struct ssd_dev *d) { return mem_ops->flush (d); }
static void pass_close (struct ssd_dev *d) { mem_ops->close (d); }

static const struct ssd_dev_ops check_ops = {
  check_pwrite, pass_pread, pass_flush, pass_close,
};

static const struct store_config cfg = {
  .path = "(memory)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = BLOCK, .export_size = (uint64_t) SLOTS * FOLIO,
  .backing_spec = "mem", .backing_size = (uint64_t) SLOTS * FOLIO,
};

static struct store *
m_open (void)
{
  struct ssd_dev *d = ssd_mem_dev (disk, disk_size);
  mem_ops = d->ops;
  d->ops = &check_ops;
  struct store *s = store_ssd_open_dev (&cfg, d, err, sizeof err);
  if (s == NULL)
    fail_msg ("open: %s", err);
  return s;
}

static void
set_bit (struct store *s, uint32_t slot, int plane, uint32_t b)
{
  uint64_t *bits = s->ops->bitmap (s, slot);
  uint32_t i = (uint32_t) plane * BPF + b;
  __atomic_fetch_or (&bits[i / 64], 1ull << (i % 64), __ATOMIC_RELAXED);
}

struct writer {
  struct store *s;
  atomic_bool stop;
};

static void *
writer (void *arg)
{
  struct writer *w = arg;
  struct store *s = w->s;
  unsigned char buf[BLOCK];
  uint32_t v = 0;

  while (!atomic_load (&w->stop)) {
    v++;
    for (uint32_t b = 0; b < NB; b++) {
      uint32_t slot = b / BPF, i = b % BPF;
      unsigned char *dst = (unsigned char *) s->ops->data (s, slot) +
                           (size_t) i * BLOCK;
      pattern (buf, b, v);
      store_write (s, dst, buf, BLOCK);           /* data, persist */
      atomic_store (&latest[b], v);
      set_bit (s, slot, FP_UPTODATE, i);         /* then the bits */
      set_bit (s, slot, FP_DIRTY, i);
      s->ops->persist (s, s->ops->bitmap (s, slot),
                       s->bitmap_words * sizeof (uint64_t));
    }
  }
  return NULL;
}

static int
check_slot (void *arg, uint32_t slot, uint64_t folio, uint64_t *bits)
{
  struct store *s = arg;
  const unsigned char *d = s->ops->data (s, slot);

  assert_true (folio < SLOTS);
  for (uint32_t i = 0; i < BPF; i++) {
    uint32_t b = (uint32_t) folio * BPF + i;
    uint32_t bit = FP_DIRTY * BPF + i;
    assert_true (bits[bit / 64] & (1ull << (bit % 64)));
    uint32_t v = version_of (d + (size_t) i * BLOCK, b);
    if (v == 0 || v > atomic_load (&latest[b]))
      fail_msg ("block %" PRIu32 " recovered as no version written whole",
                b);
  }
  return 0;
}

static void
test_commit_races_writer (void **state)
{
  (void) state;
  disk_size = sizeof (struct ssd_dev) + SSD_LOG_OFF + LOG_BYTES;
  disk = calloc (1, disk_size);
  assert_non_null (disk);

  struct store *s = m_open ();
  for (uint32_t i = 0; i < SLOTS; i++)
    s->ops->set_index (s, i, i);
  struct writer w = { .s = s };
  pthread_t t;
  assert_int_equal (pthread_create (&t, NULL, writer, &w), 0);
  while (atomic_load (&latest[NB - 1]) == 0)
    ;                                       /* every block dirty */
  while (records < RECORDS)                 /* commits the writer races */
    assert_int_equal (s->ops->sync (s), 0);
  atomic_store (&w.stop, true);
  assert_int_equal (pthread_join (t, NULL), 0);
  assert_int_equal (s->ops->sync (s), 0);
  printf ("# %" PRIu64 " data records, %" PRIu64 " not one version whole\n",
          records, torn);
  assert_true (records > 0);
  assert_int_equal (torn, 0);
  s->ops->destroy (s);                      /* no clean stop: a crash */

  s = m_open ();
  struct store_recovery rec;
  assert_int_equal (store_recover (s, check_slot, s, &rec), 0);
  assert_int_equal (rec.folios, SLOTS);
  assert_int_equal (rec.dirty_blocks, NB);
  assert_int_equal (rec.lost_blocks, 0);
  s->ops->destroy (s);
  free (disk);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_commit_races_writer),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
