/* Readahead windows: which bytes to prefetch for which read.
 *
 * The kernel's ondemand readahead (mm/readahead.c) keeps one state per
 * open file: the window last issued and, inside it, a mark (PG_readahead)
 * at which the next window is issued, asynchronously, while the reader
 * still has the current one to consume.  A cache knows no files nor (in
 * the nbdkit plugin) connections, so the state lives in a few stream
 * slots, matched by where the stream's next read would start: several
 * clients reading sequentially each get their own stream.
 *
 * A stream starts with one read at any offset (a slot, no window).  A
 * read that starts where it ended is sequential: the second such read in
 * a row (one only would let a random read that happens to fall there
 * start a stream) issues a window of init bytes past it, marked at its
 * first byte.  A read that
 * reaches the mark issues the next window, right behind the last one and
 * twice as large (up to max), marked at its first byte again, so one
 * window is fetched while the one before is read.  A random read matches
 * no stream: it takes a slot and issues nothing.
 *
 * Pure logic, no locks, no I/O: the caller serialises the calls and
 * fetches the windows (readahead.c).
 */
#ifndef FOLIOD_CACHE_RA_WINDOW_H
#define FOLIOD_CACHE_RA_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#define RA_STREAMS 32
/* A stream not read for this many reads (of any stream) is idle: its
 * slot is taken before a live stream's. */
#define RA_IDLE_READS 1024u
/* Sequential reads in a row that make a stream. */
#define RA_SEQ_READS 2u

struct ra_stream {
  uint64_t next;    /* where the stream's next read would start */
  uint64_t start;   /* the window last issued: [start, start + size) */
  uint64_t size;    /* 0: no window yet (the stream is not sequential) */
  uint64_t mark;    /* a read past this byte issues the next window */
  uint64_t stamp;   /* ra_streams.clock at the stream's last read */
  unsigned seq;     /* sequential reads in a row, before the first window */
};

struct ra_streams {
  struct ra_stream s[RA_STREAMS];
  uint64_t clock;         /* reads noted */
  uint64_t init, max;     /* window sizes in bytes: first, cap */
};

struct ra_window {
  uint64_t off, len;
};

/* The offsets [*lo, *hi] at which a read may continue slot s (all that
 * ra_streams_note would match to it, and more); *lo > *hi when the slot
 * is empty.  For callers that look without the lock (readahead.c). */
void ra_stream_reach (const struct ra_stream *s, uint64_t *lo, uint64_t *hi);

/* No streams; windows of init bytes growing to max (init <= max). */
void ra_streams_init (struct ra_streams *rs, uint64_t init, uint64_t max);

/* A client read of [off, off + len) (len > 0) in an export of size
 * bytes.  Returns true with *w set when a window is to be fetched now:
 * at most budget bytes (the memory readahead may still take), inside the
 * export.  A window that would be empty (no budget) is not issued and the
 * stream keeps its mark: its next read tries again. */
bool ra_streams_note (struct ra_streams *rs, uint64_t off, uint64_t len,
                      uint64_t size, uint64_t budget, struct ra_window *w);

#endif /* FOLIOD_CACHE_RA_WINDOW_H */
