/* What the LD_PRELOAD fault layers of tests/faultfs/ (one .so each)
 * share: the next definition of a symbol, the settings, the random
 * stream, the fault log.  A header of static functions, so that each
 * layer stays one self-contained .so with no core library. */
#ifndef FOLIOD_FAULT_COMMON_H
#define FOLIOD_FAULT_COMMON_H

#include <dlfcn.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

/* The definition after the layer's own: abort if there is none. */
static inline void *
fault_next (const char *layer, const char *name)
{
  void *p = dlsym (RTLD_NEXT, name);

  if (!p) {
    fprintf (stderr, "%s: no %s\n", layer, name);
    abort ();
  }
  return p;
}

static inline unsigned
fault_env_uint (const char *name, unsigned dflt)
{
  const char *s = getenv (name);

  return s && *s ? (unsigned) strtoul (s, NULL, 0) : dflt;
}

/* The stream FAULT_SEED=seed starts. */
static inline uint64_t
fault_rng_init (unsigned seed)
{
  return seed * 0x9E3779B97F4A7C15ull + 1;
}

/* splitmix64. */
static inline uint64_t
fault_rnd (uint64_t *state)
{
  uint64_t z = (*state += 0x9E3779B97F4A7C15ull);

  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

static inline bool
fault_chance (uint64_t *state, unsigned per_mille)
{
  return per_mille && fault_rnd (state) % 1000 < per_mille;
}

/* One line "LAYER PID: ..." appended to fd (no-op if fd < 0), written
 * with wr (the real write(2): a layer may wrap write itself). */
static inline void
fault_note_v (int fd, ssize_t (*wr) (int, const void *, size_t),
              const char *layer, const char *fmt, va_list ap)
{
  char line[256];
  int n = snprintf (line, sizeof line, "%s %d: ", layer, (int) getpid ());

  n += vsnprintf (line + n, sizeof line - n, fmt, ap);
  if (n >= (int) sizeof line - 1)
    n = sizeof line - 2;
  line[n++] = '\n';
  if (fd >= 0 && wr (fd, line, n) != n)
    abort ();
}

#endif
