/* Parsing and clock helpers shared by every layer. */
#include <ctype.h>
#include <stdbool.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

#include "foliod/util.h"

static int
size_shift (const char *suffix, unsigned *shift)
{
  static const char units[] = "BKMGTP";
  char u = toupper ((unsigned char) suffix[0]);
  const char *p;

  if (u == '\0') {
    *shift = 0;
    return 0;
  }
  p = strchr (units, u);
  if (p == NULL)
    return -1;
  *shift = 10 * (unsigned) (p - units);
  suffix++;
  /* Accept K, KB, KiB (all powers of 1024). */
  if (u != 'B' && (strcasecmp (suffix, "") == 0 || strcasecmp (suffix, "b") == 0 ||
                   strcasecmp (suffix, "ib") == 0))
    return 0;
  return u == 'B' && *suffix == '\0' ? 0 : -1;
}

int
parse_size (const char *s, uint64_t *out)
{
  char *end;
  unsigned long long v;
  unsigned shift;

  if (s == NULL || !isdigit ((unsigned char) *s)) {
    errno = EINVAL;
    return -1;
  }
  errno = 0;
  v = strtoull (s, &end, 10);
  if (errno != 0)
    return -1;
  if (size_shift (end, &shift) == -1) {
    errno = EINVAL;
    return -1;
  }
  if (shift && v > (UINT64_MAX >> shift)) {
    errno = ERANGE;
    return -1;
  }
  *out = (uint64_t) v << shift;
  return 0;
}

int
parse_bool (const char *s, int *out)
{
  static const char *yes[] = { "1", "true", "yes", "on" };
  static const char *no[] = { "0", "false", "no", "off" };

  for (size_t i = 0; i < 4; i++) {
    if (strcasecmp (s, yes[i]) == 0) { *out = 1; return 0; }
    if (strcasecmp (s, no[i]) == 0) { *out = 0; return 0; }
  }
  errno = EINVAL;
  return -1;
}

int
parse_uint (const char *s, unsigned min, unsigned max, unsigned *out)
{
  char *end;
  unsigned long v;

  if (!isdigit ((unsigned char) *s))
    return -1;
  errno = 0;
  v = strtoul (s, &end, 10);
  if (errno || *end || v < min || v > max)
    return -1;
  *out = (unsigned) v;
  return 0;
}

uint64_t
now_ns (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000000u + (uint64_t) ts.tv_nsec;
}

uint64_t
now_ms (void)
{
  return now_ns () / 1000000u;
}

int
str_replace (char **field, const char *value)
{
  char *copy = strdup (value);

  if (copy == NULL)
    return -1;
  free (*field);
  *field = copy;
  return 0;
}

const char *
str_escape (char *out, size_t outsize, const void *in, size_t inlen)
{
  static const char hex[] = "0123456789abcdef";
  const unsigned char *p = in;
  /* Room is kept for "..." and the NUL: escapes never get cut in half. */
  size_t n = 0, room = outsize > 4 ? outsize - 4 : 0, i;

  for (i = 0; i < inlen; i++) {
    unsigned char ch = p[i];
    bool plain = ch >= 0x20 && ch < 0x7f && ch != '\\';

    if (n + (plain ? 1 : 4) > room)
      break;
    if (plain) {
      out[n++] = (char) ch;
      continue;
    }
    out[n++] = '\\';
    out[n++] = 'x';
    out[n++] = hex[ch >> 4];
    out[n++] = hex[ch & 15];
  }
  if (i < inlen && n + 4 <= outsize) {
    memcpy (out + n, "...", 3);
    n += 3;
  }
  if (outsize > 0)
    out[n] = '\0';
  return out;
}

int
cond_init_monotonic (pthread_cond_t *cv)
{
  pthread_condattr_t ca;
  int r;

  pthread_condattr_init (&ca);
  r = pthread_condattr_setclock (&ca, CLOCK_MONOTONIC);
  if (r == 0)
    r = pthread_cond_init (cv, &ca);
  pthread_condattr_destroy (&ca);
  return r;
}

int
cond_wait_ms (pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ms)
{
  uint64_t ns = now_ns () + ms * 1000000u;
  struct timespec ts = { .tv_sec = (time_t) (ns / 1000000000u),
                         .tv_nsec = (long) (ns % 1000000000u) };

  return pthread_cond_timedwait (cv, m, &ts);
}
