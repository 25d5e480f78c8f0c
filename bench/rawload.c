/* rawload: the cheapest NBD client per request we could write.
 *
 * Why it exists: on a small machine client and server share the cores,
 * and fio's nbd engine (about 9 us of CPU per 4 KiB op) or loadgen on
 * libnbd (about 5 us: one send and two recvs per request) cost more than
 * the server does, so a bench cannot show a server using more than one
 * core: the client is the bottleneck.  rawload speaks the protocol itself
 * and amortises its system calls over a whole pipeline: every request
 * that can be issued now goes out in one sendmsg, and replies are read
 * with large recv()s and parsed as many at a time as have arrived.
 *
 * What it speaks: fixed newstyle, NBD_OPT_GO (no structured replies, so
 * every reply is a simple one), then 4 KiB (--bs) reads or writes with
 * --qd requests in flight on each of --conns connections (one thread
 * each), and NBD_CMD_DISC at the end.  Every reply is checked: its magic,
 * a cookie that is in flight, error 0; with --pattern every byte read
 * must be that byte.  Any failure: a message on stderr, exit 1.  After an
 * error reply or wrong data the connection stops issuing, drains its
 * replies and disconnects cleanly (a client that vanishes with requests
 * in flight is another test: nbdkit 1.32 aborts on it).
 *
 * Output: one line on stdout, e.g.
 *   ops=123 reads=0 writes=123 errors=0 seconds=3.000 ops_per_s=41
 *   mb_per_s=0.17
 *   client_cpu_us_per_op=1.9
 * (client_cpu_us_per_op: this process's user+system CPU from getrusage
 * over the ops, so a bench can show how little of the machine it takes).
 */

#include <endian.h>
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "bench-util.h"

/* Protocol constants (NBD protocol document). */
#define NBD_MAGIC            0x4e42444d41474943ULL   /* "NBDMAGIC" */
#define NBD_IHAVEOPT         0x49484156454F5054ULL   /* "IHAVEOPT" */
#define NBD_REP_MAGIC        0x3e889045565a9ULL
#define NBD_REQUEST_MAGIC    0x25609513u
#define NBD_SIMPLE_REPLY_MAGIC 0x67446698u
#define NBD_FLAG_FIXED_NEWSTYLE 1u
#define NBD_FLAG_NO_ZEROES   2u
#define NBD_FLAG_READ_ONLY   2u                      /* transmission flag */
#define NBD_OPT_GO           7u
#define NBD_REP_ACK          1u
#define NBD_REP_INFO         3u
#define NBD_REP_FLAG_ERROR   0x80000000u
#define NBD_INFO_EXPORT      0u
#define NBD_CMD_READ         0u
#define NBD_CMD_WRITE        1u
#define NBD_CMD_DISC         2u

#define RL_HDR_BYTES   28u      /* request header on the wire */
#define RL_REPLY_BYTES 16u      /* simple reply header */
#define RL_MAX_OPT_REPLY 65536u /* longest option reply payload we accept */
#define RL_IOV_MAX 1024u        /* Linux's UIO_MAXIOV: iovecs per sendmsg */

enum rl_mode { RL_RANDREAD, RL_RANDWRITE, RL_SEQREAD, RL_SEQWRITE };

/* Options shared read-only by every connection thread. */
struct rl_opts {
  const char *uri;
  const char *socket_path;     /* nbd+unix: the socket; NULL for TCP */
  char *host, *port;           /* nbd:// (owned) */
  char *export_name;           /* owned */
  enum rl_mode mode;
  uint64_t bs_bytes;           /* request size */
  unsigned qd;                 /* requests in flight per connection */
  unsigned conns;              /* connections (one thread each) */
  double seconds;              /* run time, when ops_total == 0 */
  uint64_t ops_total;          /* total requests over all connections */
  uint64_t offset_bytes;       /* start of the range used */
  uint64_t size_bytes;         /* length of the range used; 0 = to the end */
  uint64_t seed;
  int pattern;                 /* every data byte, checked on reads; -1 none */
};

/* Per-connection state, owned by its thread. */
struct rl_conn {
  const struct rl_opts *o;
  unsigned id;
  int fd;
  uint64_t rng;
  uint64_t range_off, range_len;
  uint64_t seq_next;           /* next offset in the range, seq modes */
  uint64_t ops_budget;         /* 0 = unlimited (time based) */
  uint64_t deadline_ns;
  /* Requests: the cookie is the slot index; a slot's header lives as long
   * as it is in flight (a batch sends all headers of the batch at once). */
  unsigned char (*hdrs)[RL_HDR_BYTES];
  bool *busy;                  /* slot in flight */
  uint64_t *offsets;           /* each slot's offset (for messages) */
  unsigned *free_slots;        /* stack of free slot indices */
  unsigned nfree;
  unsigned inflight;
  char *wbuf;                  /* data of every write (the writes share it) */
  /* The batch being sent: iov[iov_at..iov_n) is still to go. */
  struct iovec *iov;
  unsigned iov_n, iov_at;
  /* Replies: rbuf[rpos..rlen) is received and not parsed yet. */
  char *rbuf;
  size_t rsize, rlen, rpos;
  /* results */
  uint64_t reads, writes, bytes;
  uint64_t errors;             /* error replies */
  int failed;                  /* an error: the run fails */
};

/* The NBD error numbers a server may send, by name. */
static const char *
nbd_errname(uint32_t e)
{
  switch (e) {
  case 1: return "EPERM";
  case 5: return "EIO";
  case 12: return "ENOMEM";
  case 22: return "EINVAL";
  case 28: return "ENOSPC";
  case 75: return "EOVERFLOW";
  case 95: return "ENOTSUP";
  case 108: return "ESHUTDOWN";
  default: return "unknown error";
  }
}

static const char *
nbd_repname(uint32_t t)
{
  switch (t) {
  case NBD_REP_FLAG_ERROR | 1: return "NBD_REP_ERR_UNSUP";
  case NBD_REP_FLAG_ERROR | 2: return "NBD_REP_ERR_POLICY";
  case NBD_REP_FLAG_ERROR | 3: return "NBD_REP_ERR_INVALID";
  case NBD_REP_FLAG_ERROR | 4: return "NBD_REP_ERR_PLATFORM";
  case NBD_REP_FLAG_ERROR | 5: return "NBD_REP_ERR_TLS_REQD";
  case NBD_REP_FLAG_ERROR | 6: return "NBD_REP_ERR_UNKNOWN";
  case NBD_REP_FLAG_ERROR | 7: return "NBD_REP_ERR_SHUTDOWN";
  case NBD_REP_FLAG_ERROR | 8: return "NBD_REP_ERR_BLOCK_SIZE_REQD";
  case NBD_REP_FLAG_ERROR | 9: return "NBD_REP_ERR_TOO_BIG";
  default: return "an error reply";
  }
}

/* Big-endian field access on wire buffers. */
static uint16_t get16(const unsigned char *p) { uint16_t v; memcpy(&v, p, 2); return be16toh(v); }
static uint32_t get32(const unsigned char *p) { uint32_t v; memcpy(&v, p, 4); return be32toh(v); }
static uint64_t get64(const unsigned char *p) { uint64_t v; memcpy(&v, p, 8); return be64toh(v); }
static void put16(unsigned char *p, uint16_t v) { v = htobe16(v); memcpy(p, &v, 2); }
static void put32(unsigned char *p, uint32_t v) { v = htobe32(v); memcpy(p, &v, 4); }
static void put64(unsigned char *p, uint64_t v) { v = htobe64(v); memcpy(p, &v, 8); }

/* Handshake I/O is blocking and small: loop until all of it is done.
 * Returns 0, or -1 with errno (0 for end of file). */
static int
read_full(int fd, void *buf, size_t n)
{
  char *p = buf;
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r == 0)
      errno = 0;
    if (r <= 0) {
      if (r < 0 && errno == EINTR)
        continue;
      return -1;
    }
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

static int
write_full(int fd, const void *buf, size_t n)
{
  const char *p = buf;
  while (n > 0) {
    ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      return -1;
    }
    p += r;
    n -= (size_t) r;
  }
  return 0;
}

/* Splits nbd+unix:///EXPORT?socket=PATH or nbd://HOST[:PORT][/EXPORT]
 * into o's fields (no percent-decoding, no TLS: a bench client).
 * Returns 0, or -1 after a message. */
static int
uri_parse(struct rl_opts *o)
{
  const char *u = o->uri, *rest, *q;

  if (!strncmp(u, "nbd+unix:///", 12)) {
    rest = u + 12;
    q = strstr(rest, "?socket=");
    if (q == NULL || strchr(q + 8, '&') != NULL) {
      fprintf(stderr, "rawload: %s: want nbd+unix:///EXPORT?socket=PATH\n", u);
      return -1;
    }
    o->export_name = strndup(rest, (size_t) (q - rest));
    o->socket_path = q + 8;
  }
  else if (!strncmp(u, "nbd://", 6)) {
    rest = u + 6;
    const char *slash = strchr(rest, '/');
    size_t hl = slash ? (size_t) (slash - rest) : strlen(rest);
    char *hp = strndup(rest, hl);
    if (hp == NULL)
      return -1;
    char *colon = strrchr(hp, ':');
    o->port = strdup(colon ? colon + 1 : "10809");
    if (colon)
      *colon = '\0';
    o->host = hp;
    o->export_name = strdup(slash ? slash + 1 : "");
    if (strchr(o->export_name ? o->export_name : "", '?') != NULL) {
      fprintf(stderr, "rawload: %s: no query parameters on nbd://\n", u);
      return -1;
    }
  }
  else {
    fprintf(stderr, "rawload: %s: only nbd+unix:// and nbd:// URIs\n", u);
    return -1;
  }
  return o->export_name ? 0 : -1;
}

/* Returns a connected socket, or -1 after a message. */
static int
sock_connect(const struct rl_opts *o)
{
  int fd;

  if (o->socket_path) {
    struct sockaddr_un sa = { .sun_family = AF_UNIX };
    if (strlen(o->socket_path) >= sizeof sa.sun_path) {
      fprintf(stderr, "rawload: socket path too long\n");
      return -1;
    }
    strcpy(sa.sun_path, o->socket_path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, (struct sockaddr *) &sa, sizeof sa) == 0)
      return fd;
    fprintf(stderr, "rawload: connect %s: %s\n", o->socket_path, strerror(errno));
    if (fd >= 0)
      close(fd);
    return -1;
  }
  struct addrinfo hints = { .ai_socktype = SOCK_STREAM }, *res, *ai;
  int e = getaddrinfo(o->host, o->port, &hints, &res);
  if (e) {
    fprintf(stderr, "rawload: %s:%s: %s\n", o->host, o->port, gai_strerror(e));
    return -1;
  }
  fd = -1;
  for (ai = res; ai != NULL && fd < 0; ai = ai->ai_next) {
    fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC, ai->ai_protocol);
    if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) {
    fprintf(stderr, "rawload: connect %s:%s: %s\n", o->host, o->port, strerror(errno));
    return -1;
  }
  /* Batches are whole: do not let Nagle hold a batch's tail back. */
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

/* Fixed-newstyle handshake with NBD_OPT_GO.  Sets *size_out.
 * Returns 0, or -1 after a message. */
static int
conn_handshake(struct rl_conn *c, uint64_t *size_out)
{
  const struct rl_opts *o = c->o;
  unsigned char b[20];
  bool have_size = false;
  uint16_t tflags = 0;

  if (read_full(c->fd, b, 18) == -1)
    goto io_error;
  if (get64(b) != NBD_MAGIC || get64(b + 8) != NBD_IHAVEOPT) {
    fprintf(stderr, "rawload: not a newstyle NBD server\n");
    return -1;
  }
  uint16_t hflags = get16(b + 16);
  if (!(hflags & NBD_FLAG_FIXED_NEWSTYLE)) {
    fprintf(stderr, "rawload: the server does not speak fixed newstyle\n");
    return -1;
  }
  put32(b, NBD_FLAG_FIXED_NEWSTYLE | (hflags & NBD_FLAG_NO_ZEROES));
  if (write_full(c->fd, b, 4) == -1)
    goto io_error;

  /* NBD_OPT_GO: name length, name, no information requests (the server
   * sends NBD_INFO_EXPORT anyway). */
  size_t nl = strlen(o->export_name);
  unsigned char *opt = malloc(16 + 4 + nl + 2);
  if (opt == NULL)
    return -1;
  put64(opt, NBD_IHAVEOPT);
  put32(opt + 8, NBD_OPT_GO);
  put32(opt + 12, (uint32_t) (4 + nl + 2));
  put32(opt + 16, (uint32_t) nl);
  memcpy(opt + 20, o->export_name, nl);
  put16(opt + 20 + nl, 0);
  int r = write_full(c->fd, opt, 16 + 4 + nl + 2);
  free(opt);
  if (r == -1)
    goto io_error;

  for (;;) {
    if (read_full(c->fd, b, 20) == -1)
      goto io_error;
    uint32_t type = get32(b + 12), len = get32(b + 16);
    if (get64(b) != NBD_REP_MAGIC || get32(b + 8) != NBD_OPT_GO ||
        len > RL_MAX_OPT_REPLY) {
      fprintf(stderr, "rawload: bad option reply (magic, option or length)\n");
      return -1;
    }
    unsigned char payload[RL_MAX_OPT_REPLY + 1];
    if (read_full(c->fd, payload, len) == -1)
      goto io_error;
    if (type & NBD_REP_FLAG_ERROR) {
      payload[len] = '\0';
      fprintf(stderr, "rawload: the server refused export \"%s\": %s%s%s\n",
              o->export_name, nbd_repname(type), len ? ": " : "",
              (char *) payload);
      return -1;
    }
    if (type == NBD_REP_INFO && len >= 12 && get16(payload) == NBD_INFO_EXPORT) {
      *size_out = get64(payload + 2);
      tflags = get16(payload + 10);
      have_size = true;
    }
    else if (type == NBD_REP_ACK)
      break;
    /* Other information (block sizes, names) is not needed here. */
  }
  if (!have_size) {
    fprintf(stderr, "rawload: NBD_REP_ACK without NBD_INFO_EXPORT\n");
    return -1;
  }
  if ((tflags & NBD_FLAG_READ_ONLY) &&
      (o->mode == RL_RANDWRITE || o->mode == RL_SEQWRITE)) {
    fprintf(stderr, "rawload: the export is read-only\n");
    return -1;
  }
  return 0;

io_error:
  fprintf(stderr, "rawload: handshake: %s\n",
          errno ? strerror(errno) : "the server closed the connection");
  return -1;
}

static bool
mode_is_write(enum rl_mode m)
{
  return m == RL_RANDWRITE || m == RL_SEQWRITE;
}

static uint64_t
conn_next_offset(struct rl_conn *c)
{
  uint64_t bs = c->o->bs_bytes, nblocks = c->range_len / bs, off;

  if (c->o->mode == RL_RANDREAD || c->o->mode == RL_RANDWRITE)
    off = (rng_next(&c->rng) % nblocks) * bs;
  else {
    off = c->seq_next;
    c->seq_next += bs;
    if (c->seq_next + bs > c->range_len)
      c->seq_next = 0;
  }
  return c->range_off + off;
}

/* Queues every request that may be issued now into one batch (iov).
 * The clock is read once per batch, not per request. */
static void
conn_fill(struct rl_conn *c)
{
  const struct rl_opts *o = c->o;
  bool is_write = mode_is_write(o->mode);

  c->iov_n = c->iov_at = 0;
  if (c->failed || (c->ops_budget == 0 && now_ns() >= c->deadline_ns))
    return;
  while (c->nfree > 0) {
    if (c->ops_budget && c->reads + c->writes >= c->ops_budget)
      return;
    unsigned s = c->free_slots[--c->nfree];
    unsigned char *h = c->hdrs[s];
    c->offsets[s] = conn_next_offset(c);
    put16(h + 6, is_write ? NBD_CMD_WRITE : NBD_CMD_READ);
    put64(h + 16, c->offsets[s]);
    c->busy[s] = true;
    c->inflight++;
    c->iov[c->iov_n++] = (struct iovec) { h, RL_HDR_BYTES };
    if (is_write) {
      c->iov[c->iov_n++] = (struct iovec) { c->wbuf, o->bs_bytes };
      c->writes++;
    }
    else
      c->reads++;
    c->bytes += o->bs_bytes;
  }
}

/* Sends what it can of the batch without blocking.  Returns 0 (the rest,
 * if any, stays in iov[iov_at..]), or -1 after a message. */
static int
conn_send(struct rl_conn *c)
{
  while (c->iov_at < c->iov_n) {
    struct msghdr m = { .msg_iov = &c->iov[c->iov_at],
                        .msg_iovlen = c->iov_n - c->iov_at };
    if (m.msg_iovlen > RL_IOV_MAX)
      m.msg_iovlen = RL_IOV_MAX;
    ssize_t r = sendmsg(c->fd, &m, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (r < 0) {
      if (errno == EINTR)
        continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK)
        return 0;
      fprintf(stderr, "rawload: conn %u: send: %s\n", c->id, strerror(errno));
      return -1;
    }
    size_t n = (size_t) r;
    while (n > 0 && n >= c->iov[c->iov_at].iov_len)
      n -= c->iov[c->iov_at++].iov_len;
    if (n > 0) {
      c->iov[c->iov_at].iov_base = (char *) c->iov[c->iov_at].iov_base + n;
      c->iov[c->iov_at].iov_len -= n;
    }
  }
  return 0;
}

/* Checks the data of the read in slot s against --pattern (wbuf holds
 * it).  Returns 0, or -1 (with a message, the connection's first). */
static int
conn_check_data(const struct rl_conn *c, unsigned s, const unsigned char *p)
{
  if (memcmp(p, c->wbuf, c->o->bs_bytes) == 0)
    return 0;
  if (c->failed)
    return -1;                       /* one message per connection */
  uint64_t i = 0;
  while (p[i] == (unsigned char) c->o->pattern)
    i++;
  fprintf(stderr, "rawload: conn %u: the byte at offset %" PRIu64
          " reads 0x%02x, not the pattern 0x%02x\n",
          c->id, c->offsets[s] + i, p[i], (unsigned) c->o->pattern);
  return -1;
}

/* Parses every complete reply in rbuf.  An error reply or wrong data
 * marks the connection failed (it drains and disconnects); a reply that
 * is not one (magic, cookie) cannot be parsed past.  Returns 0, or -1
 * after a message. */
static int
conn_parse(struct rl_conn *c)
{
  const struct rl_opts *o = c->o;
  bool is_read = !mode_is_write(o->mode);

  while (c->rlen - c->rpos >= RL_REPLY_BYTES) {
    const unsigned char *p = (const unsigned char *) c->rbuf + c->rpos;
    uint32_t magic = get32(p), error = get32(p + 4);
    uint64_t cookie = get64(p + 8);

    if (magic != NBD_SIMPLE_REPLY_MAGIC) {
      fprintf(stderr, "rawload: conn %u: bad reply magic 0x%08" PRIx32 "\n",
              c->id, magic);
      return -1;
    }
    if (cookie >= o->qd || !c->busy[cookie]) {
      fprintf(stderr, "rawload: conn %u: reply for cookie %" PRIu64
              ", which is not in flight\n", c->id, cookie);
      return -1;
    }
    /* A read that failed carries no data. */
    size_t need = RL_REPLY_BYTES + (is_read && error == 0 ? o->bs_bytes : 0);
    if (c->rlen - c->rpos < need)
      break;                         /* its data is still on the way */
    if (error != 0) {
      /* The stream is still in step: stop issuing, drain what is in
       * flight and disconnect cleanly (the run fails).  The first error
       * is the one worth reading. */
      if (c->errors++ == 0)
        fprintf(stderr, "rawload: conn %u: %s at offset %" PRIu64
                " failed: error %" PRIu32 " (%s)\n", c->id,
                is_read ? "read" : "write", c->offsets[cookie], error,
                nbd_errname(error));
      c->failed = 1;
    }
    else if (is_read && o->pattern >= 0 &&
             conn_check_data(c, (unsigned) cookie, p + RL_REPLY_BYTES) == -1)
      c->failed = 1;                 /* the data was wrong, as above */
    c->rpos += need;
    c->busy[cookie] = false;
    c->free_slots[c->nfree++] = (unsigned) cookie;
    c->inflight--;
  }
  /* Keep the partial reply at the front: it is at most one reply. */
  if (c->rpos > 0)
    memmove(c->rbuf, c->rbuf + c->rpos, c->rlen - c->rpos);
  c->rlen -= c->rpos;
  c->rpos = 0;
  return 0;
}

/* Receives what the server sent; blocks unless part of the batch is still
 * unsent, then waits for either direction.  Returns 0, or -1 after a
 * message. */
static int
conn_recv(struct rl_conn *c)
{
  int flags = 0;

  if (c->iov_at < c->iov_n) {
    struct pollfd pfd = { .fd = c->fd, .events = POLLIN | POLLOUT };
    if (poll(&pfd, 1, -1) == -1 && errno != EINTR) {
      fprintf(stderr, "rawload: conn %u: poll: %s\n", c->id, strerror(errno));
      return -1;
    }
    if (!(pfd.revents & (POLLIN | POLLHUP | POLLERR)))
      return 0;
    flags = MSG_DONTWAIT;
  }
  ssize_t r = recv(c->fd, c->rbuf + c->rlen, c->rsize - c->rlen, flags);
  if (r < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
    return 0;
  if (r <= 0) {
    fprintf(stderr, "rawload: conn %u: recv: %s\n", c->id,
            r == 0 ? "the server closed the connection" : strerror(errno));
    return -1;
  }
  c->rlen += (size_t) r;
  return conn_parse(c);
}

static int
conn_setup(struct rl_conn *c)
{
  const struct rl_opts *o = c->o;
  uint64_t size = 0;

  c->fd = sock_connect(o);
  if (c->fd < 0 || conn_handshake(c, &size) == -1)
    return -1;
  if (o->offset_bytes >= size) {
    fprintf(stderr, "rawload: offset beyond export size %" PRIu64 "\n", size);
    return -1;
  }
  c->range_off = o->offset_bytes;
  c->range_len = o->size_bytes ? o->size_bytes : size - o->offset_bytes;
  if (c->range_off + c->range_len > size)
    c->range_len = size - c->range_off;
  if (c->range_len < o->bs_bytes) {
    fprintf(stderr, "rawload: range smaller than the block size\n");
    return -1;
  }
  /* Sequential connections start at different places in the range. */
  c->seq_next = (c->range_len / o->bs_bytes / o->conns) * c->id * o->bs_bytes;

  c->hdrs = calloc(o->qd, sizeof *c->hdrs);
  c->busy = calloc(o->qd, sizeof *c->busy);
  c->offsets = calloc(o->qd, sizeof *c->offsets);
  c->free_slots = calloc(o->qd, sizeof *c->free_slots);
  c->iov = calloc(2 * (size_t) o->qd, sizeof *c->iov);
  /* Room for many replies per recv, and at least one whole read reply. */
  c->rsize = 256 * 1024 + RL_REPLY_BYTES + o->bs_bytes;
  c->rbuf = malloc(c->rsize);
  c->wbuf = malloc(o->bs_bytes);
  if (!c->hdrs || !c->busy || !c->offsets || !c->free_slots || !c->iov || !c->rbuf || !c->wbuf) {
    fprintf(stderr, "rawload: out of memory\n");
    return -1;
  }
  for (unsigned i = 0; i < o->qd; i++) {
    put32(c->hdrs[i], NBD_REQUEST_MAGIC);
    put64(c->hdrs[i] + 8, i);                 /* cookie = slot */
    put32(c->hdrs[i] + 24, (uint32_t) o->bs_bytes);
    c->free_slots[c->nfree++] = o->qd - 1 - i;
  }
  for (uint64_t j = 0; j < o->bs_bytes; j++)
    c->wbuf[j] = (char) (o->pattern >= 0 ? o->pattern : (int) rng_next(&c->rng));
  return 0;
}

/* Tells the server we are leaving (after the last reply). */
static void
conn_disconnect(struct rl_conn *c)
{
  unsigned char h[RL_HDR_BYTES] = { 0 };

  put32(h, NBD_REQUEST_MAGIC);
  put16(h + 6, NBD_CMD_DISC);
  if (write_full(c->fd, h, sizeof h) == -1)
    fprintf(stderr, "rawload: conn %u: disconnect: %s\n", c->id, strerror(errno));
  close(c->fd);
  c->fd = -1;
}

static void *
conn_run(void *arg)
{
  struct rl_conn *c = arg;

  for (;;) {
    if (c->iov_at == c->iov_n)
      conn_fill(c);
    if (conn_send(c) == -1)
      goto fail;
    if (c->inflight == 0)
      break;                         /* nothing sent, nothing to wait for */
    if (conn_recv(c) == -1)
      goto fail;
  }
  conn_disconnect(c);                /* also after an error reply */
  return NULL;

fail:
  c->failed = 1;
  return NULL;
}

static void
usage(FILE *f)
{
  fprintf(f,
"usage: rawload [options] nbd+unix:///EXPORT?socket=PATH | nbd://HOST[:PORT]/EXPORT\n"
"  --mode randread|randwrite|seqread|seqwrite   (default randwrite)\n"
"  --bs SIZE            request size (default 4k)\n"
"  --qd N               requests in flight per connection (default 16)\n"
"  --conns N            connections, one thread each (default 1)\n"
"  --seconds S          run time (default 10)\n"
"  --ops N              total requests instead of a time limit\n"
"  --offset SIZE --size SIZE   range of the export used (default all)\n"
"  --seed N\n"
"  --pattern BYTE       writes carry BYTE in every byte; reads must\n"
"                       return it (default: random data, reads unchecked)\n");
}

static int
parse_args(int argc, char **argv, struct rl_opts *o)
{
  static const struct option longopts[] = {
    { "mode", required_argument, NULL, 'm' },
    { "bs", required_argument, NULL, 'b' },
    { "qd", required_argument, NULL, 'q' },
    { "conns", required_argument, NULL, 'c' },
    { "seconds", required_argument, NULL, 's' },
    { "ops", required_argument, NULL, 'n' },
    { "offset", required_argument, NULL, 'o' },
    { "size", required_argument, NULL, 'S' },
    { "seed", required_argument, NULL, 'r' },
    { "pattern", required_argument, NULL, 'p' },
    { "help", no_argument, NULL, 'h' },
    { NULL, 0, NULL, 0 },
  };
  int ch;
  char *end;

  *o = (struct rl_opts) { .mode = RL_RANDWRITE, .bs_bytes = 4096, .qd = 16,
                          .conns = 1, .seconds = 10, .seed = 1, .pattern = -1 };
  while ((ch = getopt_long(argc, argv, "h", longopts, NULL)) != -1) {
    switch (ch) {
    case 'm':
      if (!strcmp(optarg, "randwrite")) o->mode = RL_RANDWRITE;
      else if (!strcmp(optarg, "randread")) o->mode = RL_RANDREAD;
      else if (!strcmp(optarg, "seqwrite")) o->mode = RL_SEQWRITE;
      else if (!strcmp(optarg, "seqread")) o->mode = RL_SEQREAD;
      else { fprintf(stderr, "rawload: bad --mode %s\n", optarg); return -1; }
      break;
    case 'b': o->bs_bytes = parse_size(optarg); break;
    case 'q': o->qd = (unsigned) atoi(optarg); break;
    case 'c': o->conns = (unsigned) atoi(optarg); break;
    case 's': o->seconds = atof(optarg); break;
    case 'n': o->ops_total = strtoull(optarg, NULL, 10); break;
    case 'o': o->offset_bytes = parse_size(optarg); break;
    case 'S': o->size_bytes = parse_size(optarg); break;
    case 'r': o->seed = strtoull(optarg, NULL, 10); break;
    case 'p':
      o->pattern = (int) strtol(optarg, &end, 0);
      if (*end != '\0' || o->pattern < 0 || o->pattern > 255) {
        fprintf(stderr, "rawload: --pattern wants a byte, 0-255 or 0x00-0xff\n");
        return -1;
      }
      break;
    case 'h': usage(stdout); exit(0);
    default: usage(stderr); return -1;
    }
  }
  if (optind != argc - 1) {
    usage(stderr);
    return -1;
  }
  o->uri = argv[optind];
  /* The request length is 32 bits; a reply must fit the receive buffer. */
  if (o->bs_bytes == 0 || o->bs_bytes > (32u << 20) || o->qd == 0 ||
      o->qd > 4096 || o->conns == 0 || o->conns > 256 ||
      (o->ops_total == 0 && o->seconds <= 0)) {
    fprintf(stderr, "rawload: bad option value\n");
    return -1;
  }
  return uri_parse(o);
}

static double
cpu_seconds(void)
{
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (double) ru.ru_utime.tv_sec + (double) ru.ru_utime.tv_usec / 1e6 +
         (double) ru.ru_stime.tv_sec + (double) ru.ru_stime.tv_usec / 1e6;
}

/* Frees what conn_setup allocated and closes the socket if it is still
 * open (a connection that failed, or was never run). */
static void
conn_free(struct rl_conn *c)
{
  if (c->fd >= 0)
    close(c->fd);
  free(c->hdrs);
  free(c->busy);
  free(c->offsets);
  free(c->free_slots);
  free(c->iov);
  free(c->rbuf);
  free(c->wbuf);
}

static void
opts_free(struct rl_opts *o)
{
  free(o->host);
  free(o->port);
  free(o->export_name);
}

/* Prints the result line.  Returns the exit status: 1 if a connection
 * failed. */
static int
report(const struct rl_opts *o, const struct rl_conn *conns, double secs,
       double cpu)
{
  int rc = 0;
  uint64_t reads = 0, writes = 0, bytes = 0, errors = 0;

  for (unsigned i = 0; i < o->conns; i++) {
    reads += conns[i].reads;
    writes += conns[i].writes;
    bytes += conns[i].bytes;
    errors += conns[i].errors;
    if (conns[i].failed)
      rc = 1;
  }
  uint64_t ops = reads + writes;
  printf("ops=%" PRIu64 " reads=%" PRIu64 " writes=%" PRIu64
         " errors=%" PRIu64 " seconds=%.3f ops_per_s=%.0f mb_per_s=%.2f"
         " client_cpu_us_per_op=%.2f\n",
         ops, reads, writes, errors, secs, (double) ops / secs,
         (double) bytes / secs / 1e6, ops ? cpu * 1e6 / (double) ops : 0.0);
  return rc;
}

int
main(int argc, char **argv)
{
  struct rl_opts o;
  struct rl_conn *conns = NULL;
  pthread_t *tids = NULL;
  unsigned started = 0;
  int rc = 1;

  if (parse_args(argc, argv, &o) == -1) {
    opts_free(&o);
    return 2;
  }
  conns = calloc(o.conns, sizeof *conns);
  tids = calloc(o.conns, sizeof *tids);
  if (conns == NULL || tids == NULL)
    goto out;
  for (unsigned i = 0; i < o.conns; i++)
    conns[i].fd = -1;

  /* Every connection is set up before any starts, so that they all run
   * for the same time. */
  for (unsigned i = 0; i < o.conns; i++) {
    struct rl_conn *c = &conns[i];
    c->o = &o;
    c->id = i;
    c->rng = (o.seed + 1) * 0x9E3779B97F4A7C15ULL + i * 0xBF58476D1CE4E5B9ULL;
    if (c->rng == 0)
      c->rng = 1;
    if (conn_setup(c) == -1)
      goto out;
    if (o.ops_total)
      c->ops_budget = o.ops_total / o.conns + (i < o.ops_total % o.conns);
  }

  double cpu0 = cpu_seconds();
  uint64_t t0 = now_ns();
  for (; started < o.conns; started++) {
    /* With --ops the deadline is already past: a connection whose share
     * is 0 issues nothing. */
    conns[started].deadline_ns = o.ops_total ? 0 : t0 + (uint64_t) (o.seconds * 1e9);
    if (pthread_create(&tids[started], NULL, conn_run, &conns[started]) != 0) {
      fprintf(stderr, "rawload: pthread_create failed\n");
      break;
    }
  }
  for (unsigned i = 0; i < started; i++)
    pthread_join(tids[i], NULL);
  if (started == o.conns)
    rc = report(&o, conns, (double) (now_ns() - t0) / 1e9, cpu_seconds() - cpu0);

out:
  for (unsigned i = 0; conns != NULL && i < o.conns; i++)
    conn_free(&conns[i]);
  free(conns);
  free(tids);
  opts_free(&o);
  return rc;
}
