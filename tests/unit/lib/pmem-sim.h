/* A pmem_map over simulated memory for the store and cache crash tests:
 * every store-side write that libpmem2 would persist (persist, flush,
 * the non-temporal memcpy/memset, msync) calls the test's commit hook,
 * which decides what reaches the simulated media. */
#ifndef FOLIOD_TEST_PMEM_SIM_H
#define FOLIOD_TEST_PMEM_SIM_H

#include <stddef.h>

#include "cache/pmem-map.h"

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

#endif /* FOLIOD_TEST_PMEM_SIM_H */
