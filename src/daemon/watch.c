/* foliod stats --watch: the stats table refreshed every interval, and
 * below it what happened during the interval, per second (as iostat -x 1
 * does for disks): reads, hits, bytes read, written and written back.
 *
 * Each report takes two requests on the control socket: "stats table"
 * for the table as `foliod stats` prints it, "stats" (the Prometheus
 * text, the form meant for programs) for the counters the rates come
 * from.  The rates are the difference of two readings over the time
 * between them, measured on the monotonic clock.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "daemon/daemon.h"

enum { W_HITS, W_MISSES, W_READ, W_WRITE, W_WRITEBACK, W_DIRTY, W_N };

/* The Prometheus names of the counters above, in that order. */
static const char *const watch_metric[W_N] = {
  "foliod_read_hits_total", "foliod_read_misses_total",
  "foliod_client_read_bytes_total", "foliod_client_write_bytes_total",
  "foliod_writeback_bytes_total", "foliod_dirty_bytes",
};

#define WATCH_MAX_EXPORTS 256

struct watch_sample {
  size_t n;
  struct {
    char name[256];       /* the label value, unescaped */
    unsigned long long v[W_N];
  } ex[WATCH_MAX_EXPORTS];
};

/* The export of name in s, added if new (NULL when s is full). */
static unsigned long long *
sample_export (struct watch_sample *s, const char *name)
{
  for (size_t i = 0; i < s->n; i++)
    if (strcmp (s->ex[i].name, name) == 0)
      return s->ex[i].v;
  if (s->n == WATCH_MAX_EXPORTS)
    return NULL;
  snprintf (s->ex[s->n].name, sizeof s->ex[s->n].name, "%s", name);
  memset (s->ex[s->n].v, 0, sizeof s->ex[s->n].v);
  return s->ex[s->n++].v;
}

/* One line 'METRIC{export="LABEL"} VALUE' into s; other lines are not
 * ours. */
static void
sample_line (struct watch_sample *s, const char *line)
{
  for (int m = 0; m < W_N; m++) {
    size_t n = strlen (watch_metric[m]);
    char name[256];
    size_t k = 0;
    const char *p;
    unsigned long long *v;

    if (strncmp (line, watch_metric[m], n) != 0 ||
        strncmp (line + n, "{export=\"", 9) != 0)
      continue;
    for (p = line + n + 9; *p && *p != '"' && k < sizeof name - 1; p++) {
      if (*p == '\\' && p[1]) {  /* \" \\ \n as stats.c escapes them */
        p++;
        name[k++] = *p == 'n' ? '\n' : *p;
      } else
        name[k++] = *p;
    }
    name[k] = '\0';
    if (strncmp (p, "\"} ", 3) != 0 || (v = sample_export (s, name)) == NULL)
      return;
    v[m] = strtoull (p + 3, NULL, 10);
    return;
  }
}

static int
sample_take (const char *path, struct watch_sample *s)
{
  char *text, *line, *save = NULL;

  if (control_request (path, "stats\n", &text) == -1)
    return -1;
  s->n = 0;
  for (line = strtok_r (text, "\n", &save); line;
       line = strtok_r (NULL, "\n", &save))
    sample_line (s, line);
  free (text);
  return 0;
}

static double
mono_s (void)
{
  struct timespec ts;

  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (double) ts.tv_sec + (double) ts.tv_nsec / 1e9;
}

/* Sleep until the monotonic time t (seconds). */
static void
sleep_until (double t)
{
  struct timespec ts = {
    .tv_sec = (time_t) t,
    .tv_nsec = (long) ((t - (double) (time_t) t) * 1e9),
  };

  while (clock_nanosleep (CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) == EINTR)
    ;
}

/* Per second over secs: the counter's growth (0 if it went back, as
 * across a restart of foliod). */
static double
rate (unsigned long long now, unsigned long long before, double secs)
{
  return now >= before ? (double) (now - before) / secs : 0;
}

static const char *const rates_head[] = {
  "EXPORT", "READS/S", "HITS/S", "HIT RATIO", "READ/S", "WRITTEN/S",
  "WRITTEN BACK/S", "DIRTY",
};
#define RATES_COLS (sizeof rates_head / sizeof rates_head[0])

/* The rates table of the exports in cur (those also in prev). */
static void
rates_print (const struct watch_sample *prev, const struct watch_sample *cur,
             double secs)
{
  static char cell[WATCH_MAX_EXPORTS + 1][RATES_COLS][32];
  int width[RATES_COLS] = { 0 };
  size_t rows = 1;

  for (size_t c = 0; c < RATES_COLS; c++)
    snprintf (cell[0][c], sizeof cell[0][c], "%s", rates_head[c]);
  for (size_t i = 0; i < cur->n; i++) {
    const unsigned long long *a = cur->ex[i].v, *b = NULL;
    char (*row)[32] = cell[rows];
    for (size_t j = 0; j < prev->n && b == NULL; j++)
      if (strcmp (prev->ex[j].name, cur->ex[i].name) == 0)
        b = prev->ex[j].v;
    if (b == NULL)
      continue;
    double hits = rate (a[W_HITS], b[W_HITS], secs);
    double reads = hits + rate (a[W_MISSES], b[W_MISSES], secs);
    snprintf (row[0], 32, "%.31s", cur->ex[i].name);
    snprintf (row[1], 32, "%.0f", reads);
    snprintf (row[2], 32, "%.0f", hits);
    if (reads > 0)
      snprintf (row[3], 32, "%.1f%%", 100.0 * hits / reads);
    else
      snprintf (row[3], 32, "-");
    stats_human_size (row[4], 32, (uint64_t) rate (a[W_READ], b[W_READ], secs));
    stats_human_size (row[5], 32, (uint64_t) rate (a[W_WRITE], b[W_WRITE], secs));
    stats_human_size (row[6], 32,
                      (uint64_t) rate (a[W_WRITEBACK], b[W_WRITEBACK], secs));
    stats_human_size (row[7], 32, a[W_DIRTY]);
    rows++;
  }
  for (size_t r = 0; r < rows; r++)
    for (size_t c = 0; c < RATES_COLS; c++)
      if ((int) strlen (cell[r][c]) > width[c])
        width[c] = (int) strlen (cell[r][c]);
  for (size_t r = 0; r < rows; r++) {
    for (size_t c = 0; c < RATES_COLS; c++)
      printf (c == 0 ? "%-*s" : "  %*s", width[c], cell[r][c]);
    putchar ('\n');
  }
}

int
stats_watch (const char *path, double interval, unsigned count)
{
  struct watch_sample *prev = malloc (sizeof *prev);
  struct watch_sample *cur = malloc (sizeof *cur);
  int tty = isatty (STDOUT_FILENO), r = -1;
  double t_prev, t_cur, start;

  if (prev == NULL || cur == NULL) {
    fprintf (stderr, "foliod: stats --watch: %s\n", strerror (ENOMEM));
    goto out;
  }
  if (sample_take (path, prev) == -1)
    goto out;
  start = t_prev = mono_s ();
  for (unsigned i = 1; count == 0 || i <= count; i++) {
    char *table, stamp[64];
    time_t now;
    struct tm tm;

    sleep_until (start + interval * i);
    if (sample_take (path, cur) == -1 ||
        control_request (path, "stats table\n", &table) == -1)
      goto out;
    t_cur = mono_s ();
    now = time (NULL);
    localtime_r (&now, &tm);
    strftime (stamp, sizeof stamp, "%Y-%m-%d %H:%M:%S", &tm);
    /* In place on a terminal (home, clear); one report after the other
     * into a file or a pipe. */
    printf ("%s%sfoliod stats: %s, every %g s\n\n%s\n",
            tty ? "\033[H\033[2J" : "", i > 1 && !tty ? "\n" : "",
            stamp, interval, table);
    free (table);
    printf ("per second over the last %.1f s:\n", t_cur - t_prev);
    rates_print (prev, cur, t_cur - t_prev);
    fflush (stdout);
    struct watch_sample *t = prev;
    prev = cur;
    cur = t;
    t_prev = t_cur;
  }
  r = 0;
 out:
  free (prev);
  free (cur);
  return r;
}
