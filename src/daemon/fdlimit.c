/* The open files limit (RLIMIT_NOFILE) against max-connections.
 *
 * Every connection holds one descriptor (its socket; TLS adds none).
 * systemd and login shells often give a soft limit of 1024 under a much
 * higher hard limit: foliod raises the soft one to the hard one at start,
 * since it polls with epoll (libev, libmicrohttpd), never select.  What
 * the limit still cannot hold is said once at start; at run time an
 * accept that fails with EMFILE pauses that listener (server/listen.c)
 * rather than spinning.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/resource.h>

#include "daemon/daemon.h"
#include "foliod/log.h"

/* Besides the connections and what is open once started: metrics and
 * control clients, a remote backing's reconnects, files opened briefly. */
#define FD_SPARE 32

void
fd_limit_raise (void)
{
  struct rlimit rl;

  if (getrlimit (RLIMIT_NOFILE, &rl) == -1 || rl.rlim_cur >= rl.rlim_max)
    return;
  rl.rlim_cur = rl.rlim_max;
  /* An unlimited hard limit is above fs.nr_open: keep the soft one then. */
  if (setrlimit (RLIMIT_NOFILE, &rl) == -1)
    log_debug ("cannot raise the open files limit to %llu: %s",
               (unsigned long long) rl.rlim_max, strerror (errno));
}

/* Descriptors open now (/proc/self/fd, less the one reading it); -1 if
 * unknown. */
static long
fds_open (void)
{
  DIR *d = opendir ("/proc/self/fd");
  struct dirent *e;
  long n = 0;

  if (d == NULL)
    return -1;
  // cppcheck-suppress readdirCalled ; our own DIR (readdir_r is deprecated)
  while ((e = readdir (d)) != NULL)
    if (e->d_name[0] != '.')
      n++;
  closedir (d);
  return n - 1;
}

void
fd_limit_check (unsigned max_connections)
{
  struct rlimit rl;
  long open_now = fds_open ();
  unsigned long long need;

  if (open_now < 0 || getrlimit (RLIMIT_NOFILE, &rl) == -1
      || rl.rlim_cur == RLIM_INFINITY)
    return;
  need = (unsigned long long) open_now + max_connections + FD_SPARE;
  if (rl.rlim_cur >= need)
    return;
  log_warn ("open files limit %llu cannot hold max-connections %u: that "
            "needs about %llu descriptors (%ld open now, one per "
            "connection, %d spare); raise the limit (ulimit -n, "
            "LimitNOFILE=) or lower max-connections",
            (unsigned long long) rl.rlim_cur, max_connections, need,
            open_now, FD_SPARE);
}
