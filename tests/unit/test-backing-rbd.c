/* The rbd backing's writes in doubt (issue 33 items 2, 3 and 7), over a
 * fake librbd defined here (this binary's definitions of the rados_* and
 * rbd_* calls are the ones src/backing/rbd.c links against, so no
 * cluster is needed): an image in memory, completions called back on a
 * thread of the fake's, and writes the test holds (an OSD that does not
 * answer) and later lets land or fail.
 *
 * The cache runs on top, as the daemon runs it; the test writes back
 * without a flush (wb_pass) where a background writeback would. */
#include <errno.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include <rados/librados.h>
#include <rbd/librbd.h>

#include "foliod/backing.h"
#include "foliod/cache.h"
#include "foliod/lock.h"
#include "foliod/store.h"
#include "cache/cache-int.h"     /* wb_pass: a writeback without a flush */
#include "lib/ssd-mem.h"

#define SIZE (4u << 20)
#define TIMEOUT_MS 200           /* the backing's request-timeout */

/* --- the fake librbd --- */

enum fk { FK_READ, FK_WRITE, FK_ZERO, FK_TRIM, FK_FLUSH };

struct fcomp {
  rbd_callback_t cb;
  void *arg;
  ssize_t ret;
  enum fk kind;
  uint64_t off, len;
  char *data;                    /* a held write's copy */
  struct fcomp *next;
};

static struct {
  pthread_mutex_t lock;
  pthread_cond_t cv;
  unsigned char img[SIZE];
  int hold_writes;               /* hold this many write-class requests */
  int fail_flushes;              /* fail this many flushes (EIO) */
  uint64_t writes;               /* write requests submitted */
  struct fcomp *held;            /* held, newest first */
  struct fcomp *ready;           /* to call back, newest first */
  bool calling;                  /* a callback runs */
  bool stop;
  pthread_t thread;
} F = { .lock = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *
fake_thread (void *arg)
{
  (void) arg;
  lock_or_die (&F.lock);
  for (;;) {
    while (!F.ready && !F.stop)
      pthread_cond_wait (&F.cv, &F.lock);
    if (!F.ready)
      break;
    /* Oldest first, as librbd calls back. */
    struct fcomp **pp = &F.ready;
    while ((*pp)->next)
      pp = &(*pp)->next;
    struct fcomp *fc = *pp;
    *pp = NULL;
    F.calling = true;
    unlock_or_die (&F.lock);
    fc->cb (fc, fc->arg);
    lock_or_die (&F.lock);
    F.calling = false;
    pthread_cond_broadcast (&F.cv);
  }
  unlock_or_die (&F.lock);
  return NULL;
}

/* Apply a write-class request to the image (F.lock held). */
static void
fake_apply (struct fcomp *fc, const char *buf)
{
  if (fc->kind == FK_WRITE)
    memcpy (F.img + fc->off, buf, fc->len);
  else if (fc->kind == FK_ZERO || fc->kind == FK_TRIM)
    memset (F.img + fc->off, 0, fc->len);
}

static int
fake_submit (rbd_completion_t c, enum fk kind, uint64_t off, uint64_t len,
             const char *wbuf, char *rbuf)
{
  struct fcomp *fc = c;

  fc->kind = kind;
  fc->off = off;
  fc->len = len;
  fc->ret = 0;
  lock_or_die (&F.lock);
  if (kind == FK_WRITE)
    F.writes++;
  if (kind != FK_READ && kind != FK_FLUSH && F.hold_writes > 0) {
    F.hold_writes--;
    if (wbuf) {
      fc->data = malloc (len);
      assert_non_null (fc->data);
      memcpy (fc->data, wbuf, len);
    }
    fc->next = F.held;
    F.held = fc;
    unlock_or_die (&F.lock);
    return 0;
  }
  if (kind == FK_READ) {
    memcpy (rbuf, F.img + off, len);
    fc->ret = (ssize_t) len;
  } else if (kind == FK_FLUSH && F.fail_flushes > 0) {
    F.fail_flushes--;
    fc->ret = -EIO;
  } else
    fake_apply (fc, wbuf);
  fc->next = F.ready;
  F.ready = fc;
  pthread_cond_broadcast (&F.cv);
  unlock_or_die (&F.lock);
  return 0;
}

/* The held requests end: each lands (its data over the image) or fails
 * with ret, and is called back.  Returns once every callback ran. */
static void
fake_release_held (bool land, ssize_t ret)
{
  lock_or_die (&F.lock);
  while (F.held) {
    struct fcomp *fc = F.held;
    F.held = fc->next;
    if (land)
      fake_apply (fc, fc->data);
    free (fc->data);
    fc->data = NULL;
    fc->ret = land ? 0 : ret;
    fc->next = F.ready;
    F.ready = fc;
  }
  pthread_cond_broadcast (&F.cv);
  while (F.ready || F.calling)
    pthread_cond_wait (&F.cv, &F.lock);
  unlock_or_die (&F.lock);
}

static void
fake_start (void)
{
  memset (F.img, 0, sizeof F.img);
  F.hold_writes = 0;
  F.fail_flushes = 0;
  F.writes = 0;
  F.held = F.ready = NULL;
  F.stop = false;
  assert_int_equal (pthread_create (&F.thread, NULL, fake_thread, NULL), 0);
}

static void
fake_stop (void)
{
  lock_or_die (&F.lock);
  F.stop = true;
  pthread_cond_broadcast (&F.cv);
  unlock_or_die (&F.lock);
  pthread_join (F.thread, NULL);
}

int rados_create (rados_t *cluster, const char *const id)
{ *cluster = &F; return 0; }
int rados_conf_read_file (rados_t cluster, const char *path) { return 0; }
int rados_conf_set (rados_t cluster, const char *option, const char *value)
{ return 0; }
int rados_connect (rados_t cluster) { return 0; }
void rados_shutdown (rados_t cluster) { }
int rados_ioctx_create (rados_t cluster, const char *pool_name,
                        rados_ioctx_t *ioctx) { *ioctx = &F; return 0; }
void rados_ioctx_destroy (rados_ioctx_t io) { }
int rbd_open (rados_ioctx_t io, const char *name, rbd_image_t *image,
              const char *snap_name) { *image = &F; return 0; }
int rbd_open_read_only (rados_ioctx_t io, const char *name,
                        rbd_image_t *image, const char *snap_name)
{ *image = &F; return 0; }
int rbd_close (rbd_image_t image) { return 0; }
int rbd_lock_get_owners (rbd_image_t image, rbd_lock_mode_t *lock_mode,
                         char **lock_owners, size_t *max_lock_owners)
{ *max_lock_owners = 0; return 0; }
void rbd_lock_get_owners_cleanup (char **lock_owners, size_t n) { }
int rbd_lock_acquire (rbd_image_t image, rbd_lock_mode_t lock_mode)
{ return 0; }
int rbd_lock_release (rbd_image_t image) { return 0; }
int rbd_watchers_list (rbd_image_t image, rbd_image_watcher_t *watchers,
                       size_t *max_watchers) { *max_watchers = 0; return 0; }
void rbd_watchers_list_cleanup (rbd_image_watcher_t *watchers, size_t n) { }
int rbd_get_size (rbd_image_t image, uint64_t *size)
{ *size = SIZE; return 0; }
int rbd_get_features (rbd_image_t image, uint64_t *features)
{ *features = RBD_FEATURE_EXCLUSIVE_LOCK; return 0; } /* no fast-diff:
                                                          no map */
/* The fence (rbd-fence.c): the lock stays ours, the header never changes. */
int rbd_is_exclusive_lock_owner (rbd_image_t image, int *is_owner)
{ *is_owner = 1; return 0; }
int rbd_update_watch (rbd_image_t image, uint64_t *handle,
                      rbd_update_callback_t watch_cb, void *arg)
{ *handle = 1; return 0; }
int rbd_update_unwatch (rbd_image_t image, uint64_t handle) { return 0; }
int rbd_get_flags (rbd_image_t image, uint64_t *flags)
{ *flags = 0; return 0; }
int rbd_stat (rbd_image_t image, rbd_image_info_t *info, size_t infosize)
{ return -ENOSYS; }
int rbd_diff_iterate2 (rbd_image_t image, const char *fromsnapname,
                       uint64_t ofs, uint64_t len, uint8_t include_parent,
                       uint8_t whole_object,
                       int (*cb) (uint64_t, size_t, int, void *), void *arg)
{ return -ENOSYS; }

int
rbd_aio_create_completion (void *cb_arg, rbd_callback_t complete_cb,
                           rbd_completion_t *c)
{
  struct fcomp *fc = calloc (1, sizeof *fc);

  if (!fc)
    return -ENOMEM;
  fc->cb = complete_cb;
  fc->arg = cb_arg;
  *c = fc;
  return 0;
}

ssize_t rbd_aio_get_return_value (rbd_completion_t c)
{ return ((struct fcomp *) c)->ret; }
void rbd_aio_release (rbd_completion_t c) { free (c); }
int rbd_aio_read (rbd_image_t image, uint64_t off, size_t len, char *buf,
                  rbd_completion_t c)
{ return fake_submit (c, FK_READ, off, len, NULL, buf); }
int rbd_aio_write (rbd_image_t image, uint64_t off, size_t len,
                   const char *buf, rbd_completion_t c)
{ return fake_submit (c, FK_WRITE, off, len, buf, NULL); }
int rbd_aio_write_zeroes (rbd_image_t image, uint64_t off, size_t len,
                          rbd_completion_t c, int zero_flags, int op_flags)
{ return fake_submit (c, FK_ZERO, off, len, NULL, NULL); }
int rbd_aio_discard (rbd_image_t image, uint64_t off, uint64_t len,
                     rbd_completion_t c)
{ return fake_submit (c, FK_TRIM, off, len, NULL, NULL); }
int rbd_aio_flush (rbd_image_t image, rbd_completion_t c)
{ return fake_submit (c, FK_FLUSH, 0, 0, NULL, NULL); }

/* --- the tests --- */

static char err[256];

static struct backing *
open_rbd (void)
{
  struct backing_opts o = { .request_timeout_ms = TIMEOUT_MS };

  struct backing *b = backing_rbd_open ("rbd/img", &o, err, sizeof err);
  if (b == NULL)
    fail_msg ("backing_rbd_open: %s", err);
  return b;
}

/* Each test on a fake of its own; one that failed leaves no held request
 * to the next (its cache and backing are left, with their threads). */
static int
setup (void **state)
{
  fake_start ();
  return 0;
}

static int
teardown (void **state)
{
  fake_release_held (false, -EIO);
  fake_stop ();
  return 0;
}

static struct cache *
open_cache (struct backing *b, struct store *s)
{
  struct cache_config cfg;

  cache_config_default (&cfg);
  cfg.cache_size = 1u << 20;
  cfg.dirty_expire_ms = 3600000;         /* only the test writes back */
  cfg.writeback_interval_ms = 3600000;
  if (s) {
    cfg.cache_size = (uint64_t) s->nslots << 16;
    cfg.folio_size = 65536;
    cfg.block_size = 4096;
  }
  struct cache *c = cache_create (b, s, &cfg, err, sizeof err);
  assert_non_null (c);
  cache_stop_writeback (c);
  return c;
}

static uint64_t
in_doubt (struct cache *c)
{
  struct cache_stats st;

  cache_get_stats (c, &st);
  return st.writes_in_doubt;
}

/* Write back what is dirty, no flush, until none is (the backing is down
 * after an abandoned request: it lets one probe through every 2 s). */
static void
write_back_no_flush (struct cache *c)
{
  struct cache_stats st;

  for (int i = 0; i < 100; i++) {
    int e = 0;
    lock_or_die (&c->wb_mutex);
    wb_pass (c, true, 0, &e);
    unlock_or_die (&c->wb_mutex);
    cache_get_stats (c, &st);
    if (st.dirty_bytes == 0)
      return;
    usleep (100 * 1000);
  }
  fail_msg ("the dirty block was never written back");
}

/* Block 0: a, written back and flushed; then b1, whose write back the
 * cluster does not answer: abandoned at request-timeout, the write back
 * (FLUSH) fails. */
static void
abandon_write (struct cache *c, const unsigned char *a,
               const unsigned char *b1)
{
  assert_int_equal (cache_write (c, a, 4096, 0, 0), 0);
  assert_int_equal (cache_write_back (c), 0);
  F.hold_writes = 1;
  assert_int_equal (cache_write (c, b1, 4096, 0, 0), 0);
  assert_int_equal (cache_write_back (c), -1);
}

/* A write abandoned at request-timeout is a write in doubt, in the
 * stats as the nbd backing's (issue 33 item 7): FLUSH fails while it
 * is, even once the cluster answers again; the operator's clear-doubt
 * counts it and FLUSH succeeds again. */
static void
test_abandoned_write_in_doubt (void **state)
{
  unsigned char a[4096], b1[4096];
  struct backing *b = open_rbd ();
  struct cache *c = open_cache (b, NULL);

  memset (a, 'A', sizeof a);
  memset (b1, '1', sizeof b1);
  abandon_write (c, a, b1);
  assert_int_equal (in_doubt (c), 1);
  /* The cluster answers again (another write lands after a probe): */
  assert_int_equal (cache_write (c, a, sizeof a, 65536, 0), 0);
  write_back_no_flush (c);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (in_doubt (c), 1);
  assert_int_equal (cache_clear_doubt (c), 1);
  assert_int_equal (in_doubt (c), 0);
  assert_int_equal (cache_flush (c), 0);
  assert_memory_equal (F.img, b1, sizeof b1);
  /* Released: the image's lock goes only once librbd is done with the
   * abandoned write, whatever the operator said. */
  assert_int_equal (backing_release (b), -1);
  assert_int_equal (errno, EBUSY);
  fake_release_held (false, -EIO);
  assert_int_equal (in_doubt (c), 0);
  assert_int_equal (cache_flush (c), 0);
  assert_int_equal (cache_destroy (c), 0);
  backing_close (b);
}

/* The late landing (issue 33 item 2; tests/pending/README.md seed 219):
 * a write abandoned at request-timeout lands after the block was written
 * back again with newer data.  Its doubt ends by itself (librbd called
 * back), and no FLUSH may then report the block durable with the image
 * holding the older data. */
static void
test_late_landing (void **state)
{
  unsigned char a[4096], b1[4096], b2[4096], got[4096];
  struct backing *b = open_rbd ();
  struct cache *c = open_cache (b, NULL);

  memset (a, 'A', sizeof a);
  memset (b1, '1', sizeof b1);
  memset (b2, '2', sizeof b2);
  abandon_write (c, a, b1);
  assert_int_equal (cache_write (c, b2, sizeof b2, 0, 0), 0);
  write_back_no_flush (c);                     /* b2 written */
  assert_memory_equal (F.img, b2, sizeof b2);
  fake_release_held (true, 0);                 /* b1 lands over it */
  assert_int_equal (in_doubt (c), 0);
  int r = cache_flush (c);
  lock_or_die (&F.lock);
  memcpy (got, F.img, sizeof got);
  unlock_or_die (&F.lock);
  if (r == 0)
    assert_memory_equal (got, b2, sizeof b2);
  assert_int_equal (r, 0);                     /* nothing was lost */
  assert_int_equal (cache_destroy (c), 0);
  backing_close (b);
}

/* A failed rbd flush after writes is a loss (the ledger's rule, the only
 * one: the rbd backing only returns the failure, its own "unflushed"
 * count and rule are gone): the blocks written back are written again
 * before a FLUSH succeeds; and a FUA write, which is the op and a flush
 * on rbd, whose flush fails loses the direct write made before it, so
 * every later FLUSH fails. */
static void
test_failed_flush_is_loss (void **state)
{
  unsigned char a[4096], d[4096], e[4096];
  struct cache_stats st;
  struct backing *b = open_rbd ();
  struct cache *c = open_cache (b, NULL);

  memset (a, 'A', sizeof a);
  memset (d, 'D', sizeof d);
  memset (e, 'E', sizeof e);
  assert_int_equal (cache_write (c, a, sizeof a, 0, 0), 0);
  write_back_no_flush (c);
  lock_or_die (&F.lock);
  uint64_t writes = F.writes;
  F.fail_flushes = 1;
  unlock_or_die (&F.lock);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  assert_int_equal (cache_flush (c), 0);
  lock_or_die (&F.lock);
  bool again = F.writes > writes;
  unlock_or_die (&F.lock);
  assert_true (again);                         /* written again */

  assert_int_equal (cache_write (c, d, sizeof d, 65536, CACHE_DIRECT), 0);
  lock_or_die (&F.lock);
  F.fail_flushes = 1;
  unlock_or_die (&F.lock);
  assert_int_equal (cache_write (c, e, sizeof e, 131072,
                                 CACHE_DIRECT | CACHE_FUA), -1);
  assert_int_equal (cache_flush (c), -1);
  assert_int_equal (errno, EIO);
  cache_get_stats (c, &st);
  assert_int_equal (st.passthrough_lost, 1);
  assert_int_equal (cache_destroy (c), 0);
  backing_close (b);
}

/* Doubt outlives the process (issue 33 item 3) on rbd too: the store
 * says so before the abandoned write's failure is answered; and once
 * the write has ended and a FLUSH succeeded, the store forgets it (a
 * restart must not inherit a doubt that is over). */
#define DEV_SIZE (16u << 20)
static unsigned char dev_mem[DEV_SIZE], dev_copy[DEV_SIZE];

static const struct store_config ssd_cfg = {
  .path = "(memory)", .nslots = 16, .folio_size = 65536, .block_size = 4096,
  .export_size = SIZE, .backing_spec = "rbd:rbd/img", .backing_size = SIZE,
};

static bool
stored_doubt (void)
{
  struct store_info si = { 0 };

  memcpy (dev_copy, dev_mem, sizeof dev_copy);
  struct store *s2 = store_ssd_open_dev (&ssd_cfg,
                                         ssd_mem_dev (dev_copy, DEV_SIZE),
                                         err, sizeof err);
  assert_non_null (s2);
  store_get_info (s2, &si);
  s2->ops->destroy (s2);
  return si.doubt;
}

static void
test_doubt_persisted (void **state)
{
  unsigned char a[4096], b1[4096];
  struct backing *b = open_rbd ();

  memset (dev_mem, 0, sizeof dev_mem);
  struct store *s = store_ssd_open_dev (&ssd_cfg,
                                        ssd_mem_dev (dev_mem, DEV_SIZE),
                                        err, sizeof err);
  assert_non_null (s);
  struct cache *c = open_cache (b, s);

  memset (a, 'A', sizeof a);
  memset (b1, '1', sizeof b1);
  abandon_write (c, a, b1);
  assert_true (stored_doubt ());
  fake_release_held (true, 0);
  assert_int_equal (in_doubt (c), 0);
  /* The backing answers again after its probe: the flush goes through. */
  for (int i = 0; i < 50 && cache_write_back (c) != 0; i++)
    usleep (100 * 1000);
  assert_int_equal (cache_write_back (c), 0);
  assert_false (stored_doubt ());
  assert_int_equal (cache_destroy (c), 0);
  store_destroy (s);
  backing_close (b);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test_setup_teardown (test_abandoned_write_in_doubt, setup, teardown),
    cmocka_unit_test_setup_teardown (test_late_landing, setup, teardown),
    cmocka_unit_test_setup_teardown (test_doubt_persisted, setup, teardown),
    cmocka_unit_test_setup_teardown (test_failed_flush_is_loss, setup, teardown),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
