/* An LD_PRELOAD fault layer for ONE file of a real process (issue 33):
 * the file backing's system calls as Linux could answer them on a bad
 * day.  The unit fault model (tests/unit/test-fault-model.c) does this
 * below a fake backing; this does it below the real foliod, whose file
 * backing (src/backing/file.c) does all its data I/O with pwrite/pread at
 * explicit offsets (a buffered fd, an O_DIRECT fd, a third fd for
 * fdatasync opened through /proc/self/fd), fallocate and fdatasync: no
 * io_uring, no libaio, so every write and sync passes through here.
 *
 *   FAULT_FILE=PATH   the file (matched by device and inode on every
 *                     call, so all its fds are seen); unset: inert
 *   FAULT_SEED=N      the random stream (default 0)
 *   FAULT_WRITE_ERR=M per mille of writes and fallocates that fail, EIO or
 *                     ENOSPC, nothing applied (default 0)
 *   FAULT_SYNC_FAIL=M per mille of fdatasync/fsync (and RWF_DSYNC writes)
 *                     that fail with EIO when writes are unsynced: every
 *                     write since the last good sync is undone (its
 *                     pre-image put back, newest first), as Linux drops
 *                     the pages whose writeback failed; the next sync
 *                     then succeeds (Linux reports the error once)
 *   FAULT_SYNC_DELAY_MS=N  every fdatasync/fsync of the file first sleeps
 *                     N ms, outside the lock: other threads' writes and
 *                     syncs run meanwhile, as they do beside a slow sync
 *                     (a test of concurrent syncs; default 0)
 *   FAULT_POWER_AT=N  before the Nth write, fallocate or sync of the file
 *                     (counted from 1): a power cut.  Each 512-byte sector
 *                     of each unsynced write keeps the new data or gets
 *                     its pre-image back, at random (newest first, so a
 *                     sector ends as any version written since the last
 *                     good sync); then the process SIGKILLs itself
 *   FAULT_LOG=PATH    one line per injected fault, appended
 *   FAULT_LOG_ALL=1   also a line per write, fallocate and good sync of
 *                     the file, and per write undone (a trace)
 *
 * The undo journal reads the old bytes of each write (through an fd of
 * its own, buffered) before the write is done; sync_file_range is passed
 * through and syncs nothing (it is no durability point).  Not modelled:
 * writes through mmap, ioctl(BLKZEROOUT) on a block device, growing the
 * file (a pre-image stops at the end of the file).  One mutex covers a
 * write with its journal entry and a sync with its verdict. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>
#include <sys/uio.h>

#include "fault-common.h"

#define SECT 512
#define JOURNAL_MAX ((uint64_t) 1 << 30)

struct undo {
  uint64_t off, len;
  char *pre;
};

static struct {
  bool on;
  dev_t dev;
  ino_t ino;
  uint64_t rng;
  unsigned write_err, sync_fail, sync_delay_ms;
  uint64_t power_at, calls;
  bool failed_last;             /* the last sync was an injected failure */
  bool log_all;                 /* FAULT_LOG_ALL: trace every call */
  int jfd, logfd;
  struct undo *j;
  size_t n, cap;
  uint64_t bytes;
  pthread_mutex_t lock;
} F = { .jfd = -1, .logfd = -1, .lock = PTHREAD_MUTEX_INITIALIZER };

static ssize_t (*real_pwrite) (int, const void *, size_t, off_t);
static ssize_t (*real_pwritev) (int, const struct iovec *, int, off_t);
static ssize_t (*real_pwritev2) (int, const struct iovec *, int, off_t, int);
static ssize_t (*real_write) (int, const void *, size_t);
static int (*real_fallocate) (int, int, off_t, off_t);
static int (*real_fdatasync) (int);
static int (*real_fsync) (int);
static int (*real_sync_file_range) (int, off_t, off_t, unsigned);

static void *
real (const char *name)
{
  return fault_next ("fault-preload", name);
}

__attribute__ ((constructor)) static void
fault_init (void)
{
  const char *path = getenv ("FAULT_FILE"), *log = getenv ("FAULT_LOG");
  struct stat st;

  real_pwrite = real ("pwrite64");
  real_pwritev = real ("pwritev64");
  real_pwritev2 = real ("pwritev64v2");
  real_write = real ("write");
  real_fallocate = real ("fallocate64");
  real_fdatasync = real ("fdatasync");
  real_fsync = real ("fsync");
  real_sync_file_range = real ("sync_file_range");
  if (!path || !*path)
    return;
  if (stat (path, &st) == -1 ||
      (F.jfd = open (path, O_RDWR | O_CLOEXEC)) == -1) {
    /* A child in another directory, say: it stays inert. */
    fprintf (stderr, "fault-preload: %s: %s (no faults)\n", path,
             strerror (errno));
    return;
  }
  F.dev = st.st_dev;
  F.ino = st.st_ino;
  F.rng = fault_rng_init (fault_env_uint ("FAULT_SEED", 0));
  F.write_err = fault_env_uint ("FAULT_WRITE_ERR", 0);
  F.sync_fail = fault_env_uint ("FAULT_SYNC_FAIL", 0);
  F.sync_delay_ms = fault_env_uint ("FAULT_SYNC_DELAY_MS", 0);
  F.log_all = fault_env_uint ("FAULT_LOG_ALL", 0) != 0;
  F.power_at = fault_env_uint ("FAULT_POWER_AT", 0);
  if (log && *log)
    F.logfd = open (log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
  F.on = true;
}

static uint64_t
rnd (void)
{
  return fault_rnd (&F.rng);
}

static bool
chance (unsigned per_mille)
{
  return fault_chance (&F.rng, per_mille);
}

static void __attribute__ ((format (printf, 1, 2)))
note (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  fault_note_v (F.logfd, real_write, "fault-preload", fmt, ap);
  va_end (ap);
}

static bool
is_target (int fd)
{
  struct stat st;

  return F.on && fd >= 0 && fstat (fd, &st) == 0 &&
         st.st_dev == F.dev && st.st_ino == F.ino;
}

static void
lock (void)
{
  if (pthread_mutex_lock (&F.lock) != 0)
    abort ();
}

static void
unlock (void)
{
  if (pthread_mutex_unlock (&F.lock) != 0)
    abort ();
}

static void
put_back (uint64_t off, const char *p, uint64_t len)
{
  while (len > 0) {
    ssize_t r = real_pwrite (F.jfd, p, len, off);
    if (r <= 0) {
      if (r == -1 && errno == EINTR)
        continue;
      note ("put back at %" PRIu64 " failed: %s", off, strerror (errno));
      abort ();
    }
    off += r;
    p += r;
    len -= r;
  }
}

/* Record the bytes [off, off+len) hold now (to the end of the file). */
static void
journal (uint64_t off, uint64_t len)
{
  struct undo *u;
  ssize_t r;
  uint64_t done = 0;

  if (len == 0)
    return;
  if (F.n == F.cap) {
    F.cap = F.cap ? 2 * F.cap : 64;
    F.j = realloc (F.j, F.cap * sizeof *F.j);
    if (!F.j)
      abort ();
  }
  u = &F.j[F.n];
  u->off = off;
  u->pre = malloc (len);
  if (!u->pre || (F.bytes += len) > JOURNAL_MAX) {
    note ("journal over %" PRIu64 " bytes", JOURNAL_MAX);
    abort ();
  }
  while (done < len) {
    r = pread (F.jfd, u->pre + done, len - done, off + done);
    if (r == -1 && errno == EINTR)
      continue;
    if (r == -1)
      abort ();
    if (r == 0)
      break;                    /* past the end of the file */
    done += r;
  }
  u->len = done;
  F.n++;
}

static void
journal_clear (void)
{
  for (size_t i = 0; i < F.n; i++)
    free (F.j[i].pre);
  F.n = 0;
  F.bytes = 0;
}

/* Undo the unsynced writes, newest first: all of them, or (torn) each
 * 512-byte sector with probability 1/2.  Returns sectors put back. */
static uint64_t
undo (bool torn)
{
  uint64_t n = 0;

  for (size_t i = F.n; i-- > 0;) {
    struct undo *u = &F.j[i];
    uint64_t p = u->off, end = u->off + u->len;
    if (F.log_all)
      note ("undo %" PRIu64 "+%" PRIu64 "%s", u->off, u->len,
            torn ? " (torn)" : "");
    while (p < end) {
      uint64_t q = (p / SECT + 1) * SECT;
      if (q > end)
        q = end;
      if (!torn || rnd () & 1) {
        put_back (p, u->pre + (p - u->off), q - p);
        n++;
      }
      p = q;
    }
  }
  return n;
}

/* Count one call; at FAULT_POWER_AT cut the power.  Under the lock. */
static void
tick (const char *what)
{
  uint64_t sectors, writes = F.n;

  if (++F.calls != F.power_at)
    return;
  sectors = undo (true);
  note ("power-cut at call %" PRIu64 " (%s): %zu unsynced writes, "
        "%" PRIu64 " sectors put back", F.calls, what, writes, sectors);
  kill (getpid (), SIGKILL);
  for (;;)
    pause ();
}

/* Before a write or fallocate: 0 to go on, or -1 with errno (injected). */
static int
write_fault (const char *what, uint64_t off, uint64_t len)
{
  tick (what);
  if (!chance (F.write_err))
    return 0;
  errno = rnd () & 1 ? EIO : ENOSPC;
  note ("write-error %s %" PRIu64 "+%" PRIu64 ": %s", what, off, len,
        strerror (errno));
  return -1;
}

/* A sync: 0, or -1 EIO with the unsynced writes dropped.  Under the lock. */
static int
sync_verdict (const char *what)
{
  tick (what);
  if (F.n && !F.failed_last && chance (F.sync_fail)) {
    size_t writes = F.n;
    uint64_t sectors = undo (false);
    note ("sync-fail %s: %zu unsynced writes dropped (%" PRIu64 " sectors)",
          what, writes, sectors);
    journal_clear ();
    F.failed_last = true;
    errno = EIO;
    return -1;
  }
  F.failed_last = false;
  return 0;
}

static int
do_sync (int fd, int (*fn) (int), const char *what)
{
  int r;

  if (!is_target (fd))
    return fn (fd);
  if (F.sync_delay_ms)
    usleep (F.sync_delay_ms * 1000u);
  lock ();
  r = sync_verdict (what);
  if (r == 0) {
    r = fn (fd);
    if (r == 0) {
      if (F.log_all)
        note ("%s ok: %zu writes synced", what, F.n);
      journal_clear ();
    }
  }
  unlock ();
  return r;
}

int
fdatasync (int fd)
{
  return do_sync (fd, real_fdatasync, "fdatasync");
}

int
fsync (int fd)
{
  return do_sync (fd, real_fsync, "fsync");
}

int
sync_file_range (int fd, off_t off, off_t len, unsigned flags)
{
  return real_sync_file_range (fd, off, len, flags);
}

static uint64_t
iov_len (const struct iovec *iov, int n)
{
  uint64_t len = 0;

  for (int i = 0; i < n; i++)
    len += iov[i].iov_len;
  return len;
}

/* pwritev2 is the general case: pwrite is one iovec; off -1 (write, or
 * pwritev2 asking for it) writes at the file position and moves it.  A
 * write with RWF_DSYNC or RWF_SYNC is a write and a sync. */
static ssize_t
do_write (int fd, const struct iovec *iov, int n, off_t off, int flags,
          const char *what)
{
  const int sync_flags = RWF_DSYNC | RWF_SYNC;
  bool at_pos = off == -1;
  ssize_t r;
  int e;

  if (!is_target (fd))
    return real_pwritev2 (fd, iov, n, off, flags);
  lock ();
  if (at_pos)
    off = lseek (fd, 0, SEEK_CUR);
  if (off == -1 || write_fault (what, off, iov_len (iov, n)) == -1) {
    unlock ();
    return -1;
  }
  journal (off, iov_len (iov, n));
  if (F.log_all)
    note ("%s %" PRIu64 "+%zu", what, (uint64_t) off, iov_len (iov, n));
  r = real_pwritev2 (fd, iov, n, off, flags & ~sync_flags);
  if (r >= 0 && (flags & sync_flags)) {
    if (sync_verdict (what) == -1 || real_fdatasync (fd) == -1)
      r = -1;
    else
      journal_clear ();
  }
  e = errno;
  if (r > 0 && at_pos)
    lseek (fd, off + r, SEEK_SET);
  unlock ();
  errno = e;
  return r;
}

ssize_t
pwrite64 (int fd, const void *buf, size_t len, off_t off)
{
  struct iovec v = { (void *) buf, len };

  if (!is_target (fd))
    return real_pwrite (fd, buf, len, off);
  return do_write (fd, &v, 1, off, 0, "pwrite");
}

ssize_t
pwrite (int fd, const void *buf, size_t len, off_t off)
{
  return pwrite64 (fd, buf, len, off);
}

ssize_t
write (int fd, const void *buf, size_t len)
{
  struct iovec v = { (void *) buf, len };

  if (!is_target (fd))
    return real_write (fd, buf, len);
  return do_write (fd, &v, 1, -1, 0, "write");
}

ssize_t
pwritev64 (int fd, const struct iovec *iov, int n, off_t off)
{
  if (!is_target (fd))
    return real_pwritev (fd, iov, n, off);
  return do_write (fd, iov, n, off, 0, "pwritev");
}

ssize_t
pwritev (int fd, const struct iovec *iov, int n, off_t off)
{
  return pwritev64 (fd, iov, n, off);
}

ssize_t
pwritev64v2 (int fd, const struct iovec *iov, int n, off_t off, int flags)
{
  return do_write (fd, iov, n, off, flags, "pwritev2");
}

ssize_t
pwritev2 (int fd, const struct iovec *iov, int n, off_t off, int flags)
{
  return pwritev64v2 (fd, iov, n, off, flags);
}

/* fallocate: punch, zero range, plain allocation; each may change bytes,
 * so each is journaled like a write of its range. */
int
fallocate64 (int fd, int mode, off_t off, off_t len)
{
  int r;

  if (!is_target (fd))
    return real_fallocate (fd, mode, off, len);
  lock ();
  if (write_fault ("fallocate", off, len) == -1) {
    unlock ();
    return -1;
  }
  journal (off, len);
  if (F.log_all)
    note ("fallocate mode %d %" PRIu64 "+%" PRIu64, mode, (uint64_t) off,
          (uint64_t) len);
  r = real_fallocate (fd, mode, off, len);
  unlock ();
  return r;
}

int
fallocate (int fd, int mode, off_t off, off_t len)
{
  return fallocate64 (fd, mode, off, len);
}
