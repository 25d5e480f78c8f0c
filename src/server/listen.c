#define _GNU_SOURCE /* accept4 */
/* Listening sockets: TCP (IPv4 and IPv6), Unix, and inherited descriptors
 * (systemd socket activation).  Accepted sockets become connections. */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "server/internal.h"
#include "server/log.h"

#define ACCEPTS_PER_WAKE 16
/* Out of descriptors (or memory), accept fails at once and the listener
 * stays readable: rearming the watcher would spin the loop.  Pause it for
 * this long instead; connections closing meanwhile free descriptors. */
#define ACCEPT_BACKOFF_S 0.5
#define ACCEPT_WARN_EVERY_S 60.

static void
peer_name (const struct sockaddr_storage *ss, socklen_t len,
           const struct listener *l, char *out, size_t n)
{
  char host[NI_MAXHOST], serv[NI_MAXSERV];

  if (ss->ss_family == AF_UNIX) {
    snprintf (out, n, "%.70s", l->name);
    return;
  }
  if (getnameinfo ((const struct sockaddr *) ss, len, host, sizeof host,
                   serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV))
    snprintf (out, n, "?");
  else if (ss->ss_family == AF_INET6)
    snprintf (out, n, "[%.50s]:%.10s", host, serv);
  else
    snprintf (out, n, "%.50s:%.10s", host, serv);
}

/* Whom max_connections_per_client counts a connection against: the
 * address (not the port) for TCP, the peer process for a Unix socket
 * (every local client comes from the same path; counting by uid made
 * every qemu of one libvirt user share one limit).  A pid is reused only
 * once its process, and so its connections, are gone. */
static void
client_key (int fd, const struct sockaddr_storage *ss, socklen_t len,
            char *out, size_t n)
{
  struct ucred cred;
  socklen_t clen = sizeof cred;

  if (ss->ss_family == AF_UNIX) {
    if (getsockopt (fd, SOL_SOCKET, SO_PEERCRED, &cred, &clen) == 0)
      snprintf (out, n, "pid %ld", (long) cred.pid);
    else
      snprintf (out, n, "pid ?");
    return;
  }
  if (getnameinfo ((const struct sockaddr *) ss, len, out, n, NULL, 0,
                   NI_NUMERICHOST))
    snprintf (out, n, "?");
}

static void
listener_resume_cb (struct ev_loop *loop, ev_timer *w, int revents)
{
  struct listener *l = w->data;

  ev_io_start (loop, &l->io);
}

/* accept failed with err for lack of a resource: stop accepting on l for
 * ACCEPT_BACKOFF_S (its backlog waits in the kernel), and say so once per
 * ACCEPT_WARN_EVERY_S.  Self-contained per listener, so that a listener
 * on any loop can back off on its own. */
static void
listener_backoff (struct ev_loop *loop, struct listener *l, int err)
{
  ev_tstamp now = ev_now (loop);

  if (l->warned_at == 0 || now - l->warned_at >= ACCEPT_WARN_EVERY_S) {
    l->warned_at = now;
    log_warn ("accept on %s: %s: not accepting for %.1f s at a time "
              "(raise the open files limit or lower max-connections)",
              l->name, strerror (err), ACCEPT_BACKOFF_S);
  }
  ev_io_stop (loop, &l->io);
  ev_timer_set (&l->backoff, ACCEPT_BACKOFF_S, 0.);
  ev_timer_start (loop, &l->backoff);
}

static void
listener_accept_cb (struct ev_loop *loop, ev_io *w, int revents)
{
  struct listener *l = w->data;

  for (int i = 0; i < ACCEPTS_PER_WAKE; i++) {
    struct sockaddr_storage ss;
    socklen_t len = sizeof ss;
    char peer[80], key[64];
    int one = 1;
    int fd = accept4 (l->fd, (struct sockaddr *) &ss, &len,
                      SOCK_NONBLOCK | SOCK_CLOEXEC);

    if (fd < 0) {
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS
          || errno == ENOMEM)
        listener_backoff (loop, l, errno);
      else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR
               && errno != ECONNABORTED)
        log_warn ("accept on %s: %m", l->name);
      return;
    }
    // NOLINTNEXTLINE(clang-analyzer-core.UndefinedBinaryOperatorResult): accept4 filled ss
    if (ss.ss_family == AF_INET || ss.ss_family == AF_INET6)
      setsockopt (fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    peer_name (&ss, len, l, peer, sizeof peer);
    client_key (fd, &ss, len, key, sizeof key);
    loop_hand_off (l->srv, fd, peer, key);
  }
}

static struct listener *
listener_add (struct server *s, int fd, const char *name)
{
  struct listener *l = calloc (1, sizeof *l);

  if (!l)
    return NULL;
  l->srv = s;
  l->fd = fd;
  snprintf (l->name, sizeof l->name, "%s", name);
  ev_io_init (&l->io, listener_accept_cb, fd, EV_READ);
  l->io.data = l;
  ev_timer_init (&l->backoff, listener_resume_cb, ACCEPT_BACKOFF_S, 0.);
  l->backoff.data = l;
  ev_io_start (s->loop, &l->io);
  l->next = s->listeners;
  s->listeners = l;
  return l;
}

int
server_listen_tcp (struct server *s, const char *host, const char *port,
                   char *err, size_t errlen)
{
  struct addrinfo hints = { .ai_family = AF_UNSPEC,
                            .ai_socktype = SOCK_STREAM,
                            .ai_flags = AI_PASSIVE | AI_ADDRCONFIG };
  struct addrinfo *res, *ai;
  int rc, nok = 0;

  if (host && !*host)
    host = NULL;
  rc = getaddrinfo (host, port, &hints, &res);
  if (rc) {
    snprintf (err, errlen, "%s:%s: %s", host ? host : "*", port,
              gai_strerror (rc));
    return -1;
  }
  for (ai = res; ai; ai = ai->ai_next) {
    char name[96], h[NI_MAXHOST];
    int one = 1;
    int fd = socket (ai->ai_family,
                     ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC,
                     ai->ai_protocol);

    if (getnameinfo (ai->ai_addr, ai->ai_addrlen, h, sizeof h, NULL, 0,
                     NI_NUMERICHOST))
      snprintf (h, sizeof h, "?");
    if (ai->ai_family == AF_INET6)
      snprintf (name, sizeof name, "[%.50s]:%.20s", h, port);
    else
      snprintf (name, sizeof name, "%.50s:%.20s", h, port);
    if (fd < 0) {
      snprintf (err, errlen, "%s: socket: %s", name, strerror (errno));
      continue;
    }
    setsockopt (fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    /* Each address family gets its own socket, so :: must not also
     * claim the IPv4 port that 0.0.0.0 is about to bind. */
    if (ai->ai_family == AF_INET6)
      setsockopt (fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind (fd, ai->ai_addr, ai->ai_addrlen) < 0
        || listen (fd, SOMAXCONN) < 0) {
      snprintf (err, errlen, "%s: %s", name, strerror (errno));
      close (fd);
      continue;
    }
    if (!listener_add (s, fd, name)) {
      snprintf (err, errlen, "%s: out of memory", name);
      close (fd);
      continue;
    }
    log_info ("listening on %s", name);
    nok++;
  }
  freeaddrinfo (res);
  /* Success if any address worked (e.g. no IPv6 on this host). */
  return nok > 0 ? 0 : -1;
}

#define SERVER_UNIX_MODE 0660

int
server_listen_unix (struct server *s, const char *path, char *err,
                    size_t errlen)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };
  struct listener *l;
  struct stat st;
  char name[96];
  int fd;

  if (strlen (path) >= sizeof sun.sun_path) {
    snprintf (err, errlen, "%s: socket path too long", path);
    return -1;
  }
  strcpy (sun.sun_path, path);
  /* A stale socket from an earlier run would make bind fail; anything
   * that is not a socket is left alone. */
  if (lstat (path, &st) == 0 && S_ISSOCK (st.st_mode))
    unlink (path);
  fd = socket (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    snprintf (err, errlen, "%s: socket: %s", path, strerror (errno));
    return -1;
  }
  /* 0660 whatever the umask (0777 under umask 000 let anyone on the
   * host in): the owner and its group.  Set between bind and listen, so
   * nobody connects while the mode is still the umask's. */
  if (bind (fd, (struct sockaddr *) &sun, sizeof sun) < 0
      || chmod (path, SERVER_UNIX_MODE) < 0
      || listen (fd, SOMAXCONN) < 0) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    close (fd);
    return -1;
  }
  snprintf (name, sizeof name, "unix:%.80s", path);
  l = listener_add (s, fd, name);
  if (!l || !(l->unix_path = strdup (path))) {
    snprintf (err, errlen, "%s: out of memory", path);
    if (!l)
      close (fd);
    unlink (path);
    return -1;
  }
  log_info ("listening on %s", name);
  return 0;
}

int
server_add_listen_fd (struct server *s, int fd)
{
  int fl = fcntl (fd, F_GETFL);

  if (fl < 0 || fcntl (fd, F_SETFL, fl | O_NONBLOCK) < 0
      || fcntl (fd, F_SETFD, FD_CLOEXEC) < 0)
    return -1;
  if (!listener_add (s, fd, "inherited socket"))
    return -1;
  log_info ("listening on inherited socket %d", fd);
  return 0;
}

void
server_stop_accepting (struct server *s)
{
  struct listener *l;

  while ((l = s->listeners) != NULL) {
    s->listeners = l->next;
    ev_io_stop (s->loop, &l->io);
    ev_timer_stop (s->loop, &l->backoff);
    close (l->fd);
    if (l->unix_path) {
      unlink (l->unix_path);
      free (l->unix_path);
    }
    free (l);
  }
}

/* Upgrade (handover.c): stop or go on accepting, the sockets kept. */
void
listeners_pause (struct server *s, bool pause)
{
  for (struct listener *l = s->listeners; l; l = l->next) {
    ev_timer_stop (s->loop, &l->backoff);
    if (pause)
      ev_io_stop (s->loop, &l->io);
    else
      ev_io_start (s->loop, &l->io);
  }
}

int
server_listen_fds (struct server *s, int *fds, int max)
{
  int n = 0;

  for (struct listener *l = s->listeners; l && n < max; l = l->next)
    fds[n++] = l->fd;
  return n;
}
