/* Computing, formatting and validating the pmem store layout. */
#include <errno.h>
#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <zlib.h>

#include "foliod/store.h"
#include "foliod/util.h"
#include "store/pmem-layout.h"

_Static_assert (sizeof (struct pmem_header) <= PMEM_HEADER_COPY,
                "a header copy must fit its area");
_Static_assert (sizeof (struct pmem_slot) == 32, "slot entry is on media");

uint32_t
pmem_slot_crc (uint32_t slot, uint64_t folio_index, uint64_t gen)
{
  /* The slot number too: an entry written to the wrong place fails. */
  uint64_t v[3] = { slot, folio_index, gen };

  return (uint32_t) crc32 (0, (const Bytef *) v, sizeof v);
}

#define FAIL(e, ...) \
  do { snprintf (err, errlen, __VA_ARGS__); errno = (e); return -1; } while (0)

static uint64_t
round_up (uint64_t v, uint64_t a)
{
  return (v + a - 1) / a * a;
}

int
pmem_layout_compute (struct pmem_layout *l, const struct pmem_geometry *g,
                     char *err, size_t errlen)
{
  if (!is_power_of_2 (g->folio_size) || !is_power_of_2 (g->block_size) ||
      g->block_size > g->folio_size || g->folio_size > PMEM_DATA_ALIGN)
    FAIL (EINVAL, "pmem store: folio size %" PRIu32 " / block size %" PRIu32
          " unusable", g->folio_size, g->block_size);
  if (g->nslots == 0)
    FAIL (EINVAL, "pmem store: no slots");
  memset (l, 0, sizeof *l);
  l->g = *g;
  l->bitmap_words = store_bitmap_words (g->folio_size / g->block_size);
  /* The tag and the planes in one cache line (or more), never shared. */
  l->bitmap_stride = (uint32_t) round_up ((1 + l->bitmap_words) * 8, 64);
  l->slots_off = PMEM_HEADERS_BYTES;
  l->bitmaps_off = round_up (l->slots_off + (uint64_t) g->nslots *
                             sizeof (struct pmem_slot), 4096);
  l->data_off = round_up (l->bitmaps_off + (uint64_t) g->nslots *
                          l->bitmap_stride, PMEM_DATA_ALIGN);
  l->total_size = l->data_off + (uint64_t) g->nslots * g->folio_size;
  return 0;
}

static uint32_t
header_crc (const struct pmem_header *h)
{
  return (uint32_t) crc32 (0, (const Bytef *) h,
                           offsetof (struct pmem_header, crc));
}

/* What a copy at p holds. */
static enum pmem_copy_state
header_check (const unsigned char *p, struct pmem_header *h)
{
  static const unsigned char zero[sizeof *h];

  memcpy (h, p, sizeof *h);
  if (memcmp (h, zero, sizeof *h) == 0)
    return PMEM_COPY_ZERO;
  if (memcmp (h->magic, PMEM_MAGIC, sizeof h->magic) != 0)
    return PMEM_COPY_BAD_MAGIC;
  /* Before the crc: another version's crc covers another header size. */
  if (h->version != PMEM_LAYOUT_VERSION ||
      h->header_bytes != sizeof (struct pmem_header))
    return PMEM_COPY_BAD_VERSION;
  if (h->crc != header_crc (h))
    return PMEM_COPY_BAD_CRC;
  return PMEM_COPY_OK;
}

const char *
pmem_copy_state_name (enum pmem_copy_state s)
{
  switch (s) {
  case PMEM_COPY_OK: return "valid";
  case PMEM_COPY_ZERO: return "empty";
  case PMEM_COPY_BAD_MAGIC: return "bad magic";
  case PMEM_COPY_BAD_CRC: return "bad checksum";
  case PMEM_COPY_BAD_VERSION: return "other layout version";
  }
  return "?";
}

static void
header_write (struct pmem_meta *pm, int copy)
{
  unsigned char *dst = pm->m->base + (size_t) copy * PMEM_HEADER_COPY;

  pm->hdr.crc = header_crc (&pm->hdr);
  pm->m->memcpy (dst, &pm->hdr, sizeof pm->hdr, 0);   /* copied + persisted */
  pm->cur = copy;
}

void
pmem_layout_update (struct pmem_meta *pm)
{
  pm->hdr.seq++;
  header_write (pm, 1 - pm->cur);
}

void
pmem_layout_update_both (struct pmem_meta *pm)
{
  pmem_layout_update (pm);
  pmem_layout_update (pm);
}

/* "Clean" goes into the next copy only: if that copy is damaged, the
 * older one says "in use" and only dirty blocks are trusted (the warm
 * cache is lost, nothing else).  "In use" goes into both: the older
 * copy may say "clean" (the last stop's), and one damaged newer copy
 * would then have the next open trust every uptodate block, a block
 * torn by a power cut in the middle of a change among them. */
void
pmem_layout_set_clean (struct pmem_meta *pm, bool clean)
{
  if (clean)
    pm->hdr.flags |= PMEM_FLAG_CLEAN;
  else
    pm->hdr.flags &= ~PMEM_FLAG_CLEAN;
  if (clean)
    pmem_layout_update (pm);
  else
    pmem_layout_update_both (pm);
}

static void
header_fill (struct pmem_header *h, const struct pmem_layout *l,
             const struct pmem_backing_id *b)
{
  memset (h, 0, sizeof *h);
  memcpy (h->magic, PMEM_MAGIC, sizeof h->magic);
  h->version = PMEM_LAYOUT_VERSION;
  h->header_bytes = sizeof *h;
  h->folio_size = l->g.folio_size;
  h->block_size = l->g.block_size;
  h->nslots = l->g.nslots;
  h->export_size = l->g.export_size;
  h->bitmap_words = l->bitmap_words;
  h->bitmap_stride = l->bitmap_stride;
  h->slots_off = l->slots_off;
  h->bitmaps_off = l->bitmaps_off;
  h->data_off = l->data_off;
  h->total_size = l->total_size;
  h->backing_size = b->size;
  h->backing_dev = b->dev;
  h->backing_ino = b->ino;
  snprintf (h->backing_spec, sizeof h->backing_spec, "%s", b->spec);
}

int
pmem_layout_format (struct pmem_meta *pm, struct pmem_map *m,
                    const struct pmem_layout *l,
                    const struct pmem_backing_id *b, char *err, size_t errlen)
{
  if (strlen (b->spec) >= PMEM_SPEC_MAX)
    FAIL (ENAMETOOLONG, "pmem store: backing spec longer than %d bytes",
          PMEM_SPEC_MAX - 1);
  if (m->size < l->total_size)
    FAIL (ENOSPC, "pmem store too small: %zu bytes, needs %" PRIu64,
          m->size, l->total_size);
  memset (pm, 0, sizeof *pm);
  pm->m = m;
  pm->l = *l;
  header_fill (&pm->hdr, l, b);
  if (getrandom (pm->hdr.uuid, sizeof pm->hdr.uuid, 0) != sizeof pm->hdr.uuid)
    FAIL (errno, "pmem store: getrandom: %s", strerror (errno));
  pm->hdr.uuid[6] = (pm->hdr.uuid[6] & 0x0f) | 0x40;   /* RFC 4122 v4 */
  pm->hdr.uuid[8] = (pm->hdr.uuid[8] & 0x3f) | 0x80;
  /* Empty slots before any header says this is a store. */
  for (uint32_t i = 0; i < l->g.nslots; i++)
    pmem_layout_slot_set (pm, i, STORE_NO_FOLIO, 0);
  m->memset (m->base + l->bitmaps_off, 0, l->data_off - l->bitmaps_off,
             PMEM2_F_MEM_NODRAIN);
  /* Every record stamped 1 (generations start above it): a zeroed one
   * under a sound entry is then damage, never a torn first set_index. */
  for (uint32_t i = 0; i < l->g.nslots; i++)
    *pmem_layout_bitmap (pm, i) = 1;
  m->persist (m->base + l->slots_off, l->data_off - l->slots_off);
  pm->hdr.flags |= PMEM_FLAG_FORMAT_STAMP;
  pm->hdr.seq = 1;
  header_write (pm, 0);
  pm->hdr.seq = 2;
  header_write (pm, 1);
  pm->state[0] = pm->state[1] = PMEM_COPY_OK;
  pm->seq[0] = 1;
  pm->seq[1] = 2;
  return 0;
}

/* Pick the winning copy.  0, 1 (both zero) or -1 with err. */
static int
layout_pick (struct pmem_meta *pm, const char *path, char *err, size_t errlen)
{
  struct pmem_header h[2];

  for (int i = 0; i < 2; i++) {
    pm->state[i] = header_check (pm->m->base + i * PMEM_HEADER_COPY, &h[i]);
    pm->seq[i] = h[i].seq;
  }
  bool ok0 = pm->state[0] == PMEM_COPY_OK, ok1 = pm->state[1] == PMEM_COPY_OK;
  if (ok0 || ok1) {
    pm->cur = ok0 && (!ok1 || h[0].seq > h[1].seq) ? 0 : 1;
    pm->hdr = h[pm->cur];
    return 0;
  }
  if (pm->state[0] == PMEM_COPY_ZERO && pm->state[1] == PMEM_COPY_ZERO)
    return 1;
  if (pm->state[0] == PMEM_COPY_BAD_VERSION ||
      pm->state[1] == PMEM_COPY_BAD_VERSION) {
    const struct pmem_header *v =
      &h[pm->state[0] == PMEM_COPY_BAD_VERSION ? 0 : 1];
    FAIL (EPROTO, "%s: store layout version %" PRIu32 " (header %" PRIu32
          " bytes); this foliod reads version %d: write its dirty data "
          "back with the foliod that made it ('foliod store writeback'), "
          "then remove the file (a new store is made at start)", path,
          v->version, v->header_bytes, PMEM_LAYOUT_VERSION);
  }
  if (pm->state[0] == PMEM_COPY_BAD_CRC || pm->state[1] == PMEM_COPY_BAD_CRC)
    FAIL (EBADMSG, "%s: both store headers are corrupt (A: %s, B: %s)", path,
          pmem_copy_state_name (pm->state[0]),
          pmem_copy_state_name (pm->state[1]));
  FAIL (EINVAL, "%s: not a foliod store (bad magic)", path);
}

/* The header's own layout must be what its geometry gives. */
static int
layout_self_check (struct pmem_meta *pm, const char *path,
                   char *err, size_t errlen)
{
  const struct pmem_header *h = &pm->hdr;
  struct pmem_geometry g = { h->folio_size, h->block_size, h->nslots,
                             h->export_size };
  struct pmem_layout *l = &pm->l;

  if (pmem_layout_compute (l, &g, err, errlen) == -1 ||
      l->bitmap_words != h->bitmap_words ||
      l->bitmap_stride != h->bitmap_stride || l->slots_off != h->slots_off ||
      l->bitmaps_off != h->bitmaps_off || l->data_off != h->data_off ||
      l->total_size != h->total_size)
    FAIL (EBADMSG, "%s: store header is inconsistent with its geometry",
          path);
  if (h->total_size > pm->m->size)
    FAIL (ENOSPC, "%s: store truncated: its header needs %" PRIu64
          " bytes, the file has %zu", path, h->total_size, pm->m->size);
  return 0;
}

static int
layout_match (const struct pmem_header *h, const struct pmem_geometry *g,
              const struct pmem_backing_id *b, const char *path,
              char *err, size_t errlen)
{
  if (g && (h->folio_size != g->folio_size || h->block_size != g->block_size ||
            h->nslots != g->nslots || h->export_size != g->export_size))
    FAIL (EINVAL, "%s: store has another geometry: folio-size %" PRIu32
          ", block-size %" PRIu32 ", %" PRIu32 " slots, export %" PRIu64
          " bytes; the export wants %" PRIu32 ", %" PRIu32 ", %" PRIu32
          ", %" PRIu64, path, h->folio_size, h->block_size, h->nslots,
          h->export_size, g->folio_size, g->block_size, g->nslots,
          g->export_size);
  if (b && (strcmp (h->backing_spec, b->spec) != 0 ||
            h->backing_size != b->size))
    FAIL (EINVAL, "%s: store belongs to another backing: '%s' (%" PRIu64
          " bytes), the export has '%s' (%" PRIu64 " bytes)", path,
          h->backing_spec, h->backing_size, b->spec, b->size);
  if (b && (h->backing_dev != b->dev || h->backing_ino != b->ino))
    FAIL (EINVAL, "%s: store belongs to another backing: '%s' is now another "
          "file (device/inode %" PRIu64 "/%" PRIu64 ", was %" PRIu64 "/%"
          PRIu64 ")", path, b->spec, b->dev, b->ino, h->backing_dev,
          h->backing_ino);
  return 0;
}

int
pmem_layout_open (struct pmem_meta *pm, struct pmem_map *m,
                  const struct pmem_geometry *want_g,
                  const struct pmem_backing_id *want_b,
                  const char *path, char *err, size_t errlen)
{
  int r;

  memset (pm, 0, sizeof *pm);
  pm->m = m;
  if (m->size < PMEM_HEADERS_BYTES)
    FAIL (ENOSPC, "%s: store truncated: %zu bytes, smaller than its headers",
          path, m->size);
  r = layout_pick (pm, path, err, errlen);
  if (r != 0)
    return r;
  if (layout_self_check (pm, path, err, errlen) == -1 ||
      layout_match (&pm->hdr, want_g, want_b, path, err, errlen) == -1)
    return -1;
  return 0;
}
