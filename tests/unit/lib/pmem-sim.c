/* See pmem-sim.h. */
#include <stdlib.h>
#include <string.h>

#include "pmem-sim.h"

static pmem_sim_commit_fn *sim_commit_hook;
static pmem_sim_sync_fn *sim_sync_hook;

static void sim_persist (const void *p, size_t len) { sim_commit_hook (p, len); }
static void sim_drain (void) { }

static int
sim_sync (void *p, size_t len)
{
  pmem_sim_sync_fn *hook = __atomic_load_n (&sim_sync_hook, __ATOMIC_ACQUIRE);

  if (hook && hook (p, len) == -1)
    return -1;
  sim_commit_hook (p, len);
  return 0;
}

void
pmem_sim_on_sync (pmem_sim_sync_fn *fn)
{
  __atomic_store_n (&sim_sync_hook, fn, __ATOMIC_RELEASE);
}

static void *
sim_memcpy (void *d, const void *s, size_t n, unsigned flags)
{
  memcpy (d, s, n);
  sim_commit_hook (d, n);
  return d;
}

static void *
sim_memset (void *d, int c, size_t n, unsigned flags)
{
  memset (d, c, n);
  sim_commit_hook (d, n);
  return d;
}

void
pmem_sim_map (struct pmem_map *m, void *base, size_t size,
              enum pmem2_granularity gran, pmem_sim_commit_fn *commit)
{
  sim_commit_hook = commit;
  pmem_sim_on_sync (NULL);
  *m = (struct pmem_map) {
    .fd = -1, .base = base, .size = size, .gran = gran,
    .persist = sim_persist, .flush = sim_persist, .drain = sim_drain,
    .memcpy = sim_memcpy, .memset = sim_memset, .sync = sim_sync,
  };
}

/* ---- the simulated media ---- */

int
pmem_sim_media_init (struct pmem_sim_media *s, size_t size, unsigned *seed)
{
  *s = (struct pmem_sim_media) {
    .live = aligned_alloc (4096, size), .media = aligned_alloc (4096, size),
    .snap = aligned_alloc (4096, size), .region = { { 0, size } },
    .nregions = 1, .persists_left = -1, .seed = seed,
  };
  if (s->live == NULL || s->media == NULL || s->snap == NULL) {
    pmem_sim_media_free (s);
    return -1;
  }
  memset (s->live, 0, size);
  memset (s->media, 0, size);
  memset (s->snap, 0, size);
  return 0;
}

void
pmem_sim_media_free (struct pmem_sim_media *s)
{
  free (s->live);
  free (s->media);
  free (s->snap);
  s->live = s->media = s->snap = NULL;
}

void
pmem_sim_media_power_off (struct pmem_sim_media *s)
{
  if (s->power_off)
    return;
  s->power_off = true;
  for (unsigned i = 0; i < s->nregions; i++)
    memcpy (s->snap + s->region[i][0] / 8, s->live + s->region[i][0] / 8,
            s->region[i][1] - s->region[i][0]);
}

void
pmem_sim_media_commit (struct pmem_sim_media *s, const void *p, size_t len)
{
  if (s->persists_left == 0)
    pmem_sim_media_power_off (s);
  if (s->power_off)
    return;
  if (s->persists_left > 0)
    s->persists_left--;
  size_t off = (size_t) ((const unsigned char *) p -
                         (const unsigned char *) s->live);
  size_t w = off / 8, end = (off + len + 7) / 8;
  memcpy (s->media + w, s->live + w, (end - w) * 8);
}

static void
media_tear (struct pmem_sim_media *s, uint64_t from, uint64_t to)
{
  size_t n = s->page_mode ? 512 / 8 : 1;

  for (uint64_t w = from / 8; w < to / 8; w += n) {
    if (memcmp (s->snap + w, s->media + w, n * 8) != 0 &&
        (rand_r (s->seed) & 1))
      memcpy (s->media + w, s->snap + w, n * 8);
    memcpy (s->live + w, s->media + w, n * 8);
  }
}

void
pmem_sim_media_crash (struct pmem_sim_media *s, bool kill)
{
  s->persists_left = -1;
  s->power_off = false;
  for (unsigned i = 0; i < s->nregions; i++)
    if (kill)
      memcpy (s->live + s->region[i][0] / 8, s->snap + s->region[i][0] / 8,
              s->region[i][1] - s->region[i][0]);
    else
      media_tear (s, s->region[i][0], s->region[i][1]);
}
