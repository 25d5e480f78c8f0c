/* Group commit for flushes (jbd2's transaction commit, XFS's log force):
 * a flush that arrives while a pass runs does not start its own after
 * it, in turn, but waits for the next pass to *start* and takes its
 * answer; every flush queued by then shares that one pass.
 *
 * Safety: a flush is answered only by a pass that started after the flush
 * was queued (so after every write acknowledged before it was sent): the
 * leader of a pass takes the queue as it stands when the pass begins, and
 * the generation each waiter records asserts it.  Every waiter of a pass
 * gets the pass's result, errors included.
 *
 * The lock is a leaf: held by nobody who takes another lock, and never
 * across a pass.  The waits are as bounded as the passes are: a flush
 * waits for at most the pass under way and the one it leads or joins. */
#ifndef FOLIOD_CACHE_FLUSH_GROUP_H
#define FOLIOD_CACHE_FLUSH_GROUP_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

struct flush_waiter;

struct flush_group {
  pthread_mutex_t lock;
  pthread_cond_t cv;            /* a pass ended */
  bool running;                 /* a pass is under way */
  uint64_t started;             /* passes started: the latest's generation */
  struct flush_waiter *queue;   /* waiting for the next pass to start */
  uint32_t nr_queued;
  uint64_t nr_flushes, nr_passes; /* totals: flushes answered, passes run */
};

/* 0, or an error number. */
int flush_group_init (struct flush_group *g);
void flush_group_destroy (struct flush_group *g);

/* One flush: run pass (arg), or wait for the one that will answer it.
 * pass returns 0 or an error number, which every flush of its group gets
 * (-1 with errno set to it). */
int flush_group_run (struct flush_group *g, int (*pass) (void *arg),
                     void *arg);

/* Flushes waiting for a pass to start now; totals so far. */
void flush_group_stats (struct flush_group *g, uint64_t *waiting,
                        uint64_t *flushes, uint64_t *passes);

#endif /* FOLIOD_CACHE_FLUSH_GROUP_H */
