/* Readahead windows: stream slots and the window sizes (ra-window.h). */
#include <string.h>

#include "cache/ra-window.h"
#include "foliod/minmax.h"

void
ra_streams_init (struct ra_streams *rs, uint64_t init, uint64_t max)
{
  memset (rs, 0, sizeof *rs);
  rs->init = init;
  rs->max = max;
}

/* How much a slot is worth keeping: 2 a sequential stream, 1 one that
 * was read sequentially once, 0 a single read (or an idle stream). */
static int
stream_rank (const struct ra_streams *rs, const struct ra_stream *s)
{
  if (rs->clock - s->stamp >= RA_IDLE_READS)
    return 0;
  return s->size > 0 ? 2 : s->seq > 0;
}

/* The stream a read at off continues: one whose next read starts there,
 * or a sequential one whose window holds off (its reads arrived out of
 * order: several in flight).  NULL if none. */
static struct ra_stream *
stream_find (struct ra_streams *rs, uint64_t off)
{
  for (unsigned i = 0; i < RA_STREAMS; i++)
    if (rs->s[i].stamp && rs->s[i].next == off)
      return &rs->s[i];
  for (unsigned i = 0; i < RA_STREAMS; i++) {
    struct ra_stream *s = &rs->s[i];
    if (s->size > 0 && off >= s->next - MIN (s->next, s->size) &&
        off < s->start + s->size)
      return s;
  }
  return NULL;
}

void
ra_stream_reach (const struct ra_stream *s, uint64_t *lo, uint64_t *hi)
{
  *lo = 1;
  *hi = 0;
  if (s->stamp == 0)
    return;
  *lo = *hi = s->next;                /* stream_find's first match */
  if (s->size > 0) {                  /* its second */
    *lo = s->next - MIN (s->next, s->size);
    *hi = MAX (s->next, s->start + s->size - 1);
  }
}

/* A slot for a new stream: an empty one, else the least recently read
 * of the lowest rank (random reads must not push out the streams). */
static struct ra_stream *
stream_take (struct ra_streams *rs)
{
  struct ra_stream *best = &rs->s[0];
  int best_rank = stream_rank (rs, best);

  for (unsigned i = 0; i < RA_STREAMS; i++) {
    struct ra_stream *s = &rs->s[i];
    if (s->stamp == 0)
      return s;
    int rank = stream_rank (rs, s);
    if (rank < best_rank || (rank == best_rank && s->stamp < best->stamp)) {
      best = s;
      best_rank = rank;
    }
  }
  return best;
}

/* The first window: init bytes, or two reads' worth for larger reads. */
static uint64_t
first_size (const struct ra_streams *rs, uint64_t len)
{
  return MIN (MAX (rs->init, 2 * len), rs->max);
}

bool
ra_streams_note (struct ra_streams *rs, uint64_t off, uint64_t len,
                 uint64_t size, uint64_t budget, struct ra_window *w)
{
  uint64_t end = off + len, start, want;
  struct ra_stream *s = stream_find (rs, off);

  rs->clock++;
  if (s == NULL) {
    s = stream_take (rs);
    *s = (struct ra_stream) { .next = end, .stamp = rs->clock };
    return false;
  }
  s->stamp = rs->clock;
  if (end > s->next)
    s->next = end;
  if (s->size == 0) {                 /* not a stream yet */
    if (++s->seq < RA_SEQ_READS)
      return false;
    start = end;
    want = first_size (rs, len);
  } else if (end > s->mark) {         /* the reader reached the mark */
    start = MAX (s->start + s->size, end);
    want = MIN (2 * s->size, rs->max);
  } else
    return false;
  if (start >= size)
    return false;
  want = MIN (MIN (want, size - start), budget);
  if (want == 0)
    return false;                     /* no room now: the next read retries */
  s->start = s->mark = start;
  s->size = want;
  *w = (struct ra_window) { start, want };
  return true;
}
