/* include/foliod/stat.h, the sharded counters:
 *   - every add lands in the sum, also when more threads count than there
 *     are shards (threads then share a shard: the adds stay atomic);
 *   - each shard starts on a cache line of its own, so that threads with
 *     shards of their own never write the same line;
 *   - a thread keeps its shard: the first STAT_SHARDS threads to count
 *     get one each.
 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "foliod/stat.h"

struct ctr {
  _Atomic uint64_t ops, bytes;
};

struct obj {
  STAT_SHARDED (struct ctr) *opst;
};

#define THREADS (STAT_SHARDS + 4)
#define ADDS 20000

static struct obj o;
static unsigned shard_of[THREADS];

static void *
counter (void *arg)
{
  unsigned *mine = arg;

  *mine = stat_shard ();
  for (int i = 0; i < ADDS; i++) {
    OPSTAT_ADD (&o, ops, 1);
    OPSTAT_ADD (&o, bytes, 4096);
  }
  if (stat_shard () != *mine)           /* kept */
    *mine = STAT_SHARDS;
  return NULL;
}

static void
test_sums (void **state)
{
  pthread_t th[THREADS];
  unsigned seen[STAT_SHARDS] = { 0 };

  o.opst = stat_shards_new (sizeof *o.opst);
  assert_non_null (o.opst);
  assert_int_equal (sizeof *o.opst % STAT_LINE, 0);
  for (unsigned i = 0; i < STAT_SHARDS; i++)
    assert_int_equal ((uintptr_t) &o.opst[i] % STAT_LINE, 0);
  assert_int_equal (OPSTAT_GET (&o, ops), 0);
  for (unsigned i = 0; i < THREADS; i++)
    assert_int_equal (pthread_create (&th[i], NULL, counter, &shard_of[i]),
                      0);
  for (unsigned i = 0; i < THREADS; i++)
    assert_int_equal (pthread_join (th[i], NULL), 0);
  assert_int_equal (OPSTAT_GET (&o, ops), (uint64_t) THREADS * ADDS);
  assert_int_equal (OPSTAT_GET (&o, bytes), (uint64_t) THREADS * ADDS * 4096);
  /* Round robin: THREADS consecutive picks cover every shard. */
  for (unsigned i = 0; i < THREADS; i++) {
    assert_true (shard_of[i] < STAT_SHARDS);
    seen[shard_of[i]]++;
  }
  for (unsigned i = 0; i < STAT_SHARDS; i++)
    assert_true (seen[i] >= 1);
  free (o.opst);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_sums),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
