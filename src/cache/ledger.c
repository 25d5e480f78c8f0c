/* The durability ledger: the promise "what a FLUSH, FUA or persistent
 * reply reported durable stays durable, or every later FLUSH fails until
 * an operator decides" is kept here, and only here.  The rest of the
 * cache reports facts and asks questions (ledger.h); the bottom of the
 * cache: it calls nothing of the cache's.
 *
 * Facts come from the cache (a write is on its way, ended; a flush
 * began, failed, succeeded) and from the backing, which decides nothing
 * and reports only what the cache cannot see: the events after which
 * what it acknowledged may be gone or overwritten (backing_ops.loss_epoch:
 * an nbd connection ended, an rbd write ended after it was abandoned),
 * the writes it abandoned (backing_stats.writes_in_doubt), and the loss
 * of its image (backing_ops.owner_lost).  Whether its writes are lost
 * without a flush at all is a capability (BACKING_VOLATILE: a file, a
 * remote), not a rule.  The ledger turns them into one epoch of its own,
 * the rewrite epoch, moved once for each loss:
 *
 * - a backing event taken in while anything was unflushed (a write sent
 *   or on its way since the last good flush, a flush under way, unstable
 *   blocks, passthrough writes): taken in before any loss view is read
 *   and before any flush settles, so a write sent after the event (on a
 *   new connection) is never counted in an older view;
 * - a backing flush, or a FUA write, that failed after writes were sent
 *   since the last good flush (before it, or while it was under way).
 *   This is the only failed-flush rule: no backing counts a failed flush
 *   or FUA op as a loss fact of its own (the file backing's "any failed
 *   fdatasync", the rbd backing's "a failed flush with unflushed writes"
 *   and the nbdkit filter's were private copies of it).  Linux marks the pages of a failed
 *   fdatasync clean and reports the error once, so a remote over a file
 *   (nbdkit, qemu-nbd) answers the next flush with success though it
 *   dropped the data.  Not one refused for writes in doubt, which were
 *   there as it began and still are: the backing refuses flush and FUA
 *   then without sending them, and the clear moves the epoch anyway.  A
 *   doubt that began while it was out excuses nothing;
 * - the operator's clear-doubt (counted in forgiven as well).
 *
 * A durable answer: a remote over a file serves two durable ops (flush,
 * FUA) at once on one open file; one's fdatasync fails and drops every
 * page not yet on disk, the other's, beside it, answers success (the
 * error is reported once, to the first), and the two answers may reach
 * the cache in either order.  So a success counts only once every
 * durable op that began before it was answered has answered too, none
 * of them having failed since it began (ledger_durable_end waits for
 * them, bounded by their own timeouts); else it is a failure (EIO), and
 * its blocks stay dirty.  A backing that already answers so
 * (BACKING_SYNC_FINAL: the file backing) is not waited for.
 *
 * When the epoch moved since the last good flush, the cached (unstable)
 * blocks are written again before a flush succeeds.  The loss view is
 * the epoch less forgiven: a passthrough write (direct I/O, zero; the
 * cache has no copy) is lost when the view moved after it was sent and
 * before a flush succeeded.  clear-doubt is the operator's word that no
 * abandoned write landed over newer ones: it has cached blocks written
 * again (cheap, and safe either way), but loses no passthrough write.
 * A passthrough loss fails every FLUSH from then on, across a restart
 * (a persistent store records it), until the operator's clear-doubt
 * says the loss is known. */
#include <errno.h>

#include "cache/cache-int.h"
#include "foliod/util.h"

static uint64_t
backing_events (struct cache *c)
{
  return c->b->ops->loss_epoch ? c->b->ops->loss_epoch (c->b) : 0;
}

/* Could a loss now take anything the backing acknowledged? */
static bool
anything_unflushed (struct cache *c)
{
  struct ledger *l = &c->led;

  return atomic_load (&l->sending) > 0 ||
         atomic_load (&l->backing_unflushed) ||
         atomic_load (&l->flush_sent) ||
         atomic_load (&l->passthrough_unflushed) > 0 ||
         STAT_GET (c, unstable_bytes) > 0;
}

/* A loss: the epoch moves (facts_lock held). */
static void
epoch_move_locked (struct cache *c)
{
  atomic_fetch_add (&c->led.epoch, 1);
}

/* Take in the backing's loss events since the last look: one move of the
 * epoch for all of them, if anything could be lost.  The move comes
 * before facts_seen, so a reader that finds nothing new also finds the
 * move (the fast path takes no lock). */
static void
take_facts (struct cache *c)
{
  struct ledger *l = &c->led;
  uint64_t now = backing_events (c);

  if (atomic_load (&l->facts_seen) == now)
    return;
  lock_or_die (&l->facts_lock);
  now = backing_events (c);
  if (atomic_load (&l->facts_seen) != now) {
    if (anything_unflushed (c))
      epoch_move_locked (c);
    atomic_store (&l->facts_seen, now);
  }
  unlock_or_die (&l->facts_lock);
}

/* The rule for a failed flush or FUA write: a loss when writes were sent
 * since the last good flush (sent), unless it was refused for writes in
 * doubt (refused_for_doubt). */
static void
failed_durable (struct cache *c, bool sent)
{
  struct ledger *l = &c->led;

  if (!sent)
    return;
  lock_or_die (&l->facts_lock);
  epoch_move_locked (c);
  unlock_or_die (&l->facts_lock);
}

/* A flush or FUA op that failed was refused for writes in doubt, not sent
 * (the backing refuses both unsent while it has any, the ledger while a
 * previous run left some): when the doubt was there as it began and is
 * still there.  A doubt that began while it was out (a write abandoned
 * meanwhile) excuses nothing: it was sent, and its failure may have
 * dropped writes, which the operator's clear-doubt does not forgive. */
static bool
refused_for_doubt (struct cache *c, bool doubt_at_begin)
{
  return doubt_at_begin && ledger_doubt (c) > 0;
}

/* A durable op (flush, FUA) goes to the backing. */
static void
ledger_durable_begin (struct cache *c, struct ledger_durable *d)
{
  struct ledger *l = &c->led;

  d->on = (c->b->caps & BACKING_VOLATILE) &&
          !(c->b->caps & BACKING_SYNC_FINAL);
  if (!d->on)
    return;
  lock_or_die (&l->durable_lock);
  d->ticket = ++l->durable_tickets;
  d->failures = l->durable_failures;
  d->next = NULL;
  d->prev = l->durable_tail;
  if (l->durable_tail)
    l->durable_tail->next = d;
  else
    l->durable_head = d;
  l->durable_tail = d;
  unlock_or_die (&l->durable_lock);
}

/* Its answer r (failed: a failure that counts, see failed_durable's
 * callers): r, or -1 with EIO when it succeeded but a durable op that
 * overlapped it failed (the file comment's "A durable answer").  Waits
 * for the ops that began before this answer came. */
static int
ledger_durable_end (struct cache *c, struct ledger_durable *d, int r,
                    bool failed)
{
  struct ledger *l = &c->led;
  int err = errno;

  if (!d->on)
    return r;
  d->on = false;
  lock_or_die (&l->durable_lock);
  if (d->prev)
    d->prev->next = d->next;
  else
    l->durable_head = d->next;
  if (d->next)
    d->next->prev = d->prev;
  else
    l->durable_tail = d->prev;
  if (failed)
    l->durable_failures++;
  pthread_cond_broadcast (&l->durable_cv);
  if (r == 0) {
    uint64_t last = l->durable_tickets;
    while (l->durable_head && l->durable_head->ticket <= last)
      cond_wait_ms (&l->durable_cv, &l->durable_lock, 1000);
    if (l->durable_failures != d->failures) {
      r = -1;
      err = EIO;
    }
  }
  unlock_or_die (&l->durable_lock);
  errno = err;
  return r;
}

static uint64_t
rewrite_epoch (struct cache *c)
{
  take_facts (c);
  return atomic_load (&c->led.epoch);
}

static uint64_t
loss_view (struct cache *c)
{
  /* The epoch first: cache_clear_doubt counts its move as forgiven
   * before it makes it, so a clear under way makes the view lower, never
   * higher (a write sent meanwhile counts as older: lost sooner). */
  uint64_t e = rewrite_epoch (c);
  return e - atomic_load (&c->led.forgiven);
}

uint64_t
ledger_backing_doubt (struct cache *c)
{
  struct backing_stats st = { 0 };

  if (c->b->ops->stats == NULL)
    return 0;
  c->b->ops->stats (c->b, &st);
  return st.writes_in_doubt;
}

uint64_t
ledger_doubt (struct cache *c)
{
  return ledger_backing_doubt (c) + atomic_load (&c->led.doubt_inherited);
}

int
ledger_flush_refused (struct cache *c)
{
  return atomic_load (&c->led.doubt_inherited) > 0 ||
         atomic_load (&c->led.fence_inherited) ? EIO : 0;
}

/* One writer per image (issue 33 item 5).  A backing that lost its image
 * (its lock broken and its client blocklisted after a stall; the image
 * resized, or its lock feature disabled, by another client) reports it
 * (backing_owner_lost); from then on nothing may be acknowledged that
 * the image would have to keep, and nothing served that it may no longer
 * hold.  The store records it, durably, the first time the fact is seen,
 * so that a restarted foliod (a new client, not blocklisted) never writes
 * the dirty data of the lost run over the next owner's without the
 * operator's word (cache_clear_doubt).  True when fenced. */
static bool
fence_now (struct cache *c)
{
  struct ledger *l = &c->led;

  if (atomic_load (&l->fence_inherited))
    return true;
  if (backing_owner_lost (c->b) == NULL)
    return false;
  if (!atomic_load (&l->fence_stored)) {
    lock_or_die (&l->doubt_lock);
    if (!atomic_load (&l->fence_stored) &&
        store_set_fenced (c->store, true) == 0)
      atomic_store (&l->fence_stored, true);
    unlock_or_die (&l->doubt_lock);
  }
  return true;
}

int
ledger_io_refused (struct cache *c)
{
  if (!fence_now (c))
    return 0;
  errno = EIO;
  return -1;
}

int
ledger_durable_refused (struct cache *c)
{
  if (fence_now (c))
    return EIO;
  if (backing_owner_confirm (c->b) == -1) {
    int err = errno;
    return fence_now (c) ? EIO : err;
  }
  return 0;
}

void
ledger_store_fenced (struct cache *c, bool fenced)
{
  atomic_store (&c->led.fence_inherited, fenced);
  atomic_store (&c->led.fence_stored, fenced);
}

/* Doubt outlives the process (issue 33 item 3): a restart that wrote the
 * recovered store back and flushed it would have the abandoned write
 * land over it.  Once the backing reports a write in doubt, the store
 * says so, durably, before the failed request is answered.  If the store
 * cannot, its sync failure is sticky (ledger_store_sync_failed's path). */
static void
doubt_persist (struct cache *c)
{
  struct ledger *l = &c->led;

  if (atomic_load (&l->doubt_stored) || ledger_backing_doubt (c) == 0)
    return;
  lock_or_die (&l->doubt_lock);
  if (!atomic_load (&l->doubt_stored) &&
      store_set_doubt (c->store, true) == 0)
    atomic_store (&l->doubt_stored, true);
  unlock_or_die (&l->doubt_lock);
}

/* The store forgets the doubt (doubt_lock held): when neither the backing
 * nor a previous run has any left.  A write abandoned meanwhile, whose
 * doubt_persist found the flag still set, is put back at once. */
static void
doubt_forget_locked (struct cache *c)
{
  struct ledger *l = &c->led;

  if (!atomic_load (&l->doubt_stored) || ledger_doubt (c) > 0 ||
      store_set_doubt (c->store, false) != 0)
    return;
  atomic_store (&l->doubt_stored, false);
  if (ledger_backing_doubt (c) > 0 && store_set_doubt (c->store, true) == 0)
    atomic_store (&l->doubt_stored, true);
}

/* A passthrough loss outlives the process too: a restart that answered
 * FLUSH with success would report the older data the backing holds as
 * the client's.  The store records it, durably, before the FLUSH that
 * reports it (ledger_flush_error) and as soon as it is found. */
static void
pt_lost_persist (struct cache *c)
{
  struct ledger *l = &c->led;

  lock_or_die (&l->doubt_lock);
  if (atomic_load (&l->passthrough_lost) &&
      !atomic_load (&l->pt_lost_stored) &&
      store_set_pt_lost (c->store, true) == 0)
    atomic_store (&l->pt_lost_stored, true);
  unlock_or_die (&l->doubt_lock);
}

/* Found lost (pt_lock held): n more writes. */
static void
pt_lost_locked (struct cache *c, uint64_t n)
{
  atomic_fetch_add (&c->led.passthrough_lost_writes, n);
  atomic_store (&c->led.passthrough_lost, true);
}

/* The operator's word (wb_mutex held): the writes counted lost are known
 * lost.  The store forgets last, and not when a passthrough write was
 * lost again meanwhile.  How many were counted. */
static uint64_t
pt_lost_clear (struct cache *c)
{
  struct ledger *l = &c->led;

  lock_or_die (&l->pt_lock);
  bool was = atomic_exchange (&l->passthrough_lost, false);
  uint64_t n = atomic_exchange (&l->passthrough_lost_writes, 0);
  unlock_or_die (&l->pt_lock);
  if (!was)
    return 0;
  lock_or_die (&l->doubt_lock);
  if (!atomic_load (&l->passthrough_lost) &&
      atomic_load (&l->pt_lost_stored) &&
      store_set_pt_lost (c->store, false) == 0)
    atomic_store (&l->pt_lost_stored, false);
  unlock_or_die (&l->doubt_lock);
  return n;
}

void
ledger_store_pt_lost (struct cache *c, bool lost)
{
  atomic_store (&c->led.passthrough_lost, lost);
  atomic_store (&c->led.passthrough_lost_writes, lost ? 1 : 0);
  atomic_store (&c->led.pt_lost_stored, lost);
}

void
ledger_store_opened (struct cache *c, bool doubt)
{
  atomic_store (&c->led.doubt_inherited, doubt ? 1 : 0);
  atomic_store (&c->led.doubt_stored, doubt);
}

void
ledger_init (struct cache *c)
{
  c->led.pt_view = UINT64_MAX;
  atomic_store (&c->led.facts_seen, backing_events (c));
}

int
ledger_send_begin (struct cache *c, struct ledger_send *ls, unsigned flags)
{
  ls->flags = flags;
  ls->doubt = ledger_doubt (c) > 0;
  ls->d.on = false;
  if (flags & BACKING_FUA) {
    if (ledger_flush_refused (c)) {
      errno = ledger_flush_refused (c);
      return -1;
    }
    if (ledger_io_refused (c) == -1)
      return -1;
    ledger_durable_begin (c, &ls->d);
    return 0;
  }
  atomic_fetch_add (&c->led.sending, 1);
  atomic_store (&c->led.backing_unflushed, true);
  /* Fenced: nothing reaches an image that is no longer ours (end still
   * counts the send as ended). */
  return ledger_io_refused (c);
}

int
ledger_send_end (struct cache *c, struct ledger_send *ls, int r)
{
  struct ledger *l = &c->led;
  int err = errno;

  if (!(ls->flags & BACKING_FUA)) {
    /* Again: a flush that began while it was on its way does not cover
     * it.  Then no longer on its way. */
    atomic_store (&l->backing_unflushed, true);
    atomic_fetch_sub (&l->sending, 1);
  }
  else {
    bool failed = r == -1 && (c->b->caps & BACKING_VOLATILE) &&
                  !refused_for_doubt (c, ls->doubt);
    if (failed)
      failed_durable (c, anything_unflushed (c));
    r = ledger_durable_end (c, &ls->d, r, failed);
    err = r == -1 ? errno : err;
  }
  if (r == -1)
    doubt_persist (c);
  errno = err;
  return r;
}

uint64_t
ledger_passthrough_view (struct cache *c)
{
  return loss_view (c);
}

/* Counted after its answer came: a loss settled (ledger_lost) between
 * its send and now did not count it, though the remote that acknowledged
 * it may be the one that was lost (a restart met by a flush on another
 * connection while this answer was on its way: issue 33 item 2).  Such a
 * write is lost at once, as ledger_lost would have found it. */
bool
ledger_passthrough_written (struct cache *c, uint64_t view, bool counted,
                            bool unsynced)
{
  struct ledger *l = &c->led;
  bool lost = false;

  atomic_store (&l->backing_unflushed, true);
  if (unsynced)
    atomic_store (&l->passthrough_unsynced, true);
  if (!counted)
    return false;
  lock_or_die (&l->pt_lock);
  if (view < l->lost_view) {
    pt_lost_locked (c, 1);
    lost = true;
  }
  else {
    atomic_fetch_add (&l->passthrough_unflushed, 1);
    if (view < l->pt_view)
      l->pt_view = view;
  }
  unlock_or_die (&l->pt_lock);
  if (lost)
    pt_lost_persist (c);
  return lost;
}

void
ledger_write_failed (struct cache *c, int err)
{
  atomic_store (&c->led.wb_failing, err ? err : EIO);
}

void
ledger_write_ok (struct cache *c)
{
  atomic_store (&c->led.wb_failing, 0);
}

void
ledger_store_sync_failed (struct cache *c, int err)
{
  int none = 0;

  /* Sticky, as the store's: from now on allocations that find no
   * reusable slot fail (ledger_wb_error) instead of waiting for a sync
   * that will never succeed. */
  atomic_compare_exchange_strong (&c->led.store_failing, &none, err);
}

bool
ledger_flush_begin (struct cache *c, struct ledger_flush *lf, bool refused)
{
  struct ledger *l = &c->led;

  lf->d.on = false;
  lf->doubt = ledger_doubt (c) > 0;
  lf->passthrough = atomic_load (&l->passthrough_unflushed);
  bool unflushed = atomic_exchange (&l->backing_unflushed, false);
  lf->sent = unflushed || lf->passthrough > 0 ||
             STAT_GET (c, unstable_bytes) > 0;
  atomic_store (&l->flush_sent, lf->sent);
  bool needed = lf->sent || rewrite_epoch (c) != l->stable_epoch;
  if (needed && !refused)
    ledger_durable_begin (c, &lf->d);
  return needed;
}

int
ledger_flush_answer (struct cache *c, struct ledger_flush *lf, int r)
{
  bool failed = r == -1 && !refused_for_doubt (c, lf->doubt);

  /* failed_durable comes in ledger_flush_failed, after the wait: the
   * others' failures are counted as they answer. */
  return ledger_durable_end (c, &lf->d, r, failed);
}

bool
ledger_flush_failed (struct cache *c, const struct ledger_flush *lf, int err)
{
  struct ledger *l = &c->led;
  /* Writes sent before it began, and those sent or on their way while it
   * was under way: a failed fdatasync drops the pages whose writeback
   * failed, whoever wrote them.  Read before the mark below. */
  bool sent = lf->sent || anything_unflushed (c);

  /* Dirty at once: the blocks are rewritten even if no client flushes
   * again. */
  atomic_store (&l->backing_unflushed, true);
  atomic_store (&l->flush_refused, refused_for_doubt (c, lf->doubt));
  atomic_store (&l->flush_failing, err);
  doubt_persist (c);
  take_facts (c);
  failed_durable (c, sent && !refused_for_doubt (c, lf->doubt));
  atomic_store (&l->flush_sent, false);
  return rewrite_epoch (c) != l->stable_epoch;
}

bool
ledger_flush_ok (struct cache *c, const struct ledger_flush *lf)
{
  struct ledger *l = &c->led;

  atomic_store (&l->flush_failing, 0);
  /* Events before the answer count while the flush is still "sent". */
  uint64_t e = rewrite_epoch (c);
  atomic_store (&l->flush_sent, false);
  if (e != l->stable_epoch)
    return true;
  /* A doubt the backing ended by itself (rbd: librbd ended the abandoned
   * write, its end taken in above) is over once a flush settles what was
   * written since: a restart need not inherit it. */
  if (atomic_load (&l->doubt_stored)) {
    lock_or_die (&l->doubt_lock);
    doubt_forget_locked (c);
    unlock_or_die (&l->doubt_lock);
  }
  lock_or_die (&l->pt_lock);
  /* Later ones still count; their view is at least the lowest one's. */
  if (atomic_fetch_sub (&l->passthrough_unflushed, lf->passthrough) ==
      lf->passthrough)
    l->pt_view = UINT64_MAX;
  unlock_or_die (&l->pt_lock);
  return false;
}

bool
ledger_lost (struct cache *c)
{
  struct ledger *l = &c->led;
  bool lost = false;

  l->stable_epoch = rewrite_epoch (c);
  lock_or_die (&l->pt_lock);
  uint64_t n = atomic_load (&l->passthrough_unflushed);
  l->lost_view = loss_view (c);
  if (n > 0 && l->pt_view < l->lost_view) {
    atomic_store (&l->passthrough_unflushed, 0);
    l->pt_view = UINT64_MAX;
    pt_lost_locked (c, n);
    lost = true;
  }
  unlock_or_die (&l->pt_lock);
  if (lost)
    pt_lost_persist (c);
  return lost;
}

bool
ledger_pt_unsynced_take (struct cache *c)
{
  return atomic_exchange (&c->led.passthrough_unsynced, false);
}

void
ledger_pt_unsynced_keep (struct cache *c)
{
  atomic_store (&c->led.passthrough_unsynced, true);
}

int
ledger_flush_error (struct cache *c)
{
  struct ledger *l = &c->led;

  if (!atomic_load (&l->passthrough_lost))
    return 0;
  if (!atomic_load (&l->pt_lost_stored))   /* its first try failed */
    pt_lost_persist (c);
  return EIO;
}

int
ledger_wb_error (struct cache *c)
{
  struct ledger *l = &c->led;
  int err = atomic_load (&l->wb_failing);

  /* A flush refused for a doubt that has ended since (librbd ended the
   * write, or the operator's clear-doubt) fails nothing now: the next
   * flush may succeed, so room is worth waiting for. */
  if (err == 0 && (err = atomic_load (&l->flush_failing)) != 0 &&
      atomic_load (&l->flush_refused) && ledger_doubt (c) == 0)
    err = 0;
  return err ? err : atomic_load (&l->store_failing);
}

bool
ledger_fua_may_do (struct cache *c)
{
  struct ledger *l = &c->led;

  return !atomic_load (&l->backing_unflushed) &&
         atomic_load (&l->sending) == 0 &&
         ledger_flush_refused (c) == 0 &&
         STAT_GET (c, unstable_bytes) == 0 &&
         atomic_load (&l->passthrough_unflushed) == 0 &&
         rewrite_epoch (c) == l->stable_epoch;
}

/* The operator's clear-doubt: the epoch moves (cached blocks written
 * since the last good flush are written again), a move that loses no
 * passthrough write; then the backing forgets its writes in doubt.
 * Under wb_mutex, and the move before the backing's clear, so that no
 * flush finds the doubt gone and the epoch unmoved (issue 33 item 4a).
 * Passthrough writes counted lost are known lost from now on: FLUSH may
 * succeed again (the one word that ends such a loss, also one a
 * previous run left in the store). */
uint64_t
cache_clear_doubt (struct cache *c)
{
  struct ledger *l = &c->led;
  uint64_t n = 0;

  lock_or_die (&c->wb_mutex);
  if (ledger_doubt (c) > 0) {
    take_facts (c);             /* a loss before the clear stays one */
    atomic_fetch_add (&l->forgiven, 1);
    lock_or_die (&l->facts_lock);
    epoch_move_locked (c);
    unlock_or_die (&l->facts_lock);
    n = backing_clear_doubt (c->b) + atomic_exchange (&l->doubt_inherited, 0);
    /* The store forgets last: a crash before still finds the doubt.  Not
     * if a new write was abandoned meanwhile. */
    lock_or_die (&l->doubt_lock);
    doubt_forget_locked (c);
    unlock_or_die (&l->doubt_lock);
  }
  /* A previous run's fenced store: the operator's word that its dirty
   * data may be written over the image as the image is now.  Not a
   * fence of this run: its backing can no longer write the image. */
  if (atomic_load (&l->fence_inherited) && backing_owner_lost (c->b) == NULL) {
    atomic_store (&l->fence_inherited, false);
    n++;
    lock_or_die (&l->doubt_lock);
    if (atomic_load (&l->fence_stored) && store_set_fenced (c->store, false) == 0)
      atomic_store (&l->fence_stored, false);
    unlock_or_die (&l->doubt_lock);
  }
  n += pt_lost_clear (c);
  unlock_or_die (&c->wb_mutex);
  return n;
}

uint64_t
cache_clear_lost (struct cache *c)
{
  uint64_t n;

  lock_or_die (&c->wb_mutex);
  n = pt_lost_clear (c);
  unlock_or_die (&c->wb_mutex);
  return n;
}

void
ledger_get_stats (struct cache *c, struct cache_stats *s)
{
  struct ledger *l = &c->led;

  s->passthrough_unflushed = atomic_load (&l->passthrough_unflushed);
  s->passthrough_lost = atomic_load (&l->passthrough_lost_writes);
  s->flush_error = ledger_flush_error (c);
  s->writeback_error = ledger_wb_error (c);
  s->doubt_clears = atomic_load (&l->forgiven);
  s->writes_in_doubt = ledger_doubt (c);
  s->doubt_inherited = atomic_load (&l->doubt_inherited);
  s->losses = atomic_load (&l->epoch) - s->doubt_clears;
  s->fenced = fence_now (c);
  s->fence_reason = !s->fenced ? NULL
                    : atomic_load (&l->fence_inherited)
                    ? "a previous run lost the image while this store held "
                      "dirty data (a fenced store)"
                    : backing_owner_lost (c->b);
}
