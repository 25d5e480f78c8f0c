/* bad-client: a raw-socket NBD client that sends malformed input and
 * checks the server's answer (an error reply, or closing the connection).
 *
 *   bad-client SOCKET EXPORT CASE    run one case; exit 0 if the server
 *                                    behaved, 1 (with a message) if not
 *   bad-client SOCKET EXPORT list    print the case names
 *
 * Blocking socket, 10 s receive timeout: a server that hangs fails.
 */
#include <endian.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define NBDMAGIC      0x4e42444d41474943ULL
#define IHAVEOPT      0x49484156454F5054ULL
#define REPMAGIC      0x3e889045565a9ULL
#define REQMAGIC      0x25609513u
#define SIMPLEMAGIC   0x67446698u
#define STRUCTMAGIC   0x668e33efu
#define EXTREQMAGIC   0x21e41c71u
#define EXTREPMAGIC   0x6e8a278cu

#define OPT_EXPORT_NAME 1
#define OPT_STARTTLS   5
#define OPT_GO         7
#define OPT_STRUCTURED 8
#define OPT_SET_META   10
#define OPT_EXTENDED   11
#define REP_ACK        1
#define REP_ERR(n)     ((1u << 31) | (n))

#define CMD_READ 0
#define CMD_WRITE 1
#define CMD_DISC 2
#define CMD_FLUSH 3
#define CMD_TRIM 4
#define CMD_WRITE_ZEROES 6
#define FLAG_PAYLOAD_LEN (1u << 5)
#define REPLY_TYPE_NONE 0
#define REPLY_TYPE_OFFSET_DATA 1
#define REPLY_TYPE_BLOCK_STATUS_EXT 6
#define REPLY_TYPE_ERROR ((1u << 15) + 1)
#define CMD_BLOCK_STATUS 7

static const char *sock_path, *export_name;
static uint16_t go_tflags;  /* transmission flags of the last GO's INFO */

static void __attribute__ ((noreturn, format (printf, 1, 2)))
die (const char *fmt, ...)
{
  va_list ap;

  va_start (ap, fmt);
  fprintf (stderr, "bad-client: ");
  vfprintf (stderr, fmt, ap);
  fprintf (stderr, "\n");
  va_end (ap);
  exit (1);
}

static int
open_conn (void)
{
  struct sockaddr_un sun = { .sun_family = AF_UNIX };
  struct timeval tv = { .tv_sec = 10 };
  int fd = socket (AF_UNIX, SOCK_STREAM, 0);

  if (fd < 0)
    die ("socket: %m");
  snprintf (sun.sun_path, sizeof sun.sun_path, "%s", sock_path);
  if (connect (fd, (struct sockaddr *) &sun, sizeof sun) < 0)
    die ("connect %s: %m", sock_path);
  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  return fd;
}

static void
xwrite (int fd, const void *p, size_t n)
{
  const char *c = p;

  while (n > 0) {
    ssize_t k = send (fd, c, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0)
      die ("write: %m");
    c += k;
    n -= k;
  }
}

/* Read exactly n bytes.  Returns 0, or -1 on EOF/reset (errno 0 for EOF). */
static int
xread (int fd, void *p, size_t n)
{
  char *c = p;

  while (n > 0) {
    ssize_t k = recv (fd, c, n, 0);
    if (k < 0 && errno == EINTR)
      continue;
    if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
      die ("timed out waiting for the server");
    if (k < 0)
      return -1;
    if (k == 0) {
      errno = 0;
      return -1;
    }
    c += k;
    n -= k;
  }
  return 0;
}

static void
must_read (int fd, void *p, size_t n, const char *what)
{
  if (xread (fd, p, n) < 0)
    die ("connection closed while reading %s", what);
}

/* The server must close the connection (EOF or reset) without sending
 * anything more. */
static void
expect_closed (int fd, const char *why)
{
  char b;
  ssize_t k;

  do
    k = recv (fd, &b, 1, 0);
  while (k < 0 && errno == EINTR);
  if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
    die ("%s: server did not close the connection", why);
  if (k > 0)
    die ("%s: server sent data instead of closing", why);
  close (fd);
}

static void
put16 (uint8_t *p, uint16_t v) { v = htobe16 (v); memcpy (p, &v, 2); }
static void
put32 (uint8_t *p, uint32_t v) { v = htobe32 (v); memcpy (p, &v, 4); }
static void
put64 (uint8_t *p, uint64_t v) { v = htobe64 (v); memcpy (p, &v, 8); }
static uint16_t
get16 (const uint8_t *p) { uint16_t v; memcpy (&v, p, 2); return be16toh (v); }
static uint32_t
get32 (const uint8_t *p) { uint32_t v; memcpy (&v, p, 4); return be32toh (v); }
static uint64_t
get64 (const uint8_t *p) { uint64_t v; memcpy (&v, p, 8); return be64toh (v); }

/* Greeting, then our client flags. */
static void
hs_begin (int fd, uint32_t cflags)
{
  uint8_t g[18], f[4];

  must_read (fd, g, sizeof g, "greeting");
  if (get64 (g) != NBDMAGIC || get64 (g + 8) != IHAVEOPT)
    die ("bad greeting");
  if ((get16 (g + 16) & 3) != 3)
    die ("server lacks FIXED_NEWSTYLE|NO_ZEROES");
  put32 (f, cflags);
  xwrite (fd, f, 4);
}

static void
opt_send (int fd, uint32_t opt, const void *data, uint32_t len)
{
  uint8_t h[16];

  put64 (h, IHAVEOPT);
  put32 (h + 8, opt);
  put32 (h + 12, len);
  xwrite (fd, h, sizeof h);
  if (len)
    xwrite (fd, data, len);
}

/* Read one option reply; returns its type, payload (discarded) skipped. */
static uint32_t
opt_reply (int fd, uint32_t opt)
{
  uint8_t h[20];
  uint32_t len;
  char junk[4096];

  must_read (fd, h, sizeof h, "option reply");
  if (get64 (h) != REPMAGIC || get32 (h + 8) != opt)
    die ("bad option reply header");
  len = get32 (h + 16);
  while (len > 0) {
    uint32_t n = len < sizeof junk ? len : sizeof junk;
    must_read (fd, junk, n, "option reply data");
    len -= n;
  }
  return get32 (h + 12);
}

/* NBD_OPT_GO on name; returns the final reply type, *size from INFO. */
static uint32_t
opt_go (int fd, const char *name, uint64_t *size)
{
  size_t n = strlen (name);
  uint8_t buf[4 + 256 + 2];

  put32 (buf, n);
  memcpy (buf + 4, name, n);
  put16 (buf + 4 + n, 0);
  opt_send (fd, OPT_GO, buf, 4 + n + 2);
  for (;;) {
    uint8_t h[20], d[12];
    uint32_t type, len;

    must_read (fd, h, sizeof h, "GO reply");
    type = get32 (h + 12);
    len = get32 (h + 16);
    if (type == 3 /* INFO */ && len == 12) {
      must_read (fd, d, 12, "INFO_EXPORT");
      if (get16 (d) == 0 && size)
        *size = get64 (d + 2);
      if (get16 (d) == 0)
        go_tflags = get16 (d + 10);
      continue;
    }
    while (len > 0) {
      char junk[256];
      uint32_t k = len < sizeof junk ? len : sizeof junk;
      must_read (fd, junk, k, "GO reply data");
      len -= k;
    }
    if (type != 3)
      return type;
  }
}

/* A connection in transmission (simple replies) on the export. */
static int
connect_export (uint64_t *size)
{
  int fd = open_conn ();
  uint32_t t;

  hs_begin (fd, 3);
  t = opt_go (fd, export_name, size);
  if (t != REP_ACK)
    die ("GO to '%s' failed: reply 0x%x", export_name, t);
  return fd;
}

/* A request header at r: 28 bytes compact, 32 extended (64-bit len). */
static void
req_header_form (uint8_t *r, bool ext, uint16_t flags, uint16_t type,
                 uint64_t cookie, uint64_t off, uint64_t len)
{
  put32 (r, ext ? EXTREQMAGIC : REQMAGIC);
  put16 (r + 4, flags);
  put16 (r + 6, type);
  put64 (r + 8, cookie);
  put64 (r + 16, off);
  if (ext)
    put64 (r + 24, len);
  else
    put32 (r + 24, len);
}

static void
req_header (uint8_t *r, uint16_t flags, uint16_t type, uint64_t cookie,
            uint64_t off, uint32_t len)
{
  req_header_form (r, false, flags, type, cookie, off, len);
}

static void
send_req (int fd, uint16_t flags, uint16_t type, uint64_t cookie,
          uint64_t off, uint32_t len)
{
  uint8_t r[28];

  req_header (r, flags, type, cookie, off, len);
  xwrite (fd, r, sizeof r);
}

/* Read a reply header of n bytes into h: its magic must be magic, its
 * cookie (at byte 8 in every form) cookie. */
static void
reply_header (int fd, uint8_t *h, size_t n, uint32_t magic, uint64_t cookie)
{
  must_read (fd, h, n, "reply");
  if (get32 (h) != magic)
    die ("bad reply magic 0x%x, expected 0x%x", get32 (h), magic);
  if (get64 (h + 8) != cookie)
    die ("reply for cookie %llu, expected %llu",
         (unsigned long long) get64 (h + 8), (unsigned long long) cookie);
}

/* Read a simple reply for cookie; returns its error.  Read data (if ok
 * and datalen) is discarded. */
static uint32_t
simple_reply (int fd, uint64_t cookie, uint32_t datalen)
{
  uint8_t h[16];
  uint32_t err;

  reply_header (fd, h, sizeof h, SIMPLEMAGIC, cookie);
  err = get32 (h + 4);
  while (!err && datalen > 0) {
    char junk[65536];
    uint32_t k = datalen < sizeof junk ? datalen : sizeof junk;
    must_read (fd, junk, k, "read data");
    datalen -= k;
  }
  return err;
}

static void
expect_error (int fd, uint64_t cookie, uint32_t want, const char *what)
{
  uint32_t err = simple_reply (fd, cookie, 0);

  if (err != want)
    die ("%s: error %u, expected %u", what, err, want);
}

/* The connection still works: a small read succeeds. */
static void
still_works (int fd)
{
  send_req (fd, 0, CMD_READ, 999, 0, 512);
  if (simple_reply (fd, 999, 512) != 0)
    die ("read after the bad request failed");
}

static void
write_zeroes_payload (int fd, uint64_t n)
{
  static char z[65536];

  while (n > 0) {
    size_t k = n < sizeof z ? n : sizeof z;
    xwrite (fd, z, k);
    n -= k;
  }
}

/* ---- extended headers ------------------------------------------------------ */

/* A connection in transmission with extended headers negotiated. */
static int
connect_extended (void)
{
  int fd = open_conn ();
  uint32_t t;

  hs_begin (fd, 3);
  opt_send (fd, OPT_EXTENDED, NULL, 0);
  if ((t = opt_reply (fd, OPT_EXTENDED)) != REP_ACK)
    die ("EXTENDED_HEADERS: reply 0x%x, expected ACK", t);
  if ((t = opt_go (fd, export_name, NULL)) != REP_ACK)
    die ("GO to '%s' failed: reply 0x%x", export_name, t);
  return fd;
}

/* A 32-byte extended request header, then len payload bytes of zeroes
 * when payload is set. */
static void
send_ext_req (int fd, uint16_t flags, uint16_t type, uint64_t cookie,
              uint64_t off, uint64_t len, bool payload)
{
  uint8_t r[32];

  req_header_form (r, true, flags, type, cookie, off, len);
  xwrite (fd, r, sizeof r);
  if (payload)
    write_zeroes_payload (fd, len);
}

/* Read one extended reply chunk for cookie, whose header must echo off;
 * returns its type, the error of an error chunk in *err (else 0), its
 * flags in *flags, and its payload (up to cap bytes kept) in buf. */
static uint16_t
ext_chunk (int fd, uint64_t cookie, uint64_t off, uint32_t *err,
           uint16_t *flags, uint8_t *buf, size_t cap)
{
  uint8_t h[32], junk[4096];
  uint64_t len, got = 0;
  uint16_t type;

  reply_header (fd, h, sizeof h, EXTREPMAGIC, cookie);
  if (get64 (h + 16) != off)
    die ("reply offset %llu, expected the request's %llu",
         (unsigned long long) get64 (h + 16), (unsigned long long) off);
  *flags = get16 (h + 4);
  type = get16 (h + 6);
  len = get64 (h + 24);
  if (len > (64u << 20) + 64)
    die ("reply payload of %llu bytes", (unsigned long long) len);
  while (got < len) {
    size_t k = len - got < sizeof junk ? len - got : sizeof junk;
    must_read (fd, junk, k, "reply payload");
    if (buf && got < cap)
      memcpy (buf + got, junk, got + k <= cap ? k : cap - got);
    got += k;
  }
  *err = 0;
  if (type & (1u << 15)) {
    if (len < 6 || !buf || cap < 6)
      die ("error chunk of %llu bytes", (unsigned long long) len);
    *err = get32 (buf);
  }
  return type;
}

/* The whole reply to cookie: returns its error (0: success).  A success
 * without a payload must be one NONE chunk, never a simple reply. */
static uint32_t
ext_reply (int fd, uint64_t cookie, uint64_t off)
{
  uint8_t buf[4096];
  uint32_t err = 0, e;
  uint16_t flags;

  do {
    ext_chunk (fd, cookie, off, &e, &flags, buf, sizeof buf);
    if (e)
      err = e;
  } while (!(flags & 1));
  return err;
}

static void
expect_ext_error (int fd, uint64_t cookie, uint64_t off, uint32_t want,
                  const char *what)
{
  uint32_t err = ext_reply (fd, cookie, off);

  if (err != want)
    die ("%s: error %u, expected %u", what, err, want);
}

/* Still in step: a 512-byte read answers with data, and a flush. */
static void
ext_still_works (int fd)
{
  send_ext_req (fd, 0, CMD_READ, 999, 4096, 512, false);
  if (ext_reply (fd, 999, 4096) != 0)
    die ("read after the bad request failed");
  send_ext_req (fd, 0, CMD_FLUSH, 998, 0, 0, false);
  if (ext_reply (fd, 998, 0) != 0)
    die ("flush after the bad request failed");
}

/* Negotiation: EXTENDED_HEADERS takes no data; once acked, structured
 * replies are refused with EXT_HEADER_REQD, and EXPORT_NAME (which
 * cannot carry an error) closes. */
static void
case_ext_negotiate (void)
{
  int fd = open_conn ();
  uint32_t t;

  hs_begin (fd, 3);
  opt_send (fd, OPT_EXTENDED, "x", 1);
  if ((t = opt_reply (fd, OPT_EXTENDED)) != REP_ERR (3))
    die ("EXTENDED_HEADERS with data: 0x%x, expected ERR_INVALID", t);
  opt_send (fd, OPT_STRUCTURED, NULL, 0);
  if ((t = opt_reply (fd, OPT_STRUCTURED)) != REP_ACK)
    die ("STRUCTURED_REPLY: 0x%x, expected ACK", t);
  opt_send (fd, OPT_EXTENDED, NULL, 0);
  if ((t = opt_reply (fd, OPT_EXTENDED)) != REP_ACK)
    die ("EXTENDED_HEADERS after STRUCTURED_REPLY: 0x%x, expected ACK", t);
  opt_send (fd, OPT_STRUCTURED, NULL, 0);
  if ((t = opt_reply (fd, OPT_STRUCTURED)) != REP_ERR (10))
    die ("STRUCTURED_REPLY after EXTENDED_HEADERS: 0x%x, expected"
         " ERR_EXT_HEADER_REQD", t);
  opt_send (fd, OPT_EXPORT_NAME, export_name, strlen (export_name));
  expect_closed (fd, "EXPORT_NAME after EXTENDED_HEADERS");
}

/* The header form is fixed by the negotiation: a compact header on an
 * extended connection, or an extended one on a compact connection, is a
 * protocol violation (closed). */
static void
case_ext_wrong_magic (void)
{
  int fd = connect_extended ();
  uint8_t r[32];

  req_header (r, 0, CMD_READ, 1, 0, 512);
  put32 (r + 28, 0);
  xwrite (fd, r, sizeof r);
  expect_closed (fd, "compact header after extended headers");

  fd = connect_export (NULL);
  put32 (r, EXTREQMAGIC);
  xwrite (fd, r, 28);
  expect_closed (fd, "extended header without extended headers");
}

/* Payload rules: a payload a command does not take is read and dropped
 * (EINVAL, the stream stays in step); a payload over the maximum closes
 * the connection; a write carries its payload with or without
 * NBD_CMD_FLAG_PAYLOAD_LEN (qemu 10 sends none). */
static void
case_ext_payload (void)
{
  int fd = connect_extended ();

  send_ext_req (fd, FLAG_PAYLOAD_LEN, CMD_TRIM, 1, 0, 4096, true);
  expect_ext_error (fd, 1, 0, 22, "trim with a payload");
  send_ext_req (fd, FLAG_PAYLOAD_LEN, CMD_BLOCK_STATUS, 2, 0, 12, true);
  expect_ext_error (fd, 2, 0, 22, "block status with a payload");
  send_ext_req (fd, FLAG_PAYLOAD_LEN, CMD_WRITE, 3, 8192, 4096, true);
  expect_ext_error (fd, 3, 8192, 0, "write with NBD_CMD_FLAG_PAYLOAD_LEN");
  send_ext_req (fd, 0, CMD_WRITE, 4, 8192, 4096, true);
  expect_ext_error (fd, 4, 8192, 0, "write without NBD_CMD_FLAG_PAYLOAD_LEN");
  ext_still_works (fd);
  send_ext_req (fd, FLAG_PAYLOAD_LEN, CMD_WRITE, 5, 0, (64u << 20) + 1,
                false);
  expect_closed (fd, "payload over the maximum");
}

/* 64-bit lengths: a read over the maximum payload is EOVERFLOW (the
 * client may retry smaller); ranges past the end, even by 2^63, are
 * EINVAL (ENOSPC for writes); errors come as extended error chunks that
 * echo the request's offset, and the connection goes on. */
static void
case_ext_lengths (void)
{
  int fd = connect_extended ();

  send_ext_req (fd, 0, CMD_READ, 1, 0, (64u << 20) + 1, false);
  expect_ext_error (fd, 1, 0, 75, "read over the maximum payload");
  send_ext_req (fd, 0, CMD_READ, 2, 0, 1ull << 40, false);
  expect_ext_error (fd, 2, 0, 75, "read of 1 TiB");
  send_ext_req (fd, 0, CMD_TRIM, 3, 4096, 1ull << 40, false);
  expect_ext_error (fd, 3, 4096, 22, "trim of 1 TiB past the end");
  send_ext_req (fd, 0, CMD_WRITE_ZEROES, 4, 1ull << 63, 1ull << 63, false);
  expect_ext_error (fd, 4, 1ull << 63, 28, "zero at 2^63 of 2^63");
  send_ext_req (fd, 0, CMD_BLOCK_STATUS, 5, 0, ~0ull, false);
  expect_ext_error (fd, 5, 0, 22, "block status without a meta context");
  send_ext_req (fd, 0, 99, 6, 0, 0, false);
  expect_ext_error (fd, 6, 0, 22, "unknown command");
  ext_still_works (fd);
  close (fd);
}

/* Send block status at offset 0 with payload p of len bytes: refused
 * with EINVAL. */
static void
bs_payload_refused (int fd, uint64_t cookie, const uint8_t *p, size_t len,
                    const char *what)
{
  send_ext_req (fd, FLAG_PAYLOAD_LEN, CMD_BLOCK_STATUS, cookie, 0, len,
                false);
  xwrite (fd, p, len);
  expect_ext_error (fd, cookie, 0, 22, what);
}

/* Extended headers and both contexts selected (ids 1 and 2, the order
 * foliod gives them): the block status payload form is offered.  Its
 * payload (64-bit effect length, then context ids) is checked: a wrong
 * length, an id not selected, an id twice, or a zero effect length are
 * refused with EINVAL, the stream kept in step; a valid one answers the
 * contexts it names only. */
static void
case_ext_bs_payload (void)
{
  int fd = open_conn ();
  static const char *q[] = { "base:allocation", "foliod:cache" };
  uint8_t o[256], p[32], buf[256];
  size_t n = strlen (export_name), len = 0;
  uint32_t t, err;
  uint16_t flags;

  hs_begin (fd, 3);
  opt_send (fd, OPT_EXTENDED, NULL, 0);
  if ((t = opt_reply (fd, OPT_EXTENDED)) != REP_ACK)
    die ("EXTENDED_HEADERS: reply 0x%x, expected ACK", t);
  put32 (o, n);
  memcpy (o + 4, export_name, n);
  put32 (o + 4 + n, 2);
  len = 8 + n;
  for (int i = 0; i < 2; i++) {
    put32 (o + len, strlen (q[i]));
    memcpy (o + len + 4, q[i], strlen (q[i]));
    len += 4 + strlen (q[i]);
  }
  opt_send (fd, OPT_SET_META, o, len);
  while ((t = opt_reply (fd, OPT_SET_META)) == 4 /* META_CONTEXT */)
    ;
  if (t != REP_ACK)
    die ("SET_META_CONTEXT: 0x%x", t);
  if ((t = opt_go (fd, export_name, NULL)) != REP_ACK)
    die ("GO: 0x%x", t);
  if (!(go_tflags & (1u << 12)))
    die ("NBD_FLAG_BLOCK_STATUS_PAYLOAD not offered: flags 0x%x", go_tflags);

  memset (p, 0, sizeof p);
  put64 (p, 8192);
  put32 (p + 8, 1);
  put32 (p + 12, 1);
  put32 (p + 16, 2);
  bs_payload_refused (fd, 1, p, 10, "a payload of 10 bytes (not 8 + 4n)");
  bs_payload_refused (fd, 2, p, 16, "a payload naming id 1 twice");
  bs_payload_refused (fd, 4, p, 20, "a payload of three ids");
  put32 (p + 12, 99);
  bs_payload_refused (fd, 3, p, 16, "a payload naming id 99");
  put64 (p, 0);
  bs_payload_refused (fd, 5, p, 12, "a payload of effect length 0");
  /* Valid: foliod:cache only, one BLOCK_STATUS_EXT chunk, context 2. */
  put64 (p, 8192);
  put32 (p + 8, 2);
  send_ext_req (fd, FLAG_PAYLOAD_LEN, CMD_BLOCK_STATUS, 6, 0, 12, false);
  xwrite (fd, p, 12);
  t = ext_chunk (fd, 6, 0, &err, &flags, buf, sizeof buf);
  if (t != REPLY_TYPE_BLOCK_STATUS_EXT || !(flags & 1))
    die ("filtered block status: chunk type %u flags %u, expected one"
         " final BLOCK_STATUS_EXT", t, flags);
  if (get32 (buf) != 2 || get32 (buf + 4) < 1)
    die ("filtered block status: context %u, %u descriptors", get32 (buf),
         get32 (buf + 4));
  ext_still_works (fd);
  close (fd);
}

/* ---- cases ---------------------------------------------------------------- */

static void
case_bad_magic (void)
{
  int fd = connect_export (NULL);
  uint8_t r[28] = { 0xde, 0xad, 0xbe, 0xef };

  xwrite (fd, r, sizeof r);
  expect_closed (fd, "bad request magic");
}

static void
case_truncated_header (void)
{
  int fd = connect_export (NULL);
  uint8_t r[28];

  put32 (r, REQMAGIC);
  memset (r + 4, 0, 24);
  xwrite (fd, r, 11);
  shutdown (fd, SHUT_WR);
  expect_closed (fd, "truncated header");
}

static void
case_unknown_command (void)
{
  int fd = connect_export (NULL);

  send_req (fd, 0, 99, 1, 0, 512);
  expect_error (fd, 1, 22, "unknown command");
  still_works (fd);
  close (fd);
}

static void
case_unknown_flag (void)
{
  int fd = connect_export (NULL);

  send_req (fd, 1u << 9, CMD_READ, 1, 0, 512);
  expect_error (fd, 1, 22, "unknown flag");
  /* DF needs structured replies, which this connection did not ask for. */
  send_req (fd, 1u << 2, CMD_READ, 2, 0, 512);
  expect_error (fd, 2, 22, "DF without structured replies");
  still_works (fd);
  close (fd);
}

static void
case_beyond_end (void)
{
  uint64_t size;
  int fd = connect_export (&size);

  send_req (fd, 0, CMD_READ, 1, size - 10, 512);
  expect_error (fd, 1, 22, "read beyond the end");
  send_req (fd, 0, CMD_READ, 2, UINT64_MAX - 100, 512);
  expect_error (fd, 2, 22, "read at a wrapping offset");
  /* A write past the end: payload still sent, must be skipped. */
  send_req (fd, 0, CMD_WRITE, 3, size - 10, 4096);
  write_zeroes_payload (fd, 4096);
  expect_error (fd, 3, 28, "write beyond the end");
  still_works (fd);
  close (fd);
}

static void
case_too_big (void)
{
  int fd = connect_export (NULL);
  uint32_t big = 96u << 20; /* over the 64 MiB maximum */

  send_req (fd, 0, CMD_READ, 1, 0, big);
  expect_error (fd, 1, 22, "read over the maximum payload");
  send_req (fd, 0, CMD_WRITE, 2, 0, big);
  write_zeroes_payload (fd, big);
  expect_error (fd, 2, 22, "write over the maximum payload");
  still_works (fd);
  close (fd);
}

static void
case_read_only (void)
{
  int fd = connect_export (NULL);

  send_req (fd, 0, CMD_WRITE, 1, 0, 8192);
  write_zeroes_payload (fd, 8192);
  expect_error (fd, 1, 1, "write on a read-only export");
  send_req (fd, 0, 4 /* TRIM */, 2, 0, 8192);
  expect_error (fd, 2, 1, "trim on a read-only export");
  send_req (fd, 0, 6 /* WRITE_ZEROES */, 3, 0, 8192);
  expect_error (fd, 3, 1, "zero on a read-only export");
  still_works (fd);
  close (fd);
}

static void
case_block_status_no_meta (void)
{
  int fd = connect_export (NULL);

  send_req (fd, 0, CMD_BLOCK_STATUS, 1, 0, 4096);
  expect_error (fd, 1, 22, "block status without a meta context");
  still_works (fd);
  close (fd);
}

static void
case_bad_option_magic (void)
{
  int fd = open_conn ();
  uint8_t h[16] = "NOTMAGIC";

  hs_begin (fd, 3);
  put32 (h + 8, OPT_GO);
  put32 (h + 12, 0);
  xwrite (fd, h, sizeof h);
  expect_closed (fd, "bad option magic");
}

static void
case_bad_client_flags (void)
{
  int fd = open_conn ();

  hs_begin (fd, 3 | (1u << 7));
  expect_closed (fd, "unknown client flags");
}

static void
case_unknown_option (void)
{
  int fd = open_conn ();
  uint32_t t;

  hs_begin (fd, 3);
  opt_send (fd, 4242, "abc", 3);
  if ((t = opt_reply (fd, 4242)) != REP_ERR (1))
    die ("unknown option: reply 0x%x, expected ERR_UNSUP", t);
  opt_send (fd, OPT_STARTTLS, NULL, 0);
  if ((t = opt_reply (fd, OPT_STARTTLS)) != REP_ERR (2))
    die ("STARTTLS: reply 0x%x, expected ERR_POLICY", t);
  opt_send (fd, OPT_STRUCTURED, "x", 1);
  if ((t = opt_reply (fd, OPT_STRUCTURED)) != REP_ERR (3))
    die ("STRUCTURED_REPLY with data: 0x%x, expected ERR_INVALID", t);
  if ((t = opt_go (fd, "no-such-export", NULL)) != REP_ERR (6))
    die ("GO unknown export: 0x%x, expected ERR_UNKNOWN", t);
  /* After all that the handshake still completes. */
  if ((t = opt_go (fd, export_name, NULL)) != REP_ACK)
    die ("GO after errors: 0x%x", t);
  still_works (fd);
  close (fd);
}

static void
case_malformed_go (void)
{
  int fd = open_conn ();
  uint8_t b[10];
  uint32_t t;

  hs_begin (fd, 3);
  put32 (b, 200); /* name length beyond the option */
  memcpy (b + 4, "abcd", 4);
  put16 (b + 8, 0);
  opt_send (fd, OPT_GO, b, sizeof b);
  if ((t = opt_reply (fd, OPT_GO)) != REP_ERR (3))
    die ("malformed GO: reply 0x%x, expected ERR_INVALID", t);
  if ((t = opt_go (fd, export_name, NULL)) != REP_ACK)
    die ("GO after malformed GO: 0x%x", t);
  close (fd);
}

static void
case_huge_option (void)
{
  int fd = open_conn ();
  uint32_t len = 1u << 20, t;
  uint8_t h[16];

  hs_begin (fd, 3);
  put64 (h, IHAVEOPT);
  put32 (h + 8, OPT_GO);
  put32 (h + 12, len);
  xwrite (fd, h, sizeof h);
  write_zeroes_payload (fd, len);
  if ((t = opt_reply (fd, OPT_GO)) != REP_ERR (9))
    die ("1 MiB option: reply 0x%x, expected ERR_TOO_BIG", t);
  if ((t = opt_go (fd, export_name, NULL)) != REP_ACK)
    die ("GO after huge option: 0x%x", t);
  close (fd);
}

static void
case_unknown_export_name (void)
{
  int fd = open_conn ();

  hs_begin (fd, 3);
  opt_send (fd, OPT_EXPORT_NAME, "no-such-export", 14);
  expect_closed (fd, "EXPORT_NAME of an unknown export");
}

/* Everything one byte at a time: the server must resume on partial
 * reads, in the handshake and in transmission. */
static void
case_byte_by_byte (void)
{
  int fd = open_conn ();
  uint8_t g[18], m[512], r[28];
  size_t n = strlen (export_name), len = 0;
  struct timespec ts = { 0, 2000000 };

  must_read (fd, g, sizeof g, "greeting");
  put32 (m, 3);
  len = 4;
  put64 (m + len, IHAVEOPT);
  put32 (m + len + 8, OPT_EXPORT_NAME);
  put32 (m + len + 12, n);
  memcpy (m + len + 16, export_name, n);
  len += 16 + n;
  for (size_t i = 0; i < len; i++) {
    xwrite (fd, m + i, 1);
    nanosleep (&ts, NULL);
  }
  must_read (fd, g, 10, "EXPORT_NAME reply");
  req_header (r, 0, CMD_READ, 77, 1, 100);
  for (size_t i = 0; i < sizeof r; i++) {
    xwrite (fd, r + i, 1);
    nanosleep (&ts, NULL);
  }
  if (simple_reply (fd, 77, 100) != 0)
    die ("byte-by-byte read failed");
  close (fd);
}

/* Many requests in one go, replies possibly out of order. */
static void
case_pipelined (void)
{
  int fd = connect_export (NULL);
  enum { N = 200 };
  static uint8_t buf[N * (28 + 4096)];
  /* Reads are small so that all replies fit in the socket buffers: this
   * client writes everything before reading anything. */
  uint8_t seen[N] = { 0 };
  size_t len = 0;

  for (int i = 0; i < N; i++) {
    uint8_t *r = buf + len;
    int w = i % 2;
    put32 (r, REQMAGIC);
    put16 (r + 4, 0);
    put16 (r + 6, w ? CMD_WRITE : CMD_READ);
    put64 (r + 8, 1000 + i);
    put64 (r + 16, (uint64_t) i * 4096);
    put32 (r + 24, w ? 4096 : 512);
    len += 28;
    if (w) {
      memset (buf + len, i, 4096);
      len += 4096;
    }
  }
  xwrite (fd, buf, len);
  for (int i = 0; i < N; i++) {
    uint8_t h[16];
    uint64_t ck;
    must_read (fd, h, sizeof h, "pipelined reply");
    ck = get64 (h + 8);
    if (get32 (h) != SIMPLEMAGIC || ck < 1000 || ck >= 1000 + N
        || seen[ck - 1000] || get32 (h + 4) != 0)
      die ("bad pipelined reply (cookie %llu)", (unsigned long long) ck);
    seen[ck - 1000] = 1;
    if ((ck - 1000) % 2 == 0) {
      char d[512];
      must_read (fd, d, sizeof d, "pipelined read data");
    }
  }
  close (fd);
}

/* Gone in the middle of a write payload, and with requests in flight. */
static void
case_disconnect_mid_request (void)
{
  int fd = connect_export (NULL);

  send_req (fd, 0, CMD_WRITE, 1, 0, 1 << 20);
  write_zeroes_payload (fd, 300000);
  close (fd);

  fd = connect_export (NULL);
  for (int i = 0; i < 16; i++) {
    send_req (fd, 0, CMD_WRITE, i, (uint64_t) i << 16, 65536);
    write_zeroes_payload (fd, 65536);
    send_req (fd, 0, CMD_READ, 1000 + i, (uint64_t) i << 16, 65536);
  }
  send_req (fd, 0, CMD_FLUSH, 5000, 0, 0);
  close (fd); /* without reading a single reply */
}

/* A client that connects and says nothing: closed after the timeout. */
static void
case_handshake_timeout (void)
{
  int fd = open_conn ();
  uint8_t g[18];
  char b;
  struct timeval tv = { .tv_sec = 30 };

  must_read (fd, g, sizeof g, "greeting");
  setsockopt (fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (recv (fd, &b, 1, 0) != 0)
    die ("idle client not disconnected");
  close (fd);
}

/* Clean NBD_CMD_DISC with a request in flight: reply, then close. */
static void
case_disc (void)
{
  int fd = connect_export (NULL);

  send_req (fd, 0, CMD_FLUSH, 1, 0, 0);
  send_req (fd, 0, CMD_DISC, 2, 0, 0);
  if (simple_reply (fd, 1, 0) != 0)
    die ("flush before DISC failed");
  expect_closed (fd, "after NBD_CMD_DISC");
}

/* A request refused on the loop thread and what ends the connection,
 * all in one write: the refusal's reply is queued for sending when the
 * connection dies in the same read (this aborted the daemon once). */
static void
refused_then (int fd, uint64_t off, const uint8_t *tail, size_t tail_len,
              uint32_t want, int reply_required, const char *what)
{
  uint8_t b[2 * 28];
  uint8_t h[16];

  req_header (b, 0, CMD_READ, 1, off, 512);
  memcpy (b + 28, tail, tail_len);
  xwrite (fd, b, 28 + tail_len);
  /* After a bad magic the server may close before the reply is out. */
  if (xread (fd, h, sizeof h) == 0) {
    if (get32 (h) != SIMPLEMAGIC || get64 (h + 8) != 1 || get32 (h + 4) != want)
      die ("%s: wrong reply to the refused request", what);
  } else if (reply_required)
    die ("%s: closed without answering the refused request", what);
  expect_closed (fd, what);
}

static void
case_refused_disc (void)
{
  uint64_t size;
  int fd = connect_export (&size);
  uint8_t d[28];

  req_header (d, 0, CMD_DISC, 2, 0, 0);
  refused_then (fd, size, d, sizeof d, 22, 1, "refused read, then DISC");
}

static void
case_refused_bad_magic (void)
{
  uint64_t size;
  int fd = connect_export (&size);
  uint8_t d[28] = { 0xde, 0xad, 0xbe, 0xef };

  refused_then (fd, size, d, sizeof d, 22, 0, "refused read, then bad magic");
}

/* On the read-only export: a WRITE (refused, its payload skipped) and
 * NBD_CMD_DISC in one write. */
static void
case_read_only_disc (void)
{
  int fd = connect_export (NULL);
  static uint8_t b[28 + 4096 + 28];
  uint8_t h[16];

  req_header (b, 0, CMD_WRITE, 1, 0, 4096);
  req_header (b + 28 + 4096, 0, CMD_DISC, 2, 0, 0);
  xwrite (fd, b, sizeof b);
  must_read (fd, h, sizeof h, "reply to the refused write");
  if (get32 (h) != SIMPLEMAGIC || get64 (h + 8) != 1 || get32 (h + 4) != 1)
    die ("write on a read-only export, then DISC: wrong reply");
  expect_closed (fd, "read-only write, then DISC");
}

/* SIGTERM to $BAD_CLIENT_PID while this connection holds replies it has
 * not read yet: a request sent then is refused with ESHUTDOWN, the
 * replies are all delivered, then the server closes.  (The connection
 * closed with the refusal still queued and aborted the daemon once.) */
static void
case_shutdown_refused (void)
{
  const char *e = getenv ("BAD_CLIENT_PID");
  int fd = connect_export (NULL), seen = 0;
  enum { N = 8, LEN = 4 << 20 };
  struct timespec ts = { 0, 500000000 };

  if (e == NULL || atoi (e) <= 0)
    die ("set BAD_CLIENT_PID to the server's pid");
  for (int i = 0; i < N; i++)
    send_req (fd, 0, CMD_READ, 1 + i, (uint64_t) i * LEN, LEN);
  nanosleep (&ts, NULL);        /* the replies fill the socket buffers */
  if (kill (atoi (e), SIGTERM) == -1)
    die ("kill %s: %m", e);
  nanosleep (&ts, NULL);
  send_req (fd, 0, CMD_READ, 100, 0, 512);
  while (seen != (1 << N) - 1 + (1 << N)) {
    uint8_t h[16];
    uint64_t ck;
    must_read (fd, h, sizeof h, "reply during shutdown");
    ck = get64 (h + 8);
    if (get32 (h) != SIMPLEMAGIC)
      die ("bad reply magic during shutdown");
    if (ck == 100) {
      if (get32 (h + 4) != 108)
        die ("request during shutdown: error %u, expected ESHUTDOWN",
             get32 (h + 4));
      seen |= 1 << N;
      continue;
    }
    if (ck < 1 || ck > N || get32 (h + 4) != 0)
      die ("read before the shutdown: cookie %llu error %u",
           (unsigned long long) ck, get32 (h + 4));
    seen |= 1 << (ck - 1);
    for (uint32_t left = LEN; left > 0;) {
      static char junk[65536];
      uint32_t k = left < sizeof junk ? left : sizeof junk;
      must_read (fd, junk, k, "read data during shutdown");
      left -= k;
    }
  }
  expect_closed (fd, "after the shutdown");
}

/* Export names that would forge a log line if logged as they are: GO
 * and INFO get ERR_UNKNOWN, EXPORT_NAME a close. */
static void
case_log_forgery (void)
{
  static const char forged[] =
    "x\n2026-12-03T00:00:00.000 foliod[1] error: forged";
  int fd = open_conn ();
  uint32_t t;

  hs_begin (fd, 3);
  if ((t = opt_go (fd, forged, NULL)) != REP_ERR (6))
    die ("GO with a forged name: 0x%x, expected ERR_UNKNOWN", t);
  opt_send (fd, OPT_EXPORT_NAME, forged, sizeof forged - 1);
  expect_closed (fd, "EXPORT_NAME with a forged name");
}

/* Started with --max-connections $BAD_CLIENT_LIMIT: that many clients
 * get a greeting, the next is closed at once, and after one leaves a new
 * one is served again. */
static void
case_connection_limit (void)
{
  const char *e = getenv ("BAD_CLIENT_LIMIT");
  int limit = e ? atoi (e) : 0, fds[64];
  uint8_t g[18];

  if (limit < 1 || limit > 60)
    die ("set BAD_CLIENT_LIMIT to the server's --max-connections");
  for (int i = 0; i < limit; i++) {
    fds[i] = open_conn ();
    must_read (fds[i], g, sizeof g, "greeting within the limit");
  }
  expect_closed (open_conn (), "connection over the limit");
  close (fds[0]);
  /* The server notices the close on its next loop iteration: retry for a
   * while (a loaded machine) until a new client is served again. */
  for (int tries = 0;; tries++) {
    fds[0] = open_conn ();
    if (xread (fds[0], g, sizeof g) == 0)
      break;
    close (fds[0]);
    if (tries == 100)
      die ("no client served after one left");
    usleep (100000);
  }
  for (int i = 0; i < limit; i++)
    close (fds[i]);
}

struct bad_case {
  const char *name;
  void (*fn) (void);
};

static const struct bad_case cases[] = {
  { "bad-magic", case_bad_magic },
  { "truncated-header", case_truncated_header },
  { "unknown-command", case_unknown_command },
  { "unknown-flag", case_unknown_flag },
  { "beyond-end", case_beyond_end },
  { "too-big", case_too_big },
  { "read-only", case_read_only },
  { "block-status-no-meta", case_block_status_no_meta },
  { "bad-option-magic", case_bad_option_magic },
  { "bad-client-flags", case_bad_client_flags },
  { "unknown-option", case_unknown_option },
  { "malformed-go", case_malformed_go },
  { "huge-option", case_huge_option },
  { "unknown-export-name", case_unknown_export_name },
  { "byte-by-byte", case_byte_by_byte },
  { "pipelined", case_pipelined },
  { "disconnect-mid-request", case_disconnect_mid_request },
  { "handshake-timeout", case_handshake_timeout },
  { "disc", case_disc },
  { "refused-disc", case_refused_disc },
  { "refused-bad-magic", case_refused_bad_magic },
  { "read-only-disc", case_read_only_disc },
  { "shutdown-refused", case_shutdown_refused },
  { "log-forgery", case_log_forgery },
  { "connection-limit", case_connection_limit },
  { "ext-negotiate", case_ext_negotiate },
  { "ext-wrong-magic", case_ext_wrong_magic },
  { "ext-payload", case_ext_payload },
  { "ext-lengths", case_ext_lengths },
  { "ext-bs-payload", case_ext_bs_payload },
  { NULL, NULL },
};

int
main (int argc, char **argv)
{
  if (argc != 4) {
    fprintf (stderr, "usage: bad-client SOCKET EXPORT CASE|list\n");
    return 2;
  }
  sock_path = argv[1];
  export_name = argv[2];
  for (const struct bad_case *c = cases; c->name; c++) {
    if (strcmp (argv[3], "list") == 0)
      printf ("%s\n", c->name);
    else if (strcmp (argv[3], c->name) == 0) {
      c->fn ();
      return 0;
    }
  }
  if (strcmp (argv[3], "list") == 0)
    return 0;
  fprintf (stderr, "bad-client: unknown case %s\n", argv[3]);
  return 2;
}
