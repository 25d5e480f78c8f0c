/* See ssd-mem.h. */
#include <string.h>

#include "ssd-mem.h"

static int
mem_pwrite (struct ssd_dev *d, const void *buf, size_t len, uint64_t off)
{
  memcpy ((unsigned char *) (d + 1) + off, buf, len);
  return 0;
}

static int
mem_pread (struct ssd_dev *d, void *buf, size_t len, uint64_t off)
{
  memcpy (buf, (unsigned char *) (d + 1) + off, len);
  return 0;
}

static int mem_flush (struct ssd_dev *d) { (void) d; return 0; }
static void mem_close (struct ssd_dev *d) { (void) d; }

static const struct ssd_dev_ops mem_ops = {
  mem_pwrite, mem_pread, mem_flush, mem_close,
};

struct ssd_dev *
ssd_mem_dev (unsigned char *mem, size_t size)
{
  struct ssd_dev *d = (struct ssd_dev *) mem;

  d->ops = &mem_ops;
  d->size = size - sizeof *d;
  return d;
}
