/* The on-disk layout of the SSD log store (store=ssd:PATH), and the
 * device it is written through.
 *
 *   0        superblock copy A (4 KiB)
 *   4 KiB    superblock copy B
 *   8 KiB    the log: a ring of log_bytes bytes
 *
 * The log is a sequence of batches, each at a 4 KiB boundary: a 4 KiB
 * header (its first sector, and a copy of it in the second) listing up
 * to SSD_ENTRIES entries, then the data of its data entries, one block
 * each, in entry order (padded to 4 KiB).  An entry
 * says "block b of folio f now holds this data" (with the data's crc32),
 * or with SSD_ENT_CLEAN "block b of folio f is clean: forget older
 * records".  Positions in the log are LSNs, byte offsets in an endless
 * log; the ring holds lsn at log_off + lsn % log_bytes.  A batch never
 * crosses the end of the ring: one that does not fit starts at the next
 * lap.  Batches carry consecutive sequence numbers and the store's
 * epoch (one more at every open), so a leftover of an older lap or of a
 * run before a crash never continues the log.
 *
 * The superblock is written twice, alternately, each copy with a sequence
 * number and a crc32 (the pmem header's scheme): a torn write leaves the
 * other copy.  It holds the geometry, the backing's identity and the
 * checkpoint: where the log starts (tail_lsn, tail_seq), and after a clean
 * stop that nothing is to be replayed.  Integers in host byte order. */
#ifndef FOLIOD_SSD_LAYOUT_H
#define FOLIOD_SSD_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#include "foliod/store.h"

#define SSD_MAGIC        "FOLIODSL"
#define SSD_BATCH_MAGIC  "FOLIODSB"
#define SSD_VERSION      1
#define SSD_ALIGN        4096u     /* O_DIRECT: every I/O, buffer and offset */
#define SSD_SUPER_COPY   4096u
#define SSD_LOG_OFF      (2 * SSD_SUPER_COPY)
#define SSD_SPEC_MAX     1024
#define SSD_FLAG_CLEAN   1u        /* stopped cleanly: nothing to replay */
#define SSD_FLAG_DOUBT   2u        /* writes in doubt (set_doubt) */
#define SSD_FLAG_FENCED  4u        /* the image was lost (set_fenced) */
#define SSD_FLAG_PT_LOST 8u        /* passthrough writes were lost
                                    * (set_pt_lost) */
#define SSD_BATCH_DATA   (1u << 20)   /* data bytes per batch, at most */

struct ssd_super {
  char magic[8];
  uint32_t version;
  uint32_t super_bytes;     /* sizeof (struct ssd_super) of its writer */
  uint64_t seq;             /* the newer valid copy wins */
  uint8_t uuid[16];         /* every batch carries it */
  uint32_t flags;           /* SSD_FLAG_* */
  uint32_t folio_size, block_size, nslots;
  uint64_t export_size;
  uint64_t log_off, log_bytes;
  uint64_t epoch;           /* batches from now on carry this one */
  uint64_t tail_lsn, tail_seq;   /* the checkpoint: the scan starts here */
  uint64_t backing_size, backing_dev, backing_ino;
  char backing_spec[SSD_SPEC_MAX];
  uint32_t crc;             /* crc32 of every byte before it */
  uint32_t pad;
};

#define SSD_ENT_CLEAN 1u

struct ssd_entry {
  uint64_t folio;
  uint32_t block;
  uint32_t flags;           /* SSD_ENT_CLEAN: no data */
  uint32_t crc;             /* crc32 of the block's data */
  uint32_t pad;
};

struct ssd_batch {
  char magic[8];
  uint8_t uuid[16];
  uint64_t seq, epoch, lsn;
  uint64_t flushed_lsn;     /* the log was durable up to here when this
                             * batch was written (a bad block before it is
                             * damage, after it a torn write) */
  uint32_t nentries, ndata;
  uint32_t crc;             /* crc32 of the 4 KiB header, this field 0 */
  uint32_t flags;           /* SSD_BATCH_* */
};

/* A compaction's first and last batch.  A complete compaction (every
 * batch sound) restates every block the log held: recovery starts there
 * even when the checkpoint that was to move the log's start was lost. */
#define SSD_BATCH_FIRST 1u
#define SSD_BATCH_LAST  2u

/* The header and its entries fill the batch's first 512-byte sector
 * (the rest of its 4 KiB is zeros but for the copy): a sector is written
 * whole or not at all, so a torn header is never half of one batch and
 * half of another written later at the same place, with the same
 * sequence number, after a recovery (its checksum could match the older
 * one).  The second sector holds a copy of the first, written with it:
 * one damaged sector leaves a sound copy, so the log's last commit,
 * which no later header proves flushed, is not taken for a torn write
 * when one sector of its header is damaged. */
#define SSD_HEADER_BYTES 512u
#define SSD_ENTRIES ((SSD_HEADER_BYTES - sizeof (struct ssd_batch)) / \
                     sizeof (struct ssd_entry))

/* A batch header as written: the fixed part, then the entries. */
static inline struct ssd_entry *
ssd_batch_entries (struct ssd_batch *b)
{
  return (struct ssd_entry *) (b + 1);
}

/* The device the log lives on: a file or a block device (ssd-dev.c), or
 * the unit tests' simulated disk.  Each call moves whole buffers or fails
 * (-1, errno). */
struct ssd_dev;
struct ssd_dev_ops {
  int (*pwrite) (struct ssd_dev *d, const void *buf, size_t len, uint64_t off);
  int (*pread) (struct ssd_dev *d, void *buf, size_t len, uint64_t off);
  int (*flush) (struct ssd_dev *d);       /* the device's cache too */
  void (*close) (struct ssd_dev *d);
};
struct ssd_dev {
  const struct ssd_dev_ops *ops;
  uint64_t size;
  bool created;             /* made now by ssd_dev_open_file (all zeros) */
};

/* Open path as a log device (created with create_size bytes when missing
 * or empty), O_DIRECT where the file system has it, locked against a
 * second foliod; writable, a file is allocated whole at every open (one
 * made with truncate on a filling file system fails here, not at a
 * commit).  NULL with errno and err. */
struct ssd_dev *ssd_dev_open_file (const char *path, uint64_t create_size,
                                   bool readonly, char *err, size_t errlen);

/* Superblocks: read both copies of dev into *sb (the newer valid one);
 * 0, 1 when both are all zeros, -1 with errno and err.  *other_bad: the
 * other copy is damaged (or blank), so *sb may be the older one: one
 * write behind, its checkpoint and clean flag stale, its epoch one less
 * than the batches of the run it did not see. */
int ssd_super_read (struct ssd_dev *d, struct ssd_super *sb, int *cur,
                    bool *other_bad, const char *path, char *err,
                    size_t errlen);
/* Write sb (seq + 1) over the older copy (*cur flips).  Not flushed. */
int ssd_super_write (struct ssd_dev *d, struct ssd_super *sb, int *cur);

uint32_t ssd_batch_crc (const struct ssd_batch *b);
uint32_t ssd_data_crc (const void *p, size_t len);

/* The store_kind functions (store-kinds.c) and the tests' way in. */
struct store *store_ssd_open (const struct store_config *cfg,
                              char *err, size_t errlen);
/* As store_ssd_open, on an open device (the store owns it, failing too). */
struct store *store_ssd_open_dev (const struct store_config *cfg,
                                  struct ssd_dev *d, char *err, size_t errlen);
int store_ssd_inspect (const char *path, FILE *out, char *err, size_t errlen);
int store_ssd_read_header (const char *path, struct store_header_info *out,
                           char *err, size_t errlen);

/* The log a new store file gets for a cache of cache_bytes, and the least
 * a log must have: room for twice what a compaction may write. */
uint64_t ssd_log_default (uint64_t cache_bytes);
uint64_t ssd_compaction_max (uint32_t nslots, uint32_t folio_size,
                             uint32_t block_size);

/* What the store did (its stats op says part of it). */
struct ssd_stats {
  uint64_t syncs, batches, records, compactions;
  uint64_t reclaims, reclaimed;  /* checkpoint moves, bytes they freed */
  uint64_t recopies;             /* block copies a write overlapped */
  uint64_t sync_ns_total, sync_ns_max;
  uint64_t hold_slots_max;       /* the most slots a commit looked at in
                                  * one hold of the store's lock, which
                                  * every client write takes */
};

/* A commit looks at this many blocks (of whole slots, one slot at
 * least) per hold of the store's lock, whatever the cache's size. */
#define SSD_HOLD_BLOCKS 1024u

/* What the ssd store s did (once no commit runs). */
void store_ssd_get_stats (struct store *s, struct ssd_stats *out);

#endif /* FOLIOD_SSD_LAYOUT_H */
