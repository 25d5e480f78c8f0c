/* TLS with pre-shared keys: a server context from a PSK file in the
 * format nbdkit, qemu and GnuTLS's psktool use: one "username:hexkey"
 * per line.
 *
 * The keys hang off the SSL_CTX (ex_data), so a reload swaps them along
 * with the context and open connections keep the table they started with.
 * OpenSSL's server PSK callback serves TLS 1.2 (PSK cipher suites) and
 * TLS 1.3 (external PSK, SHA-256 suites), which is what GnuTLS clients
 * offer by default.
 */
#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/ssl.h>

#include "foliod/util.h"
#include "server/internal.h"
#include "server/log.h"
#include "server/tls.h"

#define PSK_MAX_KEY 64    /* bytes; OpenSSL's PSK_MAX_PSK_LEN is 512 */
#define PSK_MIN_KEY 16    /* bytes (128 bits); psktool makes 32 */
#define PSK_MAX_USER 128

struct psk_entry {
  char user[PSK_MAX_USER + 1];
  unsigned char key[PSK_MAX_KEY];
  unsigned keylen;
};

struct psk_table {
  size_t n;
  struct psk_entry e[];
};

static int psk_index = -1;
static pthread_once_t psk_once = PTHREAD_ONCE_INIT;

static void
psk_table_free (void *parent, void *ptr, CRYPTO_EX_DATA *ad, int idx,
                long argl, void *argp)
{
  struct psk_table *t = ptr;

  if (t)
    OPENSSL_cleanse (t->e, t->n * sizeof t->e[0]);
  free (t);
}

static void
psk_index_init (void)
{
  psk_index = SSL_CTX_get_ex_new_index (0, NULL, NULL, NULL, psk_table_free);
}

static unsigned int
psk_server_cb (SSL *ssl, const char *identity, unsigned char *psk,
               unsigned int max_psk_len)
{
  const struct psk_table *t =
    SSL_CTX_get_ex_data (SSL_get_SSL_CTX (ssl), psk_index);
  const struct conn *c = SSL_get_app_data (ssl);
  char esc[ESCAPED_MAX];

  if (!t || !identity || !c)
    return 0;
  for (size_t i = 0; i < t->n; i++)
    if (strcmp (t->e[i].user, identity) == 0) {
      if (t->e[i].keylen > max_psk_len)
        return 0;
      /* Logged here: with TLS 1.3 OpenSSL does not keep the identity
       * for SSL_get_psk_identity. */
      log_info ("conn %" PRIu64 " (%s): TLS PSK user '%s'", c->id, c->peer,
                str_escape (esc, sizeof esc, identity, strlen (identity)));
      memcpy (psk, t->e[i].key, t->e[i].keylen);
      return t->e[i].keylen;
    }
  log_warn ("conn %" PRIu64 " (%s): unknown TLS PSK user '%s'", c->id,
            c->peer, str_escape (esc, sizeof esc, identity, strlen (identity)));
  return 0; /* unknown identity: handshake fails */
}

static int
psk_hex (int c)
{
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

/* Parse "user:hexkey" into e.  0, or -1 with the reason in err. */
static int
psk_parse_line (char *line, struct psk_entry *e, const char *path,
                unsigned lineno, char *err, size_t errlen)
{
  char *colon = strchr (line, ':'), *hex;
  size_t len, ulen;

  len = strlen (line);
  while (len && isspace ((unsigned char) line[len - 1]))
    line[--len] = '\0';
  if (!colon || colon == line
      || (ulen = (size_t) (colon - line)) > PSK_MAX_USER) {
    snprintf (err, errlen, "%s:%u: expected username:hexkey", path, lineno);
    return -1;
  }
  hex = colon + 1;
  len = strlen (hex);
  if (len == 0 || len % 2 || len / 2 > PSK_MAX_KEY) {
    snprintf (err, errlen, "%s:%u: the key must be %d to %d hex digits, "
              "an even number", path, lineno, 2 * PSK_MIN_KEY,
              2 * PSK_MAX_KEY);
    return -1;
  }
  if (len / 2 < PSK_MIN_KEY) {
    snprintf (err, errlen, "%s:%u: the key is %zu bytes, at least %d bytes "
              "are needed (psktool -s 32 makes one)", path, lineno, len / 2,
              PSK_MIN_KEY);
    return -1;
  }
  for (size_t i = 0; i < len; i += 2) {
    int hi = psk_hex (hex[i]), lo = psk_hex (hex[i + 1]);

    if (hi < 0 || lo < 0) {
      snprintf (err, errlen, "%s:%u: the key is not hexadecimal", path,
                lineno);
      return -1;
    }
    e->key[i / 2] = (unsigned char) (hi << 4 | lo);
  }
  memcpy (e->user, line, ulen);
  e->user[ulen] = '\0';
  e->keylen = len / 2;
  return 0;
}

/* Read path into a table.  NULL with the reason in err. */
static struct psk_table *
psk_read (const char *path, char *err, size_t errlen)
{
  FILE *f = fopen (path, "re");
  struct psk_table *t = NULL, *nt;
  char line[1024];
  unsigned lineno = 0;

  struct stat st;

  if (!f) {
    snprintf (err, errlen, "%s: %s", path, strerror (errno));
    return NULL;
  }
  /* As ssh does with a private key: a secret anyone on the host may read
   * is no secret; refuse it rather than serve with it. */
  if (fstat (fileno (f), &st) == 0 && (st.st_mode & S_IRWXO)) {
    snprintf (err, errlen, "%s: readable by others (mode %04o): the keys "
              "are secrets; chmod o-rwx %s", path,
              (unsigned) (st.st_mode & 07777), path);
    fclose (f);
    return NULL;
  }
  if (!(t = calloc (1, sizeof *t)))
    goto nomem;
  while (fgets (line, sizeof line, f)) {
    lineno++;
    if (line[0] == '\n' || line[0] == '#')
      continue;
    nt = realloc (t, sizeof *t + (t->n + 1) * sizeof t->e[0]);
    if (!nt)
      goto nomem;
    t = nt;
    if (psk_parse_line (line, &t->e[t->n], path, lineno, err, errlen) < 0)
      goto fail;
    t->n++;
  }
  OPENSSL_cleanse (line, sizeof line);
  if (t->n == 0) {
    snprintf (err, errlen, "%s: no username:hexkey line", path);
    goto fail;
  }
  fclose (f);
  return t;
nomem:
  snprintf (err, errlen, "%s: out of memory", path);
fail:
  OPENSSL_cleanse (line, sizeof line);
  if (t)
    psk_table_free (NULL, t, NULL, 0, 0, NULL);
  fclose (f);
  return NULL;
}

SSL_CTX *
tls_ctx_new_psk (const char *path, char *err, size_t errlen)
{
  struct psk_table *t;
  SSL_CTX *ctx;

  if (pthread_once (&psk_once, psk_index_init) != 0 || psk_index < 0) {
    snprintf (err, errlen, "TLS PSK: cannot register the key table");
    return NULL;
  }
  if (!(t = psk_read (path, err, errlen)))
    return NULL;
  if (!(ctx = tls_ctx_base (err, errlen))) {
    psk_table_free (NULL, t, NULL, 0, 0, NULL);
    return NULL;
  }
  if (!SSL_CTX_set_ex_data (ctx, psk_index, t)) {
    psk_table_free (NULL, t, NULL, 0, 0, NULL);
    SSL_CTX_free (ctx);
    snprintf (err, errlen, "TLS PSK: out of memory");
    return NULL;
  }
  SSL_CTX_set_psk_server_callback (ctx, psk_server_cb);
  return ctx;
}
