/* foliod_log(): the log sink the server and the daemon write to.
 *
 * One line per call on stderr.  Under systemd (JOURNAL_STREAM set, stderr
 * connected to the journal) lines carry a "<N>" syslog priority prefix and
 * no timestamp: journald adds its own and maps the prefix to the priority.
 * Elsewhere each line starts with an ISO 8601 timestamp and the level.
 * Each line goes out in one write() so that lines from worker threads do
 * not interleave.  Once foliod is ready, lines can go elsewhere instead
 * (main.c): to a file (log-file; timestamped lines, appended) or, for a
 * detached foliod, to syslog (the journal where there is one).
 *
 * Repeated lines are rate-limited per call site (its format string is the
 * kind of line): a token bucket of LOG_BURST lines refilled at LOG_RATE
 * per second.  What it drops is counted and said once a second, on the
 * next line logged: "N similar messages suppressed: FORMAT".  A client
 * that makes us log per request or per connection cannot fill the disk
 * or drown the lines that matter.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "foliod/lock.h"
#include "daemon/daemon.h"
#include "foliod/util.h"
#include "server/log.h"

#define LOG_RATE   20   /* lines per second of one kind, sustained */
#define LOG_BURST  100  /* lines of one kind at once (start-up, exports) */
#define LOG_KINDS  128  /* call sites tracked; a power of 2 */
#define LOG_PROBE  4    /* slots tried per call site */

struct log_kind {
  const char *fmt;          /* NULL: free slot */
  int level;
  uint64_t last_ms;         /* last refill / use */
  uint64_t millitokens;     /* 1000 per line allowed */
  unsigned long long suppressed;  /* dropped since the last report */
};

static struct log_kind log_kinds[LOG_KINDS];
static uint64_t log_report_sec;   /* last second suppressions were said */
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* Written once at start-up (and by SIGHUP later), read by every thread;
 * a stale read only changes whether one line is printed. */
/* Read by every thread that logs (relaxed: a level orders nothing). */
static _Atomic int log_max_level = LOG_LVL_INFO;
static _Atomic int log_journal = -1; /* -1: not checked yet */
/* Where lines go: log_fd (stderr, or log-file), or syslog.  Set once when
 * foliod is ready, before the worker threads have anything to log. */
static int log_fd = STDERR_FILENO;
static bool log_syslog;

/* By level; log_level_parse also takes "warning". */
static const char *level_names[] = { "error", "warn", "info", "debug" };

const char *
log_level_name (int level)
{
  if (level < 0 || level > LOG_LVL_DEBUG)
    return "?";
  return level_names[level];
}

int
log_level_parse (const char *s, int *level)
{
  for (int i = 0; i <= LOG_LVL_DEBUG; i++)
    if (strcasecmp (s, level_names[i]) == 0) {
      *level = i;
      return 0;
    }
  if (strcasecmp (s, "warning") == 0) {
    *level = LOG_LVL_WARN;
    return 0;
  }
  return -1;
}

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

/* Format and write one line.  errno is set back to saved before the
 * formatting, for %m. */
static void
log_vline (int level, int saved, const char *fmt, va_list ap)
{
  /* syslog priorities for our levels: err, warning, info, debug */
  static const int prio[] = { 3, 4, 6, 7 };
  char line[2048];
  size_t n = 0;
  int r;

  if (log_journal == -1)
    log_journal = stderr_is_journal ();

  if (log_syslog) {
    errno = saved;
    vsyslog (prio[level], fmt, ap);
    return;
  }
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
  errno = saved;
  r = vsnprintf (line + n, sizeof line - n - 1, fmt, ap);
  if (r < 0)
    return;
  n += (size_t) r;
  if (n > sizeof line - 2)
    n = sizeof line - 2;        /* truncated */
  while (n > 0 && line[n - 1] == '\n')
    n--;
  line[n++] = '\n';
  /* Best effort: a log line that cannot be written is dropped. */
  if (write (log_fd, line, n) < 0)
    return;
}

int
log_to_file (const char *path)
{
  int fd = open (path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);

  if (fd == -1)
    return -1;
  log_journal = 0;
  log_fd = fd;
  return 0;
}

void
log_to_syslog (void)
{
  openlog ("foliod", LOG_PID | LOG_NDELAY, LOG_DAEMON);
  log_syslog = true;
}

static void __attribute__ ((format (printf, 2, 3)))
log_line (int level, const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  log_vline (level, 0, fmt, ap);
  va_end (ap);
}

/* Say how many lines of kind k were dropped.  Under log_lock. */
static void
log_report (struct log_kind *k)
{
  char esc[128];

  if (k->suppressed == 0)
    return;
  log_line (k->level, "%llu similar messages suppressed: %s", k->suppressed,
            str_escape (esc, sizeof esc, k->fmt, strlen (k->fmt)));
  k->suppressed = 0;
}

/* The slot of fmt: its own, else a free one, else the least recently used
 * of its probe sequence (whose count is said first).  Under log_lock. */
static struct log_kind *
log_kind_of (const char *fmt, int level, uint64_t now)
{
  size_t h = (size_t) (((uintptr_t) fmt >> 3) * 2654435761u);
  struct log_kind *k, *lru = NULL;

  for (size_t i = 0; i < LOG_PROBE; i++) {
    k = &log_kinds[(h + i) & (LOG_KINDS - 1)];
    if (k->fmt == fmt)
      return k;
    if (k->fmt == NULL) {
      lru = k;
      break;
    }
    if (lru == NULL || k->last_ms < lru->last_ms)
      lru = k;
  }
  if (lru->fmt)
    log_report (lru);
  lru->fmt = fmt;
  lru->level = level;
  lru->last_ms = now;
  lru->millitokens = LOG_BURST * 1000u;
  lru->suppressed = 0;
  return lru;
}

/* Whether a line of fmt may go out now; once a second, also say what was
 * dropped before. */
static bool
log_admit (const char *fmt, int level)
{
  uint64_t now = now_ms ();
  struct log_kind *k;
  bool ok;

  lock_or_die (&log_lock);
  if (now / 1000 != log_report_sec) {
    log_report_sec = now / 1000;
    for (size_t i = 0; i < LOG_KINDS; i++)
      if (log_kinds[i].fmt)
        log_report (&log_kinds[i]);
  }
  k = log_kind_of (fmt, level, now);
  k->millitokens += (now - k->last_ms) * LOG_RATE;
  if (k->millitokens > LOG_BURST * 1000u)
    k->millitokens = LOG_BURST * 1000u;
  k->last_ms = now;
  ok = k->millitokens >= 1000;
  if (ok)
    k->millitokens -= 1000;
  else
    k->suppressed++;
  unlock_or_die (&log_lock);
  return ok;
}

void
foliod_log (int level, const char *fmt, ...)
{
  /* First: the caller's errno is what %m means and what it gets back. */
  int saved = errno;
  va_list ap;

  if (level > log_max_level)
    return;
  if (level < 0)
    level = 0;
  if (level > LOG_LVL_DEBUG)
    level = LOG_LVL_DEBUG;
  if (log_admit (fmt, level)) {
    va_start (ap, fmt);
    log_vline (level, saved, fmt, ap);
    va_end (ap);
  }
  errno = saved;
}
