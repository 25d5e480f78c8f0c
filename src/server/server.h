/* The NBD server: listeners, connections, handshake, transmission.
 *
 * Contract with the daemon (src/daemon/):
 *   - The daemon owns the libev loop, signals, where log lines go (the
 *     sink is foliod/log.h) and the exports (export_open/export_close).
 *   - All server_* calls are made on the main thread (the thread that
 *     runs ev_run on `loop`), except server_get_stats and
 *     server_get_loop_stats which are safe anywhere.  The connections
 *     themselves run on cfg.loops threads of their own (internal.h).
 *   - Typical life:
 *        s = server_new (loop, &cfg);             // starts the worker pool
 *        server_add_export (s, e);                // for each export
 *        server_listen_tcp / _unix / _add_listen_fd
 *        ev_run (loop, 0);
 *        ... on SIGTERM:
 *        server_stop_accepting (s);
 *        server_shutdown (s, done_cb, opaque);    // returns at once
 *        ... done_cb runs on the loop once every connection is gone:
 *        export_close (e) for each export;  ev_break (loop, EVBREAK_ALL);
 *        server_free (s);                         // after ev_run returns
 *   - server_shutdown closes connections still in the handshake, keeps
 *     replying to requests already received (new ones get NBD_ESHUTDOWN),
 *     closes each connection once it has nothing in flight (after
 *     shutdown_grace_s it drops the rest: what they had queued for the
 *     workers is skipped, nobody is left to answer), and calls done once
 *     no connection is left.  The worker
 *     threads are joined just before done runs, so exports may be closed
 *     from done (thread-local cache state is freed by then).  A second call
 *     (second signal) drops connections at once; in-flight worker calls
 *     still finish before done runs (the cache stays consistent).
 */
#ifndef FOLIOD_SERVER_H
#define FOLIOD_SERVER_H

#include <stddef.h>
#include <stdint.h>

struct ev_loop;
struct export;

enum server_tls_mode {
  SERVER_TLS_OFF = 0,      /* STARTTLS refused (NBD_REP_ERR_POLICY) */
  SERVER_TLS_ON = 1,       /* STARTTLS offered, plaintext allowed */
  SERVER_TLS_REQUIRE = 2,  /* nothing but STARTTLS/ABORT before TLS */
};

struct server_config {
  unsigned workers;             /* worker threads; 0: default (16) */
  unsigned loops;               /* connection loops, a thread each;
                                   0: default (server_default_loops) */
  int loops_inline;             /* one loop, run on the caller's loop
                                   (no thread): in-process drivers such
                                   as the fuzzer */
  unsigned max_connections;     /* 0: default (128); more are closed */
  unsigned handshake_timeout_s; /* 0: default (10 s) */
  unsigned max_inflight;        /* requests in flight per connection;
                                   0: default (64, nbdcopy's depth) */
  unsigned max_connections_per_client; /* per source address (TCP) or
                                   peer pid (Unix socket); 0: default (32) */
  unsigned shutdown_grace_s;    /* server_shutdown drops connections
                                   still busy after this long; 0:
                                   default (30 s) */
  unsigned idle_timeout_s;      /* close a connection with nothing in
                                   flight and no input for this long;
                                   0: never (the default) */
  uint64_t max_conn_buffer;     /* request/reply buffer bytes one
                                   connection may hold before it is no
                                   longer read; 0: default (64 MiB) */
  uint64_t max_buffer_total;    /* the same, all connections together;
                                   0: default (1 GiB) */
  enum server_tls_mode tls_mode;
  const char *tls_certificates; /* directory with server-cert.pem,
                                   server-key.pem, ca-cert.pem; may be
                                   NULL when TLS is not used */
  int tls_verify_peer;          /* clients need a certificate signed by
                                   ca-cert.pem */
  const char *tls_psk_file;     /* "username:hexkey" lines: pre-shared
                                   keys instead of certificates; NULL:
                                   certificates */
};

/* Fill cfg with the defaults above. */
void server_config_default (struct server_config *cfg);

/* The default number of connection loops: the CPUs this process may
 * run on (sched_getaffinity), at most 8. */
unsigned server_default_loops (void);

struct server;

/* Create a server on loop and start its worker threads.  NULL with errno
 * set on failure. */
struct server *server_new (struct ev_loop *loop,
                           const struct server_config *cfg);

/* Serve e under e->name.  The server does not own e; e must outlive the
 * server's last connection (close exports in the shutdown done callback).
 * The first export added is the default one (empty export name).
 * Returns 0, or -1 with errno (EEXIST for a duplicate name). */
int server_add_export (struct server *s, struct export *e);

/* No export answers the empty name: the one that would (named "", or
 * configured first) could not be opened, and the next one is another
 * client's disk.  Before the first server_add_export. */
void server_no_default_export (struct server *s);

/* Listen on host:port (host NULL or "" = all addresses, IPv4 and IPv6;
 * "::1", "127.0.0.1", names: every address getaddrinfo returns).
 * Returns 0, or -1 with a reason in err. */
int server_listen_tcp (struct server *s, const char *host, const char *port,
                       char *err, size_t errlen);

/* Listen on a Unix socket at path (an existing socket file there is
 * removed first; the file is removed again by server_free).  0 or -1. */
int server_listen_unix (struct server *s, const char *path,
                        char *err, size_t errlen);

/* Accept on an already-listening socket (systemd socket activation).  The
 * server owns fd from now on.  0 or -1 with errno. */
int server_add_listen_fd (struct server *s, int fd);

/* Stop accepting new connections (close the listeners). */
void server_stop_accepting (struct server *s);

/* Graceful shutdown, see the life cycle above.  done(opaque) is called
 * once, on the loop, from a callback (never from inside this call). */
void server_shutdown (struct server *s, void (*done) (void *opaque),
                      void *opaque);

/* Free everything: joins the workers, closes any remaining sockets,
 * removes Unix socket files.  Call after ev_run has returned or from the
 * done callback's aftermath; never while requests are in flight. */
void server_free (struct server *s);

struct server_stats {
  uint64_t connections_now;
  uint64_t connections_total;   /* accepted since start */
  uint64_t connections_refused; /* over max_connections (per client) */
  uint64_t handshakes_failed;   /* timeouts, protocol errors */
  uint64_t requests;            /* transmission requests completed */
  uint64_t request_errors;      /* of which replied with an error */
  uint64_t requests_inline;     /* of which completed on the loop thread
                                   (run-to-completion), not a worker */
  uint64_t requests_parked;     /* read misses answered from an
                                   asynchronous backing read, no worker
                                   held while it ran */
  uint64_t bytes_read;          /* NBD_CMD_READ payload sent */
  uint64_t bytes_written;       /* NBD_CMD_WRITE payload received */
};

/* TLS (OpenSSL) is built in: the daemon may offer it. */
#define SERVER_TLS_SUPPORTED 1

/* (Re)load the TLS credentials from cfg.tls_psk_file if set, else from
 * cfg.tls_certificates, if TLS is used
 * at all (tls_mode not OFF, or an export with tls_require == 1): call it
 * once after the server_add_export calls, and again to reload (SIGHUP).
 * New connections get the new credentials; open ones keep theirs.
 * Returns 0 (also when TLS is not used), or -1 with a reason naming the
 * file in err; on failure the previous credentials stay in use. */
int server_tls_reload (struct server *s, char *err, size_t errlen);

/* Snapshot of the counters (thread-safe). */
void server_get_stats (struct server *s, struct server_stats *st);

/* The same per connection loop, i < server_loop_count (s). */
struct server_loop_stats {
  uint64_t connections_now;
  uint64_t connections_total;   /* adopted by this loop since start */
  uint64_t requests;
};
unsigned server_loop_count (struct server *s);
void server_get_loop_stats (struct server *s, unsigned i,
                            struct server_loop_stats *st);

/* Upgrade in place (handover.c): the old process hands its plain
 * connections in transmission to a new one, which adopts them.
 *
 *   old: server_handover (s, done, opaque)  // returns at once
 *        ... done runs on the loop once no connection is left: plain
 *        ones in transmission stopped reading at a request boundary,
 *        answered what they had and sent it, and were detached (their
 *        socket kept open, their state in a struct server_moved);
 *        handshakes and TLS ones were closed as by server_shutdown.
 *        server_handover_take (s, &n)       // the detached ones
 *        ... on failure to start the new process:
 *        server_handover_abort (s); server_adopt (s, m) for each
 *   new: server_adopt (s, m) for each, after its server_add_export calls.
 * The listeners are only paused (server_listen_fds gives them to the new
 * process).  Main thread only. */
#define SERVER_MOVED_STRUCTURED 1u  /* structured replies negotiated */
#define SERVER_MOVED_EXTENDED   2u  /* extended headers negotiated */
#define SERVER_MOVED_META_ALLOC 4u  /* base:allocation selected */
#define SERVER_MOVED_META_CACHE 8u  /* foliod:cache selected */
#define SERVER_MOVED_NO_ZEROES  16u
#define SERVER_MOVED_REQUESTED  32u /* has sent a request */
struct server_moved {
  int fd;                       /* the socket (plain, in transmission) */
  char *export_name;            /* malloc'd */
  char peer[80];                /* for log lines */
  char key[64];                 /* per-client limit key */
  uint32_t client_flags;
  uint16_t tflags;              /* transmission flags sent at GO */
  uint16_t flags;               /* SERVER_MOVED_* */
  uint32_t hdr_have;            /* bytes of a request header read ... */
  uint8_t hdr[32];              /* ... here */
  uint32_t pending_len;         /* bytes read from the socket, unparsed */
  uint8_t *pending;             /* malloc'd (NULL when 0) */
};
int server_handover (struct server *s, void (*done) (void *opaque),
                     void *opaque);
/* The detached connections (a malloc'd array of *n), now the caller's. */
struct server_moved *server_handover_take (struct server *s, size_t *n);
/* Serve again: listeners resumed, new connections accepted. */
void server_handover_abort (struct server *s);
/* Adopt a detached connection (takes m's fd and buffers).  0 or -1. */
int server_adopt (struct server *s, struct server_moved *m);
void server_moved_free (struct server_moved *m);
/* The listening sockets (still open, owned by the server).  How many. */
int server_listen_fds (struct server *s, int *fds, int max);
/* Serve e where old was (an export reopened). */
void server_replace_export (struct server *s, struct export *old,
                            struct export *e);

#endif /* FOLIOD_SERVER_H */
