/* Statistics counters: bumped by any thread, read by the stats getters.
 *
 * Two kinds, one rule for which is which:
 *
 * - Counters bumped by every request (a cache's hits, bytes, backing I/O
 *   of misses, lock waits) are sharded, as the kernel's percpu counters:
 *   STAT_SHARDS copies of the counter struct, each on cache lines of its
 *   own; a thread adds to its own shard (stat_shard: picked once, round
 *   robin, kept in a thread-local) and a reader sums the shards.  So two
 *   threads serving requests never write the same line to count them.
 *   The object keeps them as a pointer named opst to STAT_SHARDED (type),
 *   from stat_shards_new; OPSTAT_ADD (obj, field, n) and
 *   OPSTAT_GET (obj, field) work on them.
 * - Gauges that decide something (dirty bytes: the throttle compares them
 *   with a limit) and events off the request path (a flush, a writeback
 *   error, a throttle wait) are single _Atomic uint64_t fields of a
 *   struct member named st: STAT_ADD (obj, field, n) and
 *   STAT_GET (obj, field) work on obj->st.field.  So are the counters of
 *   an object only one thread bumps (a server loop's).
 *
 * Relaxed order: a counter orders no other memory, and a reader only
 * wants a value that is recent.  A shard is still added to atomically:
 * threads beyond STAT_SHARDS share shards.
 */
#ifndef FOLIOD_STAT_H
#define FOLIOD_STAT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define STAT_ADD(obj, field, n) \
  atomic_fetch_add_explicit (&(obj)->st.field, (n), memory_order_relaxed)
#define STAT_SUB(obj, field, n) \
  atomic_fetch_sub_explicit (&(obj)->st.field, (n), memory_order_relaxed)
#define STAT_GET(obj, field) \
  atomic_load_explicit (&(obj)->st.field, memory_order_relaxed)

/* ---- sharded counters ---- */
#define STAT_SHARDS 16u
#define STAT_LINE 64u

/* One shard of a struct of _Atomic uint64_t counters: its own lines. */
#define STAT_SHARDED(type) struct { _Alignas (STAT_LINE) type v; }

/* The calling thread's shard, [0, STAT_SHARDS). */
extern _Thread_local unsigned stat_shard_plus1; /* 0: none picked yet */
unsigned stat_shard_pick (void);
static inline unsigned
stat_shard (void)
{
  unsigned s = stat_shard_plus1;

  return s != 0 ? s - 1 : stat_shard_pick ();
}

/* STAT_SHARDS zeroed shards of shard_size bytes (sizeof *obj->opst), line
 * aligned; free them with free().  NULL if out of memory. */
void *stat_shards_new (size_t shard_size);
/* The sum of a counter over the shards: first is its address in shard 0. */
uint64_t stat_shards_sum (const _Atomic uint64_t *first, size_t shard_size);

#define OPSTAT_PTR(obj, field) (&(obj)->opst[stat_shard ()].v.field)
#define OPSTAT_ADD(obj, field, n) \
  atomic_fetch_add_explicit (OPSTAT_PTR (obj, field), (n), \
                             memory_order_relaxed)
#define OPSTAT_GET(obj, field) \
  stat_shards_sum (&(obj)->opst[0].v.field, sizeof *(obj)->opst)

#endif /* FOLIOD_STAT_H */
