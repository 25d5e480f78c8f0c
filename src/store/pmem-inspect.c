/* foliod store inspect PATH: what a pmem store holds, read offline. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "foliod/store.h"
#include "store/pmem-layout.h"

static void
inspect_uuid (const uint8_t *u, char out[37])
{
  snprintf (out, 37, "%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-"
            "%02x%02x%02x%02x%02x%02x", u[0], u[1], u[2], u[3], u[4], u[5],
            u[6], u[7], u[8], u[9], u[10], u[11], u[12], u[13], u[14], u[15]);
}

/* Folios held and their dirty and unstable blocks, as recovery sees them. */
static void
inspect_slots (const struct pmem_meta *pm, FILE *out)
{
  uint32_t blocks = pm->l.g.folio_size / pm->l.g.block_size, folios = 0;
  uint32_t damaged = 0;
  uint64_t dirty = 0, unstable = 0, lost = 0;

  for (uint32_t i = 0; i < pm->l.g.nslots; i++) {
    uint32_t d = pmem_layout_slot_damaged (pm, i);
    damaged += d > 0;
    lost += d;
    if (!pmem_layout_slot_live (pm, i))
      continue;
    const uint64_t *bits = pmem_layout_bitmap (pm, i) + 1;
    folios++;
    for (uint32_t b = 0; b < blocks; b++) {
      dirty += pmem_plane_test (bits, blocks, FP_DIRTY, b);
      unstable += pmem_plane_test (bits, blocks, FP_UNSTABLE, b);
    }
  }
  fprintf (out, "folios: %" PRIu32 " of %" PRIu32 " slots\n", folios,
           pm->l.g.nslots);
  fprintf (out, "dirty: %" PRIu64 " bytes\n", dirty * pm->l.g.block_size);
  fprintf (out, "unstable: %" PRIu64 " bytes\n",
           unstable * pm->l.g.block_size);
  if (damaged)   /* recovery reports them and writes their data nowhere */
    fprintf (out, "damaged slot entries: %" PRIu32 " (checksum), over %"
             PRIu64 " dirty bytes of unknown offset\n", damaged,
             lost * pm->l.g.block_size);
}

static void
inspect_print (const struct pmem_meta *pm, const char *path, FILE *out)
{
  const struct pmem_header *h = &pm->hdr;
  char uuid[37];

  fprintf (out, "store: %s\n", path);
  for (int i = 0; i < 2; i++)
    fprintf (out, "header %c: %s, seq %" PRIu64 "%s\n", 'A' + i,
             pmem_copy_state_name (pm->state[i]), pm->seq[i],
             i == pm->cur ? " (current)" : "");
  inspect_uuid (h->uuid, uuid);
  fprintf (out, "layout: version %" PRIu32 ", uuid %s, %" PRIu64 " bytes\n",
           h->version, uuid, h->total_size);
  fprintf (out, "geometry: folio-size %" PRIu32 ", block-size %" PRIu32
           ", slots %" PRIu32 ", export-size %" PRIu64 "\n", h->folio_size,
           h->block_size, h->nslots, h->export_size);
  fprintf (out, "backing: %s, %" PRIu64 " bytes", h->backing_spec,
           h->backing_size);
  if (h->backing_dev || h->backing_ino)
    fprintf (out, ", device %" PRIu64 " inode %" PRIu64, h->backing_dev,
             h->backing_ino);
  fprintf (out, "\nstate: %s\n", (h->flags & PMEM_FLAG_CLEAN) ? "clean"
           : "not clean (in use, or not shut down cleanly)");
  if (h->flags & PMEM_FLAG_DOUBT)
    fprintf (out, "writes in doubt: the backing is not trusted with this "
             "data until 'foliod clear-doubt'\n");
  if (h->flags & PMEM_FLAG_FENCED)
    fprintf (out, "fenced: written under an image lock that was lost; not "
             "written back until 'foliod clear-doubt'\n");
  if (h->flags & PMEM_FLAG_PT_LOST)
    fprintf (out, "passthrough writes lost: every FLUSH fails until "
             "'foliod clear-doubt'\n");
  if (h->flags & PMEM_FLAG_STAMPED)   /* what a warm start compares */
    fprintf (out, "backing at clean shutdown: mtime %" PRIu64 ".%09" PRIu64
             ", ctime %" PRIu64 ".%09" PRIu64 "\n",
             h->backing_mtime_ns / 1000000000u,
             h->backing_mtime_ns % 1000000000u,
             h->backing_ctime_ns / 1000000000u,
             h->backing_ctime_ns % 1000000000u);
  fprintf (out, "granularity: %s\n",
           pmem_map_granularity_name (pm->m->gran));
  inspect_slots (pm, out);
}

/* Map path read-only (a shared lock) and read its headers.  0, or -1
 * with err (the map is closed then). */
static int
inspect_open (const char *path, struct pmem_map *m, struct pmem_meta *pm,
              char *err, size_t errlen)
{
  int r;

  if (pmem_map_open (m, path, 0, 0, PMEM_MAP_READONLY, err, errlen) == -1)
    return -1;
  r = pmem_layout_open (pm, m, NULL, NULL, path, err, errlen);
  if (r == 1) {
    snprintf (err, errlen, "%s: not a foliod store (never formatted)", path);
    errno = EINVAL;
    r = -1;
  }
  if (r != 0)
    pmem_map_close (m);
  return r;
}

int
store_pmem_inspect (const char *path, FILE *out, char *err, size_t errlen)
{
  struct pmem_map m;
  struct pmem_meta pm;

  if (inspect_open (path, &m, &pm, err, errlen) == -1)
    return -1;
  inspect_print (&pm, path, out);
  pmem_map_close (&m);
  return 0;
}

int
store_pmem_read_header (const char *path, struct store_header_info *out,
                        char *err, size_t errlen)
{
  struct pmem_map m;
  struct pmem_meta pm;

  if (inspect_open (path, &m, &pm, err, errlen) == -1)
    return -1;
  const struct pmem_header *h = &pm.hdr;
  out->nslots = h->nslots;
  out->folio_size = h->folio_size;
  out->block_size = h->block_size;
  out->export_size = h->export_size;
  out->backing_size = h->backing_size;
  snprintf (out->backing_spec, sizeof out->backing_spec, "%.*s",
            (int) sizeof h->backing_spec, h->backing_spec);
  pmem_map_close (&m);
  return 0;
}
