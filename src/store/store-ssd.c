/* The SSD log store (store=ssd:PATH): folio memory in RAM, as the ram
 * store, made durable by a write-back log on a file or a block device
 * (the layout: ssd-layout.h).  The shape of the journals that are fast on
 * SSDs (jbd2, dm-writecache's SSD mode, Ceph PWL's ssd mode): appended,
 * sequential, O_DIRECT, one device flush per group commit.
 *
 * What persist() names is only noted (STORE_DEFERRED):
 *  - data of a slot: its blocks are "wanted" in the log;
 *  - a slot's bitmap: if the set of blocks that must survive a crash
 *    (dirty or unstable) differs from what the log holds for the slot,
 *    the slot is queued.
 * sync() is the group commit: one commit at a time, and every sync()
 * that arrives while one runs shares the next.  A commit takes the queue
 * and collects its slots a few at a time (SSD_HOLD_BLOCKS blocks per
 * hold of the lock, which every client write's persist takes: the hold
 * is bounded whatever the cache's size), for each block deciding from
 * the bitmap as it is then: a block that must survive and is wanted (or
 * not in the log yet) gets a data record with its data as it is now in
 * RAM; a block the log holds that no longer must survive (written back
 * and flushed, or overwritten on the backing directly) gets a "clean"
 * record, so that recovery never writes an old version over the
 * backing.  A taken slot stays marked queued until collected, so a
 * persist meanwhile is in this commit, not the next.  Then the
 * batches go out in one or a few large sequential writes, and one device
 * flush (fdatasync) makes them durable.  Data is copied at commit time,
 * not at persist: repeated writes to a block between two FLUSHes cost
 * one record, and the log's memory is the cache's own.
 *
 * Slot reuse (may_reuse): a slot takes a new folio once the log holds
 * nothing live for its old one and the commit that said so is durable.
 *
 * Reclaim (see foliod.conf(5)): a record is dead once a newer one covers
 * its block, or its block no longer must survive (written back and the
 * backing flushed it: a clean record says so).  Every commit keeps room
 * in the log for a compaction (every live block once, ssd_compaction_max),
 * so that the next commit fits whatever it writes; one that would not
 * keep it reclaims first, in the same write: the log is cut into 64
 * segments, and the log's start moves past the oldest ones, their few
 * live blocks (those whose newest record lies there) copied forward with
 * the commit's records.  The reclaim takes no lock: the committer alone
 * changes what the log holds and where, so it chooses the cut, and finds
 * the copies as it writes the batches, without one (the cache's bits are
 * atomic; a slot the log holds blocks of keeps its folio).  Once the
 * batches are durable the superblock's
 * checkpoint moves (a second flush; a crash before it scans from the old
 * start, where the copies are newer).  Only when no start short of the
 * head keeps the room is the commit a compaction (every live block again:
 * the log restarts there).  The log must hold two compactions (the open
 * refuses a smaller one); a commit never fails for want of space: a full
 * log makes it slower (writers wait on their FLUSH), never fail.  Live
 * data is at most the cache's size, so the dirty thresholds of the cache
 * bound the log too.
 *
 * Recovery (open): the newer valid superblock (if the other copy is
 * damaged, this one may be a write behind: its clean flag and checkpoint
 * are not trusted, see super_suspect); after a clean stop nothing is
 * replayed.  Otherwise the batches from the checkpoint on (one pass,
 * read in large sequential pieces; the live blocks are then read back in
 * log order), while each header is sound and continues the sequence.  A
 * bad header ends the log (a torn tail, never flushed) unless the headers
 * after it show that a later commit followed it: then it is damage
 * (look_past).  The newest record of each block wins.  A block whose
 * data crc fails in the log's last commit is a torn write: that commit is
 * dropped whole (and its first header zeroed); anywhere else it is
 * damage.  Damage refuses the store, naming it, before anything is
 * written: the log is kept for the operator (foliod store inspect), and
 * never an older version comes back.  The folios that hold live blocks
 * go into slots (the log never holds more live folios than the cache has
 * slots: a slot is reused only when its old folio's records are dead and
 * durable), dirty.  Every open starts a new epoch in the superblock,
 * above every epoch the scan met, before the first new
 * batch: leftovers after the recovered end never continue the log. */
#define _GNU_SOURCE
#include <assert.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"

#define WBUF_BYTES (4u << 20)   /* the commit's write buffer */

struct recovered;

struct store_ssd {
  struct store s;   /* first: the base */
  struct ssd_dev *dev;
  const char *path;
  char *path_buf;
  unsigned char *data;
  size_t data_len;
  uint64_t *bitmaps;
  uint32_t bpf, bs, mwords;      /* blocks per folio, block size, mask words */
  /* per slot, the cache's writes into its memory (write_begin, write_end):
   * a commit's copy of a block is whole when no write began or ran
   * meanwhile (a sequence count, as a seqlock's) */
  _Atomic uint32_t *wbegun, *wended;

  pthread_mutex_t mu;            /* everything below; never held over I/O */
  pthread_cond_t cv;
  /* per slot */
  uint64_t *log_folio;           /* the folio the log's records name */
  uint64_t *logged;              /* mwords each: live in the log (or in
                                  * the commit under way) */
  uint64_t *want;                /* mwords each: data persisted since */
  uint32_t *nlogged;
  uint64_t *slot_commit;         /* the commit that last wrote for it */
  bool *queued;
  uint32_t *queue, nqueue;
  uint32_t *taken;               /* the committer's: the queue it took */
  /* commits */
  bool running;
  uint64_t started, done;        /* commits begun, and durable */
  int err;                       /* sticky */
  /* the log (lsn: offsets in the endless log) */
  struct ssd_super sb;
  int sb_cur;
  bool sb_dirty;                 /* the superblock says clean: unsay it */
  uint64_t head, next_seq, flushed;
  uint64_t cmax;                 /* ssd_compaction_max */
  unsigned char *wbuf;
  /* reclaim (the committer's: p->running) */
  uint64_t *rec_lsn;             /* slot * bpf + block: the batch of the
                                  * block's newest data record */
  uint64_t seg;                  /* segment bytes */
  uint32_t nseg;
  struct segstart { uint64_t lsn, seq; } *segs;   /* the first batch of
                                  * segment k (lsn / seg) at k % nseg */
  uint64_t *seg_live;            /* scratch: live blocks per segment */
  /* what open found */
  bool formatted, was_clean;
  bool was_doubt;               /* SSD_FLAG_DOUBT at open */
  bool was_fenced;              /* SSD_FLAG_FENCED at open */
  bool was_pt_lost;             /* SSD_FLAG_PT_LOST at open */
  bool sb_suspect;               /* one superblock copy damaged: the other
                                  * may be one write behind */
  uint64_t epoch_floor;          /* the scan's first batch: at least this */
  uint64_t scan_limit;           /* the scan ends before this lsn */
  uint64_t seen_epoch;           /* the highest epoch the scan met */
  struct recovered *rec;
  struct ssd_stats st;           /* the committer's (p->running) */
  struct store_stats pub;        /* under mu: what stats reads */
};

#define SS(s) ((struct store_ssd *) (s))

static bool
mtest (const uint64_t *m, uint32_t b)
{
  return m[b / 64] & (1ull << (b % 64));
}

static void
mset (uint64_t *m, uint32_t b, bool on)
{
  if (on)
    m[b / 64] |= 1ull << (b % 64);
  else
    m[b / 64] &= ~(1ull << (b % 64));
}

/* The cache changes the words under its stripe, while a commit reads
 * them: relaxed atomic loads (folio.c's stores are too). */
static bool
plane_test (const uint64_t *bits, uint32_t bpf, int plane, uint32_t b)
{
  uint32_t i = (uint32_t) plane * bpf + b;
  return __atomic_load_n (&bits[i / 64], __ATOMIC_RELAXED) &
         (1ull << (i % 64));
}

/* Must block b of the slot survive a crash (dirty or unstable)? */
static bool
block_live (struct store_ssd *p, uint32_t slot, uint32_t b)
{
  const uint64_t *bits = p->bitmaps + (size_t) slot * p->s.bitmap_words;
  return plane_test (bits, p->bpf, FP_DIRTY, b) ||
         plane_test (bits, p->bpf, FP_UNSTABLE, b);
}

static void *
ssd_data (struct store *s, uint32_t slot)
{
  return SS (s)->data + (size_t) slot * s->folio_size;
}

static uint64_t *
ssd_bitmap (struct store *s, uint32_t slot)
{
  return SS (s)->bitmaps + (size_t) slot * s->bitmap_words;
}

/* The slots [*a, *b] that [ptr, ptr+len) of slot memory covers; false:
 * none (not slot memory). */
static bool
slots_of (struct store_ssd *p, const void *ptr, size_t len, uint32_t *a,
          uint32_t *b)
{
  const unsigned char *c = ptr;

  if (len == 0 || c < p->data || c >= p->data + p->data_len)
    return false;
  *a = (uint32_t) ((size_t) (c - p->data) / p->s.folio_size);
  *b = (uint32_t) ((size_t) (c - p->data + len - 1) / p->s.folio_size);
  if (*b >= p->s.nslots)
    *b = p->s.nslots - 1;
  return true;
}

/* One more write into the slots of [ptr, ptr+len) begun (or ended). */
static void
count_writes (struct store *s, void *ptr, size_t len, bool end)
{
  struct store_ssd *p = SS (s);
  uint32_t a, b;

  if (!slots_of (p, ptr, len, &a, &b))
    return;
  /* A beginning comes before the data changes (acquire: no store after
   * it moves before it); block_copy reads the count with a read-modify-
   * write after its copy, so either it comes first in the count's order
   * (and its copy before any of the change) or it sees the count moved.
   * An end comes after them (release). */
  for (uint32_t i = a; i <= b; i++)
    atomic_fetch_add_explicit (end ? &p->wended[i] : &p->wbegun[i], 1,
                               end ? memory_order_release
                                   : memory_order_acq_rel);
}

static void
ssd_write_begin (struct store *s, void *ptr, size_t len)
{
  count_writes (s, ptr, len, false);
}

static void
ssd_write_end (struct store *s, void *ptr, size_t len)
{
  count_writes (s, ptr, len, true);
}

/* The words of a block, each read once (not memcpy: no byte of a word
 * torn, and no call TSan intercepts).  TSan does not instrument it: the
 * reads race with the cache's writes on purpose (a seqlock's read side;
 * block_copy keeps only a copy no write overlapped). */
#if defined __has_attribute
#if __has_attribute (no_sanitize)
__attribute__ ((no_sanitize ("thread")))
#endif
#endif
static void
copy_words (uint64_t *dst, const uint64_t *src, size_t n)
{
  for (size_t i = 0; i < n; i++)
    dst[i] = __atomic_load_n (&src[i], __ATOMIC_RELAXED);
}

/* Copy block b of slot into d as one version the cache wrote whole: a
 * copy that a write into the slot began or ran over is read again
 * (writers hold a folio a block's copy at a time: they leave gaps). */
static void
block_copy (struct store_ssd *p, uint32_t slot, uint32_t b, unsigned char *d)
{
  const unsigned char *src = p->data + (size_t) slot * p->s.folio_size +
                             (size_t) b * p->bs;

  for (;;) {
    uint32_t e0 = atomic_load_explicit (&p->wended[slot],
                                        memory_order_acquire);
    uint32_t b0 = atomic_load_explicit (&p->wbegun[slot],
                                        memory_order_relaxed);
    if (b0 == e0) {             /* no write under way */
      copy_words ((uint64_t *) d, (const uint64_t *) src, p->bs / 8);
      if (atomic_fetch_add_explicit (&p->wbegun[slot], 0,
                                     memory_order_acq_rel) == b0)
        return;
    }
    p->st.recopies++;
    sched_yield ();
  }
}

static void
queue_slot (struct store_ssd *p, uint32_t slot)
{
  if (!p->queued[slot]) {
    p->queued[slot] = true;
    p->queue[p->nqueue++] = slot;
  }
}

static void
ssd_set_index (struct store *s, uint32_t slot, uint64_t folio_index)
{
  struct store_ssd *p = SS (s);

  pthread_mutex_lock (&p->mu);
  if (folio_index != STORE_NO_FOLIO) {
    /* may_reuse allowed it: nothing of the old folio is live. */
    p->log_folio[slot] = folio_index;
    memset (p->want + (size_t) slot * p->mwords, 0, p->mwords * 8);
  }
  pthread_mutex_unlock (&p->mu);
}

static int
ssd_persist (struct store *s, const void *ptr, size_t len)
{
  struct store_ssd *p = SS (s);
  const unsigned char *c = ptr;

  if (len == 0)
    return 0;
  pthread_mutex_lock (&p->mu);
  if (c >= p->data && c < p->data + p->data_len) {
    size_t off = (size_t) (c - p->data);
    uint32_t slot = (uint32_t) (off / s->folio_size);
    uint32_t b0 = (uint32_t) (off % s->folio_size / p->bs);
    uint32_t b1 = (uint32_t) ((off % s->folio_size + len - 1) / p->bs);
    uint64_t *w = p->want + (size_t) slot * p->mwords;
    for (uint32_t b = b0; b <= b1 && b < p->bpf; b++)
      mset (w, b, true);
    queue_slot (p, slot);
  } else {
    size_t off = (size_t) ((const uint64_t *) ptr - p->bitmaps);
    uint32_t slot = (uint32_t) (off / s->bitmap_words);
    const uint64_t *lg = p->logged + (size_t) slot * p->mwords;
    for (uint32_t b = 0; b < p->bpf; b++)
      if (block_live (p, slot, b) != mtest (lg, b)) {
        queue_slot (p, slot);
        break;
      }
  }
  pthread_mutex_unlock (&p->mu);
  return 0;
}

static bool
ssd_may_reuse (struct store *s, uint32_t slot)
{
  struct store_ssd *p = SS (s);
  bool r;

  pthread_mutex_lock (&p->mu);
  r = p->nlogged[slot] == 0 && p->slot_commit[slot] <= p->done;
  /* A queued slot only if it would log nothing, and not while a commit
   * runs: it may be one the commit took and has yet to collect, which
   * would log the new folio's data in this commit, and the clean records
   * of the slot that folio left (collected already) in the next one,
   * after its data: recovery would then drop the data. */
  if (r && p->queued[slot])
    r = !p->running;
  if (r && p->queued[slot])
    for (uint32_t b = 0; b < p->bpf && r; b++)
      r = !block_live (p, slot, b);
  pthread_mutex_unlock (&p->mu);
  return r;
}

/* --- the commit --- */

struct pend {
  uint64_t folio;
  uint32_t slot, block;
  bool clean;
};

struct plist {
  struct pend *v;
  size_t n, cap;
};

/* Room for extra more entries in l.  0, or -1 (out of memory: l as it
 * was). */
static int
plist_reserve (struct plist *l, size_t extra)
{
  if (l->v != NULL && l->n + extra <= l->cap)
    return 0;
  size_t cap = l->cap ? 2 * l->cap : 1024;
  while (cap < l->n + extra)
    cap *= 2;
  struct pend *v = realloc (l->v, cap * sizeof *v);
  if (v == NULL)
    return -1;
  l->v = v;
  l->cap = cap;
  return 0;
}

/* Under mu: the records slot needs now, into room plist_reserve made
 * (bpf entries in each list).  A live block gets a data record when it
 * was written since or is not in the log yet; a block the log holds
 * that no longer must survive gets a clean one.
 * Clean records go to cl, data records to dl: a commit writes every clean
 * record before any data record, because a folio evicted from one slot
 * may be in another already, written again, and the old slot's clean
 * records must not follow the new slot's data. */
static void
collect_slot (struct store_ssd *p, uint32_t slot, struct plist *cl,
              struct plist *dl)
{
  const uint64_t *lg = p->logged + (size_t) slot * p->mwords;
  const uint64_t *w = p->want + (size_t) slot * p->mwords;
  uint64_t fi = p->log_folio[slot];

  for (uint32_t b = 0; b < p->bpf; b++) {
    bool live = block_live (p, slot, b), in = mtest (lg, b);
    if (live && (mtest (w, b) || !in))
      dl->v[dl->n++] = (struct pend) { fi, slot, b, false };
    else if (!live && in)
      cl->v[cl->n++] = (struct pend) { fi, slot, b, true };
  }
}

/* Under mu, the records of commit in l from index from on: the log's
 * view of their slots as if they were written (a data record: the block
 * is in the log; a clean one: no longer). */
static void
note_records (struct store_ssd *p, const struct plist *l, size_t from,
              uint64_t commit)
{
  for (size_t i = from; i < l->n; i++) {
    const struct pend *e = &l->v[i];
    uint64_t *lg = p->logged + (size_t) e->slot * p->mwords;
    if (mtest (lg, e->block) == e->clean) {
      mset (lg, e->block, !e->clean);
      p->nlogged[e->slot] += e->clean ? (uint32_t) -1 : 1;
    }
    p->slot_commit[e->slot] = commit;
  }
}

/* The bytes a batch of n entries with nd data blocks takes. */
static uint64_t
batch_bytes (const struct store_ssd *p, uint32_t nd)
{
  uint64_t d = (uint64_t) nd * p->bs;
  return SSD_ALIGN + (d + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
}

static uint32_t
batch_data_max (const struct store_ssd *p)
{
  uint32_t per = SSD_BATCH_DATA / p->bs;
  if (per > SSD_ENTRIES)
    per = SSD_ENTRIES;
  return per ? per : 1;
}

/* The batch at lsn, sequence seq, was written (or found by recovery):
 * the first one of its segment is where a reclaim may move the log's
 * start to. */
static void
note_seg (struct store_ssd *p, uint64_t lsn, uint64_t seq)
{
  uint64_t k = lsn / p->seg;
  struct segstart *e = &p->segs[k % p->nseg];

  if (e->lsn / p->seg != k || e->lsn > lsn)
    *e = (struct segstart) { lsn, seq };
}

/* The bytes n data records take at most (their headers, and a clean
 * record's header for each, and the jump at the ring's end). */
static uint64_t
records_bytes (const struct store_ssd *p, uint64_t n)
{
  uint32_t per = batch_data_max (p);
  return n * p->bs + (n + per - 1) / per * 2 * SSD_ALIGN +
         batch_bytes (p, per);
}

/* When a commit of est bytes would leave less free log than a
 * compaction needs (the room every commit keeps, so that the next one
 * fits whatever it writes): where the log's start moves to.  Segment by
 * segment from the oldest, the live blocks whose newest record lies
 * before the new start are copied forward (few: most of an old segment
 * was overwritten or written back since); the first start that leaves a
 * quarter of the spare room free, else the first that keeps the room,
 * else (*compact) every live block again and the log starts there.
 * Without mu (the committer's, p->running): it reads what only the
 * committer changes (what the log holds, and where) and the cache's bits
 * (atomic), and counts every block the log holds, live or not, so that a
 * block that turns live before its copy is written was counted too. */
static void
choose_cut (struct store_ssd *p, uint64_t est, uint64_t *cut, uint64_t *tail,
            uint64_t *tail_seq, bool *compact)
{
  uint64_t C = p->sb.log_bytes, t = p->sb.tail_lsn;
  uint64_t room = C - p->cmax, good = room - (room - p->cmax) / 4;
  uint64_t copies = 0;
  bool ok = false;

  memset (p->seg_live, 0, p->nseg * sizeof *p->seg_live);
  for (uint32_t s = 0; s < p->s.nslots; s++) {
    if (p->nlogged[s] == 0)
      continue;
    const uint64_t *lg = p->logged + (size_t) s * p->mwords;
    const uint64_t *rl = p->rec_lsn + (size_t) s * p->bpf;
    for (uint32_t b = 0; b < p->bpf; b++)
      if (mtest (lg, b))
        p->seg_live[(rl[b] >= t ? rl[b] : t) / p->seg % p->nseg]++;
  }
  *compact = false;
  for (uint64_t k = t / p->seg + 1; k <= p->head / p->seg; k++) {
    const struct segstart *e = &p->segs[k % p->nseg];
    copies += p->seg_live[(k - 1) % p->nseg];
    if (e->lsn / p->seg != k || e->lsn <= t || e->lsn > p->head)
      continue;                 /* no batch starts there (yet) */
    uint64_t used = p->head + records_bytes (p, copies) + est - e->lsn;
    if (used <= room && !ok) {
      ok = true;
      *cut = *tail = e->lsn;
      *tail_seq = e->seq;
    }
    if (used <= good) {
      *cut = *tail = e->lsn;
      *tail_seq = e->seq;
      return;
    }
  }
  if (!ok) {
    *compact = true;
    *cut = UINT64_MAX;
  }
}

/* The records of a commit in the order they are written: the clean
 * ones, the data ones, then a reclaim's copies.  The copies are found as
 * the batches are written, with no list and no lock: every block the log
 * holds whose newest record lies before copy_cut and that must survive
 * now.  What the log holds, and where, only the committer changes; a
 * slot whose blocks the log holds keeps its folio (may_reuse); the
 * cache's bits are read atomically. */
struct rsrc {
  const struct plist *cl, *dl;
  size_t i;                     /* the next of cl, then of dl */
  uint64_t copy_cut;            /* 0: no copies */
  uint32_t slot, block;         /* the copies' cursor */
};

static bool
rsrc_next (struct store_ssd *p, struct rsrc *r, struct pend *out)
{
  if (r->i < r->cl->n) {
    *out = r->cl->v[r->i++];
    return true;
  }
  if (r->i < r->cl->n + r->dl->n) {
    *out = r->dl->v[r->i++ - r->cl->n];
    return true;
  }
  if (r->copy_cut == 0)
    return false;
  for (; r->slot < p->s.nslots; r->slot++, r->block = 0) {
    if (p->nlogged[r->slot] == 0)
      continue;
    const uint64_t *lg = p->logged + (size_t) r->slot * p->mwords;
    const uint64_t *rl = p->rec_lsn + (size_t) r->slot * p->bpf;
    while (r->block < p->bpf) {
      uint32_t b = r->block++;
      if (mtest (lg, b) && rl[b] < r->copy_cut && block_live (p, r->slot, b)) {
        *out = (struct pend) { p->log_folio[r->slot], r->slot, b, false };
        return true;
      }
    }
  }
  return false;
}

/* The batches of src's records appended at p->head: written in runs as
 * large as the buffer, never across the end of the ring.  Not flushed.
 * *first: the first batch's lsn (unchanged when there is none). */
static int
write_batches (struct store_ssd *p, struct rsrc *src, bool compact,
               uint64_t *first)
{
  uint64_t C = p->sb.log_bytes;
  uint64_t run_lsn = p->head;   /* where wbuf[0] goes */
  size_t used = 0;
  uint32_t dmax = batch_data_max (p);
  struct pend v[SSD_ENTRIES], next;
  bool have = rsrc_next (p, src, &next), first_batch = true;

  while (have) {
    /* The next batch: up to SSD_ENTRIES entries, dmax data blocks. */
    size_t j = 0;
    uint32_t nd = 0;
    while (have && j < SSD_ENTRIES && (next.clean || nd < dmax)) {
      nd += !next.clean;
      v[j++] = next;
      have = rsrc_next (p, src, &next);
    }
    uint64_t len = batch_bytes (p, nd);
    uint64_t lsn = run_lsn + used;
    /* A run is one write: it ends at the ring's end and when full. */
    if (lsn % C + len > C || (used > 0 && lsn % C == 0) ||
        used + len > WBUF_BYTES) {
      if (used > 0 &&
          p->dev->ops->pwrite (p->dev, p->wbuf, used,
                               p->sb.log_off + run_lsn % C) == -1)
        return -1;
      run_lsn += used;
      used = 0;
      if (run_lsn % C + len > C)
        run_lsn += C - run_lsn % C;   /* the next lap */
      lsn = run_lsn;
    }
    if (first_batch)
      *first = lsn;
    note_seg (p, lsn, p->next_seq);
    /* Never over the log's start (commit keeps room: see its check). */
    assert (lsn + len <= p->sb.tail_lsn + C);
    struct ssd_batch *h = (struct ssd_batch *) (p->wbuf + used);
    struct ssd_entry *e = ssd_batch_entries (h);
    unsigned char *d = p->wbuf + used + SSD_ALIGN;
    memset (h, 0, SSD_ALIGN);
    memcpy (h->magic, SSD_BATCH_MAGIC, sizeof h->magic);
    memcpy (h->uuid, p->sb.uuid, sizeof h->uuid);
    h->seq = p->next_seq++;
    h->epoch = p->sb.epoch;
    h->lsn = lsn;
    h->flushed_lsn = p->flushed;
    h->nentries = (uint32_t) j;
    h->ndata = nd;
    if (compact)
      h->flags = (first_batch ? SSD_BATCH_FIRST : 0) |
                 (!have ? SSD_BATCH_LAST : 0);
    first_batch = false;
    for (size_t k = 0; k < j; k++, e++) {
      e->folio = v[k].folio;
      e->block = v[k].block;
      if (v[k].clean) {
        e->flags = SSD_ENT_CLEAN;
        continue;
      }
      /* The block as it is now, a version a writer wrote whole (one may
       * be changing it: its own persist queued it again). */
      block_copy (p, v[k].slot, v[k].block, d);
      e->crc = ssd_data_crc (d, p->bs);
      p->rec_lsn[(size_t) v[k].slot * p->bpf + v[k].block] = lsn;
      d += p->bs;
    }
    memset (d, 0, (size_t) (p->wbuf + used + len - d));
    h->crc = ssd_batch_crc (h);
    /* Its copy in the next sector: one damaged sector of the log's last
     * commit, which no later header proves flushed, is not taken for a
     * torn write (header_at). */
    memcpy ((unsigned char *) h + SSD_HEADER_BYTES, h, SSD_HEADER_BYTES);
    used += len;
    p->st.batches++;
    p->st.records += j;
  }
  if (used > 0 &&
      p->dev->ops->pwrite (p->dev, p->wbuf, used,
                           p->sb.log_off + run_lsn % C) == -1)
    return -1;
  p->head = run_lsn + used;
  return 0;
}

static uint64_t
now_ns (void)
{
  struct timespec t;
  clock_gettime (CLOCK_MONOTONIC, &t);
  return (uint64_t) t.tv_sec * 1000000000u + (uint64_t) t.tv_nsec;
}

/* The log and its counters change outside mu, by the one committer
 * (p->running): it publishes them, mu held, when it is done. */
static void
publish_stats (struct store_ssd *p)
{
  p->pub.log_used = p->head - p->sb.tail_lsn;
  p->pub.log_bytes = p->sb.log_bytes;
  p->pub.records = p->st.records;
  p->pub.syncs = p->st.syncs;
  p->pub.sync_ns = p->st.sync_ns_total;
  p->pub.reclaims = p->st.reclaims;
  p->pub.reclaimed_bytes = p->st.reclaimed;
  p->pub.compactions = p->st.compactions;
}

/* The slots a commit looks at per hold of mu (SSD_HOLD_BLOCKS). */
static uint32_t
hold_slots (const struct store_ssd *p)
{
  uint32_t n = SSD_HOLD_BLOCKS / p->bpf;
  return n ? n : 1;
}

/* The records of the taken slots tq[0, n), into cl and dl, a few slots
 * per hold of mu: persist, which every client write calls, waits for
 * it.  A slot stays marked queued until its hold: a persist before that
 * needs no new entry, since the collection comes after it.  Returns the
 * slots collected: fewer than n when out of memory (the others go back
 * into the queue, as they were). */
static uint32_t
collect_taken (struct store_ssd *p, const uint32_t *tq, uint32_t n,
               struct plist *cl, struct plist *dl, uint64_t me)
{
  uint32_t k = 0;

  while (k < n) {
    uint32_t m = n - k < hold_slots (p) ? n - k : hold_slots (p);
    if (plist_reserve (cl, (size_t) m * p->bpf) == -1 ||
        plist_reserve (dl, (size_t) m * p->bpf) == -1)
      break;
    pthread_mutex_lock (&p->mu);
    size_t c0 = cl->n, d0 = dl->n;
    for (uint32_t i = k; i < k + m; i++) {
      uint32_t s = tq[i];
      collect_slot (p, s, cl, dl);
      p->queued[s] = false;
      memset (p->want + (size_t) s * p->mwords, 0, p->mwords * 8);
    }
    note_records (p, cl, c0, me);
    note_records (p, dl, d0, me);
    if (m > p->st.hold_slots_max)
      p->st.hold_slots_max = m;
    pthread_mutex_unlock (&p->mu);
    k += m;
  }
  if (k < n) {
    pthread_mutex_lock (&p->mu);
    for (uint32_t i = k; i < n; i++)    /* still marked queued */
      p->queue[p->nqueue++] = tq[i];
    pthread_mutex_unlock (&p->mu);
  }
  return k;
}

/* One commit (only one runs at a time: p->running).  0 or -1/errno;
 * *retry: it ran out of memory (what it collected before is written),
 * and the next one may succeed. */
static int
commit (struct store_ssd *p, uint64_t me, bool *retry)
{
  struct plist cl = { 0 }, dl = { 0 };
  bool compact = false, sb_dirty;
  uint64_t t0 = now_ns (), start;
  uint64_t old_tail = p->sb.tail_lsn;
  uint64_t cut = 0, tail = old_tail, tail_seq = p->sb.tail_seq;
  uint32_t n, *tq;
  int r = 0;

  /* The queue, taken whole (its slots stay marked queued). */
  pthread_mutex_lock (&p->mu);
  n = p->nqueue;
  tq = p->queue;
  p->queue = p->taken;
  p->taken = tq;
  p->nqueue = 0;
  pthread_mutex_unlock (&p->mu);
  bool short_of_memory = collect_taken (p, tq, n, &cl, &dl, me) < n;
  if (short_of_memory && cl.n + dl.n == 0) {
    free (cl.v);
    free (dl.v);
    *retry = true;
    errno = ENOMEM;
    return -1;                  /* nothing changed */
  }
  /* Will they fit, leaving room for a compaction?  If not, the reclaim's
   * cut (outside mu: choose_cut) and its copies (write_batches) take no
   * lock. */
  uint64_t est = records_bytes (p, cl.n + dl.n);
  if ((p->head - p->sb.tail_lsn) + est > p->sb.log_bytes - p->cmax)
    choose_cut (p, est, &cut, &tail, &tail_seq, &compact);
  /* After a clean stop the superblock says "replay nothing": it says
   * otherwise before the first record counts. */
  pthread_mutex_lock (&p->mu);
  sb_dirty = p->sb_dirty && (cl.n + dl.n > 0 || cut > 0);
  if (sb_dirty)
    p->sb_dirty = false;
  pthread_mutex_unlock (&p->mu);
  if (cl.n + dl.n == 0 && cut == 0) {
    free (cl.v);
    free (dl.v);
    return 0;                   /* nothing was persisted since */
  }
  if (sb_dirty) {               /* the same flush covers both */
    p->sb.flags &= ~SSD_FLAG_CLEAN;
    if (ssd_super_write (p->dev, &p->sb, &p->sb_cur) == -1)
      goto fail;
  }
  start = p->head;
  uint64_t start_seq = p->next_seq;
  /* A reclaim copies what lies before its cut; a compaction every block
   * the log holds from before this commit. */
  struct rsrc src = { &cl, &dl, 0, cut == 0 ? 0 : compact ? start : cut,
                      0, 0 };
  if (write_batches (p, &src, compact, &start) == -1 ||
      p->dev->ops->flush (p->dev) == -1)
    goto fail;
  p->flushed = p->head;
  if (compact) {
    /* Every live block is in the log from start on: the log begins there. */
    tail = start;
    tail_seq = start_seq;
    p->st.compactions++;
  }
  if (cut > 0) {
    /* Every live block with a record before tail has a newer one now,
     * durable: the checkpoint moves the log's start (a crash before it
     * is durable scans from the old start: the copies are newer). */
    p->sb.tail_lsn = tail;
    p->sb.tail_seq = tail_seq;
    if (ssd_super_write (p->dev, &p->sb, &p->sb_cur) == -1 ||
        p->dev->ops->flush (p->dev) == -1)
      goto fail;
    p->st.reclaims++;
    p->st.reclaimed += tail - old_tail;
  }
  free (cl.v);
  free (dl.v);
  uint64_t dt = now_ns () - t0;
  p->st.syncs++;
  p->st.sync_ns_total += dt;
  if (dt > p->st.sync_ns_max)
    p->st.sync_ns_max = dt;
  if (short_of_memory) {        /* the rest waits in the queue */
    *retry = true;
    errno = ENOMEM;
    return -1;
  }
  return 0;

 fail:
  r = errno;
  free (cl.v);
  free (dl.v);
  errno = r;
  return -1;
}

static int
ssd_sync (struct store *s)
{
  struct store_ssd *p = SS (s);
  int err;

  pthread_mutex_lock (&p->mu);
  /* The commit that takes what was persisted until now: the one under
   * way (or the last) if the queue is empty (it took everything when it
   * began), else the next.  A FLUSH that follows its writes closely
   * waits for the commit that took them, not for one more. */
  uint64_t need = p->started + (p->nqueue > 0);
  while (p->done < need && p->err == 0) {
    if (p->running) {
      pthread_cond_wait (&p->cv, &p->mu);
      continue;
    }
    p->running = true;
    uint64_t me = ++p->started;
    bool retry = false;
    pthread_mutex_unlock (&p->mu);
    int r = commit (p, me, &retry), e = errno;
    pthread_mutex_lock (&p->mu);
    p->running = false;
    publish_stats (p);
    if (r == 0)
      p->done = me;
    else if (!retry)
      p->err = e ? e : EIO;
    pthread_cond_broadcast (&p->cv);
    if (retry) {                /* this FLUSH fails; the next may not */
      pthread_mutex_unlock (&p->mu);
      errno = e;
      return -1;
    }
  }
  err = p->err;
  pthread_mutex_unlock (&p->mu);
  if (err) {
    errno = err;
    return -1;
  }
  return 0;
}

/* Write the superblock between commits: super_exclusive waits for the
 * commit under way and keeps others out; super_write_end writes p->sb,
 * flushes it, and lets commits run again (clean: the next commit must
 * say "not clean" first; both: into both copies, one after the other,
 * each flushed).  Its result: 0, or -1/errno (sticky). */
static void
super_exclusive (struct store_ssd *p)
{
  pthread_mutex_lock (&p->mu);
  while (p->running)
    pthread_cond_wait (&p->cv, &p->mu);
  p->running = true;
  pthread_mutex_unlock (&p->mu);
}

static int
super_write_end (struct store_ssd *p, bool clean, bool both)
{
  int r = 0;

  for (int i = 0; r == 0 && i < (both ? 2 : 1); i++) {
    r = ssd_super_write (p->dev, &p->sb, &p->sb_cur);
    if (r == 0)
      r = p->dev->ops->flush (p->dev);
  }
  int e = errno;
  pthread_mutex_lock (&p->mu);
  p->running = false;
  if (clean) {
    publish_stats (p);
    p->sb_dirty = true;
  }
  if (r == -1 && p->err == 0)
    p->err = e;
  pthread_cond_broadcast (&p->cv);
  pthread_mutex_unlock (&p->mu);
  errno = e;
  return r;
}

static int
ssd_mark_clean (struct store *s)
{
  struct store_ssd *p = SS (s);

  /* Everything was written back and the backing flushed: nothing in the
   * log is live, and the checkpoint says so.  The commit first is not
   * needed for that, and its failure does not stop it: a store whose
   * log failed (an fdatasync: sticky) lacks what was persisted since
   * and holds older versions of those blocks, which the next start
   * would write back over the backing's newer data unless the log is
   * retired here (issue 33 item 14). */
  (void) ssd_sync (s);
  super_exclusive (p);          /* no commit meanwhile */
  p->sb.flags |= SSD_FLAG_CLEAN;
  p->sb.tail_lsn = p->head;
  p->sb.tail_seq = p->next_seq;
  return super_write_end (p, true, false);
}

void
store_ssd_get_stats (struct store *s, struct ssd_stats *out)
{
  struct store_ssd *p = SS (s);

  pthread_mutex_lock (&p->mu);
  while (p->running)
    pthread_cond_wait (&p->cv, &p->mu);
  *out = p->st;
  pthread_mutex_unlock (&p->mu);
}

static void
ssd_stats_op (struct store *s, struct store_stats *out)
{
  struct store_ssd *p = SS (s);

  pthread_mutex_lock (&p->mu);
  *out = p->pub;
  pthread_mutex_unlock (&p->mu);
}

static void
ssd_info (struct store *s, struct store_info *out)
{
  struct store_ssd *p = SS (s);

  out->granularity = "log";
  out->mechanism = "log write, fdatasync";
  out->formatted = p->formatted;
  out->was_clean = p->was_clean;
  out->doubt = p->was_doubt;
  out->fenced = p->was_fenced;
  out->pt_lost = p->was_pt_lost;
}

/* A flag of the ledger's in the superblock (writes in doubt, fenced,
 * passthrough writes lost): written as a checkpoint is, with no commit
 * meanwhile (as ssd_mark_clean), but into both copies: one damaged
 * sector of the newer copy would otherwise give back the older one,
 * without the fact (every later superblock write carries it). */
static int
ssd_set_flag (struct store *s, uint32_t flag, bool on)
{
  struct store_ssd *p = SS (s);

  super_exclusive (p);
  if (on)
    p->sb.flags |= flag;
  else
    p->sb.flags &= ~flag;
  return super_write_end (p, false, true);
}

static int
ssd_set_doubt (struct store *s, bool doubt)
{
  return ssd_set_flag (s, SSD_FLAG_DOUBT, doubt);
}

static int
ssd_set_fenced (struct store *s, bool fenced)
{
  return ssd_set_flag (s, SSD_FLAG_FENCED, fenced);
}

static int
ssd_set_pt_lost (struct store *s, bool lost)
{
  return ssd_set_flag (s, SSD_FLAG_PT_LOST, lost);
}

/* --- recovery --- */

enum rstate { R_NONE, R_DATA, R_CLEAN, R_LOST };

struct rblock {
  uint64_t pos;     /* R_DATA: the data's byte offset on the device */
  uint64_t lsn;     /* R_DATA: its batch */
  uint32_t crc;
  uint8_t state;
  bool bad;         /* the newest record's data crc failed: damage, unless
                     * the scan drops its commit as a torn write */
};

struct rfolio {
  uint64_t folio;
  struct rblock *b;             /* NULL: a free entry; &gone: a folio
                                 * whose blocks are all clean again */
  uint32_t nkeep;               /* blocks whose newest record is data */
};

/* What the scan found: folios by index (open addressing).  A folio only
 * while the log holds data of it: one whose every block was cleaned
 * since gives its blocks back (memory follows the live folios, not every
 * folio the log ever named). */
struct recovered {
  struct rfolio *t;
  size_t cap, n, used;          /* n: with blocks; used: and gone ones */
  uint64_t lost_blocks, batches, records;
  uint64_t lost_batches;        /* headers unreadable where the log was
                                 * flushed past them: their blocks unknown */
  uint64_t lost_lsn;            /* the first of them */
  uint64_t end_lsn, end_seq;
  /* The commit being read: its batches share epoch and flushed_lsn (the
   * head when it began); c_bad: one of its data records failed. */
  uint64_t c_epoch, c_flushed, c_lsn;
  bool c_bad;
  /* the compaction being read, and the last complete one */
  bool in_comp, comp_sound, comp_found;
  uint64_t comp_lsn, comp_seq, found_lsn, found_seq;
};

static uint64_t
hash64 (uint64_t v)
{
  v ^= v >> 33;
  v *= 0xff51afd7ed558ccdull;
  v ^= v >> 33;
  return v;
}

static struct rblock gone;      /* see struct rfolio */

static bool
has_blocks (const struct rfolio *f)
{
  return f->b != NULL && f->b != &gone;
}

/* The entry of folio (with blocks or gone), or NULL. */
static struct rfolio *
rec_find (struct recovered *r, uint64_t folio)
{
  if (r->cap == 0)
    return NULL;
  size_t h = hash64 (folio) & (r->cap - 1);
  while (r->t[h].b && r->t[h].folio != folio)
    h = (h + 1) & (r->cap - 1);
  return r->t[h].b ? &r->t[h] : NULL;
}

static struct rfolio *
rec_get (struct recovered *r, uint64_t folio, uint32_t bpf)
{
  struct rfolio *f = rec_find (r, folio);

  if (f == NULL && 2 * (r->used + 1) > r->cap) {
    /* Rehashed without the gone entries: sized by the folios that
     * have blocks. */
    size_t cap = 1024;
    while (cap < 4 * (r->n + 1))
      cap *= 2;
    struct rfolio *t = calloc (cap, sizeof *t);
    if (t == NULL)
      return NULL;
    for (size_t i = 0; i < r->cap; i++)
      if (has_blocks (&r->t[i])) {
        size_t h = hash64 (r->t[i].folio) & (cap - 1);
        while (t[h].b)
          h = (h + 1) & (cap - 1);
        t[h] = r->t[i];
      }
    free (r->t);
    r->t = t;
    r->cap = cap;
    r->used = r->n;
  }
  if (f == NULL) {
    size_t h = hash64 (folio) & (r->cap - 1);
    while (r->t[h].b)
      h = (h + 1) & (r->cap - 1);
    f = &r->t[h];
    *f = (struct rfolio) { folio, NULL, 0 };
    r->used++;
  }
  if (!has_blocks (f)) {
    struct rblock *b = calloc (bpf, sizeof *b);
    if (b == NULL) {
      f->b = &gone;             /* probes go on past it */
      return NULL;
    }
    f->b = b;
    f->nkeep = 0;
    r->n++;
  }
  return f;
}

/* Block b of f was data (or failed its crc) before a record, and is
 * (now): the folio's count follows, and a folio with nothing kept gives
 * its blocks back. */
static void
rec_keep (struct recovered *r, struct rfolio *f, bool before, bool now)
{
  f->nkeep += (uint32_t) now - (uint32_t) before;
  if (f->nkeep == 0) {
    free (f->b);
    f->b = &gone;
    r->n--;
  }
}

static void
rec_free (struct recovered *r)
{
  if (r == NULL)
    return;
  for (size_t i = 0; i < r->cap; i++)
    if (has_blocks (&r->t[i]))
      free (r->t[i].b);
  free (r->t);
  free (r);
}

/* Is the header at lsn one of this log's batches, written there, in an
 * epoch from epoch_min to the store's?  (*h read.) */
static bool
header_sound (const struct store_ssd *p, const struct ssd_batch *h,
              uint64_t lsn, uint64_t epoch_min)
{
  uint64_t C = p->sb.log_bytes;

  return memcmp (h->magic, SSD_BATCH_MAGIC, sizeof h->magic) == 0 &&
         memcmp (h->uuid, p->sb.uuid, sizeof h->uuid) == 0 &&
         h->lsn == lsn && h->epoch >= epoch_min &&
         h->epoch <= p->sb.epoch && h->nentries <= SSD_ENTRIES &&
         h->ndata <= h->nentries &&
         lsn % C + batch_bytes (p, h->ndata) <= C &&
         h->crc == ssd_batch_crc (h);
}

/* The log read in large sequential pieces (O_DIRECT reads no ahead):
 * at recovery a full log of 1 GiB is read in about the time the disk
 * takes to stream it, not at a device round trip per batch. */
#define READ_CHUNK (8u << 20)

struct reader {
  unsigned char *buf;
  uint64_t off, len;        /* device bytes [off, off + len) in buf */
};

/* Device bytes [off, off + len) (len <= READ_CHUNK - SSD_ALIGN), reading on from off
 * up to want_end (at least off + len; within the device) when they are
 * not in the buffer.  NULL on an I/O error. */
static const unsigned char *
reader_get (struct store_ssd *p, struct reader *rd, uint64_t off,
            uint64_t len, uint64_t want_end)
{
  if (off >= rd->off && off + len <= rd->off + rd->len)
    return rd->buf + (off - rd->off);
  uint64_t start = off / SSD_ALIGN * SSD_ALIGN;   /* O_DIRECT */
  uint64_t e = want_end > off + len ? want_end : off + len;
  e = (e + SSD_ALIGN - 1) / SSD_ALIGN * SSD_ALIGN;
  if (e - start > READ_CHUNK)
    e = start + READ_CHUNK;
  assert (off + len <= e);
  if (p->dev->ops->pread (p->dev, rd->buf, e - start, start) == -1)
    return NULL;
  rd->off = start;
  rd->len = e - start;
  return rd->buf + (off - start);
}

/* Of the 4 KiB header block blk at lsn: the sound copy of its header
 * (the first sector, else its copy in the second) with sequence seq
 * (ANY_SEQ: any), or NULL.  Both copies are written in one write: one
 * damaged sector leaves the other; a torn write may leave either. */
#define ANY_SEQ UINT64_MAX

static const struct ssd_batch *
header_copy (const struct store_ssd *p, const unsigned char *blk,
             uint64_t lsn, uint64_t epoch_min, uint64_t seq)
{
  for (int i = 0; i < 2; i++) {
    const struct ssd_batch *h = (const struct ssd_batch *)
      (blk + (size_t) i * SSD_HEADER_BYTES);
    if (header_sound (p, h, lsn, epoch_min) && (seq == ANY_SEQ || h->seq == seq))
      return h;
  }
  return NULL;
}

/* The header at lsn (sequence seq, or ANY_SEQ) if a copy of it is sound
 * (1), else 0; -1 on an I/O error. */
static int
header_at (struct store_ssd *p, struct reader *rd, uint64_t lsn,
           uint64_t epoch_min, uint64_t seq, const struct ssd_batch **h)
{
  uint64_t C = p->sb.log_bytes;

  if (lsn - p->sb.tail_lsn >= C)
    return 0;                   /* a lap past the log's start */
  const unsigned char *blk = reader_get (p, rd, p->sb.log_off + lsn % C,
                                         SSD_ALIGN, p->sb.log_off + C);
  if (blk == NULL)
    return -1;
  *h = header_copy (p, blk, lsn, epoch_min, seq);
  return *h != NULL;
}

/* The batch that continues the log at lsn with sequence seq: there, or
 * at the next lap if it did not fit.  1 with *at and *h, 0, -1. */
static int
next_batch (struct store_ssd *p, struct reader *rd, uint64_t lsn,
            uint64_t seq, uint64_t epoch_min, uint64_t *at,
            const struct ssd_batch **h)
{
  uint64_t C = p->sb.log_bytes;

  for (int tries = 0; tries < 2; tries++) {
    if (tries == 1) {
      if (lsn % C == 0)
        break;
      lsn += C - lsn % C;
    }
    int r = header_at (p, rd, lsn, epoch_min, seq, h);
    if (r == -1)
      return -1;
    if (r == 1) {
      *at = lsn;
      return 1;
    }
  }
  return 0;
}

/* Nothing continues the log at lsn (seq expected).  A torn write ends
 * the log there; damage does not: the batch after a flushed one starts
 * at most one batch further on (or at the next lap), and some header
 * from there on says the log was flushed past lsn (a later commit).
 * 1 with *next the batch after the unreadable one, 0: the end, -1. */
static int
look_past (struct store_ssd *p, struct reader *rd, uint64_t lsn,
           uint64_t seq, uint64_t epoch_min, uint64_t *next)
{
  uint64_t C = p->sb.log_bytes, reach = batch_bytes (p, batch_data_max (p));
  uint64_t base[2] = { lsn, lsn + (lsn % C ? C - lsn % C : 0) };
  const struct ssd_batch *h;

  for (int k = 0; k < (lsn % C ? 2 : 1); k++)
    for (uint64_t d = SSD_ALIGN; d <= reach; d += SSD_ALIGN) {
      uint64_t at = base[k] + d, w, ws = seq + 1;
      if (base[k] % C + d >= C)     /* the next lap: its start only */
        at = base[k] + C - base[k] % C;
      int r = header_at (p, rd, at, epoch_min, ws, &h);
      if (r == -1)
        return -1;
      if (r == 0) {
        if (at != base[k] + d)
          break;
        continue;
      }
      /* A batch after the unreadable one: does the log go on past it? */
      for (w = at; r == 1; ws++) {
        if (h->flushed_lsn > lsn) {
          *next = at;
          return 1;
        }
        r = next_batch (p, rd, w + batch_bytes (p, h->ndata), ws + 1,
                        h->epoch, &w, &h);
      }
      return r;                 /* one commit, torn: the end (or -1) */
    }
  return 0;
}

/* One superblock copy is damaged and the other may be a write behind:
 * the checkpoint it lost may have moved the log's start, and the next
 * lap written over the old start.  The log starts at the first batch
 * from the old start on that is still where its lsn says (the next lap
 * writes over the oldest first: every batch after it is in place too).
 * 1 with *lsn and *seq, 0: none, -1. */
static int
find_start (struct store_ssd *p, struct reader *rd, uint64_t epoch_min,
            uint64_t *lsn, uint64_t *seq)
{
  const struct ssd_batch *h;

  for (uint64_t at = *lsn; at - p->sb.tail_lsn < p->sb.log_bytes;
       at += SSD_ALIGN) {
    int r = header_at (p, rd, at, epoch_min, ANY_SEQ, &h);
    if (r != 0) {
      if (r == 1) {
        *lsn = at;
        *seq = h->seq;
      }
      return r;
    }
  }
  return 0;
}

/* Walk the log from the checkpoint: fn for each batch (its header and
 * data), up to p->scan_limit.  Returns the number of batches, *end and
 * *end_seq where the log goes on, *lost the unreadable headers it found
 * flushed and went past; -1 on an I/O error or fn's. */
typedef int scan_fn (struct store_ssd *p, const struct ssd_batch *h,
                     const unsigned char *data, void *arg);

static int64_t
scan (struct store_ssd *p, struct reader *rd, scan_fn *fn, void *arg,
      uint64_t *end, uint64_t *end_seq, uint64_t *lost, uint64_t *lost_lsn)
{
  uint64_t C = p->sb.log_bytes, lsn = p->sb.tail_lsn, seq = p->sb.tail_seq;
  uint64_t epoch = p->epoch_floor, at = 0, next = 0;
  const struct ssd_batch *h;
  int64_t n = 0;
  int r;

  while (lsn - p->sb.tail_lsn < C && lsn < p->scan_limit) {
    r = next_batch (p, rd, lsn, seq, epoch, &at, &h);
    if (r == 0 && n == 0 && p->sb_suspect) {
      /* Taken for a moved start, not for damage: the checkpoint the
       * damaged copy held is the likelier loss than a header too. */
      r = find_start (p, rd, epoch, &lsn, &seq);
      if (r == 1) {             /* the log's start from now on */
        p->sb.tail_lsn = lsn;
        p->sb.tail_seq = seq;
        continue;
      }
    }
    if (r == 0) {
      r = look_past (p, rd, lsn, seq, epoch, &next);
      if (r == 1) {
        if ((*lost)++ == 0)
          *lost_lsn = lsn;
        lsn = next;
        seq++;
        continue;
      }
    }
    if (r == -1)
      return -1;
    if (r == 0 || at >= p->scan_limit)
      break;                   /* the end: the log goes on from lsn */
    lsn = at;
    uint64_t len = batch_bytes (p, h->ndata);
    uint64_t off = p->sb.log_off + lsn % C;
    const unsigned char *b = reader_get (p, rd, off, len, p->sb.log_off + C);
    if (b == NULL)
      return -1;
    h = header_copy (p, b, lsn, epoch, seq);   /* as next_batch found it */
    if (h == NULL) {
      errno = EIO;              /* it changed under the scan */
      return -1;
    }
    if (fn (p, h, b + SSD_ALIGN, arg) == -1)
      return -1;
    epoch = h->epoch;
    lsn += len;
    seq++;
    n++;
  }
  *end = lsn;
  *end_seq = seq;
  return n;
}

#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic push     /* -fanalyzer: rec_get's blocks belong to
                                 * r->t (rec_free frees them) */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
static int
apply_batch (struct store_ssd *p, const struct ssd_batch *h,
             const unsigned char *data, void *arg)
{
  struct recovered *r = arg;
  const struct ssd_entry *e = ssd_batch_entries ((struct ssd_batch *) h);
  uint64_t dpos = p->sb.log_off + h->lsn % p->sb.log_bytes + SSD_ALIGN;

  if (r->batches == 0 || h->epoch != r->c_epoch ||
      h->flushed_lsn != r->c_flushed) {     /* a new commit */
    r->c_epoch = h->epoch;
    r->c_flushed = h->flushed_lsn;
    r->c_lsn = h->lsn;
    r->c_bad = false;
  }
  if (h->epoch > p->seen_epoch)
    p->seen_epoch = h->epoch;
  r->batches++;
  if (p->segs)                  /* the store's (not an offline reader's) */
    note_seg (p, h->lsn, h->seq);
  if (h->flags & SSD_BATCH_FIRST) {
    r->in_comp = r->comp_sound = true;
    r->comp_lsn = h->lsn;
    r->comp_seq = h->seq;
  }
  for (uint32_t i = 0; i < h->nentries; i++, e++) {
    r->records++;
    if (e->block >= p->bpf) {
      errno = EBADMSG;
      return -1;
    }
    struct rfolio *f;
    if (e->flags & SSD_ENT_CLEAN) {
      /* Nothing of a folio without blocks to clean. */
      f = rec_find (r, e->folio);
      if (f == NULL || !has_blocks (f))
        continue;
      struct rblock *b = &f->b[e->block];
      bool before = b->state == R_DATA || b->bad;
      b->bad = false;           /* a newer record: the failed one is moot */
      b->state = R_CLEAN;
      rec_keep (r, f, before, false);
      continue;
    }
    f = rec_get (r, e->folio, p->bpf);
    if (f == NULL || !has_blocks (f))  /* rec_get gives blocks or NULL */
      return -1;
    struct rblock *b = &f->b[e->block];
    bool before = b->state == R_DATA || b->bad;
    b->bad = false;             /* a newer record: the failed one is moot */
    if (ssd_data_crc (data, p->bs) == e->crc) {
      b->state = R_DATA;
      b->pos = dpos;
      b->lsn = h->lsn;
      b->crc = e->crc;
    } else {
      /* Damage, unless its commit is the log's last: a torn write
       * (decided once the whole log was read: recover_scan). */
      b->bad = true;
      r->c_bad = true;
      r->comp_sound = false;
    }
    rec_keep (r, f, before, true);
    data += p->bs;
    dpos += p->bs;
  }
  if ((h->flags & SSD_BATCH_LAST) && r->in_comp && r->comp_sound) {
    r->comp_found = true;
    r->found_lsn = r->comp_lsn;
    r->found_seq = r->comp_seq;
  }
  if (h->flags & SSD_BATCH_LAST)
    r->in_comp = false;
  return 0;
}

#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic pop
#endif

/* After the scan: the records whose data crc failed and that no newer
 * record covers are damage (a torn last commit was dropped whole). */
static void
settle_damage (struct store_ssd *p, struct recovered *r)
{
  for (size_t i = 0; i < r->cap; i++)
    for (uint32_t b = 0; has_blocks (&r->t[i]) && b < p->bpf; b++) {
      struct rblock *rb = &r->t[i].b[b];
      if (rb->bad)
        rb->state = R_LOST;
      rb->bad = false;
    }
}

/* After the scan: the batch of the oldest newest data record of a live
 * block (end: none), or UINT64_MAX when a record failed its crc (the
 * log must not start past damage). */
static uint64_t
oldest_live (const struct store_ssd *p, const struct recovered *r,
             uint64_t end)
{
  uint64_t m = end;

  for (size_t i = 0; i < r->cap; i++)
    for (uint32_t b = 0; has_blocks (&r->t[i]) && b < p->bpf; b++) {
      const struct rblock *rb = &r->t[i].b[b];
      if (rb->bad || rb->state == R_LOST)
        return UINT64_MAX;
      if (rb->state == R_DATA && rb->lsn < m)
        m = rb->lsn;
    }
  return m;
}

/* After an unclean stop: what the log holds, into p->rec. */
static int
recover_scan (struct store_ssd *p, char *err, size_t errlen)
{
  unsigned char *buf;
  uint64_t end, end_seq;
  int64_t n;

  if (posix_memalign ((void **) &buf, SSD_ALIGN, READ_CHUNK) != 0)
    goto nomem;
  p->scan_limit = UINT64_MAX;
 again:;
  struct reader rd = { buf, 0, 0 };
  for (uint32_t i = 0; p->segs && i < p->nseg; i++)
    p->segs[i].lsn = UINT64_MAX;        /* what this pass finds only */
  p->rec = calloc (1, sizeof *p->rec);
  if (p->rec == NULL) {
    free (buf);
    goto nomem;
  }
  struct recovered *r = p->rec;
  n = scan (p, &rd, apply_batch, r, &end, &end_seq, &r->lost_batches,
            &r->lost_lsn);
  if (n >= 0 && r->comp_found && r->found_lsn != p->sb.tail_lsn) {
    /* A compaction whose checkpoint was lost: the log starts there (the
     * open's superblock update records it). */
    p->sb.tail_lsn = r->found_lsn;
    p->sb.tail_seq = r->found_seq;
    rec_free (r);
    p->rec = NULL;
    goto again;
  }
  if (n > 0 && r->c_bad && p->scan_limit == UINT64_MAX) {
    /* The log's last commit holds a record whose data crc fails: the
     * power went while it was written, before its flush (a later commit
     * would prove it flushed): nothing of it was acknowledged.  The log
     * ends before it, all of it dropped, so that a failed record
     * anywhere else is damage (never taken for a torn write: this
     * recovery's new epoch writes over the torn commit). */
    p->scan_limit = r->c_lsn;
    rec_free (r);
    p->rec = NULL;
    goto again;
  }
  if (n > 0 && p->cmax > 0 && p->scan_limit == UINT64_MAX &&
      r->lost_batches == 0 &&
      end - p->sb.tail_lsn + p->cmax > p->sb.log_bytes) {
    /* The log leaves no room for a compaction, the room every commit
     * keeps (issue 33 item 16).  Its last commit needed a reclaim, and
     * the checkpoint it moved was lost (one superblock copy damaged) or
     * never written: the log starts at the batch of the oldest live
     * record (nothing before it is live), which that reclaim's copies
     * moved past the old start when they were all written. */
    uint64_t oldest = oldest_live (p, r, end);
    const struct ssd_batch *h;
    if (oldest != UINT64_MAX && oldest > p->sb.tail_lsn &&
        header_at (p, &rd, oldest, 0, ANY_SEQ, &h) == 1) {
      p->sb.tail_lsn = oldest;
      p->sb.tail_seq = h->seq;
      rec_free (r);
      p->rec = NULL;
      goto again;
    }
    if (oldest != UINT64_MAX && !p->sb_suspect) {
      /* Killed in the middle of that commit's batches (a reclaim's or a
       * compaction's): its sync never returned, nothing of it was
       * acknowledged.  Dropped whole, as a torn one: the log ends where
       * the room was kept. */
      p->scan_limit = r->c_lsn;
      rec_free (r);
      p->rec = NULL;
      goto again;
    }
  }
  free (buf);
  if (n < 0) {
    snprintf (err, errlen, "%s: reading the log: %s", p->path,
              strerror (errno));
    return -1;
  }
  settle_damage (p, r);
  r->end_lsn = end;
  r->end_seq = end_seq;
  p->head = p->flushed = end;
  p->next_seq = end_seq;
  return 0;

 nomem:
  snprintf (err, errlen, "%s: out of memory", p->path);
  errno = ENOMEM;
  return -1;
}

static int
cmp_rfolio (const void *a, const void *b)
{
  uint64_t x = (*(const struct rfolio *const *) a)->folio;
  uint64_t y = (*(const struct rfolio *const *) b)->folio;
  return x < y ? -1 : x > y;
}

/* A live block to read back at recovery: where it is in the log, where
 * it goes. */
struct rjob {
  uint64_t pos, lsn;
  uint32_t slot, block, crc;
};

static int
cmp_rjob (const void *a, const void *b)
{
  uint64_t x = ((const struct rjob *) a)->pos, y = ((const struct rjob *) b)->pos;
  return x < y ? -1 : x > y;
}

static int
ssd_recover (struct store *s, store_recover_fn fn, void *arg,
             struct store_recovery *out)
{
  struct store_ssd *p = SS (s);
  struct recovered *r = p->rec;
  struct rfolio **order;
  struct rjob *jobs = NULL;
  unsigned char *buf = NULL;
  size_t nf = 0, nj = 0;
  int ret = 0;

  if (r == NULL)
    return 0;
  out->lost_blocks = r->lost_blocks;
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  order = malloc ((r->n + 1) * sizeof *order);
  if (order == NULL)
    return -1;
  size_t ndata = 0;
  for (size_t i = 0; i < r->cap; i++)
    if (has_blocks (&r->t[i])) {
      bool any = false;
      for (uint32_t b = 0; b < p->bpf; b++)
        if (r->t[i].b[b].state == R_DATA) {
          any = true;
          ndata++;
        }
      if (any)
        order[nf++] = &r->t[i];
    }
  // NOLINTNEXTLINE(bugprone-sizeof-expression): an array of pointers
  qsort (order, nf, sizeof *order, cmp_rfolio);
  jobs = malloc ((ndata + 1) * sizeof *jobs);
  if (jobs == NULL || posix_memalign ((void **) &buf, SSD_ALIGN,
                                      READ_CHUNK) != 0) {
    free (order);
    free (jobs);
    errno = ENOMEM;
    return -1;
  }
  /* Slot k holds the k-th folio; its live blocks are read in log order,
   * in large pieces. */
  for (size_t k = 0; k < nf; k++) {
    const struct rfolio *f = order[k];
    p->log_folio[k] = f->folio;
    for (uint32_t b = 0; b < p->bpf; b++)
      if (f->b[b].state == R_DATA)
        jobs[nj++] = (struct rjob) { f->b[b].pos, f->b[b].lsn,
                                     (uint32_t) k, b, f->b[b].crc };
  }
  qsort (jobs, nj, sizeof *jobs, cmp_rjob);
  struct reader rd = { buf, 0, 0 };
  for (size_t i = 0, j = 0; i < nj && ret == 0; i++) {
    const struct rjob *jb = &jobs[i];
    /* Read on as far as the live blocks of the next piece go. */
    if (j <= i)
      j = i + 1;
    while (j < nj && jobs[j].pos + p->bs - jb->pos <= READ_CHUNK - SSD_ALIGN)
      j++;
    const unsigned char *src = reader_get (p, &rd, jb->pos, p->bs,
                                           jobs[j - 1].pos + p->bs);
    if (src == NULL) {
      ret = -1;
      break;
    }
    unsigned char *d = (unsigned char *) ssd_data (s, jb->slot) +
                       (size_t) jb->block * p->bs;
    memcpy (d, src, p->bs);
    if (ssd_data_crc (d, p->bs) != jb->crc) {
      memset (d, 0, p->bs);
      out->lost_blocks++;     /* it changed since the scan: damage */
      continue;
    }
    uint64_t *bits = ssd_bitmap (s, jb->slot);
    uint32_t iu = FP_UPTODATE * p->bpf + jb->block;
    uint32_t id = FP_DIRTY * p->bpf + jb->block;
    bits[iu / 64] |= 1ull << (iu % 64);
    bits[id / 64] |= 1ull << (id % 64);
    mset (p->logged + (size_t) jb->slot * p->mwords, jb->block, true);
    p->nlogged[jb->slot]++;
    p->rec_lsn[(size_t) jb->slot * p->bpf + jb->block] = jb->lsn;
    out->dirty_blocks++;
  }
  for (size_t k = 0; k < nf && ret == 0; k++)
    if (p->nlogged[k] > 0) {
      out->folios++;
      ret = fn (arg, (uint32_t) k, order[k]->folio,
                ssd_bitmap (s, (uint32_t) k));
    }
  free (buf);
  free (jobs);
  free (order);
  rec_free (r);
  p->rec = NULL;
  return ret;
}

/* --- open --- */

static void
ssd_destroy (struct store *s)
{
  struct store_ssd *p = SS (s);

  if (p->dev)
    p->dev->ops->close (p->dev);
  if (p->data)
    munmap (p->data, p->data_len);
  free (p->bitmaps);
  free (p->log_folio);
  free (p->logged);
  free (p->want);
  free (p->nlogged);
  free (p->slot_commit);
  free (p->queued);
  free (p->queue);
  free (p->taken);
  free (p->wbuf);
  free (p->rec_lsn);
  free ((void *) p->wbegun);
  free ((void *) p->wended);
  free (p->segs);
  free (p->seg_live);
  free (p->path_buf);
  rec_free (p->rec);
  pthread_mutex_destroy (&p->mu);
  pthread_cond_destroy (&p->cv);
  free (p);
}

static const struct store_ops ssd_ops = {
  .name = "ssd",
  .data = ssd_data,
  .bitmap = ssd_bitmap,
  .set_index = ssd_set_index,
  .persist = ssd_persist,
  .write_begin = ssd_write_begin,
  .write_end = ssd_write_end,
  .sync = ssd_sync,
  .may_reuse = ssd_may_reuse,
  .recover = ssd_recover,
  .mark_clean = ssd_mark_clean,
  .set_doubt = ssd_set_doubt,
  .set_fenced = ssd_set_fenced,
  .set_pt_lost = ssd_set_pt_lost,
  .info = ssd_info,
  .stats = ssd_stats_op,
  .destroy = ssd_destroy,
};

#define FAIL(e, ...) \
  do { snprintf (err, errlen, __VA_ARGS__); errno = (e); goto fail; } while (0)

static int
check_match (const struct ssd_super *sb, const struct store_config *cfg,
             const char *path, char *err, size_t errlen)
{
  if (sb->folio_size != cfg->folio_size || sb->block_size != cfg->block_size ||
      sb->nslots != cfg->nslots || sb->export_size != cfg->export_size) {
    snprintf (err, errlen, "%s: store has another geometry: folio-size %"
              PRIu32 ", block-size %" PRIu32 ", %" PRIu32 " slots, export %"
              PRIu64 " bytes; the export wants %" PRIu32 ", %" PRIu32 ", %"
              PRIu32 ", %" PRIu64, path, sb->folio_size, sb->block_size,
              sb->nslots, sb->export_size, cfg->folio_size, cfg->block_size,
              cfg->nslots, cfg->export_size);
    errno = EINVAL;
    return -1;
  }
  if (strcmp (sb->backing_spec, cfg->backing_spec) != 0 ||
      sb->backing_size != cfg->backing_size) {
    snprintf (err, errlen, "%s: store belongs to another backing: '%s' (%"
              PRIu64 " bytes), the export has '%s' (%" PRIu64 " bytes)", path,
              sb->backing_spec, sb->backing_size, cfg->backing_spec,
              cfg->backing_size);
    errno = EINVAL;
    return -1;
  }
  if (sb->backing_dev != cfg->backing_dev ||
      sb->backing_ino != cfg->backing_ino) {
    snprintf (err, errlen, "%s: store belongs to another backing: '%s' is now "
              "another file (device/inode %" PRIu64 "/%" PRIu64 ", was %"
              PRIu64 "/%" PRIu64 ")", path, cfg->backing_spec,
              cfg->backing_dev, cfg->backing_ino, sb->backing_dev,
              sb->backing_ino);
    errno = EINVAL;
    return -1;
  }
  return 0;
}

static void
super_format (struct ssd_super *sb, const struct store_config *cfg,
              uint64_t log_bytes)
{
  memset (sb, 0, sizeof *sb);
  memcpy (sb->magic, SSD_MAGIC, sizeof sb->magic);
  sb->version = SSD_VERSION;
  sb->super_bytes = sizeof *sb;
  sb->folio_size = cfg->folio_size;
  sb->block_size = cfg->block_size;
  sb->nslots = cfg->nslots;
  sb->export_size = cfg->export_size;
  sb->log_off = SSD_LOG_OFF;
  sb->log_bytes = log_bytes;
  sb->epoch = 1;
  sb->backing_size = cfg->backing_size;
  sb->backing_dev = cfg->backing_dev;
  sb->backing_ino = cfg->backing_ino;
  snprintf (sb->backing_spec, sizeof sb->backing_spec, "%s", cfg->backing_spec);
}

static int
alloc_state (struct store_ssd *p, const struct store_config *cfg)
{
  uint32_t n = cfg->nslots;

  p->data_len = (size_t) n * cfg->folio_size;
  p->data = mmap (NULL, p->data_len, PROT_READ | PROT_WRITE,
                  // cppcheck-suppress invalidFunctionArg ; MAP_ANONYMOUS: fd -1
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p->data == MAP_FAILED) {
    p->data = NULL;
    return -1;
  }
  p->bitmaps = calloc ((size_t) n * p->s.bitmap_words, 8);
  p->log_folio = malloc ((size_t) n * sizeof *p->log_folio);
  p->logged = calloc ((size_t) n * p->mwords, 8);
  p->want = calloc ((size_t) n * p->mwords, 8);
  p->nlogged = calloc (n, sizeof *p->nlogged);
  p->slot_commit = calloc (n, sizeof *p->slot_commit);
  p->queued = calloc (n, sizeof *p->queued);
  p->queue = calloc (n, sizeof *p->queue);
  p->taken = calloc (n, sizeof *p->taken);
  p->rec_lsn = calloc ((size_t) n * p->bpf, sizeof *p->rec_lsn);
  p->wbegun = calloc (n, sizeof *p->wbegun);
  p->wended = calloc (n, sizeof *p->wended);
  if (posix_memalign ((void **) &p->wbuf, SSD_ALIGN, WBUF_BYTES) != 0)
    p->wbuf = NULL;
  if (!p->bitmaps || !p->log_folio || !p->logged || !p->want ||
      !p->nlogged || !p->slot_commit || !p->queued || !p->queue || !p->taken || !p->wbuf ||
      !p->rec_lsn || !p->wbegun || !p->wended)
    return -1;
  for (uint32_t i = 0; i < n; i++)
    p->log_folio[i] = STORE_NO_FOLIO;
  return 0;
}

/* The other superblock copy is damaged (or blank): this one may be a
 * write behind.  Its clean flag may be stale (the lost copy's run wrote
 * after it): the log is scanned; that run's batches carry one epoch
 * more (after a clean stop, only such batches continue the log: a
 * leftover of an older run there does not); its checkpoint may be
 * behind (scan's find_start).  A new epoch then goes above them. */
static void
super_suspect (struct store_ssd *p, bool other_bad)
{
  if (!other_bad)
    return;
  p->sb_suspect = true;
  if (p->sb.flags & SSD_FLAG_CLEAN)
    p->epoch_floor = p->sb.epoch + 1;
  p->sb.flags &= ~SSD_FLAG_CLEAN;
  p->sb.epoch++;
}

/* Recovery dropped the torn commit at lsn: its first header zeroed (made
 * durable with the superblock), so that it never continues the log: the
 * new run's first batch may go to the next lap and leave it in place,
 * with the very sequence number the log goes on with. */
static int
erase_header (struct store_ssd *p, uint64_t lsn)
{
  unsigned char *z;
  int r;

  if (posix_memalign ((void **) &z, SSD_ALIGN, SSD_ALIGN) != 0) {
    errno = ENOMEM;
    return -1;
  }
  memset (z, 0, SSD_ALIGN);
  r = p->dev->ops->pwrite (p->dev, z, SSD_ALIGN,
                           p->sb.log_off + lsn % p->sb.log_bytes);
  free (z);
  return r;
}

/* What recovery found lost, in words. */
static void
damage_text (const struct recovered *r, uint32_t bs, char *buf, size_t len)
{
  snprintf (buf, len, "%" PRIu64 " records fail their data checksum (%"
            PRIu64 " bytes), %" PRIu64 " batch headers unreadable where the "
            "log was flushed past them (the first at lsn %" PRIu64 "; their "
            "blocks unknown)", r->lost_blocks, r->lost_blocks * bs,
            r->lost_batches, r->lost_batches ? r->lost_lsn : 0);
}

/* A batch header of some foliod log (either copy of one). */
static bool
batch_magic (const struct ssd_batch *h)
{
  return memcmp (h->magic, SSD_BATCH_MAGIC, sizeof h->magic) == 0 &&
         h->crc == ssd_batch_crc (h);
}

/* Both superblocks are blank: a new store, or a log whose superblocks
 * were wiped (wipefs, a discard).  A sound batch header in the log's
 * first 64 MiB says the latter (a used log has one every 1 MiB at
 * most): 0, or -1 (refused, nothing written). */
static int
held_log (struct store_ssd *p, char *err, size_t errlen)
{
  uint64_t end = p->dev->size < SSD_LOG_OFF + (64u << 20)
                 ? p->dev->size : SSD_LOG_OFF + (64u << 20);
  struct reader rd = { NULL, 0, 0 };
  int r = 0;

  if (posix_memalign ((void **) &rd.buf, SSD_ALIGN, READ_CHUNK) != 0) {
    snprintf (err, errlen, "%s: out of memory", p->path);
    errno = ENOMEM;
    return -1;
  }
  for (uint64_t off = SSD_LOG_OFF; off + SSD_ALIGN <= end && r == 0;
       off += SSD_ALIGN) {
    const struct ssd_batch *h = (const struct ssd_batch *)
      reader_get (p, &rd, off, SSD_ALIGN, end / SSD_ALIGN * SSD_ALIGN);
    if (h == NULL) {
      snprintf (err, errlen, "%s: reading the log: %s", p->path,
                strerror (errno));
      r = -1;
    } else if (batch_magic (h) ||
               batch_magic ((const struct ssd_batch *)
                            ((const unsigned char *) h + SSD_HEADER_BYTES))) {
      snprintf (err, errlen, "%s: both superblocks are blank, but it holds "
                "a foliod log (a batch header at byte %" PRIu64 "): not "
                "formatting over its data; zero the whole device or remove "
                "the file to make a new store", p->path, off);
      errno = EEXIST;
      r = -1;
    }
  }
  free (rd.buf);
  return r;
}

struct store *
store_ssd_open_dev (const struct store_config *cfg, struct ssd_dev *d,
                    char *err, size_t errlen)
{
  struct store_ssd *p = calloc (1, sizeof *p);
  const char *path = cfg->path ? cfg->path : "ssd store";
  bool other_bad = false;
  char why[512];
  int r;

  if (p == NULL) {
    d->ops->close (d);
    snprintf (err, errlen, "out of memory");
    errno = ENOMEM;
    return NULL;
  }
  pthread_mutex_init (&p->mu, NULL);
  pthread_cond_init (&p->cv, NULL);
  p->dev = d;
  p->path_buf = strdup (path);
  p->path = p->path_buf ? p->path_buf : "ssd store";
  p->s.ops = &ssd_ops;
  /* Slot memory is RAM that only a commit reads, and only where an
   * indexed slot has live blocks: data may arrive before set_index. */
  p->s.caps = STORE_DURABLE | STORE_DEFERRED | STORE_REUSE_SYNC |
              STORE_EARLY_DATA;
  p->s.nslots = cfg->nslots;
  p->s.folio_size = cfg->folio_size;
  if (cfg->block_size == 0 || cfg->folio_size % cfg->block_size != 0 ||
      cfg->block_size % 512 != 0 || cfg->nslots == 0)
    FAIL (EINVAL, "%s: folio size %" PRIu32 " / block size %" PRIu32
          " unusable", path, cfg->folio_size, cfg->block_size);
  p->bs = cfg->block_size;
  p->bpf = cfg->folio_size / cfg->block_size;
  p->mwords = (p->bpf + 63) / 64;
  p->s.bitmap_words = store_bitmap_words (p->bpf);
  p->cmax = ssd_compaction_max (cfg->nslots, cfg->folio_size, cfg->block_size);
  if (alloc_state (p, cfg) == -1)
    FAIL (ENOMEM, "%s: out of memory for %" PRIu32 " slots", path,
          cfg->nslots);

  r = ssd_super_read (d, &p->sb, &p->sb_cur, &other_bad, path, err, errlen);
  if (r == -1)
    goto fail_kept;
  if (r == 1) {                 /* all zeros: a new store */
    uint64_t log = (d->size - SSD_LOG_OFF) / SSD_ALIGN * SSD_ALIGN;
    if (!d->created && held_log (p, err, errlen) != 0)
      goto fail_kept;
    if (strlen (cfg->backing_spec) >= SSD_SPEC_MAX)
      FAIL (ENAMETOOLONG, "%s: backing spec longer than %d bytes", path,
            SSD_SPEC_MAX - 1);
    super_format (&p->sb, cfg, log);
    if (getrandom (p->sb.uuid, sizeof p->sb.uuid, 0) != sizeof p->sb.uuid)
      FAIL (EIO, "%s: getrandom: %s", path, strerror (errno));
    p->sb_cur = 1;
    p->formatted = true;
  } else {
    if (check_match (&p->sb, cfg, path, err, errlen) == -1)
      goto fail_kept;
    super_suspect (p, other_bad);
    p->was_clean = p->sb.flags & SSD_FLAG_CLEAN;
    p->was_doubt = p->sb.flags & SSD_FLAG_DOUBT;
    p->was_fenced = p->sb.flags & SSD_FLAG_FENCED;
    p->was_pt_lost = p->sb.flags & SSD_FLAG_PT_LOST;
  }
  if (p->sb.log_bytes < 2 * p->cmax)
    FAIL (ENOSPC, "%s: log of %" PRIu64 " bytes too small for a cache of %"
          PRIu64 " bytes: it needs %" PRIu64 " at least (two compactions; "
          "default for a new file: 4 times the cache)", path, p->sb.log_bytes,
          (uint64_t) cfg->nslots * cfg->folio_size, 2 * p->cmax);
  /* Reclaim's segments: a 64th of the log (16 KiB at least). */
  p->seg = p->sb.log_bytes / 64 / SSD_ALIGN * SSD_ALIGN;
  if (p->seg < 4 * SSD_ALIGN)
    p->seg = 4 * SSD_ALIGN;
  p->nseg = (uint32_t) (p->sb.log_bytes / p->seg + 2);
  p->segs = malloc (p->nseg * sizeof *p->segs);
  p->seg_live = calloc (p->nseg, sizeof *p->seg_live);
  if (p->segs == NULL || p->seg_live == NULL)
    FAIL (ENOMEM, "%s: out of memory", path);
  for (uint32_t i = 0; i < p->nseg; i++)
    p->segs[i].lsn = UINT64_MAX;        /* no batch yet */
  if (p->formatted || p->was_clean) {
    p->head = p->flushed = p->sb.tail_lsn;
    p->next_seq = p->sb.tail_seq;
  } else if (recover_scan (p, err, errlen) == -1) {
    goto fail_kept;
  } else {
    /* Blocks the log reports lost, and the live folios, counted now: a
     * log with more live folios than slots is not this cache's. */
    size_t live = 0;
    struct recovered *rc = p->rec;
    for (size_t i = 0; i < rc->cap; i++) {
      bool any = false;
      for (uint32_t b = 0; has_blocks (&rc->t[i]) && b < p->bpf; b++) {
        any |= rc->t[i].b[b].state == R_DATA;
        rc->lost_blocks += rc->t[i].b[b].state == R_LOST;
      }
      live += any;
    }
    if (live > cfg->nslots)
      FAIL (EBADMSG, "%s: the log holds %zu dirty folios, more than the "
            "cache's %" PRIu32 " slots", path, live, cfg->nslots);
    if (rc->lost_blocks > 0 || rc->lost_batches > 0) {
      damage_text (rc, p->bs, why, sizeof why);
      FAIL (EBADMSG, "%s: the log is damaged: %s; refused, the log kept as "
            "it is, rather than bring back older data ('foliod store "
            "inspect %s' lists the damage; move the store aside, it is the "
            "only copy of that data, to start without it)", path, why,
            path);
    }
    if (p->scan_limit != UINT64_MAX && erase_header (p, p->scan_limit) == -1)
      FAIL (errno, "%s: erasing a torn commit: %s", path, strerror (errno));
  }
  /* A new epoch before any new batch, above every epoch in the log:
   * what lies after the log's end never continues it.  In use from now
   * on (not clean). */
  if (p->seen_epoch > p->sb.epoch)
    p->sb.epoch = p->seen_epoch;
  p->sb.epoch++;
  p->sb.flags &= ~SSD_FLAG_CLEAN;
  p->sb.tail_lsn = p->formatted || p->was_clean ? p->head : p->sb.tail_lsn;
  p->sb.tail_seq = p->formatted || p->was_clean ? p->next_seq
                                                : p->sb.tail_seq;
  /* Both copies when one was damaged (or for a new store): the sound
   * one is a write behind, and the new epoch may be two above its own
   * (the one it missed, then this run's): left in place, a second damage
   * later would leave it to say what the log holds, and the scan would
   * end the log before this run's batches, of an epoch it never saw. */
  bool twice = p->formatted || p->sb_suspect;
  if (ssd_super_write (d, &p->sb, &p->sb_cur) == -1 ||
      d->ops->flush (d) == -1 ||     /* a torn second write leaves it */
      (twice && ssd_super_write (d, &p->sb, &p->sb_cur) == -1) ||
      (twice && d->ops->flush (d) == -1))
    FAIL (errno, "%s: writing the superblock: %s", path, strerror (errno));
  publish_stats (p);            /* no other thread yet */
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic push     /* -fanalyzer: &p->s is p (its first member), freed by ssd_destroy */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
  return &p->s;

 fail:
 fail_kept:
  r = errno;
  ssd_destroy (&p->s);
  errno = r;
  return NULL;
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic pop
#endif
}

/* Is path the backing itself (its file, or its block device)? */
static bool
is_backing (const struct store_config *cfg)
{
  struct stat st;

  if ((cfg->backing_dev == 0 && cfg->backing_ino == 0) ||
      cfg->path == NULL || stat (cfg->path, &st) == -1)
    return false;
  if (S_ISBLK (st.st_mode))
    return cfg->backing_ino == 0 && st.st_rdev == cfg->backing_dev;
  return cfg->backing_ino != 0 && st.st_dev == cfg->backing_dev &&
         st.st_ino == cfg->backing_ino;
}

struct store *
store_ssd_open (const struct store_config *cfg, char *err, size_t errlen)
{
  uint64_t cache = (uint64_t) cfg->nslots * cfg->folio_size;

  if (is_backing (cfg)) {       /* before anything is allocated or written */
    snprintf (err, errlen, "%s: the store is the backing itself ('%s'): "
              "its log would be written into the image", cfg->path,
              cfg->backing_spec);
    errno = EINVAL;
    return NULL;
  }
  struct ssd_dev *d = ssd_dev_open_file (cfg->path, SSD_LOG_OFF +
                                         ssd_log_default (cache), false,
                                         err, errlen);

  return d ? store_ssd_open_dev (cfg, d, err, errlen) : NULL;
}

/* --- offline: foliod store inspect, foliod store writeback --- */

/* The device at path read-only, its superblock in p->sb. */
static int
offline_open (struct store_ssd *p, const char *path, char *err, size_t errlen)
{
  bool other_bad = false;
  int cur, r;

  memset (p, 0, sizeof *p);
  p->path = path;
  p->dev = ssd_dev_open_file (path, 0, true, err, errlen);
  if (p->dev == NULL)
    return -1;
  r = ssd_super_read (p->dev, &p->sb, &cur, &other_bad, path, err, errlen);
  if (r == 0)
    super_suspect (p, other_bad);
  if (r == 1) {
    snprintf (err, errlen, "%s: not a foliod store (never formatted)", path);
    errno = EINVAL;
  }
  if (r != 0) {
    int e = errno;
    p->dev->ops->close (p->dev);
    errno = e;
    return -1;
  }
  p->bs = p->sb.block_size;
  p->bpf = p->sb.folio_size / p->sb.block_size;
  return 0;
}

int
store_ssd_inspect (const char *path, FILE *out, char *err, size_t errlen)
{
  struct store_ssd p;
  const struct ssd_super *sb = &p.sb;
  uint64_t folios = 0, dirty = 0, lost = 0;

  if (offline_open (&p, path, err, errlen) == -1)
    return -1;
  fprintf (out, "store: %s\nkind: ssd (write-back log), layout version %"
           PRIu32 ", superblock seq %" PRIu64 ", epoch %" PRIu64 "\n", path,
           sb->version, sb->seq, sb->epoch);
  fprintf (out, "geometry: folio-size %" PRIu32 ", block-size %" PRIu32
           ", %" PRIu32 " slots, export %" PRIu64 " bytes\n", sb->folio_size,
           sb->block_size, sb->nslots, sb->export_size);
  fprintf (out, "backing: %s, %" PRIu64 " bytes", sb->backing_spec,
           sb->backing_size);
  if (sb->backing_dev || sb->backing_ino)
    fprintf (out, ", device %" PRIu64 " inode %" PRIu64, sb->backing_dev,
             sb->backing_ino);
  fprintf (out, "\nlog: %" PRIu64 " bytes, checkpoint at lsn %" PRIu64
           " seq %" PRIu64 "\nstate: %s\n", sb->log_bytes, sb->tail_lsn,
           sb->tail_seq, p.sb_suspect
           ? "unknown: the other superblock copy is damaged (the log is "
             "read from this one's checkpoint)"
           : (sb->flags & SSD_FLAG_CLEAN)
           ? "clean" : "not clean (in use, or a crash)");
  if (sb->flags & SSD_FLAG_DOUBT)
    fprintf (out, "writes in doubt: the backing is not trusted with this "
             "data until 'foliod clear-doubt'\n");
  if (sb->flags & SSD_FLAG_FENCED)
    fprintf (out, "fenced: written under an image lock that was lost; not "
             "written back until 'foliod clear-doubt'\n");
  if (sb->flags & SSD_FLAG_PT_LOST)
    fprintf (out, "passthrough writes lost: every FLUSH fails until "
             "'foliod clear-doubt'\n");
  if (!(sb->flags & SSD_FLAG_CLEAN)) {
    if (recover_scan (&p, err, errlen) == -1) {
      int e = errno;
      rec_free (p.rec);
      p.dev->ops->close (p.dev);
      errno = e;
      return -1;
    }
    struct recovered *r = p.rec;
    for (size_t i = 0; i < r->cap; i++) {
      bool any = false;
      for (uint32_t b = 0; has_blocks (&r->t[i]) && b < p.bpf; b++) {
        uint8_t st = r->t[i].b[b].state;
        any |= st == R_DATA;
        dirty += st == R_DATA;
        if (st == R_LOST) {
          lost++;
          fprintf (out, "damaged: export bytes %" PRIu64 "-%" PRIu64
                   " (data checksum; written nowhere)\n",
                   r->t[i].folio * sb->folio_size + (uint64_t) b * p.bs,
                   r->t[i].folio * sb->folio_size + (uint64_t) (b + 1) * p.bs);
        }
      }
      folios += any;
    }
    if (r->lost_batches)
      fprintf (out, "damaged: %" PRIu64 " batch headers from lsn %" PRIu64
               " (the log was flushed past them; their blocks unknown: "
               "older versions would come back)\n", r->lost_batches,
               r->lost_lsn);
    fprintf (out, "log used: %" PRIu64 " bytes, %" PRIu64 " batches, %"
             PRIu64 " records\n", r->end_lsn - sb->tail_lsn, r->batches,
             r->records);
    rec_free (p.rec);
  }
  fprintf (out, "folios: %" PRIu64 " of %" PRIu32 " slots\n", folios,
           sb->nslots);
  fprintf (out, "dirty: %" PRIu64 " bytes\n", dirty * p.bs);
  if (lost)
    fprintf (out, "lost: %" PRIu64 " bytes (damaged records)\n", lost * p.bs);
  p.dev->ops->close (p.dev);
  return 0;
}

int
store_ssd_read_header (const char *path, struct store_header_info *out,
                       char *err, size_t errlen)
{
  struct store_ssd p;

  if (offline_open (&p, path, err, errlen) == -1)
    return -1;
  out->nslots = p.sb.nslots;
  out->folio_size = p.sb.folio_size;
  out->block_size = p.sb.block_size;
  out->export_size = p.sb.export_size;
  out->backing_size = p.sb.backing_size;
  snprintf (out->backing_spec, sizeof out->backing_spec, "%.*s",
            (int) sizeof p.sb.backing_spec, p.sb.backing_spec);
  p.dev->ops->close (p.dev);
  return 0;
}
