/* MIN and MAX that evaluate each argument once (GNU C statement
 * expressions), so MIN (len, next_chunk (c)) calls next_chunk once and
 * MIN (i++, n) increments once.  The usual arithmetic conversions apply
 * to the two values as in a ?: expression: compare like-signed types (a
 * bare constant such as 1000 is an int: write 1000u against an unsigned
 * value, or -Wsign-compare says so).
 *
 * The locals get a name unique to each expansion (__COUNTER__), so that
 * MIN (MIN (a, b), c) does not shadow itself.  Not usable where a
 * constant expression is needed (array sizes, static initialisers).
 * Tested by tests/unit/test-minmax.c.
 */
#ifndef FOLIOD_MINMAX_H
#define FOLIOD_MINMAX_H

#define MINMAX_CAT_(a, b) a##b
#define MINMAX_CAT(a, b)  MINMAX_CAT_ (a, b)

/* vx, vy and op are names and an operator: parentheses would break them,
 * so clang-tidy's bugprone-macro-parentheses is silenced on the body. */
#define MINMAX_PICK_(x, y, op, vx, vy) /* NOLINTNEXTLINE(bugprone-macro-parentheses) */ \
  ({ __auto_type vx = (x); __auto_type vy = (y); vx op vy ? vx : vy; })
#define MINMAX_PICK(x, y, op, n)                                        \
  MINMAX_PICK_ (x, y, op, MINMAX_CAT (minmax_x_, n),                    \
                MINMAX_CAT (minmax_y_, n))

#undef MIN
#undef MAX
#ifdef __CPPCHECK__
/* cppcheck cannot parse statement expressions ("AST broken"): it checks
 * the plain form, which means the same for side-effect-free arguments. */
#define MIN(x, y) ((x) < (y) ? (x) : (y))
#define MAX(x, y) ((x) > (y) ? (x) : (y))
#else
#define MIN(x, y) MINMAX_PICK ((x), (y), <, __COUNTER__)
#define MAX(x, y) MINMAX_PICK ((x), (y), >, __COUNTER__)
#endif

#endif /* FOLIOD_MINMAX_H */
