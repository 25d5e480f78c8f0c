/* A disk in memory for the ssd store's unit tests, its bytes at device
 * offsets (bytes[off] is the device's byte off, so a test can read and
 * damage the layout in place).  Every write is durable at once: a copy
 * of the bytes is the disk after a kill or a power cut.  A test may
 * watch each write before it lands (a kill in the middle of one), and
 * make the device's flushes fail (a failed fdatasync, which may drop the
 * writes it was to make durable). */
#ifndef FOLIOD_TEST_SSD_DISK_H
#define FOLIOD_TEST_SSD_DISK_H

#include <stddef.h>
#include <stdint.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"

struct ssd_disk {
  unsigned char *bytes;
  uint64_t size;
  uint64_t written;             /* bytes written to it so far */
  unsigned flush_fails;         /* the next flushes that fail, EIO */
  /* NULL, or size bytes: what the last good flush made durable.  A
   * failed flush then drops every write since (bytes revert to it), as
   * a device cache lost with a failed fdatasync. */
  unsigned char *durable;
  uint64_t flushes;             /* flushes that succeeded */
  /* Called with each write before it lands (NULL: none). */
  void (*before_write) (struct ssd_disk *k, const void *buf, size_t len,
                        uint64_t off);
};

/* The store on disk k, opened as foliod opens one (the device it opens
 * is k's, until the store is destroyed); NULL with err. */
struct store *ssd_disk_open (struct ssd_disk *k,
                             const struct store_config *cfg, char *err,
                             size_t errlen);

#endif /* FOLIOD_TEST_SSD_DISK_H */
