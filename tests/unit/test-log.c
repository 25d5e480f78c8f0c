/* The log sink (src/util/log.c, compiled in here) and the
 * escaping of what peers send (str_escape):
 *   - foliod_log keeps the caller's errno, even when the write fails,
 *     and %m prints the caller's errno;
 *   - a burst of one kind of line is cut to LOG_BURST lines, and the
 *     number dropped is said once a second later;
 *   - str_escape turns control bytes into \xHH and caps the length;
 *   - log-level names parse back to their level ("warning" too);
 *   - log_signal_line (the SIGBUS handler's way in) stamps its line with
 *     the local time the other lines show, in a zone off UTC, and sends
 *     syslog a datagram with the daemon facility and the level.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "util/log.c"

/* Point stderr at path (truncated); returns the old stderr. */
static int
stderr_to (const char *path)
{
  int old = dup (STDERR_FILENO), fd = open (path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

  assert_true (old >= 0 && fd >= 0);
  assert_int_equal (dup2 (fd, STDERR_FILENO), STDERR_FILENO);
  close (fd);
  return old;
}

static void
stderr_back (int old)
{
  assert_int_equal (dup2 (old, STDERR_FILENO), STDERR_FILENO);
  close (old);
}

static char *
slurp (const char *path)
{
  static char buf[1 << 20];
  FILE *f = fopen (path, "r");
  size_t n;

  assert_non_null (f);
  n = fread (buf, 1, sizeof buf - 1, f);
  buf[n] = '\0';
  fclose (f);
  return buf;
}

static size_t
count_lines (const char *s, const char *needle)
{
  size_t n = 0;

  for (const char *p = s; (p = strstr (p, needle)) != NULL; p++)
    n++;
  return n;
}

static void
test_errno_kept (void **state)
{
  char path[] = "/tmp/foliod-test-log-XXXXXX";
  int fd = mkstemp (path), old;

  assert_true (fd >= 0);
  close (fd);
  /* A write that fails (ENOSPC) must not change the caller's errno. */
  old = stderr_to ("/dev/full");
  errno = EPERM;
  log_warn ("errno test");
  assert_int_equal (errno, EPERM);
  stderr_back (old);
  old = stderr_to (path);
  errno = ENOSPC;
  log_warn ("failed: %m");
  assert_int_equal (errno, ENOSPC);
  stderr_back (old);
  assert_non_null (strstr (slurp (path), strerror (ENOSPC)));
  unlink (path);
}

static void
test_rate_limit (void **state)
{
  char path[] = "/tmp/foliod-test-log-XXXXXX";
  int fd = mkstemp (path), old;
  const char *out;

  assert_true (fd >= 0);
  close (fd);
  old = stderr_to (path);
  for (int i = 0; i < 5000; i++)
    log_warn ("storm line %d", i);
  log_info ("another kind");
  usleep (1100 * 1000);
  log_info ("after the storm");
  stderr_back (old);
  out = slurp (path);
  /* The burst, plus what refilled while the loop ran. */
  assert_true (count_lines (out, "storm line") >= LOG_BURST);
  assert_true (count_lines (out, "storm line") < LOG_BURST + 50);
  assert_non_null (strstr (out, "another kind"));
  assert_non_null (strstr (out, "similar messages suppressed: storm line %d"));
  assert_non_null (strstr (out, "after the storm"));
  unlink (path);
}

static void
test_escape (void **state)
{
  char out[ESCAPED_MAX], small[12];
  static const char forged[] = "x\n2026-01-01 foliod[1] error: forged\\\x7f\xff";
  char big[5000];

  str_escape (out, sizeof out, forged, sizeof forged - 1);
  assert_string_equal (out, "x\\x0a2026-01-01 foliod[1] error: forged"
                       "\\x5c\\x7f\\xff");
  /* Cut short: "..." and never half an escape. */
  str_escape (small, sizeof small, "abcdef\n\n\n", 9);
  assert_string_equal (small, "abcdef...");
  memset (big, 'a', sizeof big);
  str_escape (out, sizeof out, big, sizeof big);
  assert_int_equal (strlen (out), ESCAPED_MAX - 1);
  assert_string_equal (out + ESCAPED_MAX - 4, "...");
  str_escape (out, sizeof out, "", 0);
  assert_string_equal (out, "");
}

static void
test_level_names (void **state)
{
  int level = -1;

  for (int i = LOG_LVL_ERROR; i <= LOG_LVL_DEBUG; i++) {
    assert_int_equal (log_level_parse (log_level_name (i), &level), 0);
    assert_int_equal (level, i);
  }
  assert_int_equal (log_level_parse ("Warning", &level), 0);
  assert_int_equal (level, LOG_LVL_WARN);
  assert_int_equal (log_level_parse ("loud", &level), -1);
  assert_string_equal (log_level_name (LOG_LVL_DEBUG + 1), "?");
}

/* The time at the start of the line of out that holds needle. */
static time_t
line_time (const char *out, const char *needle)
{
  const char *p = strstr (out, needle);
  struct tm tm;

  assert_non_null (p);
  while (p > out && p[-1] != '\n')
    p--;
  memset (&tm, 0, sizeof tm);
  assert_non_null (strptime (p, "%Y-%m-%dT%H:%M:%S", &tm));
  return timegm (&tm);
}

static void
test_signal_line_time (void **state)
{
  char path[] = "/tmp/foliod-test-log-XXXXXX";
  int fd = mkstemp (path), old;
  char want[64];
  const char *out;
  time_t a, b;

  assert_true (fd >= 0);
  close (fd);
  /* Half an hour off a whole hour, so that a wrong offset shows. */
  setenv ("TZ", "XST-5:30", 1);
  tzset ();
  /* What installing a handler does; the handler's line comes first, so
   * that no ordinary line has noted the offset for it. */
  log_signal_prepare ();
  old = stderr_to (path);
  log_signal_line (LOG_LVL_ERROR, "from a handler", 14);
  log_warn ("an ordinary line");
  stderr_back (old);
  out = slurp (path);
  snprintf (want, sizeof want, " foliod[%d] error: from a handler\n",
            (int) getpid ());
  assert_non_null (strstr (out, want));
  a = line_time (out, "an ordinary line");
  b = line_time (out, "from a handler");
  assert_true (a >= b && a - b <= 2);
  unsetenv ("TZ");
  tzset ();
  unlink (path);
}

static void
test_signal_line_syslog (void **state)
{
  int sv[2];
  char buf[256], want[64];
  ssize_t n;

  assert_int_equal (socketpair (AF_UNIX, SOCK_DGRAM, 0, sv), 0);
  log_syslog = true;
  log_syslog_fd = sv[0];
  log_signal_line (LOG_LVL_ERROR, "store x: SIGBUS", 15);
  log_syslog = false;
  log_syslog_fd = -1;
  n = recv (sv[1], buf, sizeof buf - 1, MSG_DONTWAIT);
  assert_true (n > 0);
  buf[n] = '\0';
  /* daemon (3) * 8 + err (3) */
  snprintf (want, sizeof want, "<27>foliod[%d]: store x: SIGBUS",
            (int) getpid ());
  assert_string_equal (buf, want);
  close (sv[0]);
  close (sv[1]);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_errno_kept),
    cmocka_unit_test (test_rate_limit),
    cmocka_unit_test (test_escape),
    cmocka_unit_test (test_level_names),
    cmocka_unit_test (test_signal_line_time),
    cmocka_unit_test (test_signal_line_syslog),
  };

  return cmocka_run_group_tests (tests, NULL, NULL);
}
