/* Checker attributes for the public core API (GCC and clang), so that the
 * compiler checks what the prose contracts in cache.h, backing.h and
 * export.h say.
 *
 * FOLIOD_NONNULL (1, 3): those pointer arguments must not be NULL; a call
 * passing NULL warns (and is a runtime error under UBSan).  Never on an
 * argument the function accepts as NULL (cache_destroy (NULL), err with
 * errlen 0): the compiler would drop the function's own NULL test.
 *
 * FOLIOD_WUR: the result says whether the call worked; a caller that
 * drops it is a bug (-Wunused-result).  GCC warns even through a (void)
 * cast: handle the result, do not silence it.
 */
#ifndef FOLIOD_ATTR_H
#define FOLIOD_ATTR_H

#define FOLIOD_NONNULL(...) __attribute__ ((__nonnull__ (__VA_ARGS__)))
#define FOLIOD_WUR          __attribute__ ((__warn_unused_result__))

#endif /* FOLIOD_ATTR_H */
