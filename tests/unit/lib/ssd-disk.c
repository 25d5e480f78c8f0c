/* See ssd-disk.h. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "ssd-disk.h"

struct disk_dev {
  struct ssd_dev d;             /* first: the store's handle */
  struct ssd_disk *k;
};

static struct ssd_disk *
disk_of (struct ssd_dev *d)
{
  return ((struct disk_dev *) d)->k;
}

static int
disk_pwrite (struct ssd_dev *d, const void *buf, size_t len, uint64_t off)
{
  struct ssd_disk *k = disk_of (d);

  if (off + len > k->size)
    abort ();                   /* the store wrote past its device */
  if (k->before_write)
    k->before_write (k, buf, len, off);
  memcpy (k->bytes + off, buf, len);
  k->written += len;
  return 0;
}

static int
disk_pread (struct ssd_dev *d, void *buf, size_t len, uint64_t off)
{
  struct ssd_disk *k = disk_of (d);

  if (off + len > k->size)
    abort ();
  memcpy (buf, k->bytes + off, len);
  return 0;
}

static int
disk_flush (struct ssd_dev *d)
{
  struct ssd_disk *k = disk_of (d);

  if (k->flush_fails > 0) {
    k->flush_fails--;
    if (k->durable)
      memcpy (k->bytes, k->durable, k->size);
    errno = EIO;
    return -1;
  }
  if (k->durable)
    memcpy (k->durable, k->bytes, k->size);
  k->flushes++;
  return 0;
}

static void
disk_close (struct ssd_dev *d)
{
  free (d);
}

static const struct ssd_dev_ops disk_ops = {
  disk_pwrite, disk_pread, disk_flush, disk_close,
};

struct store *
ssd_disk_open (struct ssd_disk *k, const struct store_config *cfg,
               char *err, size_t errlen)
{
  struct disk_dev *dd = calloc (1, sizeof *dd);

  if (dd == NULL) {
    errno = ENOMEM;
    return NULL;
  }
  dd->d.ops = &disk_ops;
  dd->d.size = k->size;
  dd->k = k;
  err[0] = '\0';
  return store_ssd_open_dev (cfg, &dd->d, err, errlen);
}
