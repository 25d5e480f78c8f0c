/* ublk devices: their life through /dev/ublk-control, and the set the
 * daemon keeps them in.
 *
 *   add:  ADD_DEV (queues, depth, buffer size) -> SET_PARAMS (sizes from
 *         the cache) -> open /dev/ublkcN -> workers, queue threads (each
 *         fetches all its tags) -> START_DEV: /dev/ublkbN appears.
 *   del:  STOP_DEV (the kernel removes the disk after draining what it
 *         sent us; the queue threads answer until then) -> stop the
 *         threads -> close /dev/ublkcN -> DEL_DEV.
 *
 * User recovery: devices are made with UBLK_F_USER_RECOVERY and
 * UBLK_F_USER_RECOVERY_REISSUE, and with the export's tag in the
 * dev_info's ublksrv_flags (kept by the kernel for the server, never
 * read by it).  When foliod dies (or detaches for an upgrade: its queue
 * threads leave, /dev/ublkcN is closed) the kernel quiesces the device:
 * requests wait, those foliod had taken but not answered are requeued.
 *
 *   recover: find the device by its tag among /sys/class/ublk-char/ublkcN
 *         (GET_DEV_INFO each), wait for QUIESCED -> START_USER_RECOVERY
 *         (EBUSY while the old process still holds /dev/ublkcN) -> open
 *         /dev/ublkcN, workers, queue threads fetching every tag ->
 *         END_USER_RECOVERY: the waiting requests reach the new process.
 *   detach: stop the queue threads and workers (what a worker holds is
 *         answered first; what arrives meanwhile is not taken: the
 *         kernel requeues it for the next server), close /dev/ublkcN;
 *         no STOP_DEV.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "foliod/export.h"
#include "foliod/lock.h"
#include "foliod/log.h"
#include "foliod/util.h"
#include "ublk/internal.h"
#include "ublk/ublk.h"

#define UBLK_MAX_IO_BYTES (32u << 20) /* a tag's buffer at most */
#define CDEV_WAIT_MS 2000u            /* for /dev/ublkcN to appear */
#define UBLK_CHAR_CLASS "/sys/class/ublk-char"
#define TAG_MAGIC ((uint64_t) 0xf011d0e5u << 32)

/* What foliod leaves in a device's ublksrv_flags: a magic number and the
 * export name's FNV-1a hash, to find the device again after a restart. */
static uint64_t
export_tag (const char *name)
{
  uint32_t h = 2166136261u;

  for (const unsigned char *c = (const unsigned char *) name; *c; c++)
    h = (h ^ *c) * 16777619u;
  return TAG_MAGIC | h;
}

struct ublk_set {
  pthread_mutex_t lock;       /* serialises add, del, list */
  struct ublk_dev *devs;
};

struct ublk_set *
ublk_set_new (void)
{
  struct ublk_set *s = calloc (1, sizeof *s);

  if (s)
    pthread_mutex_init (&s->lock, NULL);
  return s;
}

static unsigned
log2u (uint32_t v)
{
  unsigned n = 0;

  while ((1u << (n + 1)) <= v)
    n++;
  return n;
}

/* /dev/ublk-control, or -1 with the reason in err. */
static int
control_open (char *err, size_t errlen)
{
  int fd = open (UBLK_CONTROL_PATH, O_RDWR | O_CLOEXEC);

  if (fd < 0 && errno == ENOENT)
    snprintf (err, errlen, "this kernel has no ublk driver (no %s: "
              "modprobe ublk_drv; foliod needs Linux 6.4 or later built "
              "with CONFIG_BLK_DEV_UBLK)", UBLK_CONTROL_PATH);
  else if (fd < 0)
    snprintf (err, errlen, "%s: %s", UBLK_CONTROL_PATH, strerror (errno));
  return fd;
}

static void
params_fill (struct ublk_params *p, const struct ublk_dev *d)
{
  const struct cache_config *cfg = cache_get_config (d->exp->cache);
  unsigned bs_shift = log2u (cfg->block_size);

  memset (p, 0, sizeof *p);
  p->len = sizeof *p;
  p->types = UBLK_PARAM_TYPE_BASIC;
  /* The kernel takes logical blocks up to a page; a larger cache block
   * is the physical size (writes of less cost a read of the rest). */
  p->basic.logical_bs_shift = (uint8_t) (bs_shift > 12 ? 12 : bs_shift);
  p->basic.physical_bs_shift = (uint8_t) bs_shift;
  p->basic.io_min_shift = (uint8_t) bs_shift;
  p->basic.io_opt_shift = (uint8_t) log2u (cfg->folio_size);
  p->basic.max_sectors = d->max_io >> 9;
  /* Whole logical blocks: a tail shorter than one is not served. */
  p->basic.dev_sectors = (d->exp->size >> (p->basic.logical_bs_shift)) <<
    (p->basic.logical_bs_shift - 9);
  /* A write-back cache that honours FLUSH and FUA. */
  p->basic.attrs = UBLK_ATTR_VOLATILE_CACHE | UBLK_ATTR_FUA;
  if (d->exp->read_only) {
    p->basic.attrs |= UBLK_ATTR_READ_ONLY;
    return;
  }
  p->types |= UBLK_PARAM_TYPE_DISCARD;
  p->discard.discard_granularity = cfg->block_size;
  p->discard.max_discard_sectors = UINT32_MAX >> 9;
  p->discard.max_write_zeroes_sectors = UINT32_MAX >> 9;
  p->discard.max_discard_segments = 1;
}

/* Open /dev/ublkcN, waiting a little for it to appear (udev). */
static int
cdev_open (int id)
{
  char path[64];
  uint64_t end = now_ms () + CDEV_WAIT_MS;
  int fd;

  snprintf (path, sizeof path, "/dev/ublkc%d", id);
  while ((fd = open (path, O_RDWR | O_CLOEXEC)) < 0 &&
         (errno == ENOENT || errno == EACCES) && now_ms () < end)
    usleep (10000);
  return fd;
}

/* Wait until every queue said how its set-up went: 0, or its error. */
static int
queues_wait_ready (struct ublk_dev *d)
{
  uint64_t end = now_ms () + UBLK_READY_WAIT_MS;
  int err = 0;

  lock_or_die (&d->work_lock);
  for (unsigned i = 0; i < d->nr_queues && !err; i++) {
    while (d->q[i].ready == -1 && now_ms () < end)
      cond_wait_ms (&d->work_cond, &d->work_lock, end - now_ms ());
    err = d->q[i].ready == -1 ? ETIMEDOUT : d->q[i].ready;
  }
  unlock_or_die (&d->work_lock);
  return err;
}

/* Stop and free what add made of d (all of it or part); the kernel's
 * device goes too when del. */
static void
dev_teardown (struct ublk_dev *d, int ctrl_fd, bool del)
{
  unsigned left = 0;

  for (unsigned i = 0; i < d->nr_queues; i++)
    ublk_queue_stop (&d->q[i]);
  for (unsigned i = 0; i < d->nr_queues; i++) {
    ublk_queue_join (&d->q[i]);
    left += atomic_load (&d->q[i].left);
  }
  if (left)
    log_info ("ublk%d: %u request%s that arrived while it stopped left "
              "to the kernel (requeued for the next server)", d->id, left,
              left == 1 ? "" : "s");
  ublk_workers_stop (d);
  if (d->cdev_fd >= 0)
    close (d->cdev_fd);
  if (del) {
    int r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_DEL_DEV, (uint32_t) d->id,
                           NULL, 0, 0);
    if (r < 0)
      log_error ("ublk%d: DEL_DEV: %s", d->id, strerror (-r));
  }
  pthread_mutex_destroy (&d->work_lock);
  pthread_cond_destroy (&d->work_cond);
  free (d);
}

static struct ublk_dev *
dev_new (struct export *e)
{
  struct ublk_dev *d = calloc (1, sizeof *d);
  const struct cache_config *cfg = cache_get_config (e->cache);
  long cpus = sysconf (_SC_NPROCESSORS_ONLN);
  size_t page = (size_t) sysconf (_SC_PAGESIZE);
  uint32_t max_io = cfg->max_io_bytes;

  if (d == NULL)
    return NULL;
  d->id = -1;
  d->exp = e;
  d->cdev_fd = -1;
  d->nr_queues = cpus < 1 ? 1 : cpus > UBLK_QUEUES_MAX ? UBLK_QUEUES_MAX
                                                        : (unsigned) cpus;
  d->depth = UBLK_QUEUE_DEPTH;
  if (max_io < cfg->block_size)
    max_io = cfg->block_size;
  if (max_io > UBLK_MAX_IO_BYTES)
    max_io = UBLK_MAX_IO_BYTES;
  d->max_io = (uint32_t) ((max_io + page - 1) & ~(page - 1));
  for (unsigned i = 0; i < UBLK_QUEUES_MAX; i++)
    d->q[i].efd = -1;
  pthread_mutex_init (&d->work_lock, NULL);
  cond_init_monotonic (&d->work_cond);
  return d;
}

/* ADD_DEV and SET_PARAMS: d->id.  0, or -1 with the reason in err (the
 * kernel's device deleted again). */
static int
dev_create (struct ublk_dev *d, int ctrl_fd, char *err, size_t errlen)
{
  struct ublksrv_ctrl_dev_info info = {
    .nr_hw_queues = (uint16_t) d->nr_queues,
    .queue_depth = (uint16_t) d->depth,
    .max_io_buf_bytes = d->max_io,
    .dev_id = UINT32_MAX,       /* the kernel picks */
    .ublksrv_pid = getpid (),
    /* REISSUE: what foliod had taken but not answered when it died is
     * sent again to the next process instead of failing.  A block
     * device's read, write, discard or zeroing done twice leaves what
     * once does (and overlapping writes in flight together have no
     * order anyway), and without it a kill under load fails the
     * requests in flight with EIO. */
    .flags = UBLK_F_CMD_IOCTL_ENCODE | UBLK_F_USER_RECOVERY |
             UBLK_F_USER_RECOVERY_REISSUE,
    .ublksrv_flags = export_tag (d->exp->name),
  };
  struct ublk_params p;
  int r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_ADD_DEV, UINT32_MAX, &info,
                         sizeof info, 0);

  if (r < 0) {
    snprintf (err, errlen, "ADD_DEV: %s%s", strerror (-r),
              r == -EINVAL || r == -EOPNOTSUPP
              ? " (foliod needs Linux 6.4 or later for ublk)" : "");
    return -1;
  }
  d->id = (int) info.dev_id;
  /* The kernel clears the flags it does not know. */
  d->recoverable = (info.flags & UBLK_F_USER_RECOVERY) != 0;
  if (!d->recoverable)
    log_warn ("ublk%d: this kernel has no ublk user recovery: if foliod "
              "dies, I/O on /dev/ublkb%d fails", d->id, d->id);
  params_fill (&p, d);
  r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_SET_PARAMS, (uint32_t) d->id, &p,
                     sizeof p, 0);
  if (r < 0) {
    snprintf (err, errlen, "ublk%d: SET_PARAMS: %s", d->id, strerror (-r));
    ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_DEL_DEV, (uint32_t) d->id, NULL, 0, 0);
    return -1;
  }
  return 0;
}

/* Threads up, START_DEV (or END_USER_RECOVERY when recover).  0, or -1
 * with the reason in err. */
static int
dev_run (struct ublk_dev *d, int ctrl_fd, bool recover, char *err,
         size_t errlen)
{
  int r;

  d->cdev_fd = cdev_open (d->id);
  if (d->cdev_fd < 0) {
    snprintf (err, errlen, "/dev/ublkc%d: %s", d->id, strerror (errno));
    return -1;
  }
  if ((r = ublk_workers_start (d)) != 0) {
    snprintf (err, errlen, "ublk%d: workers: %s", d->id, strerror (r));
    return -1;
  }
  for (unsigned i = 0; i < d->nr_queues; i++)
    if ((r = ublk_queue_start (d, i)) != 0) {
      snprintf (err, errlen, "ublk%d: queue %u: %s", d->id, i, strerror (r));
      return -1;
    }
  if ((r = queues_wait_ready (d)) != 0) {
    snprintf (err, errlen, "ublk%d: queue set-up: %s", d->id, strerror (r));
    return -1;
  }
  r = ublk_ctrl_cmd (ctrl_fd, recover ? UBLK_U_CMD_END_USER_RECOVERY
                     : UBLK_U_CMD_START_DEV, (uint32_t) d->id, NULL,
                     0, (uint64_t) getpid ());
  if (r < 0) {
    snprintf (err, errlen, "ublk%d: %s: %s", d->id,
              recover ? "END_USER_RECOVERY" : "START_DEV", strerror (-r));
    return -1;
  }
  return 0;
}

int
ublk_add (struct ublk_set *s, struct export *e, char *err, size_t errlen)
{
  int ctrl_fd, id;
  struct ublk_dev *d;

  if (export_release_state (e) != EXPORT_SERVING) {
    snprintf (err, errlen, "export '%s' was released (foliod release): "
              "it is another host's now", e->name);
    return -1;
  }
  ctrl_fd = control_open (err, errlen);
  if (ctrl_fd < 0)
    return -1;
  d = dev_new (e);
  if (d == NULL) {
    snprintf (err, errlen, "out of memory");
    close (ctrl_fd);
    return -1;
  }
  lock_or_die (&s->lock);
  if (dev_create (d, ctrl_fd, err, errlen) == -1) {
    dev_teardown (d, ctrl_fd, false);
    id = -1;
  } else if (dev_run (d, ctrl_fd, false, err, errlen) == -1) {
    dev_teardown (d, ctrl_fd, true);
    id = -1;
  } else {
    d->next = s->devs;
    s->devs = d;
    id = d->id;
    log_info ("ublk: /dev/ublkb%d serves export '%s' (%u queue%s of %u, "
              "requests up to %u bytes)", id, e->name, d->nr_queues,
              d->nr_queues == 1 ? "" : "s", d->depth, d->max_io);
  }
  unlock_or_die (&s->lock);
  close (ctrl_fd);
  return id;
}

/* The device tagged for export name, not in s: its id and info, or -1
 * (none). */
static int
dev_find (struct ublk_set *s, int ctrl_fd, const char *name,
          struct ublksrv_ctrl_dev_info *info)
{
  uint64_t tag = export_tag (name);
  DIR *dir = opendir (UBLK_CHAR_CLASS);
  struct dirent *de;
  int found = -1;

  if (dir == NULL)
    return -1;
  // cppcheck-suppress readdirCalled ; the DIR is this call's own
  while (found < 0 && (de = readdir (dir)) != NULL) {
    char *end;
    long id;
    bool ours = false;
    if (strncmp (de->d_name, "ublkc", 5) != 0)
      continue;
    id = strtol (de->d_name + 5, &end, 10);
    if (end == de->d_name + 5 || *end || id < 0 || id > INT32_MAX)
      continue;
    for (struct ublk_dev *d = s->devs; d; d = d->next)
      ours = ours || d->id == id;
    if (!ours && ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_GET_DEV_INFO,
                                (uint32_t) id, info, sizeof *info, 0) >= 0 &&
        info->ublksrv_flags == tag)
      found = (int) id;
  }
  closedir (dir);
  return found;
}

/* Wait until device id has no server: QUIESCED, and START_USER_RECOVERY
 * taken (EBUSY while the old process still holds /dev/ublkcN).  0, or -1
 * with the reason in err. */
static int
dev_start_recovery (int ctrl_fd, int id, struct ublksrv_ctrl_dev_info *info,
                    const char *name, char *err, size_t errlen)
{
  uint64_t end = now_ms () + UBLK_RECOVER_WAIT_MS;
  int r;

  for (;;) {
    if (!(info->flags & UBLK_F_USER_RECOVERY) ||
        info->state == UBLK_S_DEV_DEAD) {
      snprintf (err, errlen, "/dev/ublkb%d of export %s lost its server and "
                "cannot be recovered (%s): remove it with foliod ublk del %d",
                id, name, info->flags & UBLK_F_USER_RECOVERY ? "stopped"
                : "made without user recovery", id);
      return -1;
    }
    if (info->state == UBLK_S_DEV_LIVE && info->ublksrv_pid > 0 &&
        (kill (info->ublksrv_pid, 0) == 0 || errno != ESRCH)) {
      snprintf (err, errlen, "/dev/ublkb%d of export %s is served by "
                "process %d", id, name, (int) info->ublksrv_pid);
      errno = EBUSY;
      return -1;
    }
    r = -EBUSY;
    if (info->state == UBLK_S_DEV_QUIESCED)
      r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_START_USER_RECOVERY,
                         (uint32_t) id, NULL, 0, 0);
    if (r == 0)
      return 0;
    if (r != -EBUSY || now_ms () >= end) {
      snprintf (err, errlen, "/dev/ublkb%d: START_USER_RECOVERY: %s%s", id,
                strerror (-r), r == -EBUSY ? " (still held by its old "
                "server after 10 s)" : "");
      return -1;
    }
    usleep (20000);
    r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_GET_DEV_INFO, (uint32_t) id, info,
                       sizeof *info, 0);
    if (r < 0) {
      snprintf (err, errlen, "/dev/ublkb%d: GET_DEV_INFO: %s", id,
                strerror (-r));
      return -1;
    }
  }
}

int
ublk_recover (struct ublk_set *s, struct export *e, char *err, size_t errlen)
{
  struct ublksrv_ctrl_dev_info info;
  struct ublk_dev *d = NULL;
  int ctrl_fd, id;

  if (export_release_state (e) != EXPORT_SERVING) {
    snprintf (err, errlen, "export '%s' was released (foliod release): "
              "it is another host's now", e->name);
    errno = EPERM;
    return -1;
  }
  ctrl_fd = control_open (err, errlen);
  if (ctrl_fd < 0) {
    errno = ENOENT;             /* no driver, no device to recover */
    return -1;
  }
  lock_or_die (&s->lock);
  id = dev_find (s, ctrl_fd, e->name, &info);
  if (id < 0) {
    snprintf (err, errlen, "no ublk device of export %s waits for a server",
              e->name);
    errno = ENOENT;
  } else if (info.nr_hw_queues < 1 || info.nr_hw_queues > UBLK_QUEUES_MAX ||
             info.queue_depth < 1 || info.queue_depth > UBLK_MAX_QUEUE_DEPTH ||
             info.max_io_buf_bytes < 512 ||
             info.max_io_buf_bytes > UBLK_MAX_IO_BYTES) {
    snprintf (err, errlen, "/dev/ublkb%d: %u queues of %u, buffers of %u "
              "bytes: not foliod's", id, info.nr_hw_queues, info.queue_depth,
              info.max_io_buf_bytes);
    errno = EINVAL;
    id = -1;
  } else if (dev_start_recovery (ctrl_fd, id, &info, e->name, err,
                                 errlen) == -1) {
    errno = errno == EBUSY ? EBUSY : EIO;
    id = -1;
  } else if ((d = dev_new (e)) == NULL) {
    snprintf (err, errlen, "out of memory");
    errno = ENOMEM;
    id = -1;
  } else {
    /* The device keeps the geometry it was made with. */
    d->id = id;
    d->recoverable = true;
    d->nr_queues = info.nr_hw_queues;
    d->depth = info.queue_depth;
    d->max_io = info.max_io_buf_bytes;
    if (dev_run (d, ctrl_fd, true, err, errlen) == -1) {
      /* The device waits on: another try, or ublk del, may end that. */
      dev_teardown (d, ctrl_fd, false);
      errno = EIO;
      id = -1;
    } else {
      d->next = s->devs;
      s->devs = d;
      log_info ("ublk: /dev/ublkb%d recovered: it serves export '%s' again "
                "(%u queue%s of %u)", id, e->name, d->nr_queues,
                d->nr_queues == 1 ? "" : "s", d->depth);
    }
  }
  unlock_or_die (&s->lock);
  close (ctrl_fd);
  return id;
}

/* After a detach: wait until the kernel has quiesced device id (its
 * requests requeued, QUIESCED), so that the next process finds it
 * waiting and not still served by this one. */
static void
dev_wait_quiesced (int ctrl_fd, int id)
{
  uint64_t end = now_ms () + UBLK_RECOVER_WAIT_MS;
  struct ublksrv_ctrl_dev_info info;
  int r;

  while ((r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_GET_DEV_INFO, (uint32_t) id,
                             &info, sizeof info, 0)) >= 0 &&
         info.state == UBLK_S_DEV_LIVE && now_ms () < end)
    usleep (10000);
  if (r < 0 || info.state != UBLK_S_DEV_QUIESCED)
    log_warn ("ublk%d: not quiesced after the detach (%s)", id,
              r < 0 ? strerror (-r) : info.state == UBLK_S_DEV_LIVE
              ? "still live" : "dead");
}

bool
ublk_set_detach (struct ublk_set *s)
{
  struct ublk_dev *d;
  char err[256];
  int ctrl_fd;

  lock_or_die (&s->lock);
  for (d = s->devs; d && d->recoverable; d = d->next)
    ;
  if (d) {
    unlock_or_die (&s->lock);
    return false;
  }
  ctrl_fd = s->devs ? control_open (err, sizeof err) : -1;
  while ((d = s->devs) != NULL) {
    int id = d->id;
    s->devs = d->next;
    log_info ("ublk: /dev/ublkb%d (export '%s') left to the next foliod: "
              "its I/O waits until that one recovers it", id, d->exp->name);
    dev_teardown (d, -1, false);
    if (ctrl_fd >= 0)
      dev_wait_quiesced (ctrl_fd, id);
  }
  if (ctrl_fd >= 0)
    close (ctrl_fd);
  unlock_or_die (&s->lock);
  return true;
}

bool
ublk_set_recoverable (struct ublk_set *s)
{
  bool r = true;

  lock_or_die (&s->lock);
  for (struct ublk_dev *d = s->devs; d; d = d->next)
    r = r && d->recoverable;
  unlock_or_die (&s->lock);
  return r;
}

/* Is /dev/ublkbN mounted or held exclusively?  (O_EXCL on a block
 * device fails with EBUSY then.) */
static bool
dev_busy (int id)
{
  char path[64];
  int fd;

  snprintf (path, sizeof path, "/dev/ublkb%d", id);
  fd = open (path, O_RDONLY | O_EXCL | O_CLOEXEC);
  if (fd >= 0)
    close (fd);
  return fd < 0 && errno == EBUSY;
}

/* Remove d (out of the set already). */
static void
dev_remove (struct ublk_dev *d, int ctrl_fd)
{
  int r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_STOP_DEV, (uint32_t) d->id,
                         NULL, 0, 0);

  if (r < 0)
    log_error ("ublk%d: STOP_DEV: %s", d->id, strerror (-r));
  dev_teardown (d, ctrl_fd, true);
}

/* /dev/ublkbN that this foliod does not serve: removed only when no
 * process serves it: waiting for recovery (QUIESCED: STOP_DEV fails the
 * requests that wait), or its server gone (a device made without user
 * recovery, failing all I/O).  A live server's device is never touched.
 * 0, or -1 with the reason. */
static int
dev_del_orphan (int ctrl_fd, int id, char *err, size_t errlen)
{
  struct ublksrv_ctrl_dev_info info;
  int r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_GET_DEV_INFO, (uint32_t) id,
                         &info, sizeof info, 0);

  if (r < 0) {
    snprintf (err, errlen, "foliod serves no /dev/ublkb%d, nor does the "
              "kernel know one (%s)", id, strerror (-r));
    return -1;
  }
  if (info.state != UBLK_S_DEV_QUIESCED && info.ublksrv_pid > 0 &&
      (kill (info.ublksrv_pid, 0) == 0 || errno != ESRCH)) {
    snprintf (err, errlen, "/dev/ublkb%d is served by process %d, not by "
              "this foliod", id, (int) info.ublksrv_pid);
    return -1;
  }
  log_warn ("ublk: removing /dev/ublkb%d, left behind by process %d (gone)",
            id, (int) info.ublksrv_pid);
  r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_STOP_DEV, (uint32_t) id, NULL, 0, 0);
  if (r < 0)
    log_warn ("ublk%d: STOP_DEV: %s", id, strerror (-r));
  r = ublk_ctrl_cmd (ctrl_fd, UBLK_U_CMD_DEL_DEV, (uint32_t) id, NULL, 0, 0);
  if (r < 0) {
    snprintf (err, errlen, "/dev/ublkb%d: DEL_DEV: %s", id, strerror (-r));
    return -1;
  }
  return 0;
}

int
ublk_del (struct ublk_set *s, int id, bool force, char *err, size_t errlen)
{
  struct ublk_dev **pp, *d;
  int ctrl_fd;

  lock_or_die (&s->lock);
  for (pp = &s->devs; (d = *pp) != NULL; pp = &d->next)
    if (d->id == id)
      break;
  if (!force && dev_busy (id)) {
    unlock_or_die (&s->lock);
    snprintf (err, errlen, "/dev/ublkb%d is in use (mounted or held "
              "open exclusively): unmount it first, or force", id);
    errno = EBUSY;
    return -1;
  }
  ctrl_fd = control_open (err, errlen);
  if (ctrl_fd < 0 || d == NULL) {
    int r = -1;
    if (ctrl_fd >= 0) {
      r = dev_del_orphan (ctrl_fd, id, err, errlen);
      close (ctrl_fd);
    } else if (d == NULL)      /* no driver: no device either */
      snprintf (err, errlen, "foliod serves no /dev/ublkb%d", id);
    unlock_or_die (&s->lock);
    return r;
  }
  *pp = d->next;
  log_info ("ublk: removing /dev/ublkb%d (export '%s')", id, d->exp->name);
  dev_remove (d, ctrl_fd);
  unlock_or_die (&s->lock);
  close (ctrl_fd);
  return 0;
}

size_t
ublk_list (struct ublk_set *s, char *buf, size_t len)
{
  size_t n = 0;

  buf[0] = '\0';
  lock_or_die (&s->lock);
  for (struct ublk_dev *d = s->devs; d && n + 1 < len; d = d->next) {
    int w = snprintf (buf + n, len - n, "ublkb%d %s\n", d->id, d->exp->name);
    n = w < 0 ? n : n + (size_t) w >= len ? len - 1 : n + (size_t) w;
  }
  unlock_or_die (&s->lock);
  return n;
}

bool
ublk_serves (struct ublk_set *s, const struct export *e)
{
  bool r = false;

  lock_or_die (&s->lock);
  for (struct ublk_dev *d = s->devs; d && !r; d = d->next)
    r = d->exp == e;
  unlock_or_die (&s->lock);
  return r;
}

void
ublk_set_free (struct ublk_set *s)
{
  char err[256];

  if (s == NULL)
    return;
  while (s->devs) {
    int id = s->devs->id;
    if (ublk_del (s, id, true, err, sizeof err) == -1) {
      /* No control device any more: let go of ours all the same. */
      log_error ("ublk: removing /dev/ublkb%d: %s", id, err);
      struct ublk_dev *d = s->devs;
      s->devs = d->next;
      dev_teardown (d, -1, false);
    }
  }
  pthread_mutex_destroy (&s->lock);
  free (s);
}
