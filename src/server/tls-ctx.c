/* The server's TLS context before credentials (tls.h): settings that
 * both kinds of credentials share, and what their loaders need of
 * OpenSSL (error text, the no-password callback).  Below tls-creds.c
 * (certificates, the server's reload) and tls-psk.c (pre-shared keys),
 * which call it and not each other. */
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include "server/internal.h"
#include "server/tls.h"

#define TLS_SESSION_ID_CTX "foliod"

/* The newest OpenSSL error as text in buf, or fallback; clears the
 * queue.  Returns buf. */
const char *
tls_ssl_error (char *buf, size_t len, const char *fallback)
{
  unsigned long e = ERR_peek_last_error ();

  if (e)
    ERR_error_string_n (e, buf, len);
  else
    snprintf (buf, len, "%s", fallback);
  ERR_clear_error ();
  return buf;
}

/* Encrypted keys would make OpenSSL prompt on the terminal: refuse. */
int
tls_no_password (char *buf, int size, int rwflag, void *u)
{
  return -1;
}

SSL_CTX *
tls_ctx_base (char *err, size_t errlen)
{
  SSL_CTX *ctx = SSL_CTX_new (TLS_server_method ());
  char msg[256];

  if (!ctx) {
    snprintf (err, errlen, "cannot create a TLS context: %s",
              tls_ssl_error (msg, sizeof msg, "out of memory"));
    return NULL;
  }
  /* TLS 1.2 and later with the system's cipher policy (no cipher list of
   * our own).  Renegotiation off: it is the one way an SSL_write could
   * want to read.  Unexpected EOF reads as an ordinary end of stream,
   * since clients commonly close without close_notify. */
  SSL_CTX_set_min_proto_version (ctx, TLS1_2_VERSION);
  SSL_CTX_set_options (ctx, SSL_OP_NO_RENEGOTIATION
                            | SSL_OP_IGNORE_UNEXPECTED_EOF);
  SSL_CTX_set_mode (ctx, SSL_MODE_ENABLE_PARTIAL_WRITE
                         | SSL_MODE_ACCEPT_MOVING_WRITE_BUFFER);
  SSL_CTX_set_read_ahead (ctx, 1);
  SSL_CTX_set_session_id_context (ctx,
                                  (const unsigned char *) TLS_SESSION_ID_CTX,
                                  strlen (TLS_SESSION_ID_CTX));
  SSL_CTX_set_default_passwd_cb (ctx, tls_no_password);
  return ctx;
}
