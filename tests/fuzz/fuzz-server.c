/* libFuzzer harness: the real server (src/server) fed one client's bytes.
 *
 * Each input is what a client sends, from the first byte after the
 * server's greeting to the end: client flags, options, requests, write
 * payloads.  The harness writes it into one end of a socketpair whose
 * other end the server adopts as a connection (conn_new, as a loop
 * does with an accepted socket; the server's one loop runs inline, on
 * the harness's libev loop), half-closes its side, reads every reply out and discards it,
 * and runs the libev loop until the server has freed the connection, so
 * that no request is still held by a worker when the next input starts.
 * Both ends have small socket buffers: input arrives in pieces that
 * split headers anywhere (the parser must resume) and large replies
 * fill the socket (the server must wait for room to send).
 *
 * The server and its exports live for the whole run (persistent mode):
 * one worker thread, small caches so that misses, evictions and
 * writeback happen, and exports that differ where the parser looks:
 *   disk  read-write, 1 MiB, 4 KiB blocks, writeback (the default export)
 *   ro    read-only, an odd size
 *   wt    writethrough, 512-byte blocks
 *   tls   tls=require
 *   fake  1 MiB on the test suite's fake backing (tests/unit/lib), whose
 *         reads fail in [256K, 320K) and block status in [768K, 832K),
 *         and whose extents are at most 3000 bytes: error replies and
 *         long extent lists
 * TLS is on (STARTTLS is answered) with the pre-shared key FUZZ_PSK, which
 * tests/fuzz/record-corpus.sh gives a client too: the TLS handshake starts
 * and then breaks (a replayed TLS session cannot go on), so what is
 * fuzzed there is the transport's handling of a handshake gone wrong.
 *
 * tests/fuzz/record-corpus.sh serves the first four (same names and
 * sizes), so that recorded sessions replay here as they ran; it makes
 * the "fake" seeds from "disk" sessions (same name length and size).
 *
 * FUZZ_LOG=1 in the environment prints the server's log lines.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ev.h>

#include "fake_backing.h"
#include "foliod/export.h"
#include "server/internal.h"
#include "server/log.h"

#define FUZZ_PSK "fuzz:0123456789abcdef0123456789abcdef"

struct fuzz_export {
  const char *name;
  uint64_t size;
  const char *opts[6]; /* key=value, NULL-terminated */
};

static const struct fuzz_export fuzz_exports[] = {
  { "disk", 1024 * 1024,
    { "cache-size=256K", "folio-size=64K", "block-size=4K",
      "description=fuzz disk", NULL } },
  { "ro", 192 * 1024 + 512, { "read-only=true", "cache-size=64K", "folio-size=16K", NULL } },
  { "wt", 256 * 1024 + 4096,
    { "cache=writethrough", "cache-size=128K", "folio-size=16K",
      "block-size=512", NULL } },
  { "tls", 64 * 1024, { "tls=require", "cache-size=64K", "folio-size=16K", NULL } },
};
#define FUZZ_NEXPORTS (sizeof fuzz_exports / sizeof fuzz_exports[0])

/* What lives across inputs. */
struct fuzz_env {
  struct ev_loop *loop;
  struct server *srv;
  char dir[64];
};

static int fuzz_log_on;

/* The log's destination (foliod/log.h): dropped unless asked. */
static void
fuzz_log_line (int level, const char *msg)
{
  if (fuzz_log_on)
    fprintf (stderr, "foliod[%d]: %s\n", level, msg);
}

static void fuzz_die (const char *what, const char *why)
  __attribute__ ((noreturn));

static void
fuzz_die (const char *what, const char *why)
{
  fprintf (stderr, "fuzz-server: %s: %s\n", what, why);
  exit (1);
}

/* Make a sparse backing file of fx->size bytes in dir and open it. */
static struct export *
fuzz_export_open (const char *dir, const struct fuzz_export *fx)
{
  struct export_config cfg;
  char path[128], spec[160], err[256];
  struct export *e;
  FILE *f;

  snprintf (path, sizeof path, "%s/%s.img", dir, fx->name);
  if (!(f = fopen (path, "w")) || ftruncate (fileno (f), fx->size) < 0)
    fuzz_die (path, strerror (errno));
  fclose (f);
  snprintf (spec, sizeof spec, "file:%s", path);
  export_config_init (&cfg);
  if (!(cfg.name = strdup (fx->name)))
    fuzz_die (fx->name, "out of memory");
  if (export_config_set (&cfg, "backing", spec, err, sizeof err) < 0)
    fuzz_die (fx->name, err);
  for (const char *const *o = fx->opts; *o; o++) {
    char key[64];
    const char *eq = strchr (*o, '=');

    snprintf (key, sizeof key, "%.*s", (int) (eq - *o), *o);
    if (export_config_set (&cfg, key, eq + 1, err, sizeof err) < 0)
      fuzz_die (*o, err);
  }
  if (export_config_check (&cfg, err, sizeof err) < 0
      || !(e = export_open (&cfg, err, sizeof err)))
    fuzz_die (fx->name, err);
  export_config_free (&cfg);
  /* The file is open: its name is no longer needed. */
  unlink (path);
  return e;
}

/* Socket buffer size of both ends (the kernel doubles it, and raises it
 * to its minimum of about 4.5 KiB). */
#define FUZZ_SOCKBUF 2048

/* The "fake" export.  Only reads and maps fail: a write that cannot be
 * written back stays dirty for good, and a cache full of such data is the
 * cache's business, not the protocol's. */
static struct export *
fuzz_export_fake (void)
{
  struct fake_backing *fb = fake_backing_new (1024 * 1024);
  struct export *e = calloc (1, sizeof *e);
  struct cache_config cc;
  char err[256];

  if (!fb || !e || !(e->name = strdup ("fake")))
    fuzz_die ("fake", "out of memory");
  fake_set_log (fb, 0);
  fake_set_map_style (fb, 0, 3000);
  fake_fill_pattern (fb, 64 * 1024, 200 * 1024, 1);
  if (fake_fail_range (fb, FAKE_M (FAKE_READ), 256 * 1024, 64 * 1024, EIO) < 0
      || fake_fail_range (fb, FAKE_M (FAKE_MAP), 768 * 1024, 64 * 1024,
                          EIO) < 0)
    fuzz_die ("fake", "fake_fail_range");
  cache_config_default (&cc);
  cc.cache_size = 256 * 1024;
  e->tls_require = -1;
  e->backing = fake_backing_base (fb);
  e->size = e->backing->size;
  if (!(e->cache = cache_create (e->backing, NULL, &cc, err, sizeof err)))
    fuzz_die ("fake", err);
  return e;
}

/* Load FUZZ_PSK as the server's TLS credentials. */
static void
fuzz_tls_on (struct server *srv, const char *dir)
{
  char path[128], err[256];
  FILE *f;

  snprintf (path, sizeof path, "%s/keys.psk", dir);
  if (!(f = fopen (path, "w")) || fchmod (fileno (f), 0600) != 0
      || fprintf (f, "%s\n", FUZZ_PSK) < 0
      || fclose (f) != 0)
    fuzz_die (path, strerror (errno));
  srv->cfg.tls_psk_file = path;
  if (server_tls_reload (srv, err, sizeof err) < 0)
    fuzz_die ("server_tls_reload", err);
  srv->cfg.tls_psk_file = NULL; /* path is about to go */
  unlink (path);
}

static struct fuzz_env *
fuzz_env_new (void)
{
  static struct fuzz_env env;
  struct server_config cfg;
  const char *tmpdir = getenv ("TMPDIR");

  fuzz_log_on = getenv ("FUZZ_LOG") != NULL;
  log_to_sink (fuzz_log_line);
  if (fuzz_log_on)
    log_set_level (LOG_LVL_DEBUG);  /* the replay checks debug lines */
  snprintf (env.dir, sizeof env.dir, "%.40s/fuzz-server-XXXXXX",
            tmpdir && *tmpdir ? tmpdir : "/tmp");
  if (!mkdtemp (env.dir))
    fuzz_die (env.dir, strerror (errno));
  env.loop = ev_loop_new (EVFLAG_AUTO);
  if (!env.loop)
    fuzz_die ("ev_loop_new", "failed");
  server_config_default (&cfg);
  cfg.workers = 1;              /* replies in one order: reproducible */
  cfg.loops_inline = 1;         /* the connection runs on env.loop */
  cfg.handshake_timeout_s = 60; /* never fires within one input */
  /* Small buffer budgets: large requests pause input and resume. */
  cfg.max_conn_buffer = 1u << 20;
  cfg.max_buffer_total = 2u << 20;
  cfg.tls_mode = SERVER_TLS_ON;
  if (!(env.srv = server_new (env.loop, &cfg)))
    fuzz_die ("server_new", strerror (errno));
  for (size_t i = 0; i < FUZZ_NEXPORTS; i++)
    if (server_add_export (env.srv,
                           fuzz_export_open (env.dir, &fuzz_exports[i])) < 0)
      fuzz_die (fuzz_exports[i].name, strerror (errno));
  if (server_add_export (env.srv, fuzz_export_fake ()) < 0)
    fuzz_die ("fake", strerror (errno));
  fuzz_tls_on (env.srv, env.dir);
  rmdir (env.dir);
  return &env;
}

/* Write input up to end as far as the socket takes it.  Returns false
 * once the server has hung up (EPIPE, ECONNRESET). */
static bool
fuzz_feed (int fd, const uint8_t *data, size_t end, size_t *off)
{
  while (*off < end) {
    ssize_t n = send (fd, data + *off, end - *off, MSG_NOSIGNAL);

    if (n < 0)
      return errno == EAGAIN || errno == EWOULDBLOCK;
    *off += n;
  }
  return true;
}

/* Read and drop whatever the server sent, so it never waits on us. */
static void
fuzz_drain (int fd)
{
  static uint8_t sink[256 * 1024];

  while (recv (fd, sink, sizeof sink, 0) > 0)
    ;
}

/* Where the input's first NBD_OPT_STARTTLS option ends, or size.  A real
 * client waits there for the server's answer before it starts TLS; the
 * server refuses bytes sent early (an injection attempt). */
static size_t
fuzz_starttls_end (const uint8_t *data, size_t size)
{
  static const uint8_t opt[16] = "IHAVEOPT\0\0\0\5\0\0\0\0";
  const uint8_t *p = memmem (data, size, opt, sizeof opt);

  return p ? (size_t) (p - data) + sizeof opt : size;
}

/* Has the server read everything written to it (and gone idle)? */
static bool
fuzz_server_idle (const struct conn *c)
{
  int unread = 0;

  return c->state == CONN_DEAD
    || (c->rpos == c->rlen && ioctl (c->fd, FIONREAD, &unread) == 0
        && unread == 0 && !c->tops->pending ((struct conn *) c));
}

/* libFuzzer's entry point (it has no header to declare it). */
int LLVMFuzzerTestOneInput (const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput (const uint8_t *data, size_t size)
{
  static struct fuzz_env *env;
  size_t off = 0, end = fuzz_starttls_end (data, size);
  bool open = true;
  int sv[2];

  if (!env)
    env = fuzz_env_new ();
  if (socketpair (AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0,
                  sv) < 0)
    fuzz_die ("socketpair", strerror (errno));
  for (int i = 0; i < 2; i++)
    if (setsockopt (sv[i], SOL_SOCKET, SO_SNDBUF, &(int) { FUZZ_SOCKBUF },
                    sizeof (int)) < 0)
      fuzz_die ("SO_SNDBUF", strerror (errno));
  conn_new (&env->srv->loops[0], sv[0], "fuzz", "fuzz", NULL);
  /* conn_new queued the greeting; each pass moves both directions, then
   * lets the server run until something happens (input, room to send, a
   * worker's completion).  Input stops after STARTTLS until the server
   * has taken it in; at the end, the write side is shut.  The connection
   * is gone once the server has freed it. */
  while (env->srv->loops[0].conns) {
    if (open && !fuzz_feed (sv[1], data, end, &off))
      open = false, off = end = size;
    fuzz_drain (sv[1]);
    if (off == end && end < size && fuzz_server_idle (env->srv->loops[0].conns)) {
      end = size;
      continue;
    }
    if (open && off == size) {
      shutdown (sv[1], SHUT_WR);
      open = false;
    }
    ev_run (env->loop, EVRUN_ONCE);
  }
  close (sv[1]);
  return 0;
}
