/* A backing that loses acknowledged but unflushed writes when it "crashes"
 * (a remote NBD server restarting): the cache must write them again, so a
 * FLUSH that succeeds means the data is durable; lost passthrough writes,
 * which cannot be redone, must fail every later FLUSH. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "foliod/cache.h"
#include "foliod/store.h"
#include "lib/ssd-mem.h"

#define SIZE (4u << 20)

/* Two layers: what the backing acknowledged, and what it has made
 * durable.  A crash throws the first away and moves the loss epoch. */
struct vol {
  struct backing b;
  unsigned char durable[SIZE], acked[SIZE];
  uint64_t epoch;
  int crash_on_flush;      /* crash just before the next flush */
  _Atomic int doubt;       /* a write is in doubt: every flush is refused,
                            * sending nothing (the nbd backing's rule) */
  int fail_write;          /* the next write fails, half done */
  int forget_on_fail;      /* the next flush fails and drops what was not
                            * durable, epoch unchanged; later ones succeed
                            * (a remote over Linux: fsyncgate) */
  int forget_on_fua;        /* the next FUA write fails and drops what was
                            * not durable (its fdatasync failed) */
  _Atomic uint64_t writes;    /* writeback helpers write at once */
  /* Called once the next write is acknowledged, before it returns (its
   * answer still on the way to the cache), then cleared. */
  void (*acked_hook) (struct vol *v);
  /* Called at the start of the next flush, or FUA write, then cleared (a
   * write another client sends, or one abandoned, while it is under
   * way). */
  void (*flush_hook) (struct vol *v);
  void (*fua_hook) (struct vol *v);
  /* Two durable ops at once on a remote over one file (race_lock,
   * race_cv): the first FUA write (1: armed) waits in its fdatasync (2)
   * until the next flush or FUA write has answered success (3) -- Linux
   * reports a writeback error once per open file, and the first takes
   * it -- then fails and drops every write not durable, the second's
   * included. */
  int race;
};

static pthread_mutex_t race_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t race_cv = PTHREAD_COND_INITIALIZER;

static void
race_set (struct vol *v, int to)
{
  pthread_mutex_lock (&race_lock);
  v->race = to;
  pthread_cond_broadcast (&race_cv);
  pthread_mutex_unlock (&race_lock);
}

static void
race_wait (struct vol *v, int until)
{
  pthread_mutex_lock (&race_lock);
  while (v->race != until)
    pthread_cond_wait (&race_cv, &race_lock);
  pthread_mutex_unlock (&race_lock);
}

/* Is this durable op the second of a race?  Then it answers success
 * with nothing made durable, and says so (race_set (v, 3)) once its
 * write is done. */
static bool
race_second (struct vol *v)
{
  pthread_mutex_lock (&race_lock);
  bool second = v->race == 2;
  pthread_mutex_unlock (&race_lock);
  return second;
}

static int
v_read (struct backing *b, void *buf, uint64_t len, uint64_t off)
{
  memcpy (buf, ((struct vol *) b)->acked + off, len);
  return 0;
}

static int
v_write (struct backing *b, const void *buf, uint64_t len, uint64_t off,
         unsigned flags)
{
  struct vol *v = (struct vol *) b;

  if (v->fail_write) {
    v->fail_write = 0;
    memcpy (v->acked + off, buf, len / 2);
    errno = EIO;
    return -1;
  }
  if (v->fua_hook && (flags & BACKING_FUA)) {
    void (*hook) (struct vol *) = v->fua_hook;
    v->fua_hook = NULL;
    hook (v);
  }
  if ((flags & BACKING_FUA) && v->race == 1) {
    memcpy (v->acked + off, buf, len);
    race_set (v, 2);
    race_wait (v, 3);
    /* Before the drop: the second op's answer is on its way to the
     * cache; let it arrive first, as it may. */
    nanosleep (&(struct timespec) { .tv_nsec = 50000000 }, NULL);
    memcpy (v->acked, v->durable, SIZE);
    errno = EIO;
    return -1;
  }
  if ((flags & BACKING_FUA) && race_second (v)) {
    memcpy (v->acked + off, buf, len);
    race_set (v, 3);
    return 0;
  }
  if (v->forget_on_fua && (flags & BACKING_FUA)) {
    v->forget_on_fua = 0;
    memcpy (v->acked, v->durable, SIZE);
    errno = EIO;
    return -1;
  }
  memcpy (v->acked + off, buf, len);
  if (flags & BACKING_FUA)
    memcpy (v->durable + off, buf, len);
  v->writes++;
  if (v->acked_hook) {
    void (*hook) (struct vol *) = v->acked_hook;
    v->acked_hook = NULL;
    hook (v);
  }
  return 0;
}

static int
v_zero (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  struct vol *v = (struct vol *) b;

  memset (v->acked + off, 0, len);
  if (flags & BACKING_FUA)
    memset (v->durable + off, 0, len);
  return 0;
}

static int
v_trim (struct backing *b, uint64_t len, uint64_t off, unsigned flags)
{
  memset (((struct vol *) b)->acked + off, 0xee, len); /* reads as anything */
  return 0;
}

static int
v_flush (struct backing *b)
{
  struct vol *v = (struct vol *) b;

  if (v->flush_hook) {
    void (*hook) (struct vol *) = v->flush_hook;
    v->flush_hook = NULL;
    hook (v);
  }
  if (race_second (v)) {
    race_set (v, 3);
    return 0;
  }
  if (v->forget_on_fail) {
    v->forget_on_fail = 0;
    memcpy (v->acked, v->durable, SIZE);
    errno = EIO;
    return -1;
  }
  if (v->doubt) {
    errno = EIO;
    return -1;
  }
  if (v->crash_on_flush) {          /* the remote restarts: the reconnected */
    v->crash_on_flush = 0;          /* flush succeeds on what survived */
    memcpy (v->acked, v->durable, SIZE);
    v->epoch++;
    return 0;
  }
  memcpy (v->durable, v->acked, SIZE);
  return 0;
}

static uint64_t v_epoch (struct backing *b) { return ((struct vol *) b)->epoch; }
static void v_close (struct backing *b) { (void) b; }
/* The operator's clear-doubt: as the nbd backing's, it forgets the
 * doubt (the cache's ledger moves its own epoch). */
static uint64_t
v_clear_doubt (struct backing *b)
{
  struct vol *v = (struct vol *) b;
  uint64_t n = (uint64_t) v->doubt;

  v->doubt = 0;
  return n;
}

static void
v_stats (struct backing *b, struct backing_stats *st)
{
  st->writes_in_doubt = ((struct vol *) b)->doubt;
}

static const struct backing_ops vol_ops = {
  .name = "volatile", .read = v_read, .write = v_write, .zero = v_zero,
  .trim = v_trim, .flush = v_flush, .loss_epoch = v_epoch, .close = v_close,
  .stats = v_stats, .clear_doubt = v_clear_doubt,
};

static struct cache *
open_cache (struct vol *v)
{
  struct cache_config cfg;
  char err[256];

  memset (v, 0, sizeof *v);
  v->b.ops = &vol_ops;
  v->b.size = SIZE;
  v->b.caps = BACKING_CAN_ZERO | BACKING_CAN_TRIM | BACKING_VOLATILE;
  cache_config_default (&cfg);
  cfg.cache_size = 1u << 20;
  cfg.dirty_expire_ms = 3600000;       /* only flushes write back */
  struct cache *c = cache_create (&v->b, NULL, &cfg, err, sizeof err);
  assert_non_null (c);
  return c;
}

static void
test_rewrite_after_loss (void **state)
{
  static struct vol v;
  unsigned char buf[8192];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (buf, 0x42, sizeof buf);
  assert_int_equal (cache_write (c, buf, sizeof buf, 12288, 0), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), 0);
  /* The flush that saw the crash wrote the blocks again. */
  assert_memory_equal (v.durable + 12288, buf, sizeof buf);
  assert_int_equal (v.writes, 2);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, 0);
  assert_int_equal (st.dirty_bytes, 0);
  assert_int_equal (cache_destroy (c), 0);
}

static void
test_unstable_pins_until_flush (void **state)
{
  static struct vol v;
  unsigned char buf[4096];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (buf, 7, sizeof buf);
  assert_int_equal (cache_write (c, buf, sizeof buf, 0, 0), 0);
  assert_int_equal (cache_flush (c), 0);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, 0);
  assert_memory_equal (v.durable, buf, sizeof buf);
  /* FUA writes are durable at once: never unstable. */
  assert_int_equal (cache_write (c, buf, sizeof buf, 65536, CACHE_FUA), 0);
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, 0);
  assert_memory_equal (v.durable + 65536, buf, sizeof buf);
  assert_int_equal (cache_destroy (c), 0);
}

static void
test_lost_passthrough_fails_flush (void **state)
{
  static struct vol v;
  unsigned char buf[4096];
  struct cache *c = open_cache (&v);

  memset (buf, 9, sizeof buf);
  assert_int_equal (cache_write (c, buf, sizeof buf, 0, CACHE_DIRECT), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  /* No later flush may claim it durable; the cache reads what the
   * backing really has. */
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_read (c, buf, sizeof buf, 0, 0), 0);
  assert_memory_equal (buf, v.durable, sizeof buf);
  /* The flushes reported the loss; destroy drops nothing dirty. */
  assert_int_equal (cache_destroy (c), 0);
}

/* The passthrough write d at off may have been lost: three FLUSHes, and
 * none may succeed with the backing not holding it; the last one fails
 * (EIO: a lost passthrough write fails every FLUSH). */
static void
flushes_fail_or_keep (struct cache *c, const struct vol *v,
                      const unsigned char *d, size_t len, uint64_t off)
{
  int r = -1;

  for (int i = 0; i < 3; i++) {
    r = cache_flush (c);
    if (r == 0)
      assert_memory_equal (v->durable + off, d, len);
    else
      assert_int_equal (errno, EIO);
  }
  assert_int_equal (r, -1);
}

/* The cache of test_loss_before_count, for its hook. */
static struct cache *hook_cache;

/* The remote restarts (losing what it had not flushed) and a FLUSH
 * on another connection meets the restart, settles it, and succeeds. */
static void
restart_and_flush (struct vol *v)
{
  v->crash_on_flush = 1;
  assert_int_equal (cache_flush (hook_cache), 0);
}

/* Issue 33 item 2, "a connection's end loses what its remote
 * acknowledged": a passthrough write the remote acknowledged, whose
 * answer is still on its way to the cache when the remote restarts and
 * a flush settles that loss.  It was not counted yet when the loss was
 * settled; counted after, in the view it was sent in, it must still be
 * lost (before: the next FLUSH settled it as durable though the
 * restarted remote never had it). */
static void
test_loss_before_count (void **state)
{
  static struct vol v;
  unsigned char d[4096];
  struct cache *c = open_cache (&v);

  hook_cache = c;
  memset (d, 0x5a, sizeof d);
  v.acked_hook = restart_and_flush;
  assert_int_equal (cache_write (c, d, sizeof d, 8192, CACHE_DIRECT), 0);
  assert_null (v.acked_hook);
  flushes_fail_or_keep (c, &v, d, sizeof d, 8192);
  assert_int_equal (cache_destroy (c), 0);
}

/* A backing that fails one flush, drops its unflushed writes and reports
 * the next flush fine, without moving its loss epoch (the nbd backing
 * over a remote whose fdatasync failed once, issue 33 item 1): no later
 * FLUSH may succeed with the backing holding older data.  Cached blocks
 * are written again; a passthrough write cannot be, so FLUSH fails. */
static void
test_forgotten_failed_flush (void **state)
{
  static struct vol v;
  unsigned char a[8192], b[8192], d[4096];
  int r = -1;
  struct cache *c = open_cache (&v);

  memset (a, 0x11, sizeof a);
  memset (b, 0x22, sizeof b);
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (v.durable, a, sizeof a);
  assert_int_equal (cache_write (c, b, sizeof b, 0, 0), 0);
  v.forget_on_fail = 1;
  assert_int_equal (cache_flush (c), -1);
  assert_memory_equal (v.durable, a, sizeof a);  /* B was dropped */
  for (int i = 0; i < 3 && r != 0; i++)
    r = cache_flush (c);
  assert_int_equal (r, 0);
  assert_memory_equal (v.durable, b, sizeof b);

  /* A passthrough write the failed flush dropped. */
  memset (d, 0x33, sizeof d);
  assert_int_equal (cache_write (c, d, sizeof d, 65536, CACHE_DIRECT), 0);
  v.forget_on_fail = 1;
  assert_int_equal (cache_flush (c), -1);
  flushes_fail_or_keep (c, &v, d, sizeof d, 65536);
  assert_int_equal (cache_destroy (c), 0);
}

/* The passthrough write of test_failed_flush_drops_write_sent_during,
 * sent while the flush is under way. */
static const unsigned char *during_data;

static void
direct_write_during_flush (struct vol *v)
{
  assert_int_equal (cache_write (hook_cache, during_data, 4096, 65536,
                                 CACHE_DIRECT), 0);
}

/* A failed flush drops what was written while it was under way too (a
 * file's fdatasync fails for pages whose writeback failed, whoever wrote
 * them, and Linux reports it once), though nothing was sent before it
 * began: the flush was sent because the epoch had moved (here by the
 * operator's clear-doubt).  Such a write is a passthrough write, which
 * cannot be written again: no later FLUSH may succeed without it.  (The
 * file backing's private rule, any failed fdatasync moves its loss
 * epoch, hid this; the ledger's rule looked only at what was sent before
 * the flush began.) */
static void
test_failed_flush_drops_write_sent_during (void **state)
{
  static struct vol v;
  unsigned char d[4096];
  struct cache *c = open_cache (&v);

  hook_cache = c;
  memset (d, 0x77, sizeof d);
  during_data = d;
  v.doubt = 1;
  assert_int_equal (cache_clear_doubt (c), 1);
  v.flush_hook = direct_write_during_flush;
  v.forget_on_fail = 1;
  assert_int_equal (cache_flush (c), -1);
  assert_null (v.flush_hook);
  assert_false (memcmp (v.acked + 65536, d, sizeof d) == 0);  /* dropped */
  flushes_fail_or_keep (c, &v, d, sizeof d, 65536);
  assert_int_equal (cache_destroy (c), 0);
}

/* A write abandoned (in doubt) while a flush or FUA write is out. */
static void
abandon_during (struct vol *v)
{
  v->doubt = 1;
}

/* The passthrough write the backing dropped is reported lost by the
 * next FLUSH (EIO, and in stats) before the operator is asked anything. */
static void
reported_lost (struct cache *c)
{
  struct cache_stats st;

  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 1);
  assert_int_equal (st.flush_error, EIO);
}

/* A flush, or a FUA write, that was sent and failed, dropping what was
 * not durable, while another write was abandoned: the doubt began after
 * it was sent, so it is no refusal for the doubt but a failure, and a
 * loss: the direct write it dropped is reported lost at once, not left
 * for the operator's clear-doubt to settle as durable.  (The ledger
 * excused every failure while the backing had writes in doubt, as if
 * the backing had refused it unsent: nothing was counted lost, and
 * after the clear the next FLUSH succeeded without the write; the rbd
 * backing's private rule, a failed flush with unflushed writes moves
 * its loss epoch, hid this.) */
static void
test_failed_flush_as_doubt_begins (void **state)
{
  static struct vol v;
  unsigned char d[4096], e[4096];
  struct cache *c = open_cache (&v);

  memset (d, 0x78, sizeof d);
  memset (e, 0x79, sizeof e);
  assert_int_equal (cache_write (c, d, sizeof d, 65536, CACHE_DIRECT), 0);
  v.flush_hook = abandon_during;
  v.forget_on_fail = 1;
  assert_int_equal (cache_flush (c), -1);
  reported_lost (c);
  assert_true (cache_clear_doubt (c) >= 1);
  assert_int_equal (cache_destroy (c), 0);

  /* The same with a FUA write whose sync fails. */
  c = open_cache (&v);
  assert_int_equal (cache_write (c, d, sizeof d, 65536, CACHE_DIRECT), 0);
  v.fua_hook = abandon_during;
  v.forget_on_fua = 1;
  assert_int_equal (cache_write (c, e, sizeof e, 131072,
                                 CACHE_DIRECT | CACHE_FUA), -1);
  reported_lost (c);
  assert_true (cache_clear_doubt (c) >= 1);
  assert_int_equal (cache_destroy (c), 0);
}

/* A FUA write the backing fails may have failed its fdatasync, which
 * drops every write not yet durable (issue 33 item 1, the FUA half; the
 * nbd backing once moved its epoch for it, now the ledger alone decides):
 * a passthrough write made before it is lost, so no later FLUSH may
 * succeed; cached blocks are written again. */
static void
test_failed_fua_is_loss (void **state)
{
  static struct vol v;
  unsigned char a[4096], d[4096], e[4096];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (a, 0x61, sizeof a);
  memset (d, 0x64, sizeof d);
  memset (e, 0x65, sizeof e);
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  assert_int_equal (cache_write (c, d, sizeof d, 65536, CACHE_DIRECT), 0);
  v.forget_on_fua = 1;
  assert_int_equal (cache_write (c, e, sizeof e, 131072,
                                 CACHE_DIRECT | CACHE_FUA), -1);
  flushes_fail_or_keep (c, &v, d, sizeof d, 65536);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 1);
  assert_memory_equal (v.durable, a, sizeof a);   /* written again */
  assert_int_equal (cache_destroy (c), 0);
}

/* The first FUA write of a race (test_fua_race), on a thread of its own:
 * it fails. */
static struct cache *race_cache;

static void *
race_first (void *arg)
{
  static unsigned char x[4096];

  (void) arg;
  memset (x, 0x78, sizeof x);
  intptr_t r = cache_write (race_cache, x, sizeof x, 0, CACHE_FUA);
  return (void *) r;
}

/* A remote over a file (nbdkit, qemu-nbd) serves two durable ops at once
 * on one open file: a FUA write whose fdatasync fails, dropping every
 * page not yet on disk, and another FUA write (or a flush) whose
 * fdatasync runs beside it and answers success, the error having been
 * reported to the first (test-fault-nbd-real.sh found blocks written
 * once, acknowledged, and older on the remote after a clean stop).  The
 * second's success proves nothing while the first may still fail: it
 * counts only once every durable op that overlapped it has answered
 * without failing.  Before: the second FUA write (or FLUSH) succeeded
 * and its block was settled clean, so the first's failure had nothing
 * to write again. */
static void
fua_race (bool second_is_flush)
{
  static struct vol v;
  unsigned char y[4096];
  pthread_t t;
  void *first;
  int r = -1;
  struct cache *c = open_cache (&v);

  v.b.caps |= BACKING_CAN_FUA;
  race_cache = c;
  memset (y, 0x79, sizeof y);
  v.race = 1;
  assert_int_equal (pthread_create (&t, NULL, race_first, NULL), 0);
  race_wait (&v, 2);
  if (second_is_flush) {
    assert_int_equal (cache_write (c, y, sizeof y, 2u << 20, 0), 0);
    r = cache_flush (c);
  }
  else
    r = cache_write (c, y, sizeof y, 2u << 20, CACHE_FUA);
  if (r == 0)
    assert_memory_equal (v.durable + (2u << 20), y, sizeof y);
  else
    assert_int_equal (errno, EIO);
  assert_int_equal (pthread_join (t, &first), 0);
  assert_int_equal ((intptr_t) first, -1);
  for (int i = 0; i < 3 && r != 0; i++)
    r = cache_flush (c);
  assert_int_equal (r, 0);
  assert_memory_equal (v.durable + (2u << 20), y, sizeof y);
  assert_int_equal (v.durable[0], 0x78);
  assert_int_equal (cache_destroy (c), 0);
}

static void
test_fua_race_fua (void **state)
{
  fua_race (false);
}

static void
test_fua_race_flush (void **state)
{
  fua_race (true);
}

/* Issue 33 item 4b: a passthrough write made while a write was in doubt
 * (every FLUSH refused), then the operator's clear-doubt.  Nothing was
 * lost: the next FLUSH writes the cached blocks again and succeeds, with
 * the passthrough write durable.  A loss after a clear still fails every
 * FLUSH, and foliod stats counts it. */
static void
test_clear_doubt_keeps_passthrough (void **state)
{
  static struct vol v;
  unsigned char a[4096], d[4096];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (a, 0x44, sizeof a);
  memset (d, 0x55, sizeof d);
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  v.doubt = 1;
  assert_int_equal (cache_write (c, d, sizeof d, 65536, CACHE_DIRECT), 0);
  assert_int_equal (cache_flush (c), -1);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_unflushed, 1);
  assert_int_equal (cache_clear_doubt (c), 1);
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (v.durable, a, sizeof a);
  assert_memory_equal (v.durable + 65536, d, sizeof d);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_unflushed, 0);
  assert_int_equal (st.passthrough_lost, 0);
  assert_int_equal (st.flush_error, 0);

  /* The same, and the remote restarts after the clear: lost. */
  v.doubt = 1;
  assert_int_equal (cache_write (c, d, sizeof d, 131072, CACHE_DIRECT), 0);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (cache_clear_doubt (c), 1);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_flush (c), -1);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 1);
  assert_int_equal (st.flush_error, EIO);
  assert_int_equal (cache_destroy (c), 0);
}

/* clear-doubt --lost-only: the operator accepts a lost passthrough write
 * and says nothing of a write in doubt (one abandoned after he looked at
 * the stats, say).  The doubt stays: FLUSH still fails, and stats count
 * it; once the backing ends it, FLUSH succeeds with the cached data
 * durable. */
static void
test_clear_lost_keeps_doubt (void **state)
{
  static struct vol v;
  unsigned char a[4096], d[4096];
  struct cache_stats st;
  struct cache *c = open_cache (&v);

  memset (a, 0x46, sizeof a);
  memset (d, 0x57, sizeof d);
  assert_int_equal (cache_write (c, d, sizeof d, 131072, CACHE_DIRECT), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), -1);     /* the zero is lost */
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  v.doubt = 1;                                /* and a write in doubt */
  assert_int_equal (cache_clear_lost (c), 1);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 0);
  assert_int_equal (st.writes_in_doubt, 1);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (v.doubt, 1);              /* not cleared behind it */
  v.doubt = 0;                                /* the backing ends it */
  v.epoch++;
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (v.durable, a, sizeof a);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 0);
  assert_int_equal (st.flush_error, 0);
  assert_int_equal (cache_destroy (c), 0);
}

/* After the operator's clear-doubt, a read that needs room waits for
 * writeback to make it, as it would have before the doubt: the flush
 * refused while the doubt held is no reason to fail at once any more.
 * (It failed with EIO: a restarted foliod whose store held the cache
 * full of dirty data and a doubt failed the first read after the clear;
 * test-fault-rbd-real.) */
static void
test_clear_doubt_reads_again (void **state)
{
  static struct vol v;
  static unsigned char a[4096], r[1u << 20];
  struct cache *c = open_cache (&v);

  memset (a, 0x61, sizeof a);
  for (int i = 0; i < 64; i++)      /* a block of each 16K folio dirty */
    assert_int_equal (cache_write (c, a, sizeof a, i * 65536, 0), 0);
  v.doubt = 1;
  assert_int_equal (cache_flush (c), -1);     /* written, not flushed */
  assert_int_equal (cache_clear_doubt (c), 1);
  assert_int_equal (cache_read (c, r, sizeof r, 0, 0), 0);
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (v.durable + 65536, a, sizeof a);
  assert_int_equal (cache_destroy (c), 0);
}

/* Dirty plus unstable bytes: what the cache still answers for. */
static uint64_t
pinned (struct cache *c)
{
  struct cache_stats st;

  cache_get_stats (c, &st);
  return st.dirty_bytes + st.unstable_bytes;
}

/* Fill buf with 0x42, write it and write it back, but leave it unflushed
 * (the flush is refused while a write is in doubt, and the doubt ends
 * with nothing lost): unstable. */
static void
write_unstable (struct cache *c, struct vol *v, unsigned char *buf,
                uint64_t len, uint64_t off)
{
  struct cache_stats st;

  memset (buf, 0x42, len);
  assert_int_equal (cache_write (c, buf, len, off, 0), 0);
  v->doubt = 1;
  assert_int_equal (cache_flush (c), -1);
  v->doubt = 0;
  cache_get_stats (c, &st);
  assert_int_equal (st.unstable_bytes, len);
  assert_int_equal (st.dirty_bytes, 0);
}

/* A trim over unstable blocks ends the cache's duty to them: a loss after
 * it writes nothing again (the blocks may read as anything), and nothing
 * stays pinned.  (The cache used to keep them unstable, and the loss made
 * them dirty without their data: dirty but not uptodate.) */
static void
test_trim_drops_unstable (void **state)
{
  static struct vol v;
  struct cache *c = open_cache (&v);
  unsigned char buf[8192];

  write_unstable (c, &v, buf, sizeof buf, 65536);
  assert_int_equal (cache_trim (c, sizeof buf, 65536, 0), 0);
  assert_int_equal (pinned (c), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (v.writes, 1);
  assert_int_equal (pinned (c), 0);
  assert_int_equal (cache_read (c, buf, sizeof buf, 65536, 0), 0);
  assert_memory_equal (buf, v.acked + 65536, sizeof buf);
  assert_int_equal (cache_destroy (c), 0);
}

/* A failed direct write over unstable blocks may have half overwritten
 * them in the backing: the cache still answers for what it acknowledged,
 * so it writes them again, and keeps its copy. */
static void
test_failed_direct_write_over_unstable (void **state)
{
  static struct vol v;
  struct cache *c = open_cache (&v);
  unsigned char buf[8192], other[8192];

  write_unstable (c, &v, buf, sizeof buf, 65536);
  memset (other, 0x17, sizeof other);
  v.fail_write = 1;
  assert_int_equal (cache_write (c, other, sizeof other, 65536,
                                 CACHE_DIRECT), -1);
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (v.durable + 65536, buf, sizeof buf);
  assert_int_equal (cache_read (c, other, sizeof other, 65536, 0), 0);
  assert_memory_equal (other, buf, sizeof buf);
  assert_int_equal (pinned (c), 0);
  assert_int_equal (cache_destroy (c), 0);
}


/* An ssd store's device in memory (lib/ssd-mem.h), copied for a
 * "crash". */
#define DEV_SIZE (16u << 20)
static unsigned char dev_mem[DEV_SIZE], dev_copy[DEV_SIZE];
static char err[256];

static const struct store_config ssd_cfg = {
  .path = "(memory)", .nslots = 16, .folio_size = 65536, .block_size = 4096,
  .export_size = SIZE, .backing_spec = "volatile", .backing_size = SIZE,
};

static unsigned char rec_block[4096];
static bool rec_found;

static int
rec_one (void *arg, uint32_t slot, uint64_t fi, uint64_t *bits)
{
  struct store *s = arg;

  if (fi == 0 && (bits[0] & (1ull << (FP_DIRTY * 16)))) {  /* block 0 dirty */
    rec_found = true;
    memcpy (rec_block, s->ops->data (s, slot), sizeof rec_block);
  }
  return 0;
}

/* A cache over v (with ops) and s, an ssd store in memory: only FLUSH
 * and FUA write back. */
static struct cache *
open_ssd_cache (struct vol *v, const struct backing_ops *ops,
                struct store *s)
{
  struct cache_config cfg;

  v->b.ops = ops;
  v->b.size = SIZE;
  v->b.caps = BACKING_CAN_ZERO | BACKING_CAN_TRIM | BACKING_VOLATILE;
  cache_config_default (&cfg);
  cfg.cache_size = (uint64_t) ssd_cfg.nslots * ssd_cfg.folio_size;
  cfg.folio_size = ssd_cfg.folio_size;
  cfg.block_size = ssd_cfg.block_size;
  cfg.dirty_expire_ms = 3600000;
  cfg.writeback_interval_ms = 3600000;
  struct cache *c = cache_create (&v->b, s, &cfg, err, sizeof err);
  assert_non_null (c);
  cache_stop_writeback (c);
  return c;
}

/* A direct (passthrough) write, not FUA, over a block that a persistent
 * store holds dirty and durable: the backing may still lose the write
 * (crash before its flush), so the store must keep its record of the
 * block until the backing has flushed.  The cache used to mark the block
 * clean at once: the next store sync (here a FUA write elsewhere; the
 * background writeback thread syncs too) logged it clean, and after a
 * crash that lost the backing's write the block read neither version. */
static void
test_direct_over_dirty_persistent (void **state)
{
  static struct vol v;
  unsigned char a[4096], b[4096];

  memset (&v, 0, sizeof v);
  memset (dev_mem, 0, sizeof dev_mem);
  struct store *s = store_ssd_open_dev (&ssd_cfg,
                                        ssd_mem_dev (dev_mem, DEV_SIZE),
                                        err, sizeof err);
  assert_non_null (s);
  struct cache *c = open_ssd_cache (&v, &vol_ops, s);

  memset (a, 'A', sizeof a);
  memset (b, 'B', sizeof b);
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  assert_int_equal (cache_flush (c), 0);             /* A: in the store */
  assert_int_equal (cache_write (c, b, sizeof b, 0, CACHE_DIRECT), 0);
  assert_int_equal (cache_write (c, a, sizeof a, 1 << 20, CACHE_FUA), 0);
  /* The crash: foliod dies, the backing loses what it did not flush. */
  memcpy (dev_copy, dev_mem, sizeof dev_copy);
  memcpy (v.acked, v.durable, SIZE);
  struct store *s2 = store_ssd_open_dev (&ssd_cfg,
                                         ssd_mem_dev (dev_copy, DEV_SIZE),
                                         err, sizeof err);
  assert_non_null (s2);
  struct store_recovery out = { 0 };
  rec_found = false;
  assert_int_equal (s2->ops->recover (s2, rec_one, s2, &out), 0);
  if (rec_found)
    assert_true (memcmp (rec_block, a, sizeof a) == 0 ||
                 memcmp (rec_block, b, sizeof b) == 0);
  else
    assert_memory_equal (v.durable, b, sizeof b);   /* "neither A nor B" */
  s2->ops->destroy (s2);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);            /* a store passed in is the caller's */
}

/* One writer per image (issue 33 item 5): a backing that reports its
 * image lost (an rbd lock broken while foliod stalled) fences the export:
 * reads, writes and FLUSH fail, nothing more reaches the backing, and the
 * persistent store records it, so that a restart (a new process, whose
 * backing owns the image again) writes nothing back until the operator's
 * clear-doubt, which then writes the store's data. */
static const char *owner_lost_why;

static const char *
v_owner_lost (struct backing *b)
{
  return owner_lost_why;
}

static const struct backing_ops vol_owned_ops = {
  .name = "volatile-owned", .read = v_read, .write = v_write,
  .zero = v_zero, .trim = v_trim, .flush = v_flush, .loss_epoch = v_epoch,
  .close = v_close, .stats = v_stats, .clear_doubt = v_clear_doubt,
  .owner_lost = v_owner_lost,
};

static void
test_lost_owner_fences_store (void **state)
{
  static struct vol v;
  unsigned char a[4096], buf[4096];
  struct cache_stats st;
  struct store_info info;

  memset (&v, 0, sizeof v);
  memset (dev_mem, 0, sizeof dev_mem);
  owner_lost_why = NULL;
  struct store *s = store_ssd_open_dev (&ssd_cfg,
                                        ssd_mem_dev (dev_mem, DEV_SIZE),
                                        err, sizeof err);
  assert_non_null (s);
  struct cache *c = open_ssd_cache (&v, &vol_owned_ops, s);
  memset (a, 'A', sizeof a);
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  assert_int_equal (cache_flush (c), 0);       /* flush=store: in the store */
  assert_int_equal (v.writes, 0);

  owner_lost_why = "lock broken";
  errno = 0;
  assert_int_equal (cache_write (c, a, sizeof a, 8192, 0), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (cache_read (c, buf, sizeof buf, 0, 0), -1);
  assert_int_equal (cache_write (c, a, sizeof a, 8192, CACHE_FUA), -1);
  cache_get_stats (c, &st);
  assert_true (st.fenced);
  assert_string_equal (st.fence_reason, "lock broken");
  assert_int_equal (v.writes, 0);              /* nothing reached the image */

  /* foliod dies; a new one starts on the store, owning the image again. */
  memcpy (dev_copy, dev_mem, sizeof dev_copy);
  assert_int_equal (cache_destroy (c), 0);      /* the store keeps it */
  store_destroy (s);
  owner_lost_why = NULL;
  struct store *s2 = store_ssd_open_dev (&ssd_cfg,
                                         ssd_mem_dev (dev_copy, DEV_SIZE),
                                         err, sizeof err);
  assert_non_null (s2);
  store_get_info (s2, &info);
  assert_true (info.fenced);
  struct cache *c2 = open_ssd_cache (&v, &vol_owned_ops, s2);
  cache_get_stats (c2, &st);
  assert_true (st.fenced);
  assert_int_equal (cache_flush (c2), -1);
  assert_int_equal (cache_write_back (c2), -1);
  assert_int_equal (v.writes, 0);              /* still nothing written */
  /* The operator's word: the store's data goes over the image. */
  assert_int_equal (cache_clear_doubt (c2), 1);
  cache_get_stats (c2, &st);
  assert_false (st.fenced);
  assert_int_equal (cache_write_back (c2), 0);
  assert_memory_equal (v.durable, a, sizeof a);
  assert_int_equal (cache_destroy (c2), 0);
  store_destroy (s2);
}

/* A passthrough loss outlives the process (issue 33, the ledger's "which
 * passthrough writes cannot be restored", persisted): the persistent
 * store records it, a restart's FLUSH fails and its stats count it, a
 * stop and start do not end it; only the operator's clear-doubt does,
 * and a restart after that finds it gone.  (Before: the restart's FLUSH
 * succeeded with the backing holding older data.) */
static struct store *
reopen_ssd (unsigned char *mem)
{
  struct store *s = store_ssd_open_dev (&ssd_cfg,
                                        ssd_mem_dev (mem, DEV_SIZE),
                                        err, sizeof err);
  assert_non_null (s);
  return s;
}

static void
test_lost_passthrough_persisted (void **state)
{
  static struct vol v;
  unsigned char d[4096];
  struct cache_stats st;
  struct store_info info;

  memset (&v, 0, sizeof v);
  memset (dev_mem, 0, sizeof dev_mem);
  struct store *s = reopen_ssd (dev_mem);
  struct cache *c = open_ssd_cache (&v, &vol_ops, s);
  memset (d, 'D', sizeof d);
  assert_int_equal (cache_write (c, d, sizeof d, 0, CACHE_DIRECT), 0);
  v.crash_on_flush = 1;
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);

  /* foliod dies: a restart on the store. */
  memcpy (dev_copy, dev_mem, sizeof dev_copy);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  s = reopen_ssd (dev_copy);
  store_get_info (s, &info);
  assert_true (info.pt_lost);
  c = open_ssd_cache (&v, &vol_ops, s);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 1);
  assert_int_equal (st.flush_error, EIO);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  /* A stop cannot end it: its write back fails, the store keeps it. */
  assert_int_equal (cache_write_back (c), -1);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  s = reopen_ssd (dev_copy);
  c = open_ssd_cache (&v, &vol_ops, s);
  assert_int_equal (cache_flush (c), -1);

  /* The operator's word: the loss is known. */
  assert_int_equal (cache_clear_doubt (c), 1);
  assert_int_equal (cache_flush (c), 0);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 0);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  s = reopen_ssd (dev_copy);
  store_get_info (s, &info);
  assert_false (info.pt_lost);
  c = open_ssd_cache (&v, &vol_ops, s);
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_rewrite_after_loss),
    cmocka_unit_test (test_unstable_pins_until_flush),
    cmocka_unit_test (test_lost_passthrough_fails_flush),
    cmocka_unit_test (test_forgotten_failed_flush),
    cmocka_unit_test (test_loss_before_count),
    cmocka_unit_test (test_clear_doubt_keeps_passthrough),
    cmocka_unit_test (test_clear_lost_keeps_doubt),
    cmocka_unit_test (test_clear_doubt_reads_again),
    cmocka_unit_test (test_failed_fua_is_loss),
    cmocka_unit_test (test_fua_race_fua),
    cmocka_unit_test (test_fua_race_flush),
    cmocka_unit_test (test_failed_flush_drops_write_sent_during),
    cmocka_unit_test (test_failed_flush_as_doubt_begins),
    cmocka_unit_test (test_trim_drops_unstable),
    cmocka_unit_test (test_failed_direct_write_over_unstable),
    cmocka_unit_test (test_direct_over_dirty_persistent),
    cmocka_unit_test (test_lost_owner_fences_store),
    cmocka_unit_test (test_lost_passthrough_persisted),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
