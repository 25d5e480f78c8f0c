/* Small helpers shared by every layer. */
#ifndef FOLIOD_UTIL_H
#define FOLIOD_UTIL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

/* Parse "4096", "64K", "1M", "1G", "2T" (powers of 1024, case-insensitive,
 * optional trailing "B"/"iB").  Returns 0 or -1 (EINVAL/ERANGE). */
int parse_size (const char *s, uint64_t *out);

/* Parse a boolean: 1/0, true/false, yes/no, on/off.  0 or -1. */
int parse_bool (const char *s, int *out);

/* Parse an unsigned decimal integer in [min, max] (digits only: no sign,
 * no space).  0 or -1. */
int parse_uint (const char *s, unsigned min, unsigned max, unsigned *out);

static inline int
is_power_of_2 (uint64_t v)
{
  return v && !(v & (v - 1));
}

/* What a peer sent, made safe to log: control characters, DEL, bytes over
 * 0x7e and backslash become \xHH (a newline in an export name cannot forge
 * a log line), and at most outsize - 1 bytes come out, the last three "..."
 * when cut short.  Returns out.  ESCAPED_MAX is a good outsize. */
#define ESCAPED_MAX 260
/* Replace the string *field by a copy of value (the old one freed); -1
 * and errno ENOMEM, *field unchanged, if the copy fails. */
int str_replace (char **field, const char *value);

const char *str_escape (char *out, size_t outsize, const void *in,
                        size_t inlen);

/* Monotonic clock in milliseconds / nanoseconds. */
uint64_t now_ms (void);
uint64_t now_ns (void);

/* Timed waits run on the monotonic clock, so that a step of the wall
 * clock neither stretches nor cuts them.  cond_init_monotonic makes such
 * a condition variable (0, or an error number); cond_wait_ms waits on one
 * for at most ms milliseconds (pthread_cond_timedwait's result). */
int cond_init_monotonic (pthread_cond_t *cv);
int cond_wait_ms (pthread_cond_t *cv, pthread_mutex_t *m, uint64_t ms);

/* Start a thread running fn (arg), as every thread of foliod is started:
 * with all signals blocked (they belong to the main thread) and named
 * name_fmt (printf-style, cut to 15 bytes: "foliod-loop/%u", "wb",
 * "ra/%u"), which top -H, ps -L and /proc/PID/task/TID/comm show.
 * Returns 0 or an error number (pthread_create's). */
int thread_start (pthread_t *t, void *(*fn) (void *), void *arg,
                  const char *name_fmt, ...)
  __attribute__ ((format (printf, 4, 5)));

#endif /* FOLIOD_UTIL_H */
