/* Upgrade in place, the process half: the old foliod starts the new
 * binary and hands it its sockets; the new one takes them.
 *
 * Two steps, so that the new binary's start (exec, the dynamic loader,
 * the libraries' constructors, the configuration: most of the time on a
 * busy host) happens while the old process still serves:
 *
 *   1. upgrade_start: a socketpair; the child execs this binary's path
 *      with the same argv and FOLIOD_UPGRADE=FD (its end).  Once main
 *      runs and the configuration is read, it writes "L" (loaded) and
 *      waits.  Nothing is handed over yet: if it fails now, the old
 *      process just goes on.
 *   2. upgrade_hand, after server_handover: one message "G" with, as
 *      SCM_RIGHTS, a memfd describing what goes across, the listening
 *      sockets and the control socket; then the connections' sockets in
 *      messages "C" of at most UPGRADE_FDS_PER_MSG.  The memfd holds a
 *      versioned header, then per connection what it negotiated (struct
 *      server_moved) and the bytes the old process had read but not
 *      parsed.  Then, if the child reads this process's ram store layout,
 *      one message "S" with the memfds of the ram stores, handed over
 *      whole (store_ram_keep).  The child opens its exports (adopting
 *      those stores), serves, and writes "R"; if it exits or says nothing
 *      within wait_s, it is killed and the old process takes everything
 *      back, its ram stores included (store_ram_adopt again).
 *
 * Whether the ram stores go over: the old process puts its layout
 * version (STORE_RAM_LAYOUT_VERSION) in FOLIOD_UPGRADE_RAM; a child of
 * the same version answers "K" (loaded, and takes the ram stores)
 * instead of "L".  An older child ignores the variable and answers "L";
 * a newer one of another version answers "L" too: the old process then
 * writes its ram stores back before the hand-over, as without this.
 * FOLIOD_TEST_RAM_LAYOUT=N makes a child claim version N (tests).
 *
 * A binary that does not know the header's version refuses to start.
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
#include <sys/pidfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "daemon/daemon.h"
#include "foliod/store.h"
#include "foliod/util.h"

#define UPGRADE_ENV "FOLIOD_UPGRADE"
#define UPGRADE_RAM_ENV "FOLIOD_UPGRADE_RAM"
#define UPGRADE_TEST_RAM_ENV "FOLIOD_TEST_RAM_LAYOUT"
#define UPGRADE_MAGIC "FOLIOUP1"

#define UPGRADE_FDS_PER_MSG 200  /* under the kernel's SCM_MAX_FD (253) */
_Static_assert (UPGRADE_MAX_RAM <= UPGRADE_FDS_PER_MSG,
                "the ram stores travel in one message");

/* The fds travel as SCM_RIGHTS, in this order: the memfd, the listening
 * sockets, the control socket (if any), then the connections. */
struct blob_hdr {
  char magic[8];
  uint32_t n_listen;
  int32_t control_fd;       /* >= 0: one is passed */
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
  if (n == 0)                   /* dst may be NULL: nothing pending */
    return 0;
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
  return 0;
}

static int recv_fds (int sock, char *tag, int *fds, size_t *n);

/* The fd numbers in the description are the old process's: ours are
 * those received, in the order of struct blob_hdr's comment. */
static int
recv_handoff (int sock, struct upgrade_handoff *u)
{
  int fds[2 + UPGRADE_MAX_LISTEN];
  size_t n = sizeof fds / sizeof fds[0], k = 0;
  struct stat st;
  uint8_t *buf = NULL;
  char tag = 0;
  int r = -1;

  if (recv_fds (sock, &tag, fds, &n) < 0 || tag != 'G' || n < 1)
    return -1;
  if (fstat (fds[0], &st) == 0 && (buf = malloc ((size_t) st.st_size + 1)) &&
      pread (fds[0], buf, (size_t) st.st_size, 0) == st.st_size &&
      blob_read (buf, (size_t) st.st_size, u) == 0 &&
      n == 1 + (size_t) u->n_listen + (u->control_fd >= 0))
    r = 0;
  free (buf);
  close (fds[0]);
  if (r < 0)
    return -1;
  for (int i = 0; i < u->n_listen; i++)
    u->listen_fds[i] = fds[1 + i];
  if (u->control_fd >= 0)
    u->control_fd = fds[n - 1];
  while (k < u->n_conns) {
    int cf[UPGRADE_FDS_PER_MSG];
    size_t got = UPGRADE_FDS_PER_MSG;
    if (recv_fds (sock, &tag, cf, &got) < 0 || tag != 'C' || got == 0 ||
        got > u->n_conns - k)
      return -1;
    for (size_t i = 0; i < got; i++)
      u->conns[k++].fd = cf[i];
  }
  if (u->takes_ram) {
    size_t got = UPGRADE_MAX_RAM;
    if (recv_fds (sock, &tag, u->ram_fds, &got) < 0 || tag != 'S')
      return -1;
    u->n_ram = got;
  }
  return 0;
}

/* New process: does this binary read the ram store layout of the old
 * one (its version in FOLIOD_UPGRADE_RAM; none from an older foliod)? */
static bool
reads_old_ram_layout (void)
{
  const char *old = getenv (UPGRADE_RAM_ENV);
  const char *test = getenv (UPGRADE_TEST_RAM_ENV);
  unsigned mine = test ? (unsigned) atoi (test) : STORE_RAM_LAYOUT_VERSION;

  return old && (unsigned) atoi (old) == mine;
}

int
upgrade_inherited (struct upgrade_handoff *u)
{
  const char *env = getenv (UPGRADE_ENV);
  int sock;

  memset (u, 0, sizeof *u);
  u->control_fd = u->ready_fd = -1;
  if (env == NULL)
    return 0;
  sock = atoi (env);
  u->takes_ram = reads_old_ram_layout ();
  unsetenv (UPGRADE_ENV);
  unsetenv (UPGRADE_RAM_ENV);
  if (sock < 3 || fcntl (sock, F_SETFD, FD_CLOEXEC) < 0) {
    log_error ("upgrade: bad %s", UPGRADE_ENV);
    return -1;
  }
  /* Loaded: the old process may hand over now (it serves until then);
   * "K": and its ram stores too. */
  if (write (sock, u->takes_ram ? "K" : "L", 1) != 1 ||
      recv_handoff (sock, u) < 0) {
    log_error ("upgrade: cannot take what the old process hands over "
               "(it went away, or another foliod version?)");
    close (sock);
    return -1;
  }
  u->ready_fd = sock;
  return 1;
}

void
upgrade_ready (struct upgrade_handoff *u)
{
  if (u->ready_fd < 0)
    return;
  if (write (u->ready_fd, "R", 1) != 1)
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

/* The environment of the child: ours with FOLIOD_UPGRADE=fd,
 * FOLIOD_UPGRADE_RAM=our ram layout version, and the socket activation
 * variables gone.  NULL: out of memory. */
static char **
child_env (int fd)
{
  extern char **environ;
  size_t n = 0, k = 0;
  char **env;

  while (environ[n])
    n++;
  if (!(env = calloc (n + 3, sizeof *env)))
    return NULL;
  for (size_t i = 0; i < n; i++)
    if (strncmp (environ[i], UPGRADE_ENV "=", sizeof UPGRADE_ENV) != 0 &&
        strncmp (environ[i], UPGRADE_RAM_ENV "=",
                 sizeof UPGRADE_RAM_ENV) != 0 &&
        strncmp (environ[i], "LISTEN_", 7) != 0)
      env[k++] = environ[i];
  if (asprintf (&env[k], UPGRADE_ENV "=%d", fd) < 0) {
    free (env);
    return NULL;
  }
  if (asprintf (&env[k + 1], UPGRADE_RAM_ENV "=%u",
                STORE_RAM_LAYOUT_VERSION) < 0) {
    free (env[k]);
    free (env);
    return NULL;
  }
  return env;
}

static void
child_env_free (char **env)
{
  if (!env)
    return;
  for (size_t i = 0; env[i]; i++)
    if (strncmp (env[i], UPGRADE_ENV "=", sizeof UPGRADE_ENV) == 0 ||
        strncmp (env[i], UPGRADE_RAM_ENV "=", sizeof UPGRADE_RAM_ENV) == 0)
      free (env[i]);
  free (env);
}

/* Wait up to deadline for byte want (or want2, if not 0) on sock: the
 * byte, or -1 (EOF, another byte, the deadline: ETIMEDOUT). */
static int
wait_byte2 (int sock, char want, char want2, uint64_t deadline)
{
  struct pollfd p = { .fd = sock, .events = POLLIN };
  char c = 0;
  int r;

  for (;;) {
    uint64_t now = now_ms ();
    r = now < deadline ? poll (&p, 1, (int) (deadline - now)) : 0;
    if (r < 0 && errno == EINTR)
      continue;
    break;
  }
  if (r == 0) {
    errno = ETIMEDOUT;
    return -1;
  }
  if (r > 0 && read (sock, &c, 1) == 1 && (c == want || (want2 && c == want2)))
    return c;
  errno = EPIPE;
  return -1;
}

static int
wait_byte (int sock, char want, uint64_t deadline)
{
  return wait_byte2 (sock, want, 0, deadline) < 0 ? -1 : 0;
}

/* Wait until c's process is gone (its pidfd readable), saying every
 * 10 s that it is not: its exports must not be taken back while it runs. */
static void
child_wait_gone (const struct upgrade_child *c)
{
  struct pollfd p = { .fd = c->pidfd, .events = POLLIN };
  unsigned waited = 0;
  int r;

  for (;;) {
    r = poll (&p, 1, 10000);
    if (r != 0 && !(r < 0 && errno == EINTR))
      return;
    if (r == 0)
      log_warn ("upgrade: the new process (pid %d) killed %u s ago is "
                "still there; its exports are taken back once it is gone",
                (int) c->pid, waited += 10);
  }
}

static void
child_close (struct upgrade_child *c)
{
  if (c->sock >= 0)
    close (c->sock);
  if (c->pidfd >= 0)
    close (c->pidfd);
  c->sock = c->pidfd = -1;
  c->pid = 0;
}

void
upgrade_abandon (struct upgrade_child *c, const char *what, int err,
                 unsigned wait_s, char *msg, size_t msglen)
{
  if (err == ETIMEDOUT)
    snprintf (msg, msglen, "the new process (pid %d) was not %s within "
              "%u s: killed", (int) c->pid, what, wait_s);
  else if (err != EPIPE)
    snprintf (msg, msglen, "the new process (pid %d): %s: killed",
              (int) c->pid, strerror (err));
  else
    snprintf (msg, msglen, "the new process (pid %d) exited before it was "
              "%s (see its log lines)", (int) c->pid, what);
  /* Not our child (upgrade_start): its pidfd kills it and tells when it
   * is gone, whoever reaps it. */
  if (err != EPIPE)
    pidfd_send_signal (c->pidfd, SIGKILL, NULL, 0);
  close (c->sock);
  c->sock = -1;
  child_wait_gone (c);
  child_close (c);
}

/* Start exe as a grandchild whose parent has exited: the new process is
 * then the child of whoever reaps orphans here (the service manager,
 * init, or a subreaper), never ours.  systemd takes a MAINPID= that is
 * not its own child as "alien": at stop it does not wait for it and,
 * with KillMode=mixed, sends SIGKILL right after SIGTERM, in the middle
 * of the writeback.  The middle process stays until c->pidfd is open, so
 * that the pid cannot be reaped and reused before.  0, or -1 (errno). */
static int
spawn_orphan (const char *exe, char *const *argv, char **env, int keep_fd,
              struct upgrade_child *c)
{
  int sv[2];
  pid_t mid, pid = -1;
  int st, saved;

  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
    return -1;
  mid = fork ();
  if (mid == 0) {
    /* Only async-signal-safe calls until exec: other threads ran.
     * _Fork runs no atfork handlers (their locks may be held). */
    char c0;
    pid_t g;

    close (sv[0]);
    g = _Fork ();
    if (g == 0) {
      close (sv[1]);
      fcntl (keep_fd, F_SETFD, 0);
      execve (exe, argv, env);
      _exit (127);
    }
    if (g < 0 || write (sv[1], &g, sizeof g) != sizeof g)
      _exit (1);
    while (read (sv[1], &c0, 1) < 0 && errno == EINTR)
      ;                         /* until the pidfd is open: EOF */
    _exit (0);
  }
  saved = errno;
  close (sv[1]);
  if (mid > 0) {
    ssize_t r;
    while ((r = read (sv[0], &pid, sizeof pid)) < 0 && errno == EINTR)
      ;
    saved = EAGAIN;             /* the middle process could not fork */
    if (r == sizeof pid && pid > 0 &&
        (c->pidfd = pidfd_open (pid, 0)) < 0) {
      saved = errno;
      kill (pid, SIGKILL);      /* still the middle one's: not reused */
    }
  }
  close (sv[0]);                /* the middle process exits */
  while (mid > 0 && waitpid (mid, &st, 0) < 0 && errno == EINTR)
    ;
  if (c->pidfd < 0) {
    errno = saved;
    return -1;
  }
  c->pid = pid;
  return 0;
}

int
upgrade_start (char *const *argv, unsigned wait_s, struct upgrade_child *c,
               char *err, size_t errlen)
{
  char exe[PATH_MAX];
  int sv[2] = { -1, -1 };
  char **env = NULL;
  int r = -1, ch;

  c->pid = 0;
  c->pidfd = c->sock = -1;
  c->takes_ram = false;
  if (self_exe (exe, sizeof exe) < 0 ||
      socketpair (AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0 ||
      !(env = child_env (sv[1]))) {
    snprintf (err, errlen, "cannot start the new process: %s",
              strerror (errno));
    goto out;
  }
  if (spawn_orphan (exe, argv, env, sv[1], c) < 0) {
    snprintf (err, errlen, "cannot start the new process: %s",
              strerror (errno));
    goto out;
  }
  log_info ("upgrade: started %s as pid %d", exe, (int) c->pid);
  close (sv[1]);
  sv[1] = -1;
  c->sock = sv[0];
  sv[0] = -1;
  ch = wait_byte2 (c->sock, 'L', 'K', now_ms () + wait_s * 1000ull);
  if (ch < 0) {
    upgrade_abandon (c, "loaded", errno, wait_s, err, errlen);
    goto out;
  }
  c->takes_ram = ch == 'K';
  r = 0;
out:
  child_env_free (env);
  if (sv[0] >= 0)
    close (sv[0]);
  if (sv[1] >= 0)
    close (sv[1]);
  return r;
}

/* One message: the byte tag and n fds. */
static int
send_fds (int sock, char tag, const int *fds, size_t n)
{
  union {
    char buf[CMSG_SPACE (UPGRADE_FDS_PER_MSG * sizeof (int))];
    struct cmsghdr align;
  } u;
  struct iovec iov = { .iov_base = &tag, .iov_len = 1 };
  struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
  struct cmsghdr *c;

  if (n > 0) {
    memset (&u, 0, sizeof u);
    m.msg_control = u.buf;
    m.msg_controllen = CMSG_SPACE (n * sizeof (int));
    c = CMSG_FIRSTHDR (&m);
    if (c == NULL) {            /* cannot be: the buffer has the room */
      errno = EINVAL;
      return -1;
    }
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN (n * sizeof (int));
    memcpy (CMSG_DATA (c), fds, n * sizeof (int));
  }
  while (sendmsg (sock, &m, MSG_NOSIGNAL) < 0)
    if (errno != EINTR)
      return -1;
  return 0;
}

/* Receive one message sent by send_fds: its tag; the fds go to fds
 * (*n: room in, received out).  0 or -1. */
static int
recv_fds (int sock, char *tag, int *fds, size_t *n)
{
  union {
    char buf[CMSG_SPACE (UPGRADE_FDS_PER_MSG * sizeof (int))];
    struct cmsghdr align;
  } u;
  struct iovec iov = { .iov_base = tag, .iov_len = 1 };
  struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
                      .msg_control = u.buf, .msg_controllen = sizeof u.buf };
  size_t room = *n;
  ssize_t r;

  *n = 0;
  while ((r = recvmsg (sock, &m, MSG_CMSG_CLOEXEC)) < 0 && errno == EINTR)
    ;
  if (r != 1)
    return -1;
  for (struct cmsghdr *c = CMSG_FIRSTHDR (&m); c; c = CMSG_NXTHDR (&m, c))
    if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
      size_t k = (c->cmsg_len - CMSG_LEN (0)) / sizeof (int);
      if (k > room - *n)
        return -1;
      memcpy (fds + *n, CMSG_DATA (c), k * sizeof (int));
      *n += k;
    }
  return 0;
}

int
upgrade_hand (struct upgrade_child *c, const struct upgrade_handoff *u,
              unsigned wait_s, char *err, size_t errlen)
{
  int sock = c->sock;
  int fds[2 + UPGRADE_MAX_LISTEN];
  size_t n = 0;
  int mfd = memfd_create ("foliod-upgrade", MFD_CLOEXEC);

  if (mfd < 0 || blob_write (mfd, u) < 0)
    goto fail;
  fds[n++] = mfd;
  for (int i = 0; i < u->n_listen; i++)
    fds[n++] = u->listen_fds[i];
  if (u->control_fd >= 0)
    fds[n++] = u->control_fd;
  if (send_fds (sock, 'G', fds, n) < 0)
    goto fail;
  close (mfd);
  mfd = -1;
  for (size_t i = 0; i < u->n_conns; i += UPGRADE_FDS_PER_MSG) {
    int cf[UPGRADE_FDS_PER_MSG];
    size_t k = 0;
    for (; k < UPGRADE_FDS_PER_MSG && i + k < u->n_conns; k++)
      cf[k] = u->conns[i + k].fd;
    if (send_fds (sock, 'C', cf, k) < 0)
      goto fail;
  }
  if (u->takes_ram && send_fds (sock, 'S', u->ram_fds, u->n_ram) < 0)
    goto fail;
  if (wait_byte (sock, 'R', now_ms () + wait_s * 1000ull) == 0) {
    child_close (c);
    return 0;
  }
fail:
  if (mfd >= 0)
    close (mfd);
  upgrade_abandon (c, "ready", errno == ETIMEDOUT || errno == EPIPE
                   ? errno : EPIPE, wait_s, err, errlen);
  return -1;
}
