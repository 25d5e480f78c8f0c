/* Upgrade in place, the process half: the old foliod starts the new
 * binary and hands it its sockets; the new one takes them.
 *
 * What goes across (docs/internals.md, "Upgrade in place"): the
 * listening sockets, the control socket and every plain connection in
 * transmission (server_handover), as file descriptors the child
 * inherits, and a description of them in a memfd: a header, the
 * listening fds, then per connection its fd, what it negotiated
 * (struct server_moved) and the bytes the old process had read but not
 * parsed.  The environment says where: FOLIOD_UPGRADE=MEMFD,READYFD.
 * The new process writes "1" to READYFD once it serves (after READY=1 to
 * systemd); if it exits or says nothing within UPGRADE_READY_S, the old
 * one kills it and serves on.  The layout is versioned: a binary that
 * does not know the version refuses to start (and the old one resumes).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "foliod/util.h"

#define UPGRADE_ENV "FOLIOD_UPGRADE"
#define UPGRADE_MAGIC "FOLIOUP1"

struct blob_hdr {
  char magic[8];
  uint32_t n_listen;
  int32_t control_fd;
  uint32_t detached;
  uint32_t n_conns;
};

/* One connection, followed by name_len bytes of export name and
 * pending_len unread bytes. */
struct blob_conn {
  int32_t fd;
  uint32_t client_flags;
  uint16_t tflags, flags;
  uint32_t hdr_have;
  uint8_t hdr[32];
  uint32_t pending_len;
  uint32_t name_len;
  char peer[80];
  char key[64];
};

static int
put (int fd, const void *p, size_t n)
{
  const char *c = p;

  while (n > 0) {
    ssize_t k = write (fd, c, n);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      return -1;
    c += k;
    n -= (size_t) k;
  }
  return 0;
}

static int
blob_write (int fd, const struct upgrade_handoff *u)
{
  struct blob_hdr h = { .n_listen = (uint32_t) u->n_listen,
                        .control_fd = u->control_fd,
                        .detached = (uint32_t) u->detached,
                        .n_conns = (uint32_t) u->n_conns };

  memcpy (h.magic, UPGRADE_MAGIC, sizeof h.magic);
  if (put (fd, &h, sizeof h) < 0)
    return -1;
  for (int i = 0; i < u->n_listen; i++) {
    int32_t lfd = u->listen_fds[i];
    if (put (fd, &lfd, sizeof lfd) < 0)
      return -1;
  }
  for (size_t i = 0; i < u->n_conns; i++) {
    const struct server_moved *m = &u->conns[i];
    struct blob_conn b = { .fd = m->fd, .client_flags = m->client_flags,
                           .tflags = m->tflags, .flags = m->flags,
                           .hdr_have = m->hdr_have,
                           .pending_len = m->pending_len,
                           .name_len = (uint32_t) strlen (m->export_name) };
    memcpy (b.hdr, m->hdr, sizeof b.hdr);
    memcpy (b.peer, m->peer, sizeof b.peer);
    memcpy (b.key, m->key, sizeof b.key);
    if (put (fd, &b, sizeof b) < 0 || put (fd, m->export_name, b.name_len) < 0
        || put (fd, m->pending, m->pending_len) < 0)
      return -1;
  }
  return lseek (fd, 0, SEEK_SET) == 0 ? 0 : -1;
}

/* Reads from a buffer; -1 when it runs out. */
struct cursor {
  const uint8_t *p;
  size_t left;
};

static int
take (struct cursor *c, void *dst, size_t n)
{
  if (n > c->left)
    return -1;
  memcpy (dst, c->p, n);
  c->p += n;
  c->left -= n;
  return 0;
}

static int
blob_conn_read (struct cursor *c, struct server_moved *m)
{
  struct blob_conn b;

  memset (m, 0, sizeof *m);
  m->fd = -1;
  if (take (c, &b, sizeof b) < 0 || b.name_len > EXPORT_NAME_MAX ||
      !(m->export_name = calloc (1, b.name_len + 1)) ||
      take (c, m->export_name, b.name_len) < 0 ||
      (b.pending_len && !(m->pending = malloc (b.pending_len))) ||
      take (c, m->pending, b.pending_len) < 0)
    return -1;
  m->fd = b.fd;
  m->client_flags = b.client_flags;
  m->tflags = b.tflags;
  m->flags = b.flags;
  m->hdr_have = b.hdr_have;
  m->pending_len = b.pending_len;
  memcpy (m->hdr, b.hdr, sizeof m->hdr);
  memcpy (m->peer, b.peer, sizeof m->peer);
  m->peer[sizeof m->peer - 1] = '\0';
  memcpy (m->key, b.key, sizeof m->key);
  m->key[sizeof m->key - 1] = '\0';
  fcntl (m->fd, F_SETFD, FD_CLOEXEC);  /* not for our children */
  return 0;
}

static int
blob_read (const uint8_t *p, size_t len, struct upgrade_handoff *u)
{
  struct cursor c = { p, len };
  struct blob_hdr h;

  if (take (&c, &h, sizeof h) < 0 ||
      memcmp (h.magic, UPGRADE_MAGIC, sizeof h.magic) != 0 ||
      h.n_listen > UPGRADE_MAX_LISTEN)
    return -1;
  u->n_listen = (int) h.n_listen;
  u->control_fd = h.control_fd;
  u->detached = (int) h.detached;
  for (int i = 0; i < u->n_listen; i++) {
    int32_t fd;
    if (take (&c, &fd, sizeof fd) < 0)
      return -1;
    u->listen_fds[i] = fd;
  }
  if (h.n_conns > 1u << 20 ||
      !(u->conns = calloc (h.n_conns ? h.n_conns : 1, sizeof *u->conns)))
    return -1;
  for (; u->n_conns < h.n_conns; u->n_conns++)
    if (blob_conn_read (&c, &u->conns[u->n_conns]) < 0)
      return -1;
  if (u->control_fd >= 0)
    fcntl (u->control_fd, F_SETFD, FD_CLOEXEC);
  return 0;
}

int
upgrade_inherited (struct upgrade_handoff *u)
{
  const char *env = getenv (UPGRADE_ENV);
  int mfd, rfd, r = -1;
  struct stat st;
  uint8_t *buf = NULL;

  memset (u, 0, sizeof *u);
  u->control_fd = u->ready_fd = -1;
  if (env == NULL)
    return 0;
  if (sscanf (env, "%d,%d", &mfd, &rfd) != 2 || mfd < 0 || rfd < 0) {
    log_error ("upgrade: bad %s=%s", UPGRADE_ENV, env);
    return -1;
  }
  unsetenv (UPGRADE_ENV);
  u->ready_fd = rfd;
  fcntl (rfd, F_SETFD, FD_CLOEXEC);
  if (fstat (mfd, &st) == 0 && (buf = malloc ((size_t) st.st_size + 1)) &&
      pread (mfd, buf, (size_t) st.st_size, 0) == st.st_size &&
      blob_read (buf, (size_t) st.st_size, u) == 0)
    r = 1;
  else
    log_error ("upgrade: cannot read what the old process handed over "
               "(another foliod version?)");
  free (buf);
  close (mfd);
  return r;
}

void
upgrade_ready (struct upgrade_handoff *u)
{
  if (u->ready_fd < 0)
    return;
  if (write (u->ready_fd, "1", 1) != 1)
    log_warn ("upgrade: cannot tell the old process we are ready: %s",
              strerror (errno));
  close (u->ready_fd);
  u->ready_fd = -1;
}

void
upgrade_handoff_free (struct upgrade_handoff *u)
{
  for (size_t i = 0; i < u->n_conns; i++)
    server_moved_free (&u->conns[i]);
  free (u->conns);
  u->conns = NULL;
  u->n_conns = 0;
}

/* The binary to start: this one's path, even when the file was replaced
 * since (a package upgrade): the kernel then says "PATH (deleted)". */
static int
self_exe (char *buf, size_t len)
{
  static const char deleted[] = " (deleted)";
  ssize_t n = readlink ("/proc/self/exe", buf, len - 1);
  size_t dl = sizeof deleted - 1;

  if (n < 0)
    return -1;
  buf[n] = '\0';
  if ((size_t) n > dl && strcmp (buf + n - dl, deleted) == 0)
    buf[n - dl] = '\0';
  return 0;
}

/* The environment of the child: ours with FOLIOD_UPGRADE set and the
 * socket activation variables gone.  NULL: out of memory. */
static char **
child_env (int mfd, int rfd)
{
  extern char **environ;
  size_t n = 0, k = 0;
  char **env;

  while (environ[n])
    n++;
  if (!(env = calloc (n + 2, sizeof *env)))
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (strncmp (environ[i], UPGRADE_ENV "=", sizeof UPGRADE_ENV) != 0 &&
        strncmp (environ[i], "LISTEN_", 7) != 0)
      env[k++] = environ[i];
  if (asprintf (&env[k], UPGRADE_ENV "=%d,%d", mfd, rfd) < 0) {
    free (env);
    return NULL;
  }
  return env;
}

/* The fds the child keeps (their FD_CLOEXEC cleared after fork).  A
 * malloc'd array of *n; NULL: out of memory. */
static int *
child_fds (const struct upgrade_handoff *u, int mfd, int rfd, size_t *n)
{
  int *fds = malloc ((u->n_listen + u->n_conns + 3) * sizeof *fds);
  size_t k = 0;

  if (!fds)
    return NULL;
  for (int i = 0; i < u->n_listen; i++)
    fds[k++] = u->listen_fds[i];
  for (size_t i = 0; i < u->n_conns; i++)
    fds[k++] = u->conns[i].fd;
  if (u->control_fd >= 0)
    fds[k++] = u->control_fd;
  fds[k++] = mfd;
  fds[k++] = rfd;
  *n = k;
  return fds;
}

/* Wait for the child's "1" on rfd: 0, or -1 with a reason. */
static int
wait_ready (pid_t pid, int rfd, unsigned wait_s, char *err, size_t errlen)
{
  struct pollfd p = { .fd = rfd, .events = POLLIN };
  uint64_t deadline = now_ms () + wait_s * 1000ull;
  char c = 0;
  int st, r;

  for (;;) {
    uint64_t now = now_ms ();
    r = now < deadline ? poll (&p, 1, (int) (deadline - now)) : 0;
    if (r < 0 && errno == EINTR)
      continue;
    break;
  }
  if (r > 0 && read (rfd, &c, 1) == 1 && c == '1')
    return 0;
  if (r == 0) {
    snprintf (err, errlen, "the new process (pid %d) was not ready within "
              "%u s: killed", (int) pid, wait_s);
    kill (pid, SIGKILL);
  }
  while (waitpid (pid, &st, 0) < 0 && errno == EINTR)
    ;
  if (r != 0) {
    if (WIFEXITED (st))
      snprintf (err, errlen, "the new process exited with status %d before "
                "it was ready (see its log lines)", WEXITSTATUS (st));
    else
      snprintf (err, errlen, "the new process died (signal %d) before it "
                "was ready", WIFSIGNALED (st) ? WTERMSIG (st) : 0);
  }
  return -1;
}

pid_t
upgrade_spawn (char *const *argv, const struct upgrade_handoff *u,
               unsigned wait_s, char *err, size_t errlen)
{
  char exe[PATH_MAX];
  int mfd = -1, rp[2] = { -1, -1 };
  int *fds = NULL;
  char **env = NULL;
  size_t nfds = 0;
  pid_t pid = -1;

  if (self_exe (exe, sizeof exe) < 0 ||
      (mfd = memfd_create ("foliod-upgrade", MFD_CLOEXEC)) < 0 ||
      blob_write (mfd, u) < 0 || pipe2 (rp, O_CLOEXEC) < 0 ||
      !(env = child_env (mfd, rp[1])) ||
      !(fds = child_fds (u, mfd, rp[1], &nfds))) {
    snprintf (err, errlen, "cannot prepare the hand-over: %s",
              strerror (errno));
    goto out;
  }
  pid = fork ();
  if (pid == 0) {
    /* Only async-signal-safe calls until exec: other threads ran. */
    for (size_t i = 0; i < nfds; i++)
      fcntl (fds[i], F_SETFD, 0);
    execve (exe, argv, env);
    _exit (127);
  }
  if (pid < 0) {
    snprintf (err, errlen, "fork: %s", strerror (errno));
    goto out;
  }
  log_info ("upgrade: started %s as pid %d", exe, (int) pid);
  close (rp[1]);
  rp[1] = -1;
  if (wait_ready (pid, rp[0], wait_s, err, errlen) < 0)
    pid = -1;

out:
  if (env) {
    for (size_t i = 0; env[i]; i++)
      if (strncmp (env[i], UPGRADE_ENV "=", sizeof UPGRADE_ENV) == 0)
        free (env[i]);
    free (env);
  }
  free (fds);
  if (mfd >= 0)
    close (mfd);
  if (rp[0] >= 0)
    close (rp[0]);
  if (rp[1] >= 0)
    close (rp[1]);
  return pid;
}
