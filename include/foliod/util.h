/* Small helpers shared by every layer. */
#ifndef FOLIOD_UTIL_H
#define FOLIOD_UTIL_H

#include <stddef.h>
#include <stdint.h>

/* Parse "4096", "64K", "1M", "1G", "2T" (powers of 1024, case-insensitive,
 * optional trailing "B"/"iB").  Returns 0 or -1 (EINVAL/ERANGE). */
int parse_size (const char *s, uint64_t *out);

/* Parse a boolean: 1/0, true/false, yes/no, on/off.  0 or -1. */
int parse_bool (const char *s, int *out);

static inline int
is_power_of_2 (uint64_t v)
{
  return v && !(v & (v - 1));
}

/* Monotonic clock in milliseconds / nanoseconds. */
uint64_t now_ms (void);
uint64_t now_ns (void);

#endif /* FOLIOD_UTIL_H */
