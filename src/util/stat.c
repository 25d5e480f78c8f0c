/* Sharded counters (foliod/stat.h): the shards and each thread's pick. */
#include <stdlib.h>
#include <string.h>

#include "foliod/stat.h"

_Thread_local unsigned stat_shard_plus1;

/* Round robin over the threads as they first count something: the first
 * STAT_SHARDS threads get a shard each (the loops and the workers of a
 * process are started together, so they do). */
unsigned
stat_shard_pick (void)
{
  static _Atomic unsigned next;
  unsigned s = atomic_fetch_add_explicit (&next, 1, memory_order_relaxed) %
               STAT_SHARDS;

  stat_shard_plus1 = s + 1;
  return s;
}

void *
stat_shards_new (size_t shard_size)
{
  size_t n = STAT_SHARDS * shard_size;   /* shard_size: lines, whole */
  void *p = aligned_alloc (STAT_LINE, n);

  if (p != NULL)
    memset (p, 0, n);
  return p;
}

uint64_t
stat_shards_sum (const _Atomic uint64_t *first, size_t shard_size)
{
  const char *p = (const char *) first;
  uint64_t sum = 0;

  for (unsigned i = 0; i < STAT_SHARDS; i++)
    sum += atomic_load_explicit ((const _Atomic uint64_t *)
                                 (p + i * shard_size), memory_order_relaxed);
  return sum;
}
