/* The folio index under memory pressure: an insert whose node allocation
 * fails returns ENOMEM and leaves every lookup and walk working (it used
 * to leave a present bit over a NULL child, which the next walk
 * dereferenced). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <cmocka.h>

#include "cache/fidx.h"

static int allocs_left; /* < 0: no limit */

static void *
failing_calloc (size_t n, size_t size)
{
  if (allocs_left == 0) {
    errno = ENOMEM;
    return NULL;
  }
  if (allocs_left > 0)
    allocs_left--;
  return calloc (n, size);
}

static int item;

/* Every walk of the whole index finds exactly the entries in want[]. */
static void
check_walks (const struct fidx *x, const uint64_t *want, size_t n)
{
  uint64_t at = 0;
  size_t found = 0;

  while (fidx_find (x, &at, x->max_index + 1, false) != NULL) {
    assert_true (found < n);
    assert_int_equal (at, want[found]);
    found++;
    if (at++ == x->max_index)
      break;
  }
  assert_int_equal (found, n);
  at = 0;
  assert_null (fidx_find (x, &at, x->max_index + 1, true));
}

static void
test_insert_enomem_keeps_index_walkable (void **state)
{
  const uint64_t max = (1ull << 30) - 1; /* height 5 */
  const uint64_t far = (123ull << 18) | 77;

  for (int budget = 0; budget < 6; budget++) {
    struct fidx x;
    const uint64_t one[] = { 5 };

    fidx_init (&x, max);
    x.node_calloc = failing_calloc;
    allocs_left = -1;
    assert_int_equal (fidx_insert (&x, 5, &item), 0);
    allocs_left = budget; /* the far insert needs 4 new nodes */
    int r = fidx_insert (&x, far, &item);
    allocs_left = -1;
    if (r < 0) {
      assert_int_equal (errno, ENOMEM);
      assert_null (fidx_get (&x, far));
      check_walks (&x, one, 1);
      assert_null (fidx_remove (&x, far));
      /* The same insert works once memory is back. */
      assert_int_equal (fidx_insert (&x, far, &item), 0);
    }
    const uint64_t two[] = { 5, far };
    assert_ptr_equal (fidx_get (&x, far), &item);
    check_walks (&x, two, 2);
    assert_ptr_equal (fidx_remove (&x, far), &item);
    assert_ptr_equal (fidx_remove (&x, 5), &item);
    assert_int_equal (x.count, 0);
    fidx_destroy (&x);
  }
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_insert_enomem_keeps_index_walkable),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
