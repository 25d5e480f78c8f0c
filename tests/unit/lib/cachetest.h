/* Small helpers shared by the cache unit tests (header only). */
#ifndef FOLIOD_TEST_CACHETEST_H
#define FOLIOD_TEST_CACHETEST_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "foliod/cache.h"
#include "lib/fake_backing.h"

static inline uint64_t
ct_now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + (uint64_t) ts.tv_nsec / 1000000;
}

/* Running under valgrind (tests/run-tests sets VALGRIND=1)? */
static inline int
ct_valgrind (void)
{
  const char *v = getenv ("VALGRIND");
  return v && *v && strcmp (v, "0") != 0;
}

/* Environment number, or def when unset/empty. */
static inline uint64_t
ct_env_u64 (const char *name, uint64_t def)
{
  const char *v = getenv (name);
  if (v == NULL || *v == '\0')
    return def;
  return strtoull (v, NULL, 0);
}

/* A cache over fb or NULL; prints the reason on failure. */
static inline struct cache *
ct_cache (struct fake_backing *fb, const struct cache_config *cfg)
{
  char err[256] = "";
  struct cache *c = cache_create (fake_backing_base (fb), NULL, cfg, err,
                                  sizeof err);
  if (c == NULL)
    fprintf (stderr, "cache_create: %s\n", err);
  return c;
}

#endif /* FOLIOD_TEST_CACHETEST_H */
