/* The transport seam: how a connection moves bytes.
 *
 * Every byte a connection reads or writes goes through c->tops, so TLS
 * plugs in as a second implementation of these ops (issue 8) without the
 * protocol code knowing.  Contract of each op:
 *
 *   recv   read up to len bytes.  Returns >0 bytes, 0 on orderly EOF, or -1
 *          with errno (EAGAIN/EWOULDBLOCK: nothing now, try again when the
 *          events in c->tport_want are ready; anything else: fatal).
 *   send   write from iov.  Returns >0 bytes written (may be short), or -1
 *          with errno as for recv.  Never 0 for a non-empty iov.
 *   pending  bytes already buffered inside the transport that recv can
 *          return although the socket is not readable (TLS records).
 *   close  release transport state and close c->fd.  Called once.
 *   short_read_drains  a recv shorter than asked means the socket had no
 *          more (a stream socket; not TLS, which returns one record at a
 *          time): the reader then waits for the next readable event rather
 *          than calling recv again only to get EAGAIN.
 *
 * c->tport_want: the socket events (EV_READ/EV_WRITE) the transport itself
 * needs to make progress on the last call that returned EAGAIN ("read
 * wants write" for TLS); a transport sets it on every recv/send (0 when
 * the call did not block for that reason).  The plain transport leaves it
 * 0.  The connection recomputes its watched events in one place
 * (conn_update_events) from its own needs plus this, and an event the
 * transport waited for retries both directions (conn_io_cb).
 */
#ifndef FOLIOD_TRANSPORT_H
#define FOLIOD_TRANSPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>
#include <sys/uio.h>

struct conn;

struct transport_ops {
  const char *name;
  ssize_t (*recv) (struct conn *c, void *buf, size_t len);
  ssize_t (*send) (struct conn *c, const struct iovec *iov, int iovcnt);
  size_t (*pending) (struct conn *c);
  void (*close) (struct conn *c);
  bool short_read_drains;
};

/* Plain sockets: recv(2) / writev(2) on c->fd. */
extern const struct transport_ops transport_plain;

#endif /* FOLIOD_TRANSPORT_H */
