/* The control socket: statistics and forced writeback.
 *
 * Why a Unix socket and not HTTP: a storage host's operators want these
 * numbers without opening a port; a socket file is protected by file
 * permissions (0600, the daemon's user and root), like haproxy's stats
 * socket or Ceph's admin socket.  Why Prometheus text format for the
 * answer: it is what monitoring stacks ingest (node_exporter's textfile
 * collector takes `foliod stats --prometheus` output as is), it is plain
 * text a human can read, and it needs no library.  Prometheus itself
 * scrapes HTTP: metrics-listen (metrics.c) serves the same text there,
 * opt-in.
 *
 * Protocol: the client sends one line, the daemon answers and closes.
 *   "stats\n"        -> Prometheus text exposition format
 *   "stats table\n"  -> the table of `foliod stats` (stats.c)
 *   "flush EXPORT\n" -> "OK ...\n" or "ERROR reason\n"
 *   "clear-doubt EXPORT\n", "clear-doubt-lost EXPORT\n" -> "OK ...\n" or
 *   "ERROR reason\n"
 *   "release EXPORT\n", "release-stop EXPORT\n" -> "OK ...\n" or
 *                    "ERROR reason\n" (export_release: hand the image to
 *                    another host, then serve it read-only, or not at all)
 *   "ublk add EXPORT\n" -> "OK /dev/ublkbN EXPORT\n" or "ERROR reason\n"
 *   "ublk recover EXPORT\n" -> "OK /dev/ublkbN EXPORT recovered\n" or
 *   "ERROR reason\n"; "ublk del N [force]\n", "ublk list\n"
 *   (src/ublk/ublk.h)
 *   "upgrade\n"      -> "OK ...\n" or "ERROR reason\n" (control_set_upgrade:
 *                      the daemon runs it, this thread waits; on success
 *                      the reply is sent as the thread stops)
 * One thread serves the clients (a flush can take as long as the dirty
 * data needs and must not stall the event loop).  It waits on none of
 * them: each has its own state (the request line so far, the reply not
 * yet sent) and a deadline, CONTROL_IO_TIMEOUT_S from its connection for
 * the request and again for the reply, and one poll() covers them all,
 * so a client dribbling a byte now and then delays nobody.  At most
 * CONTROL_MAX_CLIENTS at once; one more evicts the oldest.  The commands
 * that wait for a backing (flush, clear-doubt and release: a flush
 * during an outage waits the remote's retry-timeout, clear-doubt waits
 * for a FLUSH under way) run one after another on a second thread
 * (control_job), so that stats answers at once meanwhile; their client
 * has no deadline until the reply is there.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "foliod/lock.h"
#include "foliod/log.h"
#include "foliod/util.h"
#include "server/server.h"
#include "ublk/ublk.h"

#define CONTROL_IO_TIMEOUT_S 5
#define CONTROL_MAX_CLIENTS 16
#define CONTROL_LINE_MAX 512     /* a request line, '\n' included */
#define CONTROL_STATS_WAIT_S 30  /* the command line's wait for an answer */
#define CONTROL_FLUSH_WAIT_S 3600 /* ... for a flush (writes back first) */
#define CONTROL_RELEASE_DRAIN_MS 60000 /* a release waits this long for the
                                        * writes in progress */

/* One control client: reading its line, then sending the reply. */
struct control_client {
  int fd;                    /* -1: slot free */
  unsigned gen;              /* moves at each close: a job's reply for
                              * an earlier client of the slot is dropped */
  bool busy;                 /* a job computes its reply */
  uint64_t deadline_ms;
  size_t len;                /* bytes of line */
  char line[CONTROL_LINE_MAX];
  char *out;                 /* the reply; NULL while reading */
  size_t out_len, out_sent;
};

struct control {
  int listen_fd;
  int stop_pipe[2];          /* written by control_stop to wake the thread */
  pthread_t thread;
  char *path;
  struct daemon_export *exports;
  size_t n_exports;
  struct server *server;
  struct ublk_set *ublk;
  struct control_client clients[CONTROL_MAX_CLIENTS];
  /* "upgrade": the daemon's (blocks; the reply goes to reply). */
  void (*upgrade) (void *arg, char *reply, size_t len);
  void *upgrade_arg;
  bool keep_path;            /* handed over: control_stop leaves the file */
  /* The commands that may wait (control_job): queued by the control
   * thread, answered by the job thread in order; done_pipe wakes the
   * control thread for the replies.  job_lock guards the lists. */
  pthread_t job_thread;
  bool job_started, job_stop;
  pthread_mutex_t job_lock;
  pthread_cond_t job_cv;
  struct control_job *jobs, *jobs_tail, *done;
  int done_pipe[2];
};

/* A request line that waits for a backing, and its reply. */
struct control_job {
  struct control_job *next;
  size_t slot;               /* ctl->clients[slot] ... */
  unsigned gen;              /* ... while its gen is this */
  char *reply;
  size_t reply_len;
  char line[CONTROL_LINE_MAX];
};

/* ---- the daemon side ------------------------------------------------------ */

static int
write_all (int fd, const char *buf, size_t len)
{
  while (len > 0) {
    ssize_t r = send (fd, buf, len, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    buf += r;
    len -= (size_t) r;
  }
  return 0;
}

/* "flush NAME": write the export back; the answer goes to reply. */
static void
control_flush (struct control *ctl, char *reply, size_t len, const char *name)
{
  for (size_t i = 0; i < ctl->n_exports; i++) {
    struct daemon_export *e = &ctl->exports[i];
    if (strcmp (e->cfg.name, name) != 0 || e->ex == NULL)
      continue;
    struct cache_stats st;
    cache_get_stats (e->ex->cache, &st);
    log_info ("control: flush %s (%llu bytes dirty)", name,
              (unsigned long long) st.dirty_bytes);
    if (cache_write_back (e->ex->cache) == -1)
      snprintf (reply, len, "ERROR flush %.200s: %s\n", name,
                strerror (errno));
    else
      snprintf (reply, len, "OK %.200s: %llu dirty bytes written back\n",
                name, (unsigned long long) st.dirty_bytes);
    return;
  }
  snprintf (reply, len, "ERROR no export named '%.200s'\n", name);
}

/* "clear-doubt NAME": the operator says the remote is done with the
 * writes foliod abandoned (backing_ops.clear_doubt): flushes may succeed
 * again, once what was written since is written again.  On a store a
 * previous run left fenced: its data may be written over the image.
 * Passthrough writes counted lost: the loss is known, FLUSH may succeed
 * again.  "clear-doubt-lost NAME" (--lost-only) says only the last. */
static void
control_clear_doubt (struct control *ctl, char *reply, size_t len,
                     const char *name, bool lost_only)
{
  for (size_t i = 0; i < ctl->n_exports; i++) {
    struct daemon_export *e = &ctl->exports[i];
    if (strcmp (e->cfg.name, name) != 0 || e->ex == NULL)
      continue;
    if (lost_only) {
      uint64_t n = cache_clear_lost (e->ex->cache);
      if (n)
        log_warn ("control: clear-doubt %s: %llu write%s that bypassed the "
                  "cache known lost (the operator's word, --lost-only): "
                  "FLUSH may succeed again, the backing keeps what it has",
                  name, (unsigned long long) n, n == 1 ? "" : "s");
      snprintf (reply, len, "OK %.200s: %llu lost write%s cleared\n", name,
                (unsigned long long) n, n == 1 ? "" : "s");
      return;
    }
    struct cache_stats before, after;
    cache_get_stats (e->ex->cache, &before);
    uint64_t n = cache_clear_doubt (e->ex->cache);
    cache_get_stats (e->ex->cache, &after);
    uint64_t unfenced = before.fenced && !after.fenced;   /* counted in n */
    /* Counted in n too (most of the time: a loss meanwhile is not). */
    uint64_t unlost = after.passthrough_lost == 0 ? before.passthrough_lost
                      : 0;
    if (unlost > n - unfenced)
      unlost = n - unfenced;
    if (unlost)
      log_warn ("control: clear-doubt %s: %llu write%s that bypassed the "
                "cache known lost (the operator's word): FLUSH may succeed "
                "again, the backing keeps what it has", name,
                (unsigned long long) unlost, unlost == 1 ? "" : "s");
    if (unfenced)
      log_warn ("control: clear-doubt %s: the fenced store's dirty data is "
                "to be written over the image as it is now (the operator's "
                "word, foliod(8), Lost lock)", name);
    else if (before.fenced)
      log_warn ("control: clear-doubt %s: this run lost the image (%s): "
                "only a restart can clear that", name,
                after.fence_reason ? after.fence_reason : "fenced");
    if (n > unfenced + unlost)
      log_warn ("control: clear-doubt %s: %llu abandoned write%s no longer "
                "in doubt (the operator's word); writing back again", name,
                (unsigned long long) (n - unfenced - unlost),
                n - unfenced - unlost == 1 ? "" : "s");
    snprintf (reply, len, "OK %.200s: %llu write%s cleared\n", name,
              (unsigned long long) n, n == 1 ? "" : "s");
    return;
  }
  snprintf (reply, len, "ERROR no export named '%.200s'\n", name);
}

/* "release NAME" / "release-stop NAME": stop its writes, write it back,
 * release the image (export_release), and say so in the log as well as
 * to the operator. */
static void
control_release (struct control *ctl, char *reply, size_t len,
                 const char *name, int stop)
{
  char msg[300];

  for (size_t i = 0; i < ctl->n_exports; i++) {
    struct daemon_export *e = &ctl->exports[i];
    if (strcmp (e->cfg.name, name) != 0 || e->ex == NULL)
      continue;
    log_info ("control: release %s: refusing writes, writing back", name);
    if (export_release (e->ex, stop, CONTROL_RELEASE_DRAIN_MS, msg,
                        sizeof msg) == -1) {
      log_error ("export %s: release failed: %s; still serving it "
                 "writable, lock kept", name, msg);
      snprintf (reply, len, "ERROR release %.150s: %.250s; nothing released, "
                "still writable\n", name, msg);
    } else {
      log_info ("export %s: released: %s", name, msg);
      snprintf (reply, len, "OK %.150s released: %.250s\n", name, msg);
    }
    return;
  }
  snprintf (reply, len, "ERROR no export named '%.200s'\n", name);
}

/* "ublk add EXPORT", "ublk recover EXPORT", "ublk del N [force]", "ublk
 * list" (after "ublk "). */
static void
control_ublk (struct control *ctl, char *reply, size_t len, const char *arg)
{
  char err[300], *end;
  bool add = strncmp (arg, "add ", 4) == 0;

  if (add || strncmp (arg, "recover ", 8) == 0) {
    const char *name = arg + (add ? 4 : 8);
    for (size_t i = 0; i < ctl->n_exports; i++) {
      struct daemon_export *e = &ctl->exports[i];
      if (strcmp (e->cfg.name, name) != 0 || e->ex == NULL)
        continue;
      int id = add ? ublk_add (ctl->ublk, e->ex, err, sizeof err)
                   : ublk_recover (ctl->ublk, e->ex, err, sizeof err);
      if (id < 0)
        snprintf (reply, len, "ERROR ublk %s %.100s: %.300s\n",
                  add ? "add" : "recover", name, err);
      else
        snprintf (reply, len, "OK /dev/ublkb%d %.200s%s\n", id, name,
                  add ? "" : " recovered");
      return;
    }
    snprintf (reply, len, "ERROR no export named '%.200s'\n", name);
  } else if (strncmp (arg, "del ", 4) == 0) {
    long id = strtol (arg + 4, &end, 10);
    bool force = strcmp (end, " force") == 0;
    if (end == arg + 4 || id < 0 || id > INT32_MAX || (*end && !force))
      snprintf (reply, len, "ERROR ublk del: want a device number, "
                "N of /dev/ublkbN\n");
    else if (ublk_del (ctl->ublk, (int) id, force, err, sizeof err) == -1)
      snprintf (reply, len, "ERROR ublk del %ld: %.300s\n", id, err);
    else
      snprintf (reply, len, "OK /dev/ublkb%ld removed\n", id);
  } else if (strcmp (arg, "list") == 0) {
    size_t n = ublk_list (ctl->ublk, reply, len);
    if (n == 0)
      snprintf (reply, len, "OK no ublk device\n");
  } else
    snprintf (reply, len, "ERROR ublk: add EXPORT, recover EXPORT, "
              "del N [force] or list\n");
}

/* The reply to one request line, in a malloc'd buffer (*len bytes). */
static char *
control_answer (struct control *ctl, const char *line, size_t *len)
{
  static const char unknown[] = "ERROR unknown command (try 'stats', "
                                "'flush EXPORT', 'clear-doubt EXPORT', "
                                "'release EXPORT' or 'ublk list')\n";
  char *buf;

  if (strcmp (line, "stats") == 0 || strcmp (line, "stats table") == 0)
    return stats_text (ctl->exports, ctl->n_exports, ctl->server,
                       line[5] != '\0', len);
  buf = malloc (512);
  if (buf == NULL)
    return NULL;
  if (strncmp (line, "flush ", 6) == 0)
    control_flush (ctl, buf, 512, line + 6);
  else if (strncmp (line, "clear-doubt ", 12) == 0)
    control_clear_doubt (ctl, buf, 512, line + 12, false);
  else if (strncmp (line, "clear-doubt-lost ", 17) == 0)
    control_clear_doubt (ctl, buf, 512, line + 17, true);
  else if (strncmp (line, "release ", 8) == 0)
    control_release (ctl, buf, 512, line + 8, 0);
  else if (strncmp (line, "release-stop ", 13) == 0)
    control_release (ctl, buf, 512, line + 13, 1);
  else if (strncmp (line, "ublk ", 5) == 0 && ctl->ublk)
    control_ublk (ctl, buf, 512, line + 5);
  else if (strcmp (line, "upgrade") == 0 && ctl->upgrade)
    ctl->upgrade (ctl->upgrade_arg, buf, 512);
  else
    snprintf (buf, 512, "%s", unknown);
  *len = strlen (buf);
  return buf;
}

static void
client_close (struct control_client *cl)
{
  close (cl->fd);
  free (cl->out);
  cl->fd = -1;
  cl->out = NULL;
  cl->busy = false;
  cl->gen++;
}

/* Does line wait for a backing (flush, clear-doubt, release)? */
static bool
line_may_wait (const char *line)
{
  return strncmp (line, "flush ", 6) == 0 ||
         strncmp (line, "clear-doubt ", 12) == 0 ||
         strncmp (line, "clear-doubt-lost ", 17) == 0 ||
         strncmp (line, "release ", 8) == 0 ||
         strncmp (line, "release-stop ", 13) == 0;
}

/* Hand cl's line to the job thread: 0, or -1 (answer it here). */
static int
job_queue (struct control *ctl, struct control_client *cl)
{
  struct control_job *j;

  if (!ctl->job_started || (j = calloc (1, sizeof *j)) == NULL)
    return -1;
  j->slot = (size_t) (cl - ctl->clients);
  j->gen = cl->gen;
  memcpy (j->line, cl->line, cl->len + 1);
  lock_or_die (&ctl->job_lock);
  if (ctl->jobs_tail)
    ctl->jobs_tail->next = j;
  else
    ctl->jobs = j;
  ctl->jobs_tail = j;
  pthread_cond_signal (&ctl->job_cv);
  unlock_or_die (&ctl->job_lock);
  cl->busy = true;
  cl->deadline_ms = UINT64_MAX;   /* the command line waits for a flush */
  return 0;
}

/* The request line is complete (or the client stopped sending): answer. */
static void
client_request (struct control *ctl, struct control_client *cl)
{
  cl->line[cl->len] = '\0';
  if (cl->len > 0 && cl->line[cl->len - 1] == '\r')
    cl->line[--cl->len] = '\0';
  if (line_may_wait (cl->line) && job_queue (ctl, cl) == 0)
    return;
  cl->out = control_answer (ctl, cl->line, &cl->out_len);
  cl->out_sent = 0;
#pragma GCC diagnostic push     /* -fanalyzer: cl->out, freed by client_close */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
  if (cl->out == NULL || cl->out_len == 0) {
#pragma GCC diagnostic pop
    client_close (cl);
    return;
  }
  cl->deadline_ms = now_ms () + CONTROL_IO_TIMEOUT_S * 1000u;
}

/* Read what is there; a full line (or EOF after some) is answered. */
static void
client_read (struct control *ctl, struct control_client *cl)
{
  static const char too_long[] = "ERROR request too long\n";
  ssize_t r = recv (cl->fd, cl->line + cl->len,
                    sizeof cl->line - 1 - cl->len, MSG_DONTWAIT);
  char *nl;

  if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
    return;
  if (r <= 0) {
    if (r == 0 && cl->len > 0)
      client_request (ctl, cl);    /* the last line without '\n' */
    else
      client_close (cl);
    return;
  }
  cl->len += (size_t) r;
  nl = memchr (cl->line, '\n', cl->len);
  if (nl) {
    cl->len = (size_t) (nl - cl->line);
    client_request (ctl, cl);
  } else if (cl->len == sizeof cl->line - 1) {
    if (send (cl->fd, too_long, sizeof too_long - 1,
              MSG_NOSIGNAL | MSG_DONTWAIT) < 0)
      log_debug ("control socket: %m");
    client_close (cl);
  }
}

static void
client_write (struct control_client *cl)
{
  ssize_t r = send (cl->fd, cl->out + cl->out_sent, cl->out_len - cl->out_sent,
                    MSG_NOSIGNAL | MSG_DONTWAIT);

  if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
    return;
  if (r < 0) {
    client_close (cl);
    return;
  }
  cl->out_sent += (size_t) r;
  if (cl->out_sent == cl->out_len)
    client_close (cl);
}

/* A new client takes a free slot, or the oldest one's. */
static void
control_accept (struct control *ctl)
{
  struct control_client *cl = NULL;
  int fd = accept4 (ctl->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

  if (fd < 0)
    return;
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++) {
    struct control_client *c = &ctl->clients[i];
    if (c->fd == -1) {
      cl = c;
      break;
    }
    if (cl == NULL || c->deadline_ms < cl->deadline_ms)
      cl = c;
  }
  if (cl->fd != -1) {
    log_warn ("control socket: %d clients busy, dropping the oldest",
              CONTROL_MAX_CLIENTS);
    client_close (cl);
  }
  cl->fd = fd;
  cl->len = 0;
  cl->deadline_ms = now_ms () + CONTROL_IO_TIMEOUT_S * 1000u;
}

/* Close the clients past their deadline, fill p[3..] with the others
 * but those waiting for a job (map[i] is the client of p[3 + i]);
 * returns the poll timeout (ms) until the nearest deadline. */
static int
control_poll_set (struct control *ctl, struct pollfd *p,
                  struct control_client **map, nfds_t *n)
{
  uint64_t now = now_ms (), next = UINT64_MAX;

  *n = 3;
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++) {
    struct control_client *cl = &ctl->clients[i];
    if (cl->fd == -1 || cl->busy)
      continue;
    if (cl->deadline_ms <= now) {
      log_debug ("control socket: a client timed out");
      client_close (cl);
      continue;
    }
    if (cl->deadline_ms < next)
      next = cl->deadline_ms;
    map[*n - 3] = cl;
    p[*n].fd = cl->fd;
    p[*n].events = cl->out ? POLLOUT : POLLIN;
    p[*n].revents = 0;
    (*n)++;
  }
  return next == UINT64_MAX ? -1 : (int) (next - now);
}

/* The job thread: the queued lines, in order. */
static void *
job_thread (void *arg)
{
  struct control *ctl = arg;

  lock_or_die (&ctl->job_lock);
  for (;;) {
    while (!ctl->jobs && !ctl->job_stop)
      pthread_cond_wait (&ctl->job_cv, &ctl->job_lock);
    if (ctl->job_stop)
      break;
    struct control_job *j = ctl->jobs;
    ctl->jobs = j->next;
    if (!ctl->jobs)
      ctl->jobs_tail = NULL;
    unlock_or_die (&ctl->job_lock);
    j->reply = control_answer (ctl, j->line, &j->reply_len);
    lock_or_die (&ctl->job_lock);
    j->next = ctl->done;
    ctl->done = j;
    /* Full (EAGAIN): the control thread has a wake-up coming anyway. */
    if (write (ctl->done_pipe[1], "x", 1) != 1 && errno != EAGAIN)
      log_warn ("control socket: cannot wake the thread: %s",
                strerror (errno));
  }
  unlock_or_die (&ctl->job_lock);
  return NULL;
}

/* The job thread's replies go to their clients, if still there. */
static void
jobs_done (struct control *ctl)
{
  char buf[64];
  struct control_job *j, *next;

  while (read (ctl->done_pipe[0], buf, sizeof buf) > 0)
    ;
  lock_or_die (&ctl->job_lock);
  j = ctl->done;
  ctl->done = NULL;
  unlock_or_die (&ctl->job_lock);
  for (; j; j = next) {
    struct control_client *cl = &ctl->clients[j->slot];
    next = j->next;
    if (cl->fd != -1 && cl->busy && cl->gen == j->gen) {
      cl->busy = false;
      cl->out = j->reply;
      cl->out_len = j->reply_len;
      cl->out_sent = 0;
      cl->deadline_ms = now_ms () + CONTROL_IO_TIMEOUT_S * 1000u;
      if (cl->out == NULL || cl->out_len == 0)
        client_close (cl);
    } else
      free (j->reply);
    free (j);
  }
}

static void
jobs_free (struct control_job *j)
{
  while (j) {
    struct control_job *next = j->next;
    free (j->reply);
    free (j);
    j = next;
  }
}

static void *
control_thread (void *arg)
{
  struct control *ctl = arg;
  struct pollfd p[3 + CONTROL_MAX_CLIENTS] = {
    { .fd = ctl->listen_fd, .events = POLLIN },
    { .fd = ctl->stop_pipe[0], .events = POLLIN },
    { .fd = ctl->done_pipe[0], .events = POLLIN },
  };
  struct control_client *map[CONTROL_MAX_CLIENTS];

  for (;;) {
    nfds_t n;
    int timeout = control_poll_set (ctl, p, map, &n);

    if (poll (p, n, timeout) == -1) {
      if (errno == EINTR)
        continue;
      log_error ("control socket: poll: %s", strerror (errno));
      break;
    }
    if (p[1].revents)
      break;
    for (nfds_t i = 3; i < n; i++)
      if (p[i].revents && map[i - 3]->out)
        client_write (map[i - 3]);
      else if (p[i].revents)
        client_read (ctl, map[i - 3]);
    if (p[2].revents & POLLIN)
      jobs_done (ctl);
    if (p[0].revents & POLLIN)
      control_accept (ctl);
  }
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++)
    if (ctl->clients[i].fd != -1) {
      if (ctl->clients[i].out)      /* a short reply: one try */
        client_write (&ctl->clients[i]);
      if (ctl->clients[i].fd != -1)
        client_close (&ctl->clients[i]);
    }
  return NULL;
}

static int
sockaddr_for (const char *path, struct sockaddr_un *sa)
{
  memset (sa, 0, sizeof *sa);
  sa->sun_family = AF_UNIX;
  if (strlen (path) >= sizeof sa->sun_path) {
    errno = ENAMETOOLONG;
    return -1;
  }
  strcpy (sa->sun_path, path);
  return 0;
}

/* Refuse to steal the socket of a running daemon; remove a stale one. */
static int
remove_stale (const char *path, const struct sockaddr_un *sa)
{
  struct stat st;
  int fd, r;

  if (lstat (path, &st) == -1)
    return 0;
  if (!S_ISSOCK (st.st_mode)) {
    errno = EEXIST;
    return -1;
  }
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  r = connect (fd, (const struct sockaddr *) sa, sizeof *sa);
  close (fd);
  if (r == 0) {
    errno = EADDRINUSE;
    return -1;
  }
  return unlink (path);
}

static int
control_listen (const char *path)
{
  struct sockaddr_un sa;
  mode_t old;
  int fd, r;

  if (sockaddr_for (path, &sa) == -1 || remove_stale (path, &sa) == -1)
    return -1;
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  old = umask (0177);          /* socket file 0600 */
  r = bind (fd, (struct sockaddr *) &sa, sizeof sa);
  umask (old);
  if (r == -1 || listen (fd, 16) == -1) {
    int e = errno;
    close (fd);
    errno = e;
    return -1;
  }
  return fd;
}

void
control_set_upgrade (struct control *ctl,
                     void (*fn) (void *arg, char *reply, size_t len),
                     void *arg)
{
  ctl->upgrade = fn;
  ctl->upgrade_arg = arg;
}

int
control_fd (struct control *ctl, bool keep_path)
{
  ctl->keep_path = keep_path;
  return ctl->listen_fd;
}

/* After the control thread: the job under way ends (a flush waits as
 * long as it did in the control thread), the queued ones are dropped. */
static void
jobs_stop (struct control *ctl)
{
  if (ctl->job_started) {
    lock_or_die (&ctl->job_lock);
    ctl->job_stop = true;
    pthread_cond_signal (&ctl->job_cv);
    unlock_or_die (&ctl->job_lock);
    pthread_join (ctl->job_thread, NULL);
    ctl->job_started = false;
  }
  jobs_free (ctl->jobs);
  jobs_free (ctl->done);
  ctl->jobs = ctl->jobs_tail = ctl->done = NULL;
  if (ctl->done_pipe[0] >= 0) {
    close (ctl->done_pipe[0]);
    close (ctl->done_pipe[1]);
  }
  pthread_mutex_destroy (&ctl->job_lock);
  pthread_cond_destroy (&ctl->job_cv);
}

struct control *
control_start (const char *path, int fd, struct daemon_export *ex,
               size_t n, void *server, struct ublk_set *ublk)
{
  struct control *ctl = calloc (1, sizeof *ctl);
  int err;

  if (ctl == NULL)
    return NULL;
  ctl->exports = ex;
  ctl->n_exports = n;
  ctl->server = server;
  ctl->ublk = ublk;
  ctl->stop_pipe[0] = ctl->stop_pipe[1] = -1;
  ctl->done_pipe[0] = ctl->done_pipe[1] = -1;
  pthread_mutex_init (&ctl->job_lock, NULL);
  pthread_cond_init (&ctl->job_cv, NULL);
  for (size_t i = 0; i < CONTROL_MAX_CLIENTS; i++)
    ctl->clients[i].fd = -1;
  ctl->path = strdup (path);
  ctl->listen_fd = fd >= 0 ? fd : control_listen (path);
  if (ctl->path == NULL || ctl->listen_fd == -1 ||
      pipe2 (ctl->stop_pipe, O_CLOEXEC) == -1 ||
      pipe2 (ctl->done_pipe, O_CLOEXEC | O_NONBLOCK) == -1) {
    log_error ("control socket %s: %s", path, strerror (errno));
    goto fail;
  }
  /* Without it, the commands that wait run in the control thread. */
  err = thread_start (&ctl->job_thread, job_thread, ctl, "control-job");
  if (err)
    log_warn ("control socket: job thread: %s (flush and clear-doubt hold "
              "up stats)", strerror (err));
  ctl->job_started = err == 0;
  err = thread_start (&ctl->thread, control_thread, ctl, "control");
  if (err) {
    log_error ("control socket: thread: %s", strerror (err));
    unlink (path);
    goto fail;
  }
  log_info ("control socket %s", path);
  return ctl;

fail:
  jobs_stop (ctl);
  if (ctl->listen_fd >= 0)
    close (ctl->listen_fd);
  if (ctl->stop_pipe[0] >= 0) {
    close (ctl->stop_pipe[0]);
    close (ctl->stop_pipe[1]);
  }
  free (ctl->path);
  free (ctl);
  return NULL;
}

void
control_stop (struct control *ctl)
{
  if (ctl == NULL)
    return;
  if (write (ctl->stop_pipe[1], "x", 1) != 1)
    log_warn ("control socket: cannot wake the thread");
  pthread_join (ctl->thread, NULL);
  jobs_stop (ctl);
  close (ctl->listen_fd);
  close (ctl->stop_pipe[0]);
  close (ctl->stop_pipe[1]);
  if (!ctl->keep_path)
    unlink (ctl->path);
  free (ctl->path);
  free (ctl);
}

/* ---- the client side: foliod stats / foliod flush ------------------------- */

int
control_request (const char *path, const char *command, char **reply)
{
  struct sockaddr_un sa;
  char *buf = NULL;
  size_t len = 0, cap = 0;
  int fd, r = -1;

  *reply = NULL;
  if (sockaddr_for (path, &sa) == -1 ||
      (fd = socket (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) == -1) {
    fprintf (stderr, "foliod: %s: %s\n", path, strerror (errno));
    return -1;
  }
  if (connect (fd, (struct sockaddr *) &sa, sizeof sa) == -1) {
    fprintf (stderr, "foliod: cannot connect to the control socket %s: %s\n"
             "(is foliod running? give --control PATH or --config FILE)\n",
             path, strerror (errno));
    goto out;
  }
  /* A daemon that accepts but never answers (stopped, or wedged) must
   * not hang the command: stats answers at once; a flush may write back
   * a lot of data first. */
  struct timeval tv = {
    .tv_sec = strncmp (command, "flush", 5) == 0 ||
              strncmp (command, "release", 7) == 0 ||
              strncmp (command, "ublk", 4) == 0 ||
              strncmp (command, "upgrade", 7) == 0 ? CONTROL_FLUSH_WAIT_S
                                                   : CONTROL_STATS_WAIT_S,
  };
  if (setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == -1 ||
      setsockopt (fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv) == -1 ||
      write_all (fd, command, strlen (command)) == -1)
    goto io_error;
  for (;;) {
    if (cap - len < 4096) {
      char *nb = realloc (buf, cap + 65536);
      if (nb == NULL)
        goto io_error;
      buf = nb;
      cap += 65536;
    }
    ssize_t n = recv (fd, buf + len, cap - len - 1, 0);
    if (n < 0 && errno == EINTR)
      continue;
    if (n < 0)
      goto io_error;
    if (n == 0)
      break;
    len += (size_t) n;
  }
  buf[len] = '\0';
  /* Every answer has a line: none means foliod died (or was killed)
   * before it answered, and whatever was asked may not have happened. */
  if (len == 0) {
    fprintf (stderr, "foliod: control socket %s: closed without an answer "
             "(foliod exited?)\n", path);
    goto out;
  }
  if (strncmp (buf, "ERROR", 5) == 0) {
    fprintf (stderr, "foliod: %s", buf + 6);
    goto out;
  }
  *reply = buf;
  buf = NULL;
  r = 0;
  goto out;

io_error:
  fprintf (stderr, "foliod: control socket %s: %s\n", path,
           errno == EAGAIN || errno == EWOULDBLOCK ? "no answer in time"
                                                  : strerror (errno));
out:
  free (buf);
  close (fd);
  return r;
}

int
control_client (const char *path, const char *command)
{
  char *reply;

  if (control_request (path, command, &reply) == -1)
    return -1;
  fputs (reply, stdout);
  free (reply);
  return 0;
}
