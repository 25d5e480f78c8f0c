/* What the bench clients (loadgen.c, rawload.c) share: a clock, offsets,
 * sizes on the command line. */
#ifndef FOLIOD_BENCH_UTIL_H
#define FOLIOD_BENCH_UTIL_H

#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

static inline uint64_t
now_ns(void)
{
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

/* xorshift64*: fast, good enough to pick offsets. Never returns 0 state. */
static inline uint64_t
rng_next(uint64_t *s)
{
  uint64_t x = *s;
  x ^= x >> 12;
  x ^= x << 25;
  x ^= x >> 27;
  *s = x;
  return x * 0x2545F4914F6CDD1DULL;
}

/* Parses "4096", "4k", "1M", "2G", "1TiB". Returns 0 on error (no size is
 * 0 here). */
static inline uint64_t
parse_size(const char *s)
{
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 10);
  if (errno || end == s)
    return 0;
  switch (*end) {
  case 'k': case 'K': v <<= 10; end++; break;
  case 'm': case 'M': v <<= 20; end++; break;
  case 'g': case 'G': v <<= 30; end++; break;
  case 't': case 'T': v <<= 40; end++; break;
  default: break;
  }
  if (*end == 'i' || *end == 'B')
    end++;
  if (*end == 'B')
    end++;
  return *end == '\0' ? v : 0;
}

#endif /* FOLIOD_BENCH_UTIL_H */
