/* TLS for the NBD server (OpenSSL): credentials and the TLS transport.
 *
 * Credentials come from a directory in the layout qemu and nbdkit use:
 *
 *   server-cert.pem   the server's certificate (chain), PEM
 *   server-key.pem    its private key, PEM
 *   ca-cert.pem       the CA that signs client certificates; required
 *                     only when clients must present one (verify_peer)
 *
 * Or, instead, pre-shared keys from a file of "username:hexkey" lines
 * (tls-psk.c).  One SSL_CTX holds them.  Connections take a reference on the context
 * they start with (SSL_new does), so a reload (SIGHUP) builds a new
 * context and swaps the server's pointer: new connections use the new
 * credentials, open ones keep theirs until they close.
 *
 * The transport: after the server queued its NBD_REP_ACK to STARTTLS,
 * tls_conn_start() puts c on transport_tls.  The bytes still queued in
 * c->hsout at that moment (the ACK and anything before it) go out in
 * clear; then the TLS handshake runs inside the first recv calls, and from
 * there on every byte is a TLS record.  Non-blocking throughout: an
 * SSL_read that needs the socket writable ("read wants write") or an
 * SSL_write that needs it readable is remembered, and the events/ready
 * ops map the connection's wishes to socket events in one place, as
 * redis's tls.c does.
 */
#ifndef FOLIOD_SERVER_TLS_H
#define FOLIOD_SERVER_TLS_H

#include <stdbool.h>
#include <stddef.h>

#include "server/transport.h"

struct conn;
struct ssl_ctx_st; /* OpenSSL's SSL_CTX */

/* Build a server context from the credentials in dir: TLS 1.2 and later,
 * the system's default cipher policy; with verify_peer, clients must
 * present a certificate signed by ca-cert.pem.  Checks that the key
 * matches the certificate and that the certificate is valid now.
 * Returns the context, or NULL with a reason naming the file in err. */
struct ssl_ctx_st *tls_ctx_new (const char *dir, bool verify_peer,
                                char *err, size_t errlen);

/* tls-ctx.c: a context with the settings above and no credentials yet.
 * NULL with the reason in err. */
struct ssl_ctx_st *tls_ctx_base (char *err, size_t errlen);
/* tls-ctx.c: the newest OpenSSL error as text in buf (fallback when the
 * queue is empty), queue cleared; returns buf.  tls_no_password: the
 * pem_password_cb that refuses encrypted keys (OpenSSL would prompt on
 * the terminal). */
const char *tls_ssl_error (char *buf, size_t len, const char *fallback);
int tls_no_password (char *buf, int size, int rwflag, void *u);

/* A context whose clients authenticate with a pre-shared key from path
 * ("username:hexkey" lines, as nbdkit and qemu read), no certificates.
 * NULL with the reason naming the file (and line) in err. */
struct ssl_ctx_st *tls_ctx_new_psk (const char *path, char *err,
                                    size_t errlen);

/* Drop the server's reference (connections may hold their own). */
void tls_ctx_free (struct ssl_ctx_st *ctx);

/* Switch c to TLS with ctx, once the STARTTLS ACK has been queued in
 * c->hsout: those queued bytes still go out in clear.  Returns 0, or -1
 * (no memory; c stays on its old transport). */
int tls_conn_start (struct conn *c, struct ssl_ctx_st *ctx);

/* The server's current credentials, under its tls_lock (a loop may
 * start TLS while the main thread reloads them). */
bool server_tls_on (struct server *s);
int server_tls_start (struct conn *c);

extern const struct transport_ops transport_tls;

#endif /* FOLIOD_SERVER_TLS_H */
