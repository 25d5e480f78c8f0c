/* A pmem_map over simulated memory for the store and cache crash tests:
 * every store-side write that libpmem2 would persist (persist, flush,
 * the non-temporal memcpy/memset, msync) calls the test's commit hook,
 * which decides what reaches the simulated media. */
#ifndef FOLIOD_TEST_PMEM_SIM_H
#define FOLIOD_TEST_PMEM_SIM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/pmem-map.h"

typedef void pmem_sim_commit_fn (const void *p, size_t len);

/* Fill *m for base[0, size) with granularity gran; commit gets every
 * persisted range.  One simulation at a time (the hook is global). */
void pmem_sim_map (struct pmem_map *m, void *base, size_t size,
                   enum pmem2_granularity gran, pmem_sim_commit_fn *commit);

/* Called at each msync (page granularity) before it commits: returns 0,
 * or -1 with errno to fail it (nothing committed).  NULL (the default,
 * and after every pmem_sim_map): every msync succeeds. */
typedef int pmem_sim_sync_fn (const void *p, size_t len);
void pmem_sim_on_sync (pmem_sim_sync_fn *fn);

/* Simulated persistent media for the crash tests: "live" is what the CPU
 * sees (the map's base), "media" what would survive a power cut.  A commit
 * copies the words it covers from live to media, until persists_left
 * commits have been made: then the power goes (live is kept in snap as it
 * was then) and nothing more persists. */
struct pmem_sim_media {
  uint64_t *live, *media, *snap;
  uint64_t region[2][2];  /* the byte ranges [from, to) the test uses */
  unsigned nregions;
  long persists_left;     /* the power goes at the commit finding 0; -1 never */
  bool power_off;
  bool page_mode;         /* unpersisted data is torn per 512-byte sector
                             (page store), else per 8-byte word */
  unsigned *seed;         /* rand_r state: which torn pieces are new */
};

/* Give s its three buffers of size bytes (zeroed) and one region, the
 * whole of it; -1 if out of memory. */
int pmem_sim_media_init (struct pmem_sim_media *s, size_t size,
                         unsigned *seed);
void pmem_sim_media_free (struct pmem_sim_media *s);

/* What the map's commit hook calls for a persisted range of live. */
void pmem_sim_media_commit (struct pmem_sim_media *s, const void *p,
                            size_t len);

/* The power goes now (if it has not yet): live is kept in snap, and no
 * commit persists anything more. */
void pmem_sim_media_power_off (struct pmem_sim_media *s);

/* The power went (each unpersisted word or sector of the regions comes
 * back new or old at random), or with kill, the process was killed (a
 * shared mapping keeps memory as it was).  Then the power is on again. */
void pmem_sim_media_crash (struct pmem_sim_media *s, bool kill);

#endif /* FOLIOD_TEST_PMEM_SIM_H */
