/* Image format probe for the file backing.
 *
 * foliod serves a backing's bytes as the disk.  A qcow2 (or VMDK, VHDX...)
 * file given by mistake would be served as its container format: a client
 * sees a small "disk" holding the qcow2 header, and a write through it
 * corrupts the image.  So the first bytes (and, for the formats with a
 * trailer, the last sector) are checked against the signatures of the
 * formats qemu knows, and such a file is refused unless format=raw says
 * the bytes are what the client should see.  The signatures are those of
 * the published format specifications; qemu's probes look for the same.
 *
 * A client writes what it likes into its own disk, a signature included
 * (qemu-img create -f qcow2 nbd://..., cryptsetup luksFormat): an image
 * foliod has served writable must never be probed again (qemu's
 * CVE-2008-2004).  The daemon remembers those and sets format_raw for
 * them (src/daemon/served.c); the probe itself knows nothing of it.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "backing/file-private.h"

#define PROBE_HEAD 512          /* every signature lies in the first sector */
#define PROBE_TAIL 512          /* VHD footer, DMG "koly" trailer */

struct signature {
  const char *format;           /* qemu's name for it */
  uint32_t offset;
  const char *magic;
  uint32_t len;
};

#define SIG(fmt, off, m) { fmt, off, m, sizeof (m) - 1 }
static const struct signature head_sigs[] = {
  SIG ("qcow", 0, "QFI\xfb\0\0\0\x01"),   /* version 1 */
  SIG ("qcow2", 0, "QFI\xfb"),             /* versions 2 and 3 */
  SIG ("qed", 0, "QED\0"),
  SIG ("vmdk", 0, "KDMV"),
  SIG ("vmdk", 0, "COWD"),
  SIG ("vmdk", 0, "# Disk DescriptorFile"),
  SIG ("vhdx", 0, "vhdxfile"),
  SIG ("vdi", 0x40, "\x7f\x10\xda\xbe"),   /* 0xbeda107f, little-endian */
  SIG ("vpc", 0, "conectix"),
  SIG ("luks", 0, "LUKS\xba\xbe"),
  SIG ("parallels", 0, "WithoutFreeSpace"),
  SIG ("parallels", 0, "WithouFreSpacExt"),
  SIG ("bochs", 0, "Bochs Virtual HD Image"),
  SIG ("cloop", 0, "#!/bin/sh\n#V2.0 Format\n"),
};
static const struct signature tail_sigs[] = {
  SIG ("vpc", 0, "conectix"),   /* a fixed VHD: raw data, then a footer */
  SIG ("dmg", 0, "koly"),
};
#undef SIG

static const char *
match (const struct signature *sigs, size_t n, const unsigned char *buf,
       size_t len)
{
  for (size_t i = 0; i < n; i++)
    if (sigs[i].offset + sigs[i].len <= len &&
        memcmp (buf + sigs[i].offset, sigs[i].magic, sigs[i].len) == 0)
      return sigs[i].format;
  return NULL;
}

static ssize_t
read_at (int fd, unsigned char *buf, size_t len, uint64_t off)
{
  ssize_t r;

  do
    r = pread (fd, buf, len, off);
  while (r == -1 && errno == EINTR);
  return r;
}

int
file_probe_format (int fd, uint64_t size, const char *path, char *err,
                   size_t errlen)
{
  unsigned char buf[PROBE_HEAD];
  const char *fmt = NULL;
  ssize_t r;

  r = read_at (fd, buf, sizeof buf, 0);
  if (r > 0)
    fmt = match (head_sigs, sizeof head_sigs / sizeof head_sigs[0], buf, r);
  if (!fmt && size >= 2 * PROBE_TAIL) {
    r = read_at (fd, buf, PROBE_TAIL, size - PROBE_TAIL);
    if (r == PROBE_TAIL)
      fmt = match (tail_sigs, sizeof tail_sigs / sizeof tail_sigs[0], buf, r);
  }
  if (r == -1) {
    snprintf (err, errlen, "%s: reading its first bytes: %s", path,
              strerror (errno));
    return -1;
  }
  if (!fmt)
    return 0;
  /* The advice never names qemu-img convert: the header may be a
   * client's (a guest writes what it likes into its own raw disk), and a
   * qcow2 header can name a backing file, which a conversion would read
   * into the copy (a host file served back to the guest). */
  snprintf (err, errlen, "%s: holds a %s image header, not a raw disk "
            "(clients would see the %s file, not a disk in it). An "
            "image known to be raw (a client may have written this header "
            "into its own disk) is served with format=raw. Otherwise check "
            "it first: if 'qemu-img info %s' shows a backing file, anything "
            "qemu makes from this image reads that file too", path, fmt, fmt,
            path);
  errno = EMEDIUMTYPE;
  return -1;
}

int
backing_file_probe (const char *path, char *err, size_t errlen)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC), r, saved;
  off_t size;

  if (fd == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    return -1;
  }
  size = lseek (fd, 0, SEEK_END);
  if (size == -1) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    close (fd);
    return -1;
  }
  r = file_probe_format (fd, (uint64_t) size, path, err, errlen);
  saved = errno;
  close (fd);
  errno = saved;
  return r == 0 ? 0 : saved == EMEDIUMTYPE ? 1 : -1;
}
