/* Plain (unencrypted) transport: the socket itself. */
#include <errno.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include "server/internal.h"

static ssize_t
plain_recv (struct conn *c, void *buf, size_t len)
{
  ssize_t n;

  do
    n = recv (c->fd, buf, len, 0);
  while (n < 0 && errno == EINTR);
  return n;
}

static ssize_t
plain_send (struct conn *c, const struct iovec *iov, int iovcnt)
{
  struct msghdr msg = { .msg_iov = (struct iovec *) iov,
                        .msg_iovlen = iovcnt };
  ssize_t n;

  /* sendmsg rather than writev: MSG_NOSIGNAL, so a client that went away
   * costs an EPIPE, not a SIGPIPE. */
  do
    n = sendmsg (c->fd, &msg, MSG_NOSIGNAL);
  while (n < 0 && errno == EINTR);
  return n;
}

static size_t
plain_pending (struct conn *c)
{
  return 0;
}

static void
plain_close (struct conn *c)
{
  if (c->fd >= 0)
    close (c->fd);
  c->fd = -1;
}

const struct transport_ops transport_plain = {
  .name = "plain",
  .recv = plain_recv,
  .send = plain_send,
  .pending = plain_pending,
  .close = plain_close,
  .short_read_drains = true,
};
