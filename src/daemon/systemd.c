/* systemd integration without libsystemd: the notify datagram protocol
 * (sd_notify(3)) and socket activation (sd_listen_fds(3)).  Both are
 * small, stable, documented protocols; linking libsystemd for them would
 * add a dependency for ~60 lines.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "daemon/daemon.h"

#define SD_LISTEN_FDS_START 3

/* Send one notification ("READY=1", "STATUS=...").  Returns 1 when sent,
 * 0 when not running under a notify-aware manager, -1 on error. */
int
sd_notifyf (const char *fmt, ...)
{
  const char *path = getenv ("NOTIFY_SOCKET");
  struct sockaddr_un sa = { .sun_family = AF_UNIX };
  char msg[512];
  socklen_t salen;
  size_t len;
  va_list ap;
  int fd, r;

  if (path == NULL || path[0] == '\0')
    return 0;
  len = strlen (path);
  if ((path[0] != '/' && path[0] != '@') || len >= sizeof sa.sun_path) {
    errno = EINVAL;
    return -1;
  }
  memcpy (sa.sun_path, path, len);
  if (path[0] == '@')
    sa.sun_path[0] = '\0';       /* abstract namespace */
  salen = (socklen_t) (offsetof (struct sockaddr_un, sun_path) + len);

  va_start (ap, fmt);
  r = vsnprintf (msg, sizeof msg, fmt, ap);
  va_end (ap);
  if (r < 0)
    return -1;
  fd = socket (AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd == -1)
    return -1;
  r = sendto (fd, msg, strlen (msg), MSG_NOSIGNAL,
              (struct sockaddr *) &sa, salen) < 0 ? -1 : 1;
  close (fd);
  return r;
}

/* Names from LISTEN_FDNAMES (colon separated), kept for log messages. */
static char fdnames_buf[1024];

int
sd_listen_fds_get (int *fds, const char **names, int max)
{
  const char *pid_s = getenv ("LISTEN_PID");
  const char *n_s = getenv ("LISTEN_FDS");
  const char *names_s = getenv ("LISTEN_FDNAMES");
  char *save = NULL, *tok;
  long n;

  if (pid_s == NULL || n_s == NULL || atol (pid_s) != (long) getpid ())
    return 0;
  n = atol (n_s);
  if (n <= 0)
    return 0;
  if (n > max)
    n = max;
  snprintf (fdnames_buf, sizeof fdnames_buf, "%s", names_s ? names_s : "");
  tok = strtok_r (fdnames_buf, ":", &save);
  for (long i = 0; i < n; i++) {
    fds[i] = SD_LISTEN_FDS_START + (int) i;
    names[i] = tok;
    if (tok)
      tok = strtok_r (NULL, ":", &save);
    /* Not for our children. */
    fcntl (fds[i], F_SETFD, FD_CLOEXEC);
  }
  unsetenv ("LISTEN_PID");
  unsetenv ("LISTEN_FDS");
  unsetenv ("LISTEN_FDNAMES");
  return (int) n;
}
