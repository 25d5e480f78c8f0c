/* Images foliod has served writable, remembered in the state directory.
 *
 * A client writes what it likes into its own disk: qemu-img create -f
 * qcow2 nbd://..., cryptsetup luksFormat on the whole disk, a VDI magic in
 * a boot sector.  The format probe of the file backing would then refuse
 * the image at the next start, so an image foliod has served writable is
 * never probed again (qemu learned it with CVE-2008-2004): the daemon
 * opens it as format=raw.  An image foliod created (create-size) is served
 * writable at that same start, so it is remembered too.
 *
 * One small file per image in STATE/served-writable/, named by a hash of
 * the backing path as configured (a relative one is relative to the state
 * directory, where the daemon runs), holding that path and, for a regular
 * file, its inode: a file replaced by another one (a new inode: a copy
 * renamed into place) is probed again; a block device is known by its
 * path only (its node in /dev changes at each boot).  Written with a
 * rename and synced before a client can write, so a crash cannot lose it.
 * Without a state directory nothing is remembered.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "daemon/daemon.h"

#define RECORD_MAX 8192

/* FNV-1a, 64 bits: a file name per path. */
static uint64_t
path_hash (const char *s)
{
  uint64_t h = 0xcbf29ce484222325ull;

  for (; *s; s++) {
    h ^= (unsigned char) *s;
    h *= 0x100000001b3ull;
  }
  return h;
}

/* The record's file and the text it must hold for path as it is now.
 * 0, or -1 (path gone, or too long to remember). */
static int
record_of (const char *dir, const char *path, char *file, size_t filelen,
           char *text, size_t textlen)
{
  char full[4096];
  struct stat st;
  int n;

  n = path[0] == '/' ? snprintf (full, sizeof full, "%s", path)
                     : snprintf (full, sizeof full, "%s/%s", dir, path);
  if (n < 0 || (size_t) n >= sizeof full) {
    errno = ENAMETOOLONG;
    return -1;
  }
  if (stat (full, &st) == -1)
    return -1;
  snprintf (file, filelen, "%s/%s/%016llx", dir, SERVED_DIR,
            (unsigned long long) path_hash (path));
  if (S_ISBLK (st.st_mode))
    n = snprintf (text, textlen, "foliod served this image writable: its "
                  "format is never probed\npath %s\nblock device\n", path);
  else
    n = snprintf (text, textlen, "foliod served this image writable: its "
                  "format is never probed\npath %s\ninode %llu\n", path,
                  (unsigned long long) st.st_ino);
  if (n < 0 || (size_t) n >= textlen) {
    errno = ENAMETOOLONG;
    return -1;
  }
  return 0;
}

int
served_writable_known (const char *dir, const char *path)
{
  char file[4200], want[RECORD_MAX], got[RECORD_MAX + 1];
  ssize_t n;
  int fd;

  if (dir == NULL || path == NULL ||
      record_of (dir, path, file, sizeof file, want, sizeof want) == -1)
    return 0;
  fd = open (file, O_RDONLY | O_CLOEXEC);
  if (fd == -1)
    return 0;
  n = read (fd, got, sizeof got);
  close (fd);
  return n == (ssize_t) strlen (want) && memcmp (got, want, (size_t) n) == 0;
}

static int
fsync_path (const char *path)
{
  int fd = open (path, O_RDONLY | O_DIRECTORY | O_CLOEXEC), r;

  if (fd == -1)
    return -1;
  r = fsync (fd);
  close (fd);
  return r;
}

int
served_writable_remember (const char *dir, const char *path, char *err,
                          size_t errlen)
{
  char file[4200], text[RECORD_MAX], tmp[4300], sub[4200];
  size_t len;
  int fd, ok;

  if (record_of (dir, path, file, sizeof file, text, sizeof text) == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    return -1;
  }
  snprintf (sub, sizeof sub, "%s/%s", dir, SERVED_DIR);
  if (mkdir (sub, 0700) == 0) {
    if (fsync_path (dir) == -1)
      goto fail_sub;
  } else if (errno != EEXIST)
    goto fail_sub;
  snprintf (tmp, sizeof tmp, "%s.%d.tmp", file, (int) getpid ());
  fd = open (tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd == -1)
    goto fail_tmp;
  len = strlen (text);
  ok = write (fd, text, len) == (ssize_t) len && fsync (fd) == 0;
  if (close (fd) == -1)
    ok = 0;
  if (!ok || rename (tmp, file) == -1) {
    int e = errno;
    unlink (tmp);
    errno = e;
    goto fail_tmp;
  }
  if (fsync_path (sub) == -1)
    goto fail_sub;
  return 0;

 fail_tmp:
  snprintf (err, errlen, "%s: %s", tmp, strerror (errno));
  return -1;
 fail_sub:
  snprintf (err, errlen, "%s: %s", sub, strerror (errno));
  return -1;
}
