/* The on-media layout of a pmem store, versioned and self-describing:
 *
 *   0        header copy A  (PMEM_HEADER_COPY bytes)
 *   4 KiB    header copy B
 *   8 KiB    slot table: per slot { folio index, generation, crc32 }
 *   ...      slot bitmaps: per slot { generation tag, the FP_* planes }
 *   2 MiB-aligned: folio data, nslots * folio_size
 *
 * Each header copy carries a sequence number and a crc32; the newer valid
 * copy wins, and an update always writes the other one, so a torn header
 * write leaves the previous header valid.  A slot's bitmap carries the
 * generation of the slot entry it belongs to: bits whose tag differs from
 * the entry are not the folio's (a reuse whose writes reached the media in
 * another order) and are not trusted.  A slot entry carries a crc32 of
 * its slot number, folio index and generation: an entry whose crc fails
 * was torn by a crash inside set_index (then neither its old nor its new
 * folio has dirty bits: nothing is lost by dropping it) or damaged on the
 * media (if its bitmap holds dirty blocks, they are reported and written
 * nowhere: their folio is unknown).  Integers are in host byte order.
 *
 * Version 2 (issue 23): the slot entry's crc; the backing's mtime and
 * ctime recorded at a clean shutdown.  Version 1 stores are refused. */
#ifndef FOLIOD_PMEM_LAYOUT_H
#define FOLIOD_PMEM_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/pmem-map.h"
#include "foliod/store.h"

#define PMEM_MAGIC          "FOLIODPM"
#define PMEM_LAYOUT_VERSION 2
#define PMEM_HEADER_COPY    4096u
#define PMEM_HEADERS_BYTES  (2 * PMEM_HEADER_COPY)
#define PMEM_DATA_ALIGN     (2u << 20)   /* huge pages, device-DAX alignment */
#define PMEM_SPEC_MAX       1024         /* backing spec, NUL included */
#define PMEM_FLAG_CLEAN     1u           /* shut down cleanly: all trusted */
#define PMEM_FLAG_STAMPED   2u           /* backing_mtime/ctime_ns recorded
                                          * at the clean shutdown */
#define PMEM_FLAG_DOUBT     4u           /* writes in doubt (set_doubt) */
#define PMEM_FLAG_FENCED    8u           /* the image was lost (set_fenced) */
#define PMEM_FLAG_FORMAT_STAMP 16u        /* format stamped every bitmap
                                          * record 1: a stamp of 0 under a
                                          * sound entry is damage */
#define PMEM_FLAG_PT_LOST   32u          /* passthrough writes were lost
                                          * (set_pt_lost) */

struct pmem_geometry {
  uint32_t folio_size, block_size, nslots;
  uint64_t export_size;
};

/* What the store caches: a store is only ever used with its own backing. */
struct pmem_backing_id {
  const char *spec;   /* the export's backing spec string */
  uint64_t size;
  uint64_t dev, ino;  /* files: st_dev, st_ino; otherwise 0 */
};

/* Sizes and offsets, all computed from a geometry. */
struct pmem_layout {
  struct pmem_geometry g;
  uint32_t bitmap_words;    /* uint64_t words of one slot's planes */
  uint32_t bitmap_stride;   /* bytes per slot bitmap record (tag + planes) */
  uint64_t slots_off, bitmaps_off, data_off, total_size;
};

struct pmem_slot {
  uint64_t folio_index;     /* STORE_NO_FOLIO when free */
  uint64_t gen;             /* store-wide, grows at each set_index */
  uint32_t crc;             /* pmem_slot_crc of the slot, index and gen */
  uint32_t pad;
  uint64_t pad2;            /* 32 bytes: one per half cache line */
};

struct pmem_header {
  char magic[8];
  uint32_t version;
  uint32_t header_bytes;    /* sizeof (struct pmem_header) of its writer */
  uint64_t seq;             /* the newer valid copy wins */
  uint8_t uuid[16];
  uint32_t flags;           /* PMEM_FLAG_* */
  uint32_t folio_size, block_size, nslots;
  uint64_t export_size;
  uint32_t bitmap_words, bitmap_stride;
  uint64_t slots_off, bitmaps_off, data_off, total_size;
  uint64_t backing_size, backing_dev, backing_ino;
  uint64_t backing_mtime_ns, backing_ctime_ns;   /* PMEM_FLAG_STAMPED */
  char backing_spec[PMEM_SPEC_MAX];
  uint32_t crc;             /* crc32 of every byte before it */
  uint32_t pad;
};

enum pmem_copy_state {
  PMEM_COPY_OK, PMEM_COPY_ZERO, PMEM_COPY_BAD_MAGIC, PMEM_COPY_BAD_CRC,
  PMEM_COPY_BAD_VERSION,
};

/* An opened layout: the mapping, the computed layout, the current header. */
struct pmem_meta {
  struct pmem_map *m;
  struct pmem_layout l;
  struct pmem_header hdr;          /* the winning copy, as last written */
  int cur;                         /* which copy hdr is (0 = A, 1 = B) */
  enum pmem_copy_state state[2];   /* as found at open */
  uint64_t seq[2];
};

/* Fill l for geometry g.  0, or -1/EINVAL with err. */
int pmem_layout_compute (struct pmem_layout *l, const struct pmem_geometry *g,
                         char *err, size_t errlen);

/* Write a new, empty store for l and backing b into m (slot table and
 * bitmaps cleared, then both header copies).  Not clean. */
int pmem_layout_format (struct pmem_meta *pm, struct pmem_map *m,
                        const struct pmem_layout *l,
                        const struct pmem_backing_id *b,
                        char *err, size_t errlen);

/* Read and check the headers of m.  want_g and want_b (either may be NULL:
 * inspection) must match the store.  Returns 0, 1 when both copies are all
 * zeros (never formatted), or -1/errno with one line in err naming path. */
int pmem_layout_open (struct pmem_meta *pm, struct pmem_map *m,
                      const struct pmem_geometry *want_g,
                      const struct pmem_backing_id *want_b,
                      const char *path, char *err, size_t errlen);

/* Write pm->hdr as the older copy with seq + 1, persisted; it then wins. */
void pmem_layout_update (struct pmem_meta *pm);
/* The same into both copies, one after the other: for what must outlive
 * one damaged copy (an older copy without it would win then). */
void pmem_layout_update_both (struct pmem_meta *pm);
void pmem_layout_set_clean (struct pmem_meta *pm, bool clean);

const char *pmem_copy_state_name (enum pmem_copy_state s);

static inline struct pmem_slot *
pmem_layout_slot (const struct pmem_meta *pm, uint32_t slot)
{
  return (struct pmem_slot *) (pm->m->base + pm->l.slots_off) + slot;
}

/* The slot's bitmap record: word 0 is the generation tag, the planes follow. */
static inline uint64_t *
pmem_layout_bitmap (const struct pmem_meta *pm, uint32_t slot)
{
  return (uint64_t *) (pm->m->base + pm->l.bitmaps_off +
                       (size_t) slot * pm->l.bitmap_stride);
}

static inline void *
pmem_layout_data (const struct pmem_meta *pm, uint32_t slot)
{
  return pm->m->base + pm->l.data_off + (size_t) slot * pm->l.g.folio_size;
}

/* A slot entry's checksum; the entry is sound when its crc equals it. */
uint32_t pmem_slot_crc (uint32_t slot, uint64_t folio_index, uint64_t gen);

/* Fill slot's entry (not persisted: the caller does). */
static inline void
pmem_layout_slot_set (const struct pmem_meta *pm, uint32_t slot,
                      uint64_t folio_index, uint64_t gen)
{
  struct pmem_slot *e = pmem_layout_slot (pm, slot);

  e->folio_index = folio_index;
  e->gen = gen;
  e->crc = pmem_slot_crc (slot, folio_index, gen);
}

static inline bool
pmem_layout_slot_sound (const struct pmem_meta *pm, uint32_t slot)
{
  const struct pmem_slot *e = pmem_layout_slot (pm, slot);
  return e->crc == pmem_slot_crc (slot, e->folio_index, e->gen);
}

/* The planes of a slot bitmap, blocks bits each, are enum folio_plane's,
 * in its order: layout version 2 has them so on the media. */
_Static_assert (FP_UPTODATE == 0 && FP_DIRTY == 1 && FP_UNSTABLE == 2 &&
                FP_NPLANES == 3, "pmem layout 2: the plane order changed "
                "(bump PMEM_LAYOUT_VERSION)");

static inline bool
pmem_plane_test (const uint64_t *bits, uint32_t blocks, int plane,
                 uint32_t blk)
{
  uint32_t i = (uint32_t) plane * blocks + blk;
  return bits[i / 64] & (1ull << (i % 64));
}

static inline void
pmem_plane_assign (uint64_t *bits, uint32_t blocks, int plane, uint32_t blk,
                   bool on)
{
  uint32_t i = (uint32_t) plane * blocks + blk;
  if (on)
    bits[i / 64] |= 1ull << (i % 64);
  else
    bits[i / 64] &= ~(1ull << (i % 64));
}

/* Does any block say dirty or unstable (what recovery trusts)? */
static inline bool
pmem_bits_dirty_or_unstable (const uint64_t *bits, uint32_t blocks)
{
  for (uint32_t b = 0; b < blocks; b++)
    if (pmem_plane_test (bits, blocks, FP_DIRTY, b) ||
        pmem_plane_test (bits, blocks, FP_UNSTABLE, b))
      return true;
  return false;
}

/* Does the slot hold a folio whose bitmap is its own (a sound entry, and
 * the bitmap's stamp matches it)? */
static inline bool
pmem_layout_slot_live (const struct pmem_meta *pm, uint32_t slot)
{
  const struct pmem_slot *e = pmem_layout_slot (pm, slot);
  return e->folio_index != UINT64_MAX && pmem_layout_slot_sound (pm, slot) &&
         pmem_layout_bitmap (pm, slot)[0] == e->gen;
}

/* A bitmap record nothing but damage writes: a bit past the planes or a
 * word of the stride's padding set (format clears them, set_index and
 * the cache write the planes only), or a stamp of 0 once format stamps
 * every record 1 (PMEM_FLAG_FORMAT_STAMP: a zeroed sector, a discard). */
static inline bool
pmem_layout_record_garbled (const struct pmem_meta *pm, uint32_t slot)
{
  uint32_t blocks = pm->l.g.folio_size / pm->l.g.block_size;
  const uint64_t *rec = pmem_layout_bitmap (pm, slot);
  uint32_t used = FP_NPLANES * blocks;

  if (rec[0] == 0 && (pm->hdr.flags & PMEM_FLAG_FORMAT_STAMP))
    return true;
  if (used % 64 && rec[1 + used / 64] >> (used % 64))
    return true;
  for (uint32_t w = 1 + pm->l.bitmap_words; w < pm->l.bitmap_stride / 8; w++)
    if (rec[w])
      return true;
  return false;
}

/* A damaged entry or bitmap record: a crash cannot leave dirty or
 * unstable blocks under an entry whose crc fails (a slot takes a new
 * folio only once its bits are clear on the media), nor a garbled record
 * under a sound entry (its blocks unknown: all counted).  Returns how
 * many blocks, 0 for a sound or merely torn entry. */
static inline uint32_t
pmem_layout_slot_damaged (const struct pmem_meta *pm, uint32_t slot)
{
  uint32_t blocks = pm->l.g.folio_size / pm->l.g.block_size, n = 0;
  const uint64_t *rec = pmem_layout_bitmap (pm, slot);
  const uint64_t *bits = rec + 1;
  const struct pmem_slot *e = pmem_layout_slot (pm, slot);

  if (pmem_layout_slot_sound (pm, slot)) {
    if (e->folio_index == UINT64_MAX)
      return 0;
    return pmem_layout_record_garbled (pm, slot) ? blocks : 0;
  }
  for (uint32_t b = 0; b < blocks; b++)
    n += pmem_plane_test (bits, blocks, FP_DIRTY, b) ||
         pmem_plane_test (bits, blocks, FP_UNSTABLE, b);
  return n;
}

#endif /* FOLIOD_PMEM_LAYOUT_H */
