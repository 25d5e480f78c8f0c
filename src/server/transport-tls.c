/* TLS transport: OpenSSL on the connection's non-blocking socket.
 *
 * Life of a TLS connection (see tls.h):
 *   CLEAR      the STARTTLS ACK (and any reply before it) still goes out
 *              unencrypted; recv waits (EAGAIN) until it is sent.
 *   HANDSHAKE  recv drives SSL_accept; send has nothing to do (the client
 *              speaks first after the ACK, we answer only after it).
 *   OPEN       SSL_read / SSL_write.
 *
 * Non-blocking: every OpenSSL call may want the other direction (an
 * SSL_read that must write a handshake or key-update record, an SSL_write
 * that must read first).  Both wishes are kept and turned into
 * c->tport_want in one place (tls_update_want), which the connection adds
 * to the events it watches; an event it waited for retries both sides.
 */
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "foliod/util.h"
#include "server/internal.h"
#include "server/log.h"
#include "server/tls.h"

#define TLS_BOUNCE_SIZE  16384        /* one full TLS record */
#define TLS_SEND_BUDGET  (256u * 1024) /* bytes per send call */

struct tls_conn {
  SSL *ssl;
  size_t clear_left;      /* bytes to send unencrypted before TLS starts */
  bool handshake_done;
  bool read_wants_write;  /* last SSL_read/SSL_accept needs EV_WRITE */
  bool write_wants_read;  /* last SSL_write needs EV_READ */
  bool read_blocked;      /* last SSL_read wanted more socket input */
  bool fatal;             /* an SSL error: no close_notify on close */
  uint8_t bounce[TLS_BOUNCE_SIZE]; /* small iovecs gathered per record */
};

static void
tls_update_want (struct conn *c, struct tls_conn *t)
{
  c->tport_want = (t->read_wants_write ? EV_WRITE : 0)
                  | (t->write_wants_read ? EV_READ : 0);
}

/* The newest OpenSSL error as text (the queue is cleared). */
static void
tls_err_string (char *buf, size_t len)
{
  unsigned long e = ERR_peek_last_error ();

  if (e)
    ERR_error_string_n (e, buf, len);
  else
    snprintf (buf, len, "%s", errno ? strerror (errno) : "connection closed");
  ERR_clear_error ();
}

/* Classify the failure of an SSL call that returned r.  Returns -1 with
 * errno EAGAIN (wait; *wants_other says whether for the other direction),
 * 0 for end of stream, or -1 with another errno (fatal, logged). */
static int
tls_fail (struct conn *c, struct tls_conn *t, int r, const char *what,
          bool *wants_other, bool reading)
{
  int saved = errno;
  char msg[256];

  switch (SSL_get_error (t->ssl, r)) {
  case SSL_ERROR_WANT_READ:
    *wants_other = !reading;
    if (reading)
      t->read_blocked = true;
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_WANT_WRITE:
    *wants_other = reading;
    errno = EAGAIN;
    return -1;
  case SSL_ERROR_ZERO_RETURN:
    return 0; /* close_notify */
  case SSL_ERROR_SYSCALL:
    t->fatal = true;
    if (ERR_peek_error () == 0 && saved == 0)
      return 0; /* EOF without close_notify */
    errno = saved;
    tls_err_string (msg, sizeof msg);
    if (!t->handshake_done)
      log_warn ("conn %" PRIu64 " (%s): TLS handshake failed: %s", c->id,
                c->peer, msg);
    else
      log_debug ("conn %" PRIu64 " (%s): TLS %s: %s", c->id, c->peer, what,
                 msg);
    errno = saved ? saved : ECONNRESET; /* logging may have changed it */
    return -1;
  default:
    t->fatal = true;
    tls_err_string (msg, sizeof msg);
    if (!t->handshake_done) {
      long v = SSL_get_verify_result (t->ssl);
      log_warn ("conn %" PRIu64 " (%s): TLS handshake failed: %s%s%s",
                c->id, c->peer, msg, v != X509_V_OK ? ": " : "",
                v != X509_V_OK ? X509_verify_cert_error_string (v) : "");
    }
    else
      log_warn ("conn %" PRIu64 " (%s): TLS %s failed: %s", c->id, c->peer,
                what, msg);
    errno = EPROTO;
    return -1;
  }
}

static void
tls_log_established (struct conn *c, struct tls_conn *t)
{
  X509 *peer = SSL_get0_peer_certificate (t->ssl);
  char subject[256] = "", esc[ESCAPED_MAX];

  if (peer)
    X509_NAME_oneline (X509_get_subject_name (peer), subject,
                       sizeof subject);
  log_info ("conn %" PRIu64 " (%s): TLS established: %s, %s%s%s", c->id,
            c->peer, SSL_get_version (t->ssl), SSL_get_cipher_name (t->ssl),
            peer ? ", client " : "",
            str_escape (esc, sizeof esc, subject, strlen (subject)));
}

/* Drive the server side of the handshake.  Returns 1 when done, else as
 * tls_fail. */
static int
tls_handshake (struct conn *c, struct tls_conn *t)
{
  int r;

  ERR_clear_error ();
  errno = 0;
  r = SSL_accept (t->ssl);
  t->read_wants_write = false;
  if (r == 1) {
    t->handshake_done = true;
    tls_log_established (c, t);
    return 1;
  }
  r = tls_fail (c, t, r, "handshake", &t->read_wants_write, true);
  if (r == 0)
    log_warn ("conn %" PRIu64 " (%s): TLS handshake failed: the client "
              "closed the connection", c->id, c->peer);
  return r;
}

/* Read decrypted bytes: as many records as are there, up to len.
 * Returns as the transport contract says (transport.h). */
static ssize_t
tls_recv (struct conn *c, void *buf, size_t len)
{
  struct tls_conn *t = c->tport;
  size_t got = 0;

  if (t->clear_left) {
    /* The client may not speak before it has our ACK. */
    errno = EAGAIN;
    return -1;
  }
  if (!t->handshake_done) {
    int r = tls_handshake (c, t);
    tls_update_want (c, t);
    if (r != 1)
      return r;
  }
  t->read_wants_write = false;
  while (got < len) {
    size_t n;
    int r;

    ERR_clear_error ();
    errno = 0;
    r = SSL_read_ex (t->ssl, (uint8_t *) buf + got, len - got, &n);
    if (r == 1) {
      t->read_blocked = false;
      got += n;
      continue;
    }
    r = tls_fail (c, t, r, "read", &t->read_wants_write, true);
    if (got > 0) {
      /* Give what we have; an error shows again on the next call. */
      t->read_wants_write = false;
      break;
    }
    tls_update_want (c, t);
    return r;
  }
  tls_update_want (c, t);
  return (ssize_t) got;
}

/* Send the first t->clear_left bytes of iov unencrypted. */
static ssize_t
tls_send_clear (struct conn *c, struct tls_conn *t, const struct iovec *iov,
                int iovcnt)
{
  struct iovec v[CONN_SEND_IOV];
  size_t left = t->clear_left;
  int n = 0;
  ssize_t k;

  for (int i = 0; i < iovcnt && n < CONN_SEND_IOV && left > 0; i++) {
    v[n] = iov[i];
    if (v[n].iov_len > left)
      v[n].iov_len = left;
    left -= v[n].iov_len;
    n++;
  }
  k = transport_plain.send (c, v, n);
  if (k > 0) {
    assert ((size_t) k <= t->clear_left);
    t->clear_left -= k;
  }
  return k;
}

/* The next piece to encrypt, starting skip bytes into iov: a large iovec
 * as it is, or small ones gathered into the bounce buffer (fewer, fuller
 * records).  The same queued bytes always give the same piece or a longer
 * one, which is what OpenSSL needs when a write is retried. */
static size_t
tls_piece (struct tls_conn *t, const struct iovec *iov, int iovcnt,
           size_t skip, const void **p)
{
  size_t have = 0;
  int i = 0;

  while (i < iovcnt && skip >= iov[i].iov_len)
    skip -= iov[i++].iov_len;
  if (i == iovcnt)
    return 0;
  if (iov[i].iov_len - skip >= TLS_BOUNCE_SIZE) {
    *p = (const uint8_t *) iov[i].iov_base + skip;
    return iov[i].iov_len - skip;
  }
  for (; i < iovcnt && have < TLS_BOUNCE_SIZE; i++, skip = 0) {
    size_t n = iov[i].iov_len - skip;

    if (n > TLS_BOUNCE_SIZE - have)
      n = TLS_BOUNCE_SIZE - have;
    memcpy (t->bounce + have, (const uint8_t *) iov[i].iov_base + skip, n);
    have += n;
  }
  *p = t->bounce;
  return have;
}

static ssize_t
tls_send (struct conn *c, const struct iovec *iov, int iovcnt)
{
  struct tls_conn *t = c->tport;
  size_t done = 0;

  if (t->clear_left)
    return tls_send_clear (c, t, iov, iovcnt);
  if (!t->handshake_done) {
    /* Nothing is queued before the handshake ends (tls.h). */
    errno = EAGAIN;
    return -1;
  }
  t->write_wants_read = false;
  while (done < TLS_SEND_BUDGET) {
    const void *p;
    size_t len = tls_piece (t, iov, iovcnt, done, &p), n;
    int r;

    if (len == 0)
      break;
    ERR_clear_error ();
    errno = 0;
    r = SSL_write_ex (t->ssl, p, len, &n);
    if (r == 1) {
      done += n;
      continue;
    }
    r = tls_fail (c, t, r, "write", &t->write_wants_read, false);
    if (done > 0)
      break; /* report progress; the retry starts where it stopped */
    tls_update_want (c, t);
    if (r == 0) {
      errno = EPIPE;
      return -1;
    }
    return r;
  }
  tls_update_want (c, t);
  return done;
}

/* Decrypted bytes ready, or a whole record buffered (read-ahead) that the
 * socket will not signal again.  After SSL_read asked for more input the
 * buffered rest is a partial record: not pending, or we would spin. */
static size_t
tls_pending (struct conn *c)
{
  struct tls_conn *t = c->tport;

  if (t->clear_left || !t->handshake_done)
    return 0;
  return (size_t) SSL_pending (t->ssl)
         + (!t->read_blocked && SSL_has_pending (t->ssl));
}

static void
tls_close (struct conn *c)
{
  struct tls_conn *t = c->tport;

  if (t) {
    /* Best effort close_notify; never wait for the client's. */
    if (t->handshake_done && !t->fatal) {
      ERR_clear_error ();
      SSL_shutdown (t->ssl);
    }
    ERR_clear_error ();
    SSL_free (t->ssl);
    free (t);
    c->tport = NULL;
  }
  transport_plain.close (c);
}

int
tls_conn_start (struct conn *c, SSL_CTX *ctx)
{
  struct tls_conn *t = calloc (1, sizeof *t);

  if (!t)
    return -1;
  t->ssl = SSL_new (ctx);
  if (!t->ssl || SSL_set_fd (t->ssl, c->fd) != 1) {
    char msg[256];

    tls_err_string (msg, sizeof msg);
    log_error ("conn %" PRIu64 ": TLS: %s", c->id, msg);
    SSL_free (t->ssl);
    free (t);
    errno = ENOMEM;
    return -1;
  }
  SSL_set_app_data (t->ssl, c); /* for the PSK callback's log line */
  t->clear_left = c->hsout_len - c->hsout_sent;
  c->tport = t;
  c->tops = &transport_tls;
  c->tport_want = 0;
  return 0;
}

const struct transport_ops transport_tls = {
  .name = "tls",
  .recv = tls_recv,
  .send = tls_send,
  .pending = tls_pending,
  .close = tls_close,
};
