/* The durability ledger: the promise "what a FLUSH, FUA or persistent
 * reply reported durable stays durable, or every later FLUSH fails until
 * an operator decides" is kept here, and only here.  The rest of the
 * cache reports facts and asks questions (ledger.h); the bottom of the
 * cache: it calls nothing of the cache's.
 *
 * Two epochs, both from the backing's loss epoch (backing_ops.loss_epoch)
 * and the ledger's own count of losses:
 *
 * - the rewrite epoch, backing + own_losses: when it moved since the last
 *   good flush, what the backing acknowledged since may be gone, and the
 *   cached (unstable) blocks are written again before a flush succeeds;
 * - the loss view, the rewrite epoch less the moves that were the
 *   operator's clear-doubt: a passthrough write (direct I/O, zero; the
 *   cache has no copy) is lost when the view moved after it was sent and
 *   before a flush succeeded.  clear-doubt is the operator's word that no
 *   abandoned write landed over newer ones: it has cached blocks written
 *   again (cheap, and safe either way), but loses no passthrough write.
 *
 * The cache's own rule, for every backing: a flush that fails after
 * writes were sent since the last good one is a loss.  Linux marks the
 * pages of a failed fdatasync clean and reports the error once, so a
 * remote over a file (nbdkit, qemu-nbd) answers the next flush with
 * success though it dropped the data; a backing need not say so.  Not
 * while the backing has writes in doubt: its flushes fail then without
 * being sent, and clearing the doubt moves the epoch anyway. */
#include <errno.h>

#include "cache/cache-int.h"

static uint64_t
backing_epoch (struct cache *c)
{
  return c->b->ops->loss_epoch ? c->b->ops->loss_epoch (c->b) : 0;
}

static uint64_t
rewrite_epoch (struct cache *c)
{
  return backing_epoch (c) + atomic_load (&c->led.own_losses);
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

static bool
backing_in_doubt (struct cache *c)
{
  struct backing_stats st = { 0 };

  if (c->b->ops->stats == NULL)
    return false;
  c->b->ops->stats (c->b, &st);
  return st.writes_in_doubt > 0;
}

void
ledger_init (struct cache *c)
{
  c->led.pt_view = UINT64_MAX;
  c->led.stable_epoch = backing_epoch (c);
}

void
ledger_backing_written (struct cache *c)
{
  atomic_store (&c->led.backing_unflushed, true);
}

uint64_t
ledger_passthrough_view (struct cache *c)
{
  return loss_view (c);
}

void
ledger_passthrough_written (struct cache *c, uint64_t view, bool counted,
                            bool unsynced)
{
  struct ledger *l = &c->led;

  atomic_store (&l->backing_unflushed, true);
  if (unsynced)
    atomic_store (&l->passthrough_unsynced, true);
  if (!counted)
    return;
  lock_or_die (&l->pt_lock);
  atomic_fetch_add (&l->passthrough_unflushed, 1);
  if (view < l->pt_view)
    l->pt_view = view;
  unlock_or_die (&l->pt_lock);
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
ledger_flush_begin (struct cache *c, struct ledger_flush *lf)
{
  struct ledger *l = &c->led;

  lf->passthrough = atomic_load (&l->passthrough_unflushed);
  bool unflushed = atomic_exchange (&l->backing_unflushed, false);
  lf->sent = unflushed || lf->passthrough > 0 ||
             STAT_GET (c, unstable_bytes) > 0;
  return lf->sent || rewrite_epoch (c) != l->stable_epoch;
}

bool
ledger_flush_failed (struct cache *c, const struct ledger_flush *lf, int err)
{
  struct ledger *l = &c->led;

  /* Dirty at once: the blocks are rewritten even if no client flushes
   * again. */
  atomic_store (&l->backing_unflushed, true);
  atomic_store (&l->flush_failing, err);
  if (lf->sent && !backing_in_doubt (c))
    atomic_fetch_add (&l->own_losses, 1);
  return rewrite_epoch (c) != l->stable_epoch;
}

bool
ledger_flush_ok (struct cache *c, const struct ledger_flush *lf)
{
  struct ledger *l = &c->led;

  atomic_store (&l->flush_failing, 0);
  if (rewrite_epoch (c) != l->stable_epoch)
    return true;
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
  if (n > 0 && l->pt_view < loss_view (c)) {
    atomic_store (&l->passthrough_unflushed, 0);
    l->pt_view = UINT64_MAX;
    atomic_fetch_add (&l->passthrough_lost_writes, n);
    atomic_store (&l->passthrough_lost, true);
    lost = true;
  }
  unlock_or_die (&l->pt_lock);
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
  return atomic_load (&c->led.passthrough_lost) ? EIO : 0;
}

int
ledger_wb_error (struct cache *c)
{
  struct ledger *l = &c->led;
  int err = atomic_load (&l->wb_failing);

  if (err == 0)
    err = atomic_load (&l->flush_failing);
  return err ? err : atomic_load (&l->store_failing);
}

bool
ledger_fua_may_do (struct cache *c)
{
  struct ledger *l = &c->led;

  return !atomic_load (&l->backing_unflushed) &&
         STAT_GET (c, unstable_bytes) == 0 &&
         atomic_load (&l->passthrough_unflushed) == 0 &&
         rewrite_epoch (c) == l->stable_epoch;
}

/* The operator's clear-doubt: the backing moves its loss epoch (cached
 * blocks written since the last good flush are written again); that move
 * loses no passthrough write.  Under wb_mutex, so that no flush settles
 * anything between the backing's clear and the move (issue 33 item
 * 4a, on the cache's side). */
uint64_t
cache_clear_doubt (struct cache *c)
{
  struct ledger *l = &c->led;

  lock_or_die (&c->wb_mutex);
  uint64_t before = backing_epoch (c);
  atomic_fetch_add (&l->forgiven, 1);
  uint64_t n = backing_clear_doubt (c->b);
  uint64_t moved = backing_epoch (c) - before;
  /* Forgive one move, the clear's own: another one meanwhile (a
   * reconnect) is a loss. */
  if (n == 0 || moved == 0)
    atomic_fetch_sub (&l->forgiven, 1);
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
}
