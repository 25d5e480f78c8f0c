/* foliod_log(): the log sink the server and the daemon write to.
 *
 * One line per call on stderr.  Under systemd (JOURNAL_STREAM set, stderr
 * connected to the journal) lines carry a "<N>" syslog priority prefix and
 * no timestamp: journald adds its own and maps the prefix to the priority.
 * Elsewhere each line starts with an ISO 8601 timestamp and the level.
 * Each line goes out in one write() so that lines from worker threads do
 * not interleave.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "server/log.h"

/* Written once at start-up (and by SIGHUP later), read by every thread;
 * a stale read only changes whether one line is printed. */
static volatile int log_max_level = LOG_LVL_INFO;
static volatile int log_journal = -1; /* -1: not checked yet */

void
log_set_level (int level)
{
  log_max_level = level;
}

/* JOURNAL_STREAM is "DEV:INODE" of the stream journald gave us; only trust
 * it when stderr really is that stream (a child of a service that
 * redirected stderr elsewhere inherits the variable too). */
static int
stderr_is_journal (void)
{
  const char *js = getenv ("JOURNAL_STREAM");
  unsigned long long dev, ino;
  struct stat st;

  if (js == NULL || sscanf (js, "%llu:%llu", &dev, &ino) != 2)
    return 0;
  if (fstat (STDERR_FILENO, &st) == -1)
    return 0;
  return (unsigned long long) st.st_dev == dev &&
         (unsigned long long) st.st_ino == ino;
}

void
foliod_log (int level, const char *fmt, ...)
{
  /* syslog priorities for our levels: err, warning, info, debug */
  static const int prio[] = { 3, 4, 6, 7 };
  char line[2048];
  size_t n = 0;
  va_list ap;
  int r;

  if (level > log_max_level)
    return;
  if (level < 0)
    level = 0;
  if (level > LOG_LVL_DEBUG)
    level = LOG_LVL_DEBUG;
  if (log_journal == -1)
    log_journal = stderr_is_journal ();

  if (log_journal) {
    n = (size_t) snprintf (line, sizeof line, "<%d>", prio[level]);
  } else {
    struct timeval tv;
    struct tm tm;
    gettimeofday (&tv, NULL);
    localtime_r (&tv.tv_sec, &tm);
    n = strftime (line, sizeof line, "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t) snprintf (line + n, sizeof line - n, ".%03ld foliod[%d] %s: ",
                            (long) tv.tv_usec / 1000, (int) getpid (),
                            log_level_name (level));
  }
  va_start (ap, fmt);
  r = vsnprintf (line + n, sizeof line - n - 1, fmt, ap);
  va_end (ap);
  if (r < 0)
    return;
  n += (size_t) r;
  if (n > sizeof line - 2)
    n = sizeof line - 2;        /* truncated */
  while (n > 0 && line[n - 1] == '\n')
    n--;
  line[n++] = '\n';
  /* Best effort: a log line that cannot be written is dropped. */
  if (write (STDERR_FILENO, line, n) < 0)
    return;
}
