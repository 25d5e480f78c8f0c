/* Writes that can be checked after a crash, for tests/test-vm-pmem.sh:
 *
 *   nbd-acklog write URI SEED N [RESET_AFTER]
 *     writes ranges 0 .. N-1 (4 in flight, a FLUSH after every 8th, FUA
 *     on every 5th) and prints "ack I" once the server has answered range
 *     I; with RESET_AFTER, the moment that many are acknowledged (the
 *     others still in flight) it prints "resetting: N acked, ranges 0-I
 *     issued" and resets the machine through /proc/sysrq-trigger;
 *   nbd-acklog verify URI|PATH SEED M SKIP[,SKIP...] Z ZEROS
 *     checks that every range below M but the SKIP ones (-: none) holds
 *     its data and that the ZEROS ranges from Z on (never written) read
 *     as zeros; prints "verify: ..." and exits 1 on a mismatch.
 *
 * Range I is the bytes [I * STRIDE + a, + b) with a < 4096 and
 * b <= STRIDE - 4096 drawn from (SEED, I): unaligned, straddling folios,
 * never overlapping another range, so each one has exactly one expected
 * content whatever order the writes landed in.  Its data is a stream
 * seeded by (SEED, I). */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <termios.h>
#include <unistd.h>

#include <libnbd.h>

#define STRIDE (80 * 1024)
#define DEPTH 4         /* writes in flight */

struct range {
  uint64_t off;
  uint32_t len;
};

static uint64_t
mix (uint64_t x)
{
  /* splitmix64: cheap, and a different stream per (seed, index) */
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static struct range
range_of (uint64_t seed, uint64_t i)
{
  uint64_t h = mix (seed * 1000003 + i);
  struct range r = {
    .off = i * STRIDE + (h & 4095),
    .len = 1 + (uint32_t) ((h >> 12) % (STRIDE - 4096)),
  };
  return r;
}

static void
range_fill (unsigned char *buf, uint64_t seed, uint64_t i, uint32_t len)
{
  uint64_t x = mix (seed ^ (i << 32) ^ 0x5bd1e995);

  for (uint32_t k = 0; k < len; k += 8) {
    x = mix (x);
    memcpy (buf + k, &x, len - k < 8 ? len - k : 8);
  }
}

struct writer;
struct slot_ref {       /* what a completion callback is told */
  struct writer *w;
  unsigned slot;
  uint64_t index;
};

struct writer {
  struct nbd_handle *h;
  uint64_t seed, n, next, acked, reset_after;
  unsigned inflight;
  unsigned char *buf[DEPTH];
  bool busy[DEPTH];
  struct slot_ref ref[DEPTH];
  int failed;
};

/* Power off the machine now, without sync: the test's "power cut".  The
 * console gets the acks printed so far first (tcdrain). */
static void
writer_reset (const struct writer *w)
{
  int fd = open ("/proc/sysrq-trigger", O_WRONLY);

  printf ("resetting: %" PRIu64 " acked, ranges 0-%" PRIu64 " issued\n",
          w->acked, w->next - 1);
  fflush (stdout);
  tcdrain (STDOUT_FILENO);
  if (fd == -1 || write (fd, "b", 1) != 1)
    perror ("nbd-acklog: /proc/sysrq-trigger");
  exit (1);     /* not reached when the reset worked */
}

static int
writer_done (void *user_data, int *error)
{
  struct slot_ref *ref = user_data;
  struct writer *w = ref->w;

  w->busy[ref->slot] = false;
  w->inflight--;
  if (*error != 0) {
    fprintf (stderr, "nbd-acklog: write %" PRIu64 ": %s\n", ref->index,
             strerror (*error));
    w->failed = 1;
    return 1;
  }
  printf ("ack %" PRIu64 "\n", ref->index);
  fflush (stdout);
  if (++w->acked == w->reset_after)
    writer_reset (w);
  return 1;
}

static int
writer_flushed (void *user_data, int *error)
{
  struct writer *w = user_data;

  if (*error != 0) {
    fprintf (stderr, "nbd-acklog: flush: %s\n", strerror (*error));
    w->failed = 1;
  }
  return 1;
}

static int
writer_issue (struct writer *w)
{
  unsigned s = 0;
  uint64_t i = w->next++;
  struct range r = range_of (w->seed, i);
  uint32_t flags = i % 5 == 4 ? LIBNBD_CMD_FLAG_FUA : 0;

  while (w->busy[s])
    s++;
  range_fill (w->buf[s], w->seed, i, r.len);
  w->ref[s] = (struct slot_ref) { .w = w, .slot = s, .index = i };
  w->busy[s] = true;
  w->inflight++;
  if (nbd_aio_pwrite (w->h, w->buf[s], r.len, r.off,
                      (nbd_completion_callback) { .callback = writer_done,
                                                  .user_data = &w->ref[s] },
                      flags) == -1)
    return -1;
  /* The flush is ordered after the writes answered before it only: the
   * ack lines are what the test checks, the flushes make it realistic. */
  if (i % 8 == 7 &&
      nbd_aio_flush (w->h, (nbd_completion_callback) {
                       .callback = writer_flushed, .user_data = w }, 0) == -1)
    return -1;
  return 0;
}

static int
cmd_write (const char *uri, uint64_t seed, uint64_t n, uint64_t reset_after)
{
  struct writer w = { .seed = seed, .n = n, .reset_after = reset_after };

  w.h = nbd_create ();
  if (w.h == NULL || nbd_connect_uri (w.h, uri) == -1)
    goto err;
  if ((uint64_t) nbd_get_size (w.h) < n * STRIDE) {
    fprintf (stderr, "nbd-acklog: export smaller than %" PRIu64 " bytes\n",
             n * STRIDE);
    return 1;
  }
  for (unsigned s = 0; s < DEPTH; s++)
    if ((w.buf[s] = malloc (STRIDE)) == NULL)
      return 1;
  while ((w.next < n || w.inflight > 0) && !w.failed) {
    while (w.next < n && w.inflight < DEPTH)
      if (writer_issue (&w) == -1)
        goto err;
    if (nbd_poll (w.h, -1) == -1)
      goto err;
  }
  if (w.failed || nbd_flush (w.h, 0) == -1 || nbd_shutdown (w.h, 0) == -1)
    goto err;
  printf ("written %" PRIu64 "\n", n);
  nbd_close (w.h);
  for (unsigned s = 0; s < DEPTH; s++)
    free (w.buf[s]);
  return 0;
err:
  if (!w.failed)
    fprintf (stderr, "nbd-acklog: %s\n", nbd_get_error ());
  return 1;
}

/* Where verify reads from: an NBD export or a file (the backing). */
struct source {
  struct nbd_handle *h;
  int fd;
};

static int
source_open (struct source *src, const char *where)
{
  src->h = NULL;
  src->fd = -1;
  if (strstr (where, "://") == NULL) {
    src->fd = open (where, O_RDONLY);
    if (src->fd == -1)
      perror (where);
    return src->fd == -1 ? -1 : 0;
  }
  src->h = nbd_create ();
  if (src->h == NULL || nbd_connect_uri (src->h, where) == -1) {
    fprintf (stderr, "nbd-acklog: %s\n", nbd_get_error ());
    return -1;
  }
  return 0;
}

static int
source_read (struct source *src, void *buf, uint32_t len, uint64_t off)
{
  if (src->h)
    return nbd_pread (src->h, buf, len, off, 0);
  return pread (src->fd, buf, len, (off_t) off) == (ssize_t) len ? 0 : -1;
}

static bool
skipped (const char *skips, uint64_t i)
{
  char key[32];
  char list[4096];

  snprintf (key, sizeof key, ",%" PRIu64 ",", i);
  snprintf (list, sizeof list, ",%s,", skips);
  return strstr (list, key) != NULL;
}

/* Range i holds its data (zeros: nothing). */
static bool
range_check (struct source *src, uint64_t seed, uint64_t i, bool zeros,
             unsigned char *got, unsigned char *want)
{
  struct range r = range_of (seed, i);

  if (zeros)
    memset (want, 0, r.len);
  else
    range_fill (want, seed, i, r.len);
  if (source_read (src, got, r.len, r.off) == -1) {
    fprintf (stderr, "nbd-acklog: reading range %" PRIu64 " failed\n", i);
    return false;
  }
  return memcmp (got, want, r.len) == 0;
}

static int
cmd_verify (const char *where, uint64_t seed, uint64_t m, const char *skips,
            uint64_t zfrom, uint64_t zeros)
{
  struct source src;
  unsigned char *got = malloc (STRIDE), *want = malloc (STRIDE);
  uint64_t checked = 0, bad = 0;

  if (got == NULL || want == NULL || source_open (&src, where) == -1)
    return 1;
  for (uint64_t i = 0; i < m || i < zfrom + zeros; i++) {
    bool z = i >= zfrom && i - zfrom < zeros;
    if (!z && (i >= m || skipped (skips, i)))
      continue;
    checked++;
    if (!range_check (&src, seed, i, z, got, want)) {
      printf ("verify: range %" PRIu64 " (%s) differs\n", i,
              z ? "never written" : "acknowledged");
      bad++;
    }
  }
  printf ("verify: %s: %" PRIu64 " ranges checked, %" PRIu64 " differ\n",
          where, checked, bad);
  if (src.h)
    nbd_close (src.h);
  else
    close (src.fd);
  free (got);
  free (want);
  return bad == 0 ? 0 : 1;
}

int
main (int argc, char **argv)
{
  if (argc >= 5 && argc <= 6 && strcmp (argv[1], "write") == 0)
    return cmd_write (argv[2], strtoull (argv[3], NULL, 0),
                      strtoull (argv[4], NULL, 0),
                      argc == 6 ? strtoull (argv[5], NULL, 0) : 0);
  if (argc == 8 && strcmp (argv[1], "verify") == 0)
    return cmd_verify (argv[2], strtoull (argv[3], NULL, 0),
                       strtoull (argv[4], NULL, 0), argv[5],
                       strtoull (argv[6], NULL, 0),
                       strtoull (argv[7], NULL, 0));
  fprintf (stderr, "usage: nbd-acklog write URI SEED N [RESET_AFTER] | "
           "verify URI|PATH SEED M SKIPS Z ZEROS\n");
  return 2;
}
