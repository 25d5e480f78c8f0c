/* Readahead: the windows ra-window.h decides, fetched by a few threads of
 * the cache's own, so that neither the request that called for a window
 * nor the server's loop waits for it (the kernel's async readahead).
 *
 * A window is cut into jobs of up to max-io bytes, whole folios, which
 * the threads fetch in parallel (a remote answers several requests at
 * once).  Memory: the folios queued and those fetched but not read yet
 * are at most a quarter of the cache (a window that does not fit shrinks
 * or waits for the stream's next read); readahead takes free room or
 * clean folios no request used lately (window_ra_begin), never waits for
 * room, never dirties anything, and issues nothing while writers are
 * throttled (the backing is busy with their writeback then).
 */
#include <errno.h>
#include <stdlib.h>

#include "cache/cache-int.h"
#include "cache/ra-window.h"
#include "foliod/minmax.h"
#include "foliod/util.h"

#define RA_THREADS      4
#define RA_QUEUE        64          /* jobs; more are dropped */
#define RA_INIT_BYTES   (128u << 10)
#define RA_AUTO_BYTES   (4u << 20)  /* readahead=auto on a remote */
#define RA_BUDGET_DIV   4           /* readahead memory <= cache / this */

struct ra_job {
  uint64_t off, len;                /* whole folios (but at the export end) */
};

struct readahead {
  pthread_mutex_t lock;             /* everything here */
  pthread_cond_t cv;                /* a job was queued, or stop */
  struct ra_streams streams;
  struct ra_job q[RA_QUEUE];
  unsigned q_head, q_len;
  uint64_t queued;                  /* folios of jobs queued or running */
  uint64_t budget;                  /* cap of queued + c->ra_unread, folios */
  uint64_t job_folios;              /* folios per job, at most */
  /* Each slot's ra_stream_reach, published under lock after every note
   * and read without it by ra_follows: a hit that continues no stream
   * takes no lock and writes nothing here. */
  struct { _Atomic uint64_t lo, hi; } reach[RA_STREAMS];
  pthread_t threads[RA_THREADS];
  unsigned nthreads;
  bool stop;
};

/* The window cap the configuration asks for on this backing, in bytes. */
static uint64_t
ra_max_bytes (const struct cache *c)
{
  uint32_t v = c->cfg.readahead_bytes;

  if (v == CACHE_READAHEAD_AUTO)
    return (c->b->caps & BACKING_REMOTE) ? RA_AUTO_BYTES : 0;
  return v;
}

int
ra_create (struct cache *c)
{
  uint64_t fsize = (uint64_t) 1 << c->folio_shift;
  uint64_t max = ra_max_bytes (c);
  struct readahead *ra;

  c->ra = NULL;
  if (max == 0 || c->cfg.mode == CACHE_NONE)
    return 0;
  ra = calloc (1, sizeof *ra);
  if (ra == NULL)
    return -1;
  if (pthread_mutex_init (&ra->lock, NULL) != 0) {
    free (ra);
    return -1;
  }
  if (pthread_cond_init (&ra->cv, NULL) != 0) {
    pthread_mutex_destroy (&ra->lock);
    free (ra);
    return -1;
  }
  max = MAX (max & ~(fsize - 1), fsize);
  ra_streams_init (&ra->streams, MIN ((uint64_t) RA_INIT_BYTES, max), max);
  ra->budget = MAX (c->store->nslots / RA_BUDGET_DIV, 1u);
  ra->job_folios = MAX (c->cfg.max_io_bytes >> c->folio_shift, 1u);
  for (unsigned i = 0; i < RA_STREAMS; i++) {
    atomic_init (&ra->reach[i].lo, 1);          /* empty */
    atomic_init (&ra->reach[i].hi, 0);
  }
  c->ra = ra;
  return 0;
}

void
ra_destroy (struct cache *c)
{
  if (c->ra == NULL)
    return;
  pthread_cond_destroy (&c->ra->cv);
  pthread_mutex_destroy (&c->ra->lock);
  free (c->ra);
  c->ra = NULL;
}

static void
ra_fetch (struct cache *c, const struct ra_job *j)
{
  /* Writers wait for writeback: the backing's time is theirs. */
  if (throttle_would_wait (c, 0))
    return;
  /* An error (or no room) ends the job: the client's own read will
   * meet it again and report it. */
  (void) cache_readahead_fill (c, j->len, j->off);
}

static void *
ra_thread_main (void *arg)
{
  struct cache *c = arg;
  struct readahead *ra = c->ra;

  lock_or_die (&ra->lock);
  for (;;) {
    while (!ra->stop && ra->q_len == 0)
      pthread_cond_wait (&ra->cv, &ra->lock);
    if (ra->stop)
      break;
    struct ra_job j = ra->q[ra->q_head];
    ra->q_head = (ra->q_head + 1) % RA_QUEUE;
    ra->q_len--;
    unlock_or_die (&ra->lock);
    ra_fetch (c, &j);
    lock_or_die (&ra->lock);
    ra->queued -= (j.len + ((uint64_t) 1 << c->folio_shift) - 1)
                  >> c->folio_shift;
  }
  unlock_or_die (&ra->lock);
  return NULL;
}

int
ra_start (struct cache *c)
{
  struct readahead *ra = c->ra;

  if (ra == NULL || ra->nthreads > 0)
    return 0;
  ra->stop = false;
  for (unsigned i = 0; i < RA_THREADS; i++) {
    int r = thread_start (&ra->threads[i], ra_thread_main, c, "ra/%u", i);
    if (r != 0) {
      ra_stop (c);
      errno = r;
      return -1;
    }
    ra->nthreads++;
  }
  return 0;
}

void
ra_stop (struct cache *c)
{
  struct readahead *ra = c->ra;

  if (ra == NULL || ra->nthreads == 0)
    return;
  lock_or_die (&ra->lock);
  ra->stop = true;
  pthread_cond_broadcast (&ra->cv);
  unlock_or_die (&ra->lock);
  for (unsigned i = 0; i < ra->nthreads; i++)
    pthread_join (ra->threads[i], NULL);
  ra->nthreads = 0;
  ra->q_len = 0;                    /* dropped: nothing was fetched */
  ra->queued = 0;
}

/* Bytes a new window may take now (lock held). */
static uint64_t
ra_budget_locked (struct cache *c)
{
  struct readahead *ra = c->ra;
  uint64_t used = ra->queued + atomic_load (&c->ra_unread);

  if (ra->nthreads == 0 || used >= ra->budget || throttle_would_wait (c, 0))
    return 0;
  return (ra->budget - used) << c->folio_shift;
}

/* Queue window w's folios as jobs, waking a thread for each (lock held). */
static void
ra_queue_locked (struct cache *c, const struct ra_window *w)
{
  struct readahead *ra = c->ra;
  uint64_t fi = folio_of (c, w->off);
  uint64_t fend = folio_of (c, w->off + w->len - 1) + 1;
  /* Small windows too go to every thread: its first folios come sooner. */
  uint64_t per = MIN ((fend - fi + RA_THREADS - 1) / RA_THREADS,
                      ra->job_folios);

  STAT_ADD (c, readahead_windows, 1);
  while (fi < fend && ra->q_len < RA_QUEUE) {
    uint64_t n = MIN (fend - fi, per);
    uint64_t off = folio_pos (c, fi), end = MIN (folio_pos (c, fi + n), c->size);
    ra->q[(ra->q_head + ra->q_len++) % RA_QUEUE] =
      (struct ra_job) { off, end - off };
    ra->queued += n;
    pthread_cond_signal (&ra->cv);
    fi += n;
  }
}

/* Publish the slots' reach for ra_follows, storing only what changed
 * (lock held). */
static void
ra_publish_locked (struct readahead *ra)
{
  for (unsigned i = 0; i < RA_STREAMS; i++) {
    uint64_t lo, hi;
    ra_stream_reach (&ra->streams.s[i], &lo, &hi);
    if (atomic_load_explicit (&ra->reach[i].lo, memory_order_relaxed) != lo)
      atomic_store_explicit (&ra->reach[i].lo, lo, memory_order_relaxed);
    if (atomic_load_explicit (&ra->reach[i].hi, memory_order_relaxed) != hi)
      atomic_store_explicit (&ra->reach[i].hi, hi, memory_order_relaxed);
  }
}

bool
ra_follows (struct cache *c, uint64_t off)
{
  struct readahead *ra = c->ra;

  if (ra == NULL)
    return false;
  for (unsigned i = 0; i < RA_STREAMS; i++)
    if (atomic_load_explicit (&ra->reach[i].lo, memory_order_relaxed) <= off &&
        off <= atomic_load_explicit (&ra->reach[i].hi, memory_order_relaxed))
      return true;
  return false;
}

void
ra_note (struct cache *c, uint64_t off, uint64_t len)
{
  struct readahead *ra = c->ra;
  struct ra_window w;

  if (ra == NULL)
    return;
  OPSTAT_ADD (c, readahead_notes, 1);
  lock_or_die (&ra->lock);
  if (ra_streams_note (&ra->streams, off, len, c->size,
                       ra_budget_locked (c), &w))
    ra_queue_locked (c, &w);
  ra_publish_locked (ra);
  unlock_or_die (&ra->lock);
}

/* Readahead's step: fill what is missing, and mark the folios it filled
 * (ra_filled) so that a client's read of them counts as a hit. */
static int64_t
readahead_step (struct cache_iter *it)
{
  struct cache *c = it->c;
  uint32_t before[WINDOW_MAX];
  uint64_t first, last;
  bool missed = false;

  step_folios (it, &first, &last);
  for (uint64_t i = first; i <= last; i++)
    before[i] = it->w.f[i]->nr_uptodate;
  if (fill_range (it, &missed) == -1)
    return -1;
  for (uint64_t i = first; i <= last; i++) {
    struct folio *f = it->w.f[i];
    uint32_t got = f->nr_uptodate - before[i];
    if (got == 0)
      continue;
    OPSTAT_ADD (c, readahead_bytes, (uint64_t) got << c->block_shift);
    if (!f->ra)
      ra_filled (c, f);
  }
  return (int64_t) (it->step_end - it->pos);
}

int
cache_readahead_fill (struct cache *c, uint64_t len, uint64_t off)
{
  struct cache_iter it;
  int r;

  cache_iter_init (&it, c, off, len, CI_ALLOC | CI_READAHEAD);
  while ((r = cache_iter_next (&it)) > 0)
    it.done = readahead_step (&it);
  return r;
}
