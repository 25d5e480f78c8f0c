/* foliod_log(): the one log sink of every room (include/foliod/log.h).
 *
 * One line per call.  On stderr (the default) or a log file each line
 * starts with an ISO 8601 timestamp and the level; under systemd
 * (JOURNAL_STREAM set, stderr connected to the journal) lines carry a
 * "<N>" syslog priority prefix and no timestamp: journald adds its own and
 * maps the prefix to the priority.  Each line goes out in one write() so
 * that lines from worker threads do not interleave.  The program may send
 * lines elsewhere instead, once, before its threads log: to a file, to
 * syslog (the journal where there is one), or to a function of its own
 * (the nbdkit plugin's nbdkit_error / nbdkit_debug).
 *
 * Repeated lines are rate-limited per call site (its format string is the
 * kind of line): a token bucket of LOG_BURST lines refilled at LOG_RATE
 * per second.  What it drops is counted and said once a second, on the
 * next line logged: "N similar messages suppressed: FORMAT".  A client
 * that makes us log per request or per connection cannot fill the disk
 * or drown the lines that matter.
 *
 * log_signal_line() is the signal handler's way in (the pmem store's
 * SIGBUS line): write(2) only, to the descriptor of the destination, or
 * to a datagram socket on /dev/log opened with syslog, and a timestamp
 * computed from the UTC offset noted beforehand (log_signal_prepare, and
 * each ordinary line): localtime_r is not async-signal-safe.
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
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <syslog.h>
#include <time.h>
#include <unistd.h>

#include "foliod/lock.h"
#include "foliod/log.h"
#include "foliod/util.h"

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

/* Read by every thread that logs (relaxed: a level orders nothing). */
static _Atomic int log_max_level = LOG_LVL_INFO;
static _Atomic int log_journal = -1; /* -1: not checked yet */
/* Where lines go: log_fd (stderr, or log-file), syslog, or log_sink.  Set
 * once, before the worker threads have anything to log. */
static int log_fd = STDERR_FILENO;
static bool log_syslog;
static void (*log_sink) (int level, const char *msg);
/* For log_signal_line: a datagram socket connected to syslog's /dev/log
 * (-1: none), and the UTC offset of local time in seconds as the last
 * ordinary line found it. */
static int log_syslog_fd = -1;
static _Atomic long log_gmtoff;

/* syslog priorities for our levels: err, warning, info, debug */
static const int log_prio[] = { 3, 4, 6, 7 };

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
static void __attribute__ ((format (printf, 3, 0)))
log_vline (int level, int saved, const char *fmt, va_list ap)
{
  char line[2048];
  size_t n = 0;
  int r;

  if (log_journal == -1)
    log_journal = stderr_is_journal ();

  if (log_syslog) {
    errno = saved;
    vsyslog (log_prio[level], fmt, ap);
    return;
  }
  if (log_sink) {
    errno = saved;
    if (vsnprintf (line, sizeof line, fmt, ap) >= 0)
      log_sink (level, line);
    return;
  }
  if (log_journal) {
    n = (size_t) snprintf (line, sizeof line, "<%d>", log_prio[level]);
  } else {
    struct timeval tv;
    struct tm tm;
    gettimeofday (&tv, NULL);
    localtime_r (&tv.tv_sec, &tm);
    atomic_store_explicit (&log_gmtoff, tm.tm_gmtoff, memory_order_relaxed);
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

/* Note the UTC offset of local time now, for log_signal_line. */
void
log_signal_prepare (void)
{
  time_t t = time (NULL);
  struct tm tm;

  if (localtime_r (&t, &tm))
    atomic_store_explicit (&log_gmtoff, tm.tm_gmtoff, memory_order_relaxed);
}

int
log_to_file (const char *path)
{
  int fd = open (path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);

  if (fd == -1)
    return -1;
  log_signal_prepare ();
  log_journal = 0;
  log_fd = fd;
  return 0;
}

/* A datagram socket connected to syslog's /dev/log, or -1: syslog(3)
 * keeps its own but does not show it. */
static int
log_syslog_socket (void)
{
  struct sockaddr_un sa = { .sun_family = AF_UNIX, .sun_path = "/dev/log" };
  int fd = socket (AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);

  if (fd >= 0 && connect (fd, (struct sockaddr *) &sa, sizeof sa) == -1) {
    close (fd);
    fd = -1;
  }
  return fd;
}

void
log_to_syslog (void)
{
  openlog ("foliod", LOG_PID | LOG_NDELAY, LOG_DAEMON);
  log_syslog_fd = log_syslog_socket ();
  log_syslog = true;
}

void
log_to_sink (void (*fn) (int level, const char *msg))
{
  log_sink = fn;
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

/* ---- from a signal handler: write(2) only ------------------------------ */

/* s into buf at *n, bounded by size. */
static void
sig_put_str (char *buf, size_t size, size_t *n, const char *s, size_t len)
{
  for (size_t i = 0; i < len && *n < size; i++)
    buf[(*n)++] = s[i];
}

/* v in decimal, at least width digits (zero-padded). */
static void
sig_put_uint (char *buf, size_t size, size_t *n, uint64_t v, int width)
{
  char tmp[21];
  int k = 0;

  do {
    tmp[k++] = (char) ('0' + v % 10);
    v /= 10;
  } while (v);
  while (k < width && k < (int) sizeof tmp)
    tmp[k++] = '0';
  while (k > 0 && *n < size)
    buf[(*n)++] = tmp[--k];
}

/* The "%Y-%m-%dT%H:%M:%S.mmm" of log_vline, from the clock and the noted
 * UTC offset: days to a civil date as in H. Hinnant's days_from_civil,
 * inverted (proleptic Gregorian, valid after 1970). */
static void
sig_put_time (char *buf, size_t size, size_t *n)
{
  struct timespec ts;
  int64_t t, days, sec, z, era, doe, yoe, y, doy, mp, d, m;

  clock_gettime (CLOCK_REALTIME, &ts);
  t = (int64_t) ts.tv_sec +
      atomic_load_explicit (&log_gmtoff, memory_order_relaxed);
  days = t / 86400;
  sec = t % 86400;
  z = days + 719468;
  era = z / 146097;
  doe = z - era * 146097;
  yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
  y = yoe + era * 400;
  doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
  mp = (5 * doy + 2) / 153;
  d = doy - (153 * mp + 2) / 5 + 1;
  m = mp < 10 ? mp + 3 : mp - 9;
  y += m <= 2;
  sig_put_uint (buf, size, n, (uint64_t) y, 4);
  sig_put_str (buf, size, n, "-", 1);
  sig_put_uint (buf, size, n, (uint64_t) m, 2);
  sig_put_str (buf, size, n, "-", 1);
  sig_put_uint (buf, size, n, (uint64_t) d, 2);
  sig_put_str (buf, size, n, "T", 1);
  sig_put_uint (buf, size, n, (uint64_t) (sec / 3600), 2);
  sig_put_str (buf, size, n, ":", 1);
  sig_put_uint (buf, size, n, (uint64_t) (sec / 60 % 60), 2);
  sig_put_str (buf, size, n, ":", 1);
  sig_put_uint (buf, size, n, (uint64_t) (sec % 60), 2);
  sig_put_str (buf, size, n, ".", 1);
  sig_put_uint (buf, size, n, (uint64_t) (ts.tv_nsec / 1000000), 3);
}

void
log_signal_line (int level, const char *line, size_t len)
{
  char buf[2048];
  const char *name;
  size_t n = 0, room = sizeof buf - 1;   /* one byte kept for the newline */
  int fd = log_fd, journal = atomic_load (&log_journal) == 1;
  ssize_t r;

  if (level < 0 || level > LOG_LVL_DEBUG)
    level = LOG_LVL_ERROR;
  name = level_names[level];
  if (log_syslog && log_syslog_fd >= 0) {
    /* syslog(3)'s datagram, less the timestamp the daemon adds:
     * "<PRI>foliod[PID]: MSG", PRI = facility daemon (3) * 8 + level. */
    sig_put_str (buf, room, &n, "<", 1);
    sig_put_uint (buf, room, &n, 3 * 8 + (uint64_t) log_prio[level], 1);
    sig_put_str (buf, room, &n, ">foliod[", 8);
    sig_put_uint (buf, room, &n, (uint64_t) getpid (), 1);
    sig_put_str (buf, room, &n, "]: ", 3);
    sig_put_str (buf, room, &n, line, len);
    r = send (log_syslog_fd, buf, n, MSG_NOSIGNAL);
    (void) r;
    return;
  }
  if (log_syslog || log_sink)
    fd = STDERR_FILENO;       /* nowhere better that write(2) reaches */
  if (journal && fd == STDERR_FILENO) {
    sig_put_str (buf, room, &n, "<", 1);
    sig_put_uint (buf, room, &n, (uint64_t) log_prio[level], 1);
    sig_put_str (buf, room, &n, ">", 1);
  } else {
    sig_put_time (buf, room, &n);
    sig_put_str (buf, room, &n, " foliod[", 8);
    sig_put_uint (buf, room, &n, (uint64_t) getpid (), 1);
    sig_put_str (buf, room, &n, "] ", 2);
    sig_put_str (buf, room, &n, name, strlen (name));
    sig_put_str (buf, room, &n, ": ", 2);
  }
  sig_put_str (buf, room, &n, line, len);
  buf[n++] = '\n';
  r = write (fd, buf, n);
  (void) r;
}
