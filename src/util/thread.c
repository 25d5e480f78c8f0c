/* Starting threads: one signal policy and one naming rule for every
 * thread foliod starts (workers, loops, writeback, readahead, pollers,
 * control, closers). */
#define _GNU_SOURCE /* pthread_setname_np */
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>

#include "foliod/util.h"

int
thread_start (pthread_t *t, void *(*fn) (void *), void *arg,
              const char *name_fmt, ...)
{
  char name[16];                /* the kernel keeps 15 bytes and a NUL */
  sigset_t all, old;
  va_list ap;
  int err;

  va_start (ap, name_fmt);
  vsnprintf (name, sizeof name, name_fmt, ap);
  va_end (ap);
  /* The new thread inherits a full mask: signals belong to the main
   * thread (the daemon's libev loop, or nbdkit's).  Except the faults a
   * thread raises itself: a blocked SIGBUS or SIGSEGV kills the process
   * without running its handler (the pmem store's SIGBUS handler names
   * the store that failed, pmem-sigbus.c). */
  sigfillset (&all);
  sigdelset (&all, SIGBUS);
  sigdelset (&all, SIGSEGV);
  sigdelset (&all, SIGFPE);
  sigdelset (&all, SIGILL);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  err = pthread_create (t, NULL, fn, arg);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (err == 0)
    (void) pthread_setname_np (*t, name); /* a name is a courtesy */
  return err;
}
