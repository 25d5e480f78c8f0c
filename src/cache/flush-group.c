/* Group commit for flushes: see flush-group.h. */
#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>

#include "cache/flush-group.h"
#include "foliod/lock.h"

/* A queued flush, on its caller's stack.  done and err are written by the
 * leader of the pass that answers it, under the group lock; after done is
 * set the leader does not touch it again (its frame may be gone). */
struct flush_waiter {
  struct flush_waiter *next;
  uint64_t gen;                 /* the first pass generation that may answer */
  int err;
  bool done;
};

int
flush_group_init (struct flush_group *g)
{
  pthread_mutexattr_t ma;
  int r;

  *g = (struct flush_group) { .running = false };
  r = pthread_mutexattr_init (&ma);
  if (r != 0)
    return r;
  r = pthread_mutexattr_settype (&ma, PTHREAD_MUTEX_ERRORCHECK);
  if (r == 0)
    r = pthread_mutex_init (&g->lock, &ma);
  pthread_mutexattr_destroy (&ma);
  if (r != 0)
    return r;
  r = pthread_cond_init (&g->cv, NULL);
  if (r != 0)
    pthread_mutex_destroy (&g->lock);
  return r;
}

void
flush_group_destroy (struct flush_group *g)
{
  pthread_cond_destroy (&g->cv);
  pthread_mutex_destroy (&g->lock);
}

/* Answer every flush of a pass (group lock held). */
static void
flush_group_answer (struct flush_group *g, struct flush_waiter *w,
                    uint64_t gen, int err)
{
  while (w != NULL) {
    struct flush_waiter *next = w->next;
    /* Queued before the pass began, never after. */
    assert (w->gen <= gen);
    w->err = err;
    w->done = true;             /* w may go away once the lock is dropped */
    g->nr_flushes++;
    w = next;
  }
}

/* Lead one pass for every flush queued now, me among them (group lock
 * held on entry and return, dropped across the pass). */
static void
flush_group_lead (struct flush_group *g, int (*pass) (void *), void *arg)
{
  struct flush_waiter *group = g->queue;
  uint64_t gen = ++g->started;

  g->queue = NULL;
  g->nr_queued = 0;
  g->running = true;
  g->nr_passes++;
  unlock_or_die (&g->lock);
  int err = pass (arg);
  lock_or_die (&g->lock);
  flush_group_answer (g, group, gen, err);
  g->running = false;
  /* The answered ones return; of the queued, one leads the next pass. */
  pthread_cond_broadcast (&g->cv);
}

int
flush_group_run (struct flush_group *g, int (*pass) (void *), void *arg)
{
  struct flush_waiter me = { .done = false };

  lock_or_die (&g->lock);
  me.gen = g->started + 1;      /* any pass running now started before me */
  me.next = g->queue;
  // cppcheck-suppress autoVariables ; dequeued before me.done, which we wait for
  g->queue = &me;
  g->nr_queued++;
  while (!me.done) {
    if (!g->running)
      flush_group_lead (g, pass, arg);
    else if (pthread_cond_wait (&g->cv, &g->lock) != 0)
      abort ();                 /* only a bug makes it fail */
  }
  unlock_or_die (&g->lock);
  if (me.err) {
    errno = me.err;
    return -1;
  }
  return 0;
}

void
flush_group_stats (struct flush_group *g, uint64_t *waiting,
                   uint64_t *flushes, uint64_t *passes)
{
  lock_or_die (&g->lock);
  *waiting = g->nr_queued;
  *flushes = g->nr_flushes;
  *passes = g->nr_passes;
  unlock_or_die (&g->lock);
}
