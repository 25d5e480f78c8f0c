/* TLS credentials: an OpenSSL server context from a certificates
 * directory (tls.h), and the server's (re)load of it.
 *
 * Every check names the file it is about, because these errors are read
 * by someone who just ran openssl by hand: missing or unreadable files,
 * a key that does not belong to the certificate, a certificate outside
 * its validity period.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include "foliod/export.h"
#include "server/internal.h"
#include "server/log.h"
#include "server/tls.h"

/* Open dir/name for reading.  NULL with the reason in err. */
static FILE *
creds_open (const char *dir, const char *name, char *path, size_t pathlen,
            char *err, size_t errlen)
{
  FILE *f;

  snprintf (path, pathlen, "%s/%s", dir, name);
  f = fopen (path, "re");
  if (!f)
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
  return f;
}

/* Is x valid now?  0, or -1 with the reason in err. */
static int
creds_check_dates (X509 *x, const char *path, char *err, size_t errlen)
{
  const ASN1_TIME *t;
  char when[64] = "?";
  BIO *b;

  if (X509_cmp_current_time (X509_get0_notAfter (x)) < 0)
    t = X509_get0_notAfter (x);
  else if (X509_cmp_current_time (X509_get0_notBefore (x)) > 0)
    t = X509_get0_notBefore (x);
  else
    return 0;
  if ((b = BIO_new (BIO_s_mem ())) != NULL) {
    int n;

    ASN1_TIME_print (b, t);
    n = BIO_read (b, when, sizeof when - 1);
    when[n > 0 ? n : 0] = '\0';
    BIO_free (b);
  }
  snprintf (err, errlen, "%s: certificate %s %s", path,
            t == X509_get0_notAfter (x) ? "expired on" : "not valid before",
            when);
  return -1;
}

/* Certificate chain and key into ctx, checked.  0 or -1 (err). */
static int
creds_load_identity (SSL_CTX *ctx, const char *dir, char *err, size_t errlen)
{
  char cert_path[4096], key_path[4096], msg[256];
  EVP_PKEY *key;
  X509 *x;
  FILE *f;

  if (!(f = creds_open (dir, "server-cert.pem", cert_path, sizeof cert_path,
                        err, errlen)))
    return -1;
  fclose (f);
  if (SSL_CTX_use_certificate_chain_file (ctx, cert_path) != 1) {
    snprintf (err, errlen, "%s: cannot load the certificate: %s", cert_path,
              tls_ssl_error (msg, sizeof msg, "not a PEM certificate"));
    return -1;
  }
  x = SSL_CTX_get0_certificate (ctx);
  if (creds_check_dates (x, cert_path, err, errlen) < 0)
    return -1;

  if (!(f = creds_open (dir, "server-key.pem", key_path, sizeof key_path,
                        err, errlen)))
    return -1;
  key = PEM_read_PrivateKey (f, NULL, tls_no_password, NULL);
  fclose (f);
  if (!key) {
    snprintf (err, errlen, "%s: cannot load the private key (PEM, not "
              "encrypted): %s", key_path,
              tls_ssl_error (msg, sizeof msg, "no key found"));
    return -1;
  }
  if (X509_check_private_key (x, key) != 1) {
    ERR_clear_error ();
    snprintf (err, errlen, "%s: the private key does not match the "
              "certificate %s", key_path, cert_path);
    EVP_PKEY_free (key);
    return -1;
  }
  if (SSL_CTX_use_PrivateKey (ctx, key) != 1) {
    snprintf (err, errlen, "%s: %s", key_path,
              tls_ssl_error (msg, sizeof msg, "cannot use the key"));
    EVP_PKEY_free (key);
    return -1;
  }
  EVP_PKEY_free (key);
  return 0;
}

/* Require client certificates signed by dir/ca-cert.pem.  0 or -1. */
static int
creds_load_ca (SSL_CTX *ctx, const char *dir, char *err, size_t errlen)
{
  char path[4096], msg[256];
  // cppcheck-suppress constStatement ; OpenSSL's type macro, unexpanded
  STACK_OF (X509_NAME) *names;
  FILE *f;

  if (!(f = creds_open (dir, "ca-cert.pem", path, sizeof path, err,
                        errlen)))
    return -1;
  fclose (f);
  if (SSL_CTX_load_verify_locations (ctx, path, NULL) != 1
      || !(names = SSL_load_client_CA_file (path))) {
    snprintf (err, errlen, "%s: cannot load the CA certificate: %s", path,
              tls_ssl_error (msg, sizeof msg, "not a PEM certificate"));
    return -1;
  }
  SSL_CTX_set_client_CA_list (ctx, names);
  SSL_CTX_set_verify (ctx, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT,
                      NULL);
  return 0;
}

SSL_CTX *
tls_ctx_new (const char *dir, bool verify_peer, char *err, size_t errlen)
{
  SSL_CTX *ctx = tls_ctx_base (err, errlen);

  if (!ctx)
    return NULL;
  if (creds_load_identity (ctx, dir, err, errlen) < 0
      || (verify_peer && creds_load_ca (ctx, dir, err, errlen) < 0)) {
    SSL_CTX_free (ctx);
    return NULL;
  }
  return ctx;
}

void
tls_ctx_free (SSL_CTX *ctx)
{
  SSL_CTX_free (ctx);
}

/* Is TLS offered at all: by the server's mode or by one export? */
static bool
server_tls_wanted (const struct server *s)
{
  if (s->cfg.tls_mode != SERVER_TLS_OFF)
    return true;
  for (size_t i = 0; i < s->nexports; i++)
    if (s->exports[i]->tls_require == 1)
      return true;
  return false;
}

int
server_tls_reload (struct server *s, char *err, size_t errlen)
{
  SSL_CTX *ctx, *old;

  if (!server_tls_wanted (s))
    return 0;
  if (s->cfg.tls_psk_file) {
    /* Pre-shared keys replace certificates, as with nbdkit --tls-psk. */
    ctx = tls_ctx_new_psk (s->cfg.tls_psk_file, err, errlen);
    if (!ctx)
      return -1;
    log_info ("TLS pre-shared keys loaded from %s", s->cfg.tls_psk_file);
  }
  else if (s->cfg.tls_certificates) {
    ctx = tls_ctx_new (s->cfg.tls_certificates, s->cfg.tls_verify_peer, err,
                       errlen);
    if (!ctx)
      return -1;
    log_info ("TLS credentials loaded from %s%s", s->cfg.tls_certificates,
              s->cfg.tls_verify_peer ? " (client certificates required)"
                                     : "");
  }
  else {
    snprintf (err, errlen, "TLS needs tls-certificates (or tls-psk)");
    return -1;
  }
  lock_or_die (&s->tls_lock);
  old = s->tls_ctx;
  s->tls_ctx = ctx;
  unlock_or_die (&s->tls_lock);
  tls_ctx_free (old);   /* connections that use it hold their reference */
  return 0;
}

/* Is STARTTLS answered now?  Any loop's thread. */
bool
server_tls_on (struct server *s)
{
  bool on;

  lock_or_die (&s->tls_lock);
  on = s->tls_ctx != NULL;
  unlock_or_die (&s->tls_lock);
  return on;
}

/* Start TLS on c with the current credentials: the lock keeps a reload
 * on the main thread from freeing them under SSL_new, which then holds
 * its own reference.  tls_conn_start's returns. */
int
server_tls_start (struct conn *c)
{
  struct server *s = c->srv;
  int r;

  lock_or_die (&s->tls_lock);
  r = s->tls_ctx ? tls_conn_start (c, s->tls_ctx) : -1;
  unlock_or_die (&s->tls_lock);
  return r;
}
