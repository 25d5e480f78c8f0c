/* Logging interface the server uses.
 *
 * The server only declares foliod_log(); the daemon implements it (in
 * src/daemon/log.c: level filter, timestamps, stderr or journal).  Any other
 * program that links src/server/ must provide its own foliod_log().
 * foliod_log() must be thread-safe: worker threads may call it.
 */
#ifndef FOLIOD_SERVER_LOG_H
#define FOLIOD_SERVER_LOG_H

/* Levels, syslog-like: lower is more important. */
enum foliod_log_level {
  LOG_LVL_ERROR = 0,
  LOG_LVL_WARN  = 1,
  LOG_LVL_INFO  = 2,
  LOG_LVL_DEBUG = 3,
};

/* One log line (no trailing newline needed). */
void foliod_log (int level, const char *fmt, ...)
  __attribute__ ((format (printf, 2, 3)));

#define log_error(...) foliod_log (LOG_LVL_ERROR, __VA_ARGS__)
#define log_warn(...)  foliod_log (LOG_LVL_WARN, __VA_ARGS__)
#define log_info(...)  foliod_log (LOG_LVL_INFO, __VA_ARGS__)
#define log_debug(...) foliod_log (LOG_LVL_DEBUG, __VA_ARGS__)

#endif /* FOLIOD_SERVER_LOG_H */
