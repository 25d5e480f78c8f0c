/* The one log sink every room writes to (src/util/log.c).
 *
 * foliod_log() checks the level, rate-limits repeated lines per call site,
 * formats the line and hands it to the destination in force:
 *   - stderr, the default (unit tests, tools, foliod in the foreground):
 *     one timestamped line per call, or a "<N>" syslog priority prefix and
 *     no timestamp when stderr is the systemd journal (JOURNAL_STREAM);
 *   - a file (log_to_file: foliod's log-file), timestamped, appended;
 *   - syslog (log_to_syslog: a detached foliod without log-file);
 *   - a function (log_to_sink: the nbdkit plugin's nbdkit_error and
 *     nbdkit_debug).
 * The program picks the destination once, before its threads have
 * anything to log; every room below just calls log_warn() and so on.
 * foliod_log() is thread-safe and keeps the caller's errno (%m works).
 *
 * A signal handler cannot call foliod_log() (it formats, locks and may
 * call syslog): log_signal_line() writes one line to the same destination
 * with write(2) only, through a descriptor opened beforehand.
 */
#ifndef FOLIOD_LOG_H
#define FOLIOD_LOG_H

#include <stddef.h>

/* Levels, syslog-like: lower is more important. */
enum foliod_log_level {
  LOG_LVL_ERROR = 0,
  LOG_LVL_WARN  = 1,
  LOG_LVL_INFO  = 2,
  LOG_LVL_DEBUG = 3,
};

/* One log line (no trailing newline needed).  Lines above the level in
 * force (log_set_level, default info) are dropped unformatted. */
void foliod_log (int level, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

#define log_error(...) foliod_log (LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...)  foliod_log (LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...)  foliod_log (LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) foliod_log (LOG_LVL_DEBUG, __VA_ARGS__)

/* Level names ("error" .. "debug"; parse also takes "warning"), and the
 * level in force. */
const char *log_level_name (int level);
int log_level_parse (const char *s, int *level);
void log_set_level (int level);

/* Destinations: from now on, lines go to the file at path (appended; 0,
 * or -1 with errno), to syslog (ident "foliod", facility daemon), or to
 * fn (the message alone, no timestamp, level or newline; fn must be
 * thread-safe; NULL: back to stderr). */
int log_to_file (const char *path);
void log_to_syslog (void);
void log_to_sink (void (*fn) (int level, const char *msg));

/* Async-signal-safe: one line of n bytes (no newline) at level, whatever
 * the level in force and unlimited, written with write(2) to the file or
 * stderr in force (with the timestamp and level the other lines have), or
 * sent to syslog's socket.  A sink function cannot be called from a signal
 * handler: with one installed the line goes to stderr. */
void log_signal_line (int level, const char *line, size_t n);
/* Called outside the handler when it is installed: notes what
 * log_signal_line cannot find out safely (the local time's UTC offset;
 * every ordinary line notes it again). */
void log_signal_prepare (void);

#endif /* FOLIOD_LOG_H */
