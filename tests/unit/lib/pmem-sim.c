/* See pmem-sim.h. */
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
