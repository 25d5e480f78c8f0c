/* Image locking for the file backing, in qemu's scheme so that qemu's
 * tools and foliod see each other (qemu block/file-posix.c).
 *
 * qemu gives each user of an image permissions (consistent read, write,
 * write-unchanged, resize) and says which of them it lets others have.
 * Holding permission i is a shared OFD lock on byte 100 + i of the image;
 * not sharing it is a shared OFD lock on byte 200 + i.  A new user takes
 * its bytes, then tests (F_OFD_GETLK for an exclusive lock, which any
 * other open file description's lock blocks): 200 + i for each permission
 * it wants (nobody refuses to share it) and 100 + i for each it does not
 * share (nobody holds it).  OFD locks belong to the open file description,
 * not the process: closing another fd of the same file does not drop them,
 * and two opens in one process exclude each other as two processes do.
 * The locks go when the last fd of that description closes.
 *
 * foliod holds consistent read (and write, when writable) and shares
 * neither write nor resize: its cache must be the only writer of the
 * image, and the data it caches must not change under it.  So a second
 * foliod, qemu-nbd, qemu-io or qemu-img convert is refused an image that
 * foliod serves, and foliod is refused one that a writer holds.  Readers
 * that share write (qemu-nbd --read-only, qemu-img info, "-U") still may.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/stat.h>

#include "backing/file-private.h"

#define LOCK_PERM_BASE   100    /* byte 100 + i: permission i held */
#define LOCK_SHARED_BASE 200    /* byte 200 + i: permission i not shared */

/* qemu's BLK_PERM_* bits, in the order of their lock bytes. */
enum {
  PERM_CONSISTENT_READ = 1u << 0,
  PERM_WRITE           = 1u << 1,
  PERM_WRITE_UNCHANGED = 1u << 2,
  PERM_RESIZE          = 1u << 3,
  PERM_NBITS           = 4,
};

static const char *const perm_names[PERM_NBITS] = {
  "consistent read", "write", "write unchanged", "resize",
};

static int
lock_byte (int fd, int byte)
{
  struct flock fl = { .l_type = F_RDLCK, .l_whence = SEEK_SET,
                      .l_start = byte, .l_len = 1 };

  return fcntl (fd, F_OFD_SETLK, &fl);
}

/* 1 when another open file description holds a lock on byte, 0 when not,
 * -1 with errno. */
static int
byte_taken (int fd, int byte)
{
  struct flock fl = { .l_type = F_WRLCK, .l_whence = SEEK_SET,
                      .l_start = byte, .l_len = 1 };

  if (fcntl (fd, F_OFD_GETLK, &fl) == -1)
    return -1;
  return fl.l_type != F_UNLCK;
}

/* readdir is safe on a stream only this thread reads (readdir_r is
 * deprecated for that reason). */
static struct dirent *
next_entry (DIR *d)
{
  // cppcheck-suppress readdirCalled ; the DIR is this call's own
  return readdir (d);
}

/* OFD locks carry no pid (F_OFD_GETLK answers -1, and /proc/locks too), so
 * name the other processes that have the same file open: one of them holds
 * the lock.  Appends " (open in: PID (COMM), ...)" to buf, or nothing. */
static void
list_openers (const struct stat *img, char *buf, size_t len)
{
  DIR *proc = opendir ("/proc");
  struct dirent *d;
  size_t n = strlen (buf);
  int found = 0;
  pid_t self = getpid ();

  if (!proc)
    return;
  while (found < 4 && (d = next_entry (proc)) != NULL) {
    char path[300], comm[64] = "?";
    DIR *fds;
    struct dirent *f;
    pid_t pid = (pid_t) atol (d->d_name);
    int hit = 0;

    if (pid <= 0 || pid == self)
      continue;
    snprintf (path, sizeof path, "/proc/%d/fd", (int) pid);
    if ((fds = opendir (path)) == NULL)
      continue;
    while (!hit && (f = next_entry (fds)) != NULL) {
      struct stat st;
      snprintf (path, sizeof path, "/proc/%d/fd/%s", (int) pid, f->d_name);
      hit = f->d_name[0] != '.' && stat (path, &st) == 0 &&
            st.st_dev == img->st_dev && st.st_ino == img->st_ino &&
            ((st.st_mode ^ img->st_mode) & S_IFMT) == 0;
    }
    closedir (fds);
    if (!hit)
      continue;
    snprintf (path, sizeof path, "/proc/%d/comm", (int) pid);
    FILE *c = fopen (path, "r");
    if (c) {
      if (fgets (comm, sizeof comm, c))
        comm[strcspn (comm, "\n")] = '\0';
      fclose (c);
    }
    n += snprintf (buf + n, n < len ? len - n : 0, "%s%d (%s)",
                   found ? ", " : "; open in pid ", (int) pid, comm);
    if (n >= len)
      break;
    found++;
  }
  closedir (proc);
}

/* The refusal: which permission, which way, who may hold it. */
static void
lock_refused (int fd, const char *path, int bit, int holds, char *err,
              size_t errlen)
{
  struct stat st;

  if (holds)
    snprintf (err, errlen, "%s: in use: another process (qemu or foliod) "
              "holds the \"%s\" permission on it, which foliod does not "
              "share", path, perm_names[bit]);
  else
    snprintf (err, errlen, "%s: in use: another process (qemu or foliod) "
              "does not share the \"%s\" permission foliod needs", path,
              perm_names[bit]);
  if (fstat (fd, &st) == 0)
    list_openers (&st, err, errlen);
  {
    size_t n = strlen (err);
    if (n < errlen)
      snprintf (err + n, errlen - n, "; stop it first, or set "
                "locking=off to serve the image anyway (two writers "
                "corrupt it)");
  }
}

int
file_lock_image (int fd, const char *path, int writable, char *err,
                 size_t errlen)
{
  const unsigned perm = PERM_CONSISTENT_READ | (writable ? PERM_WRITE : 0);
  const unsigned unshared = PERM_WRITE | PERM_RESIZE;
  /* Take our bytes: one per permission held, one per permission not
   * shared.  Then the conflicts: a permission we want that someone does
   * not share, a permission we do not share that someone holds. */
  const struct { unsigned mask; int take, test, holds; } rules[] = {
    { perm, LOCK_PERM_BASE, LOCK_SHARED_BASE, 0 },
    { unshared, LOCK_SHARED_BASE, LOCK_PERM_BASE, 1 },
  };
  int i, k, r;

  for (k = 0; k < 2; k++)
    for (i = 0; i < PERM_NBITS; i++)
      if ((rules[k].mask & (1u << i)) &&
          lock_byte (fd, rules[k].take + i) == -1) {
        if (errno == EAGAIN || errno == EACCES)   /* not qemu's way */
          snprintf (err, errlen, "%s: in use: another process holds an "
                    "exclusive lock on byte %d of it; stop it first, or "
                    "set locking=off", path, rules[k].take + i);
        else                                      /* e.g. ENOLCK on NFS */
          snprintf (err, errlen, "%s: cannot lock the image (%s); set "
                    "locking=off if nothing else uses it", path,
                    strerror (errno));
        return -1;
      }
  for (k = 0; k < 2; k++)
    for (i = 0; i < PERM_NBITS; i++) {
      if (!(rules[k].mask & (1u << i)))
        continue;
      r = byte_taken (fd, rules[k].test + i);
      if (r == 1)
        lock_refused (fd, path, i, rules[k].holds, err, errlen);
      else if (r == -1)
        snprintf (err, errlen, "%s: testing the image's locks: %s", path,
                  strerror (errno));
      if (r != 0)
        return -1;
    }
  return 0;
}

int
file_unlock_image (int fd)
{
  struct flock fl = { .l_type = F_UNLCK, .l_whence = SEEK_SET,
                      .l_start = LOCK_PERM_BASE,
                      .l_len = LOCK_SHARED_BASE + PERM_NBITS - LOCK_PERM_BASE };

  return fcntl (fd, F_OFD_SETLK, &fl);
}
