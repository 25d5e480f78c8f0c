/* include/foliod/minmax.h:
 *   - MIN and MAX pick the smaller / larger of two values, of any integer
 *     width, and of pointers;
 *   - each argument is evaluated exactly once (side effects happen once);
 *   - they nest without the locals of one expansion hiding another's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "foliod/minmax.h"

static int calls;

static uint64_t
counted (uint64_t v)
{
  calls++;
  return v;
}

static void
test_values (void **state)
{
  const char buf[4] = "abc";
  uint64_t big = UINT64_MAX - 1;

  assert_int_equal (MIN (3, 7), 3);
  assert_int_equal (MAX (3, 7), 7);
  assert_int_equal (MIN (-5, 2), -5);
  assert_int_equal (MAX (-5, -2), -2);
  assert_int_equal (MIN (4u, 4u), 4);
  assert_true (MAX (big, (uint64_t) 1) == big);
  assert_true (MIN (big, UINT64_MAX) == big);
  assert_true (MIN ((uint64_t) 1 << 40, (uint64_t) 1 << 33) == 1ull << 33);
  assert_ptr_equal (MIN (&buf[2], &buf[1]), &buf[1]);
  assert_ptr_equal (MAX (&buf[2], &buf[1]), &buf[2]);
}

static void
test_once (void **state)
{
  int i = 0, j = 10;
  uint64_t r;

  assert_int_equal (MIN (i++, j--), 0);
  assert_int_equal (i, 1);
  assert_int_equal (j, 9);
  assert_int_equal (MAX (++i, ++j), 10);
  assert_int_equal (i, 2);
  assert_int_equal (j, 10);

  calls = 0;
  r = MIN (counted (5), counted (9));
  assert_int_equal (r, 5);
  assert_int_equal (calls, 2);
  calls = 0;
  r = MAX (counted (5), MIN (counted (9), counted (7)));
  assert_int_equal (r, 7);
  assert_int_equal (calls, 3);
}

static void
test_nested (void **state)
{
  int a = 4, b = 8, c = 6;

  assert_int_equal (MIN (MIN (a, b), c), 4);
  assert_int_equal (MAX (MAX (a, b), c), 8);
  assert_int_equal (MIN (MAX (a, c), b), 6);
  assert_int_equal (MAX (MIN (b, c), MIN (a, c)), 6);
  /* Clamping, the commonest use. */
  assert_int_equal (MAX (2, MIN (c, 5)), 5);
  assert_int_equal (MAX (2, MIN (-1, 5)), 2);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_values),
    cmocka_unit_test (test_once),
    cmocka_unit_test (test_nested),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
