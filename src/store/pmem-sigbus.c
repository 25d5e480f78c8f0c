/* See pmem-sigbus.h.  The handler only reads the table (each entry's base
 * is published last, with release order) and calls log_signal_line (the
 * log's destination by write(2)) and sigaction, both async-signal-safe. */
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "foliod/log.h"
#include "store/pmem-sigbus.h"

#define WATCH_MAX 64          /* stores in one process */
#define WATCH_LINE 1024       /* the line's text before the offset */

struct watch {
  const unsigned char *base;  /* atomic: NULL when free */
  size_t size;
  char head[WATCH_LINE];      /* "store PATH: SIGBUS at byte " */
};

static struct watch watches[WATCH_MAX];
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static struct sigaction old_action;   /* set once, before ours is in */
static bool installed;                /* under watch_lock */

static const char tail[] = " of the store (the file was truncated, or a "
                           "media error): foliod cannot use it, exiting";

/* The bytes of s into buf, no NUL; their count. */
static size_t
put_str (char *buf, const char *s)
{
  size_t n = 0;

  while (s[n]) {
    buf[n] = s[n];
    n++;
  }
  return n;
}

/* Decimal digits of v into buf (at least 21 bytes); their count. */
static size_t
put_u64 (char *buf, uint64_t v)
{
  char tmp[21];
  size_t n = 0, i;

  do {
    tmp[n++] = (char) ('0' + v % 10);
    v /= 10;
  } while (v);
  for (i = 0; i < n; i++)
    buf[i] = tmp[n - 1 - i];
  return n;
}

static void
on_sigbus (int sig, siginfo_t *si, void *uc)
{
  const unsigned char *a = si->si_addr;
  char line[WATCH_LINE + 21 + sizeof tail];

  for (int i = 0; i < WATCH_MAX; i++) {
    const unsigned char *b = __atomic_load_n (&watches[i].base,
                                              __ATOMIC_ACQUIRE);
    if (b == NULL || a < b || a >= b + watches[i].size)
      continue;
    size_t n = put_str (line, watches[i].head);
    n += put_u64 (line + n, (uint64_t) (a - b));
    n += put_str (line + n, tail);
    log_signal_line (LOG_LVL_ERROR, line, n);
    break;
  }
  /* Back to what was there (the default: the process dies of SIGBUS, a
   * core dump if allowed); returning re-runs the access that faults. */
  sigaction (SIGBUS, &old_action, NULL);
  (void) sig;
  (void) uc;
}

static void
install_locked (void)
{
  struct sigaction sa;

  if (installed)
    return;
  log_signal_prepare ();
  memset (&sa, 0, sizeof sa);
  sa.sa_sigaction = on_sigbus;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset (&sa.sa_mask);
  if (sigaction (SIGBUS, &sa, &old_action) == 0)
    installed = true;
}

int
pmem_sigbus_watch (const void *base, size_t size, const char *path)
{
  int h = 0;

  pthread_mutex_lock (&watch_lock);
  install_locked ();
  for (int i = 0; i < WATCH_MAX && h == 0; i++) {
    struct watch *w = &watches[i];
    if (__atomic_load_n (&w->base, __ATOMIC_RELAXED) != NULL)
      continue;
    snprintf (w->head, sizeof w->head, "store %s: SIGBUS at byte ", path);
    w->size = size;
    __atomic_store_n (&w->base, (const unsigned char *) base,
                      __ATOMIC_RELEASE);
    h = i + 1;
  }
  pthread_mutex_unlock (&watch_lock);
  return h;
}

void
pmem_sigbus_forget (int handle)
{
  if (handle <= 0 || handle > WATCH_MAX)
    return;
  pthread_mutex_lock (&watch_lock);
  __atomic_store_n (&watches[handle - 1].base, NULL, __ATOMIC_RELEASE);
  pthread_mutex_unlock (&watch_lock);
}
