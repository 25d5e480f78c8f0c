/* The ssd store at shutdown (export_close) after its log failed: a
 * FLUSH committed version A of a block, a later FLUSH's log fdatasync
 * failed (the store fails from then on: its log holds A, not B), and
 * SIGTERM's close writes B back (issue 33 item 14).
 *  - The backing takes B and its flush succeeds: nothing is lost, and
 *    the next start must not bring A back over B (it did: the store was
 *    left not clean, "kept in store for the next start", and recovery
 *    wrote the log's A over the backing).  The close succeeds and the
 *    store is marked clean.
 *  - The backing fails too: B is lost, and the close says so (its bytes
 *    in *lost: "DIRTY DATA LOST"), not "kept in store": the store holds
 *    A, which the next start brings back (the last FLUSHed version).
 * The disk drops the log's write of B with the failed fdatasync. */
#include <errno.h>
#include <setjmp.h>   /* cmocka */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "foliod/cache.h"
#include "foliod/export.h"
#include "foliod/store.h"
#include "lib/ssd-disk.h"

#define SIZE (4u << 20)
#define FOLIO 65536
#define SLOTS 16
#define DISK (SSD_LOG_OFF + (8u << 20))

/* A backing in memory that outlives the export (its close frees
 * nothing); writes fail while failing is set. */
struct membk {
  struct backing b;
  unsigned char data[SIZE];
  bool failing;
};

static int
mb_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  memcpy (buf, ((struct membk *) b)->data + off, len);
  return 0;
}

static int
mb_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
          unsigned flags)
{
  struct membk *m = (struct membk *) b;

  (void) flags;
  if (m->failing) {
    errno = EIO;
    return -1;
  }
  memcpy (m->data + off, buf, len);
  return 0;
}

static int
mb_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  (void) flags;
  memset (((struct membk *) b)->data + off, 0, len);
  return 0;
}

static int mb_flush (struct backing *b) { (void) b; return 0; }
static void mb_close (struct backing *b) { (void) b; }

static const struct backing_ops mb_ops = {
  .name = "memory", .read = mb_read, .write = mb_write, .zero = mb_zero,
  .flush = mb_flush, .close = mb_close,
};

static struct membk bk;
static struct ssd_disk dk;
static char err[1024];

static const struct store_config scfg = {
  .path = "(memory)", .nslots = SLOTS, .folio_size = FOLIO,
  .block_size = 4096, .export_size = SIZE, .backing_spec = "memory",
  .backing_size = SIZE,
};

/* An export of bk with the ssd store on dk (recovered), as export_open
 * makes one: only what export_close uses. */
static struct export *
open_export (void)
{
  struct cache_config cfg;
  struct export *e = calloc (1, sizeof *e);

  assert_non_null (e);
  e->name = strdup ("t");
  e->backing = &bk.b;
  e->size = SIZE;
  e->store = ssd_disk_open (&dk, &scfg, err, sizeof err);
  if (e->store == NULL)
    fail_msg ("store: %s", err);
  cache_config_default (&cfg);
  cfg.cache_size = (uint64_t) SLOTS * FOLIO;
  cfg.folio_size = FOLIO;
  cfg.dirty_expire_ms = 3600000;        /* only FLUSH and close write */
  cfg.writeback_interval_ms = 3600000;
  e->cache = cache_create (e->backing, e->store, &cfg, err, sizeof err);
  if (e->cache == NULL)
    fail_msg ("cache: %s", err);
  return e;
}

/* A FLUSHed, then B written and its FLUSH failed in the log's fdatasync. */
static struct export *
run_until_log_fails (unsigned char *a, unsigned char *b)
{
  memset (&bk, 0, sizeof bk);
  bk.b.ops = &mb_ops;
  bk.b.size = SIZE;
  bk.b.caps = BACKING_CAN_ZERO;
  memset (&dk, 0, sizeof dk);
  dk.size = DISK;
  dk.bytes = calloc (1, DISK);
  dk.durable = calloc (1, DISK);        /* the failed fdatasync drops B */
  assert_non_null (dk.bytes);
  assert_non_null (dk.durable);
  memset (a, 'A', 4096);
  memset (b, 'B', 4096);
  struct export *e = open_export ();
  assert_int_equal (cache_write (e->cache, a, 4096, 0, 0), 0);
  assert_int_equal (cache_flush (e->cache), 0);
  assert_int_equal (cache_write (e->cache, b, 4096, 0, 0), 0);
  dk.flush_fails = 1;
  assert_int_equal (cache_flush (e->cache), -1);
  return e;
}

/* What block 0 reads after the next start (its recovery written back). */
static void
next_start_reads (unsigned char *got)
{
  struct export *e = open_export ();
  uint64_t lost;

  assert_int_equal (cache_read (e->cache, got, 4096, 0, 0), 0);
  assert_int_equal (export_close (e, 5000, &lost), 0);
  free (dk.bytes);
  free (dk.durable);
}

static void
test_written_back_not_replayed (void **state)
{
  unsigned char a[4096], b[4096], got[4096];
  uint64_t lost = 1;

  (void) state;
  struct export *e = run_until_log_fails (a, b);
  int r = export_close (e, 300, &lost);
  assert_memory_equal (bk.data, b, 4096);       /* written back */
  next_start_reads (got);
  if (memcmp (got, a, 4096) == 0)
    fail_msg ("the log's older version came back over the written-back one");
  assert_memory_equal (got, b, 4096);
  assert_memory_equal (bk.data, b, 4096);
  assert_int_equal (r, 0);      /* nothing lost */
  assert_int_equal (lost, 0);
}

static void
test_not_written_back_is_lost (void **state)
{
  unsigned char a[4096], b[4096], got[4096];
  uint64_t lost = 0;

  (void) state;
  struct export *e = run_until_log_fails (a, b);
  bk.failing = true;
  assert_int_equal (export_close (e, 300, &lost), -1);
  if (lost == 0)
    fail_msg ("B said kept in the store, which holds only A");
  assert_int_equal (lost, 4096);
  bk.failing = false;
  next_start_reads (got);
  assert_memory_equal (got, a, 4096);   /* the last FLUSHed version */
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_written_back_not_replayed),
    cmocka_unit_test (test_not_written_back_is_lost),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
