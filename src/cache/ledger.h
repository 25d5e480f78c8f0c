/* The durability ledger (ledger.c): the only code that holds and changes
 * what the cache promises about durability.  Others report facts (a
 * write reached the backing, a flush failed, a store sync failed, the
 * operator cleared the doubt); the ledger turns them into state (the
 * epoch the unstable blocks were flushed in, the passthrough writes that
 * are lost, what a FLUSH and writeback must answer).  See
 * docs/internals.md "Durability ledger". */
#ifndef FOLIOD_CACHE_LEDGER_H
#define FOLIOD_CACHE_LEDGER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

struct cache;

struct ledger {
  /* Errors now: the last writeback write (errno or 0), the last backing
   * flush (errno or 0), the store's sync (sticky, as the store's). */
  _Atomic int wb_failing, flush_failing, store_failing;
  /* The last backing flush failed only because writes were in doubt
   * (refused): it is no failure once no doubt is left (ledger_wb_error). */
  _Atomic bool flush_refused;
  /* The backing was written without FUA since its last flush. */
  _Atomic bool backing_unflushed;
  /* flush=store: a passthrough write or trim since the last backing
   * flush (the store's sync does not cover it). */
  _Atomic bool passthrough_unsynced;
  /* Passthrough writes and zeroes (not FUA) since the last good flush
   * that the backing may still lose, and the lowest loss view (see
   * ledger.c) one of them was sent in (UINT64_MAX: none).  pt_lock;
   * the count is read without it too. */
  pthread_mutex_t pt_lock;
  _Atomic uint64_t passthrough_unflushed;
  uint64_t pt_view;
  /* The loss view the last ledger_lost settled (pt_lock): a passthrough
   * write sent in an older view and counted only after that is lost. */
  uint64_t lost_view;
  /* The rewrite epoch: moved here only, once for each loss the ledger
   * finds (a fact that may have lost acknowledged writes, at a time
   * something was unflushed: see ledger.c), and by clear-doubt.  The
   * moves that were the operator's clear-doubt (not a loss of
   * passthrough writes) are counted in forgiven. */
  _Atomic uint64_t epoch, forgiven;
  /* The backing's count of loss facts (backing_ops.loss_epoch) the
   * ledger has taken in; facts_lock (a leaf) orders taking them in with
   * the epoch's move. */
  pthread_mutex_t facts_lock;
  _Atomic uint64_t facts_seen;
  /* Writes, zeroes and trims without FUA on their way to the backing
   * (ledger_send_begin .. _end), and "a flush is under way for writes
   * sent before it" (ledger_flush_begin .. its end): what a loss fact
   * may have taken with it besides backing_unflushed. */
  _Atomic uint64_t sending;
  _Atomic bool flush_sent;
  /* The epoch at the last good flush or loss: wb_mutex. */
  uint64_t stable_epoch;
  /* Writes in doubt a previous run left (the store said so at open), and
   * whether the store says "in doubt" now (store_set_doubt): doubt_lock,
   * a leaf above the store's locks; both read without it too. */
  pthread_mutex_t doubt_lock;
  _Atomic uint64_t doubt_inherited;
  _Atomic bool doubt_stored;
  /* Fenced (one writer per image): a previous run's store says its
   * dirty data was written under an image ownership that was lost
   * (inherited), and whether the store says so now (stored; doubt_lock
   * orders its writes).  The backing's own fact: backing_owner_lost. */
  _Atomic bool fence_inherited, fence_stored;
  /* Some passthrough writes were lost (this run, or a previous run's
   * store said so at open): every FLUSH fails until the operator's
   * clear-doubt.  Set and cleared under pt_lock, read without it; the
   * store records it (pt_lost_stored: doubt_lock orders its writes). */
  _Atomic bool passthrough_lost, pt_lost_stored;
  _Atomic uint64_t passthrough_lost_writes; /* how many (stats) */
  /* Flushes and FUA ops on their way to a backing without
   * BACKING_SYNC_FINAL, oldest first, the tickets given out and the
   * failures they answered (ledger_durable_end); durable_lock is a leaf,
   * durable_cv is signalled at each answer. */
  pthread_mutex_t durable_lock;
  pthread_cond_t durable_cv;
  struct ledger_durable *durable_head, *durable_tail;
  uint64_t durable_tickets, durable_failures;
};

/* A flush or FUA op on its way (see ledger.c, "A durable answer"). */
struct ledger_durable {
  struct ledger_durable *prev, *next;
  uint64_t ticket;          /* the order it began in */
  uint64_t failures;        /* durable_failures as it began */
  bool on;                  /* in the list: its answer is weighed */
};

/* A flush's view of the ledger, from ledger_flush_begin to its end. */
struct ledger_flush {
  uint64_t passthrough;   /* passthrough writes it may settle */
  bool sent;              /* writes were sent since the last good flush */
  bool doubt;             /* writes were in doubt as it began (refused) */
  struct ledger_durable d;
};

/* A write, zero or trim's, from ledger_send_begin to ledger_send_end. */
struct ledger_send {
  unsigned flags;         /* its backing flags */
  bool doubt;             /* writes were in doubt as it began: a FUA one
                           * is refused unsent */
  struct ledger_durable d;  /* a FUA one's */
};

/* cache_create (pt_lock is initialized with the cache's locks). */
void ledger_init (struct cache *c);

/* --- facts --- */
/* A write, zero or trim with backing flags is going to the backing (ls
 * is the caller's, filled by begin); then it ended with r (0 or -1).
 * begin refuses a FUA one (-1, EIO) while a previous run's writes are in
 * doubt; end is called either way.  A FUA one that failed may have
 * failed the backing's fdatasync, which drops other unflushed writes
 * too (a loss, unless it was refused for writes in doubt).  One that
 * failed may have been abandoned: the doubt is then made durable in the
 * store.  A FUA one that succeeded counts only if no durable op that
 * overlapped it failed (ledger.c, "A durable answer"): end returns r, or
 * -1 (EIO) then, and may wait for those ops' answers. */
int ledger_send_begin (struct cache *c, struct ledger_send *ls,
                       unsigned flags);
int ledger_send_end (struct cache *c, struct ledger_send *ls, int r);
/* The store was opened (cache_init_store): doubt a previous run left,
 * whether it left the store fenced, and passthrough writes it lost. */
void ledger_store_opened (struct cache *c, bool doubt);
void ledger_store_fenced (struct cache *c, bool fenced);
void ledger_store_pt_lost (struct cache *c, bool lost);
/* The loss view to give ledger_passthrough_written: read it before the
 * passthrough write is sent. */
uint64_t ledger_passthrough_view (struct cache *c);
/* A passthrough request without FUA succeeded (sent in view): counted
 * when the backing may lose it (counted), unsynced for flush=store
 * unless it was a trim.  True when it is lost already (a loss settled
 * since it was sent: the caller forgets clean copies of its range). */
bool ledger_passthrough_written (struct cache *c, uint64_t view,
                                 bool counted, bool unsynced);
/* A writeback write failed with err / succeeded. */
void ledger_write_failed (struct cache *c, int err);
void ledger_write_ok (struct cache *c);
/* The store's sync failed (err sticks). */
void ledger_store_sync_failed (struct cache *c, int err);
/* The backing's flush (wb_mutex held): begin says whether one is needed
 * at all (refused: it will not be sent, ledger_flush_refused); answer
 * weighs what the backing said, r (0 or -1), as ledger_send_end does a
 * FUA op's, and returns r or -1 (EIO); then exactly one of failed / ok.
 * Both return true when the backing may have lost what it acknowledged
 * since the last good flush (the caller then marks unstable blocks dirty
 * and calls ledger_lost). */
bool ledger_flush_begin (struct cache *c, struct ledger_flush *lf,
                         bool refused);
int ledger_flush_answer (struct cache *c, struct ledger_flush *lf, int r);
bool ledger_flush_failed (struct cache *c, const struct ledger_flush *lf,
                          int err);
bool ledger_flush_ok (struct cache *c, const struct ledger_flush *lf);
/* After such a loss (wb_mutex held): the new epoch is the stable one.
 * True when passthrough writes were lost by it (clean copies are then
 * to be forgotten). */
bool ledger_lost (struct cache *c);
/* flush=store: take the "passthrough unsynced" mark; put it back when
 * the backing's flush failed. */
bool ledger_pt_unsynced_take (struct cache *c);
void ledger_pt_unsynced_keep (struct cache *c);

/* --- queries --- */
/* Writes the backing abandoned and reports in doubt now. */
uint64_t ledger_backing_doubt (struct cache *c);
/* Those and the ones a previous run left (1 when it left any). */
uint64_t ledger_doubt (struct cache *c);
/* Why the backing's flush may not even be tried (EIO: a previous run
 * left writes in doubt), or 0. */
int ledger_flush_refused (struct cache *c);
/* Fenced (the backing lost its image, or a previous run's did): -1 with
 * errno EIO, else 0.  Reads and writes ask at their start: nothing is
 * served from or taken into a cache that may disagree with the image.
 * The first time it finds the backing's fact, the store records it. */
int ledger_io_refused (struct cache *c);
/* The same before a FLUSH or FUA is answered: the backing must also
 * confirm that it still owns the image (backing_owner_confirm: after a
 * stall that outlasted its lease it asks the cluster first).  0, or an
 * errno value. */
int ledger_durable_refused (struct cache *c);
/* What a FLUSH must answer whatever else happens: EIO when passthrough
 * writes were lost (the store records it first, if it could not yet),
 * else 0. */
int ledger_flush_error (struct cache *c);
/* Why writeback cannot make room now (a write, the backing flush or the
 * store's sync is failing), or 0. */
int ledger_wb_error (struct cache *c);
/* May a flush pass write with FUA and skip the backing flush (nothing
 * unflushed, no loss pending)? */
bool ledger_fua_may_do (struct cache *c);
/* Its part of cache_get_stats. */
void ledger_get_stats (struct cache *c, struct cache_stats *s);

#endif
