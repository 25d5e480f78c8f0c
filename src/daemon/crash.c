/* A crash says where it happened (the daemon's; the nbdkit plugin runs
 * inside nbdkit, which owns its signals).
 *
 * A fault (SIGSEGV, SIGILL, SIGFPE) or an abort writes one line to the
 * log before the process dies as it would have (the default action:
 * a core dump where allowed):
 *
 *   crashed: SIGSEGV at 0x0 in thread wb/disk0: foliod+0x1a2b3 ...
 *   crashed: SIGABRT sent by pid 1234 in thread foliod: ...
 *
 * the thread's name and the return addresses of its stack, each as the
 * object it is in and the offset there (`addr2line -f -e BINARY 0x1a2b3`
 * names the function), so that a crash seen once on a loaded CI machine
 * or an operator's host can be found without a core dump.  Like glibc's
 * backtrace_symbols_fd, the handler calls backtrace (loaded beforehand:
 * its first call may allocate) and dladdr, and writes with
 * log_signal_line; nothing else.  A SIGSEGV also says whether the
 * address was mapped, and which mapping holds it or which lie either
 * side (open and read of /proc/self/maps):
 *
 *   crashed: 0x7f0000200000 is in no mapping; before it: 7f00...-7f00...
 *     rw-p 00000000 00:00 0 ; after it: ...
 *
 * Not under ASan or TSan, whose own reports say more.  A stack overflow is not reported: the handler
 * would need the overflowed stack (no sigaltstack per thread). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "foliod/log.h"
#include "daemon.h"

#define CRASH_FRAMES 32

static const int crash_signals[] = { SIGSEGV, SIGILL, SIGFPE, SIGABRT };

/* Append s to buf[0..n) (size bytes, one kept back): the line is
 * counted, not terminated.  The new length. */
static size_t
put (char *buf, size_t size, size_t n, const char *s)
{
  while (*s && n + 1 < size)
    buf[n++] = *s++;
  return n;
}

static size_t
put_hex (char *buf, size_t size, size_t n, uintptr_t v)
{
  char d[2 + 2 * sizeof v + 1], *p = d + sizeof d - 1;

  *p = '\0';
  do {
    *--p = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  *--p = 'x';
  *--p = '0';
  return put (buf, size, n, p);
}

static size_t
put_dec (char *buf, size_t size, size_t n, uint64_t v)
{
  char d[21], *p = d + sizeof d - 1;

  *p = '\0';
  do {
    *--p = (char) ('0' + v % 10);
    v /= 10;
  } while (v);
  return put (buf, size, n, p);
}

/* "foliod+0x1a2b": the object's base name and the offset in it. */
static size_t
put_frame (char *buf, size_t size, size_t n, void *pc)
{
  Dl_info info;
  const char *slash;

  n = put (buf, size, n, " ");
  if (dladdr (pc, &info) == 0 || info.dli_fname == NULL)
    return put_hex (buf, size, n, (uintptr_t) pc);
  slash = strrchr (info.dli_fname, '/');
  n = put (buf, size, n, slash ? slash + 1 : info.dli_fname);
  n = put (buf, size, n, "+");
  return put_hex (buf, size, n,
                  (uintptr_t) pc - (uintptr_t) info.dli_fbase);
}

/* The mapping around a bad address, from /proc/self/maps: the line
 * holding it, or the lines either side of the hole it is in.  A fault
 * that no stack explains (a mapping gone under a thread) is then told
 * apart from a stray pointer.  open, read and write only. */
struct maps_scan {
  uintptr_t addr;
  char prev[160], hit[160], next[160];   /* "" when none */
  char cur[160];
  size_t n;
  bool skip;                  /* the rest of a long line */
};

static uintptr_t
parse_hex (const char **p)
{
  uintptr_t v = 0;

  for (;; (*p)++) {
    char c = **p;
    if (c >= '0' && c <= '9')
      v = v * 16 + (uintptr_t) (c - '0');
    else if (c >= 'a' && c <= 'f')
      v = v * 16 + (uintptr_t) (c - 'a' + 10);
    else
      return v;
  }
}

static void
maps_line (struct maps_scan *m)
{
  const char *p = m->cur;
  uintptr_t lo = parse_hex (&p), hi;

  if (*p++ != '-')
    return;
  hi = parse_hex (&p);
  if (m->hit[0] || m->next[0])
    return;
  if (m->addr >= hi)
    memcpy (m->prev, m->cur, sizeof m->cur);
  else if (m->addr >= lo)
    memcpy (m->hit, m->cur, sizeof m->cur);
  else
    memcpy (m->next, m->cur, sizeof m->cur);
}

static void
maps_scan (struct maps_scan *m)
{
  char buf[1024];
  ssize_t r;
  int fd = open ("/proc/self/maps", O_RDONLY | O_CLOEXEC);

  if (fd < 0)
    return;
  while ((r = read (fd, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < r; i++) {
      if (buf[i] == '\n') {
        m->cur[m->n] = '\0';
        maps_line (m);
        m->n = 0;
        m->skip = false;
      } else if (!m->skip && m->n + 1 < sizeof m->cur) {
        m->cur[m->n++] = buf[i];
      } else {
        m->skip = true;
      }
    }
  close (fd);
}

static void
log_maps_around (uintptr_t addr)
{
  static struct maps_scan m;  /* not on a stack that may be short */
  char line[600];
  size_t n = 0;

  memset (&m, 0, sizeof m);
  m.addr = addr;
  maps_scan (&m);
  n = put (line, sizeof line, n, "crashed: ");
  n = put_hex (line, sizeof line, n, addr);
  if (m.hit[0]) {
    n = put (line, sizeof line, n, " is in ");
    n = put (line, sizeof line, n, m.hit);
  } else {
    n = put (line, sizeof line, n, " is in no mapping; before it: ");
    n = put (line, sizeof line, n, m.prev[0] ? m.prev : "none");
    n = put (line, sizeof line, n, "; after it: ");
    n = put (line, sizeof line, n, m.next[0] ? m.next : "none");
  }
  log_signal_line (LOG_LVL_ERROR, line, n);
}

static void
on_crash (int sig, siginfo_t *si, void *uc)
{
  void *frames[CRASH_FRAMES];
  char line[2048], thread[17] = "";
  size_t n = 0;
  int depth = backtrace (frames, CRASH_FRAMES);
  struct sigaction dfl;

  (void) uc;
  prctl (PR_GET_NAME, thread, 0, 0, 0);
  n = put (line, sizeof line, n, "crashed: SIG");
  n = put (line, sizeof line, n, sigabbrev_np (sig) ? sigabbrev_np (sig) : "?");
  if (si->si_code <= 0) {          /* kill(2), raise, abort */
    n = put (line, sizeof line, n, " sent by pid ");
    n = put_dec (line, sizeof line, n, (uint64_t) si->si_pid);
  } else {
    n = put (line, sizeof line, n, " at ");
    n = put_hex (line, sizeof line, n, (uintptr_t) si->si_addr);
    if (sig == SIGSEGV && si->si_code == SEGV_MAPERR)
      n = put (line, sizeof line, n, " (not mapped)");
    else if (sig == SIGSEGV && si->si_code == SEGV_ACCERR)
      n = put (line, sizeof line, n, " (mapped, access not allowed)");
  }
  n = put (line, sizeof line, n, " in thread ");
  n = put (line, sizeof line, n, thread);
  n = put (line, sizeof line, n, ":");
  /* Frame 0 is this handler, frame 1 the kernel's return trampoline. */
  for (int i = 2; i < depth; i++)
    n = put_frame (line, sizeof line, n, frames[i]);
  log_signal_line (LOG_LVL_ERROR, line, n);
  if (sig == SIGSEGV && si->si_code > 0)
    log_maps_around ((uintptr_t) si->si_addr);

  /* Die of the signal as if unhandled: it is blocked in the handler, so
   * it lands on return (a fault would also come again by itself). */
  memset (&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  sigemptyset (&dfl.sa_mask);
  sigaction (sig, &dfl, NULL);
  raise (sig);
}

void
crash_report_install (void)
{
#if !defined (__SANITIZE_ADDRESS__) && !defined (__SANITIZE_THREAD__)
  struct sigaction sa;
  void *warm[1];

  backtrace (warm, 1);        /* loads libgcc's unwinder now */
  log_signal_prepare ();
  memset (&sa, 0, sizeof sa);
  sa.sa_sigaction = on_crash;
  sa.sa_flags = SA_SIGINFO;
  sigemptyset (&sa.sa_mask);
  for (size_t i = 0; i < sizeof crash_signals / sizeof crash_signals[0]; i++)
    sigaction (crash_signals[i], &sa, NULL);
#endif
}
