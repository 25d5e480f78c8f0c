/* Content identity of an nbd remote (issue 33 item 8).
 *
 * NBD names no image: a remote that comes back after a reconnect with the
 * same size, handshake flags and description (conn_reopen checks those)
 * may still serve another image, and the cache would then serve its
 * clean blocks of the old image mixed with the new one, and write its
 * dirty ones into it.  So the backing remembers a few blocks the remote
 * served, by offset and a hash (FNV-1a, 64 bits) of their 4 KiB, one per
 * eighth of the export (spread over it, NBD_ID_SAMPLES in all), and a
 * reconnected handle reads them again before it serves anything: if one
 * differs, the remote is refused as one whose size changed is.
 *
 * Only blocks whose content the remote must still have are compared:
 *  - a sample is taken from a read that no write-class request of
 *    foliod's overlapped in time (nb->id_wseq unchanged across the read,
 *    none in flight), and is dropped when foliod writes, zeroes or trims
 *    any part of it;
 *  - it is *firm* only once a flush that began after the read, with no
 *    write in flight, succeeded (id_flushed).  A remote that restarted
 *    may have lost writes it had not flushed, and a read may have
 *    returned such a write: a sample taken while anything was unflushed
 *    is dropped at the next reconnect, not compared;
 *  - none is taken while writes are in doubt (one may still land).
 * So a legitimate restart of the same image (losing what it had not
 * flushed) never differs, and any firm sample that differs means the
 * remote serves other data than the image foliod cached (another image;
 * or one changed by a second writer, or damaged).
 *
 * What is not detected: another image that agrees on every firm sample
 * (at most 8 blocks of 4 KiB are compared; two images that differ only
 * elsewhere, e.g. clones of one base that diverged, pass), and any
 * change when nothing was sampled (nothing read since the open, or every
 * read overlapped a write, or no flush since).  A restart of foliod
 * starts with no samples.
 *
 * The samples are this file's; id_lock is a leaf. */
#define _GNU_SOURCE
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "foliod/lock.h"
#include "foliod/util.h"
#include "backing/nbd-private.h"

/* FNV-1a of n bytes. */
static uint64_t
id_hash (const unsigned char *p, size_t n)
{
  uint64_t h = 14695981039346656037u;

  for (size_t i = 0; i < n; i++)
    h = (h ^ p[i]) * 1099511628211u;
  return h;
}

/* The slot of the block at off: its eighth of the export. */
static unsigned
id_slot (const struct nbdb_backing *nb, uint64_t off)
{
  uint64_t part = (nb->b.size + NBD_ID_SAMPLES - 1) / NBD_ID_SAMPLES;

  return part ? (unsigned) (off / part) % NBD_ID_SAMPLES : 0;
}

/* Slot i is used or not (id_lock held). */
static void
id_set_used (struct nbdb_backing *nb, unsigned i, bool used)
{
  nb->id[i].used = used;
  if (used)
    atomic_fetch_or (&nb->id_mask, 1u << i);
  else
    atomic_fetch_and (&nb->id_mask, ~(1u << i));
}

void
nbdb_id_write_begin (struct nbdb_backing *nb, uint64_t off, uint64_t len)
{
  atomic_fetch_add (&nb->id_writing, 1);
  atomic_fetch_add (&nb->id_wseq, 1);
  lock_or_die (&nb->id_lock);
  for (unsigned i = 0; i < NBD_ID_SAMPLES; i++) {
    struct id_sample *s = &nb->id[i];
    if (s->used && s->off < off + len && off < s->off + NBD_ID_BLOCK)
      id_set_used (nb, i, false);
  }
  unlock_or_die (&nb->id_lock);
}

void
nbdb_id_write_end (struct nbdb_backing *nb)
{
  atomic_fetch_add (&nb->id_wseq, 1);
  atomic_fetch_sub (&nb->id_writing, 1);
}

uint64_t
nbdb_id_flush_begin (struct nbdb_backing *nb)
{
  uint64_t t = atomic_load (&nb->id_wseq);

  /* A write in flight is not covered by this flush. */
  return atomic_load (&nb->id_writing) > 0 ? UINT64_MAX : t;
}

void
nbdb_id_flushed (struct nbdb_backing *nb, uint64_t token)
{
  if (token == UINT64_MAX)
    return;
  lock_or_die (&nb->id_lock);
  if (token > nb->id_flushed)
    nb->id_flushed = token;
  unlock_or_die (&nb->id_lock);
}

uint64_t
nbdb_id_read_begin (struct nbdb_backing *nb)
{
  uint64_t t = atomic_load (&nb->id_wseq);

  if (atomic_load (&nb->id_writing) > 0 || atomic_load (&nb->in_doubt) > 0)
    return UINT64_MAX;
  return t;
}

void
nbdb_id_read_done (struct nbdb_backing *nb, uint64_t token, const void *buf,
                   uint64_t len, uint64_t off)
{
  uint64_t a = (off + NBD_ID_BLOCK - 1) / NBD_ID_BLOCK * NBD_ID_BLOCK;
  unsigned i;

  if (token == UINT64_MAX || a + NBD_ID_BLOCK > off + len ||
      atomic_load (&nb->id_wseq) != token)
    return;
  i = id_slot (nb, a);
  if (atomic_load (&nb->id_mask) & (1u << i))  /* checked again below */
    return;
  uint64_t h = id_hash ((const unsigned char *) buf + (a - off), NBD_ID_BLOCK);
  lock_or_die (&nb->id_lock);
  /* A write that began after the read dropped nothing yet, or sees this
   * one: id_wseq moves before its drop takes id_lock. */
  if (!nb->id[i].used && atomic_load (&nb->id_wseq) == token &&
      atomic_load (&nb->in_doubt) == 0) {
    nb->id[i] = (struct id_sample) { .off = a, .hash = h, .wseq = token };
    id_set_used (nb, i, true);
  }
  unlock_or_die (&nb->id_lock);
}

/* Read the block at off from h (a handle nothing else uses yet, without
 * a poller) by end (now_ms() time) into buf.  0, or -1. */
static int
id_read (struct nbd_handle *h, void *buf, uint64_t off, uint64_t end)
{
  int64_t ck;
  int r;

  ck = nbd_aio_pread (h, buf, NBD_ID_BLOCK, off, NBD_NULL_COMPLETION, 0);
  if (ck == -1)
    return -1;
  while ((r = nbd_aio_command_completed (h, ck)) == 0) {
    uint64_t now = now_ms ();
    if (now >= end || nbd_poll (h, (int) (end - now)) == -1)
      return -1;
  }
  return r == 1 ? 0 : -1;
}

int
nbdb_id_differs (struct nbdb_backing *nb, struct nbd_handle *h, uint64_t end,
                 char *why, size_t len)
{
  struct id_sample s[NBD_ID_SAMPLES];
  unsigned n = 0;
  unsigned char buf[NBD_ID_BLOCK];

  /* What was not flushed when it was read may be gone with a restart of
   * the same image: forgotten, not compared. */
  lock_or_die (&nb->id_lock);
  for (unsigned i = 0; i < NBD_ID_SAMPLES; i++) {
    if (nb->id[i].used && nb->id[i].wseq > nb->id_flushed)
      id_set_used (nb, i, false);
    if (nb->id[i].used)
      s[n++] = nb->id[i];
  }
  unlock_or_die (&nb->id_lock);

  for (unsigned i = 0; i < n; i++) {
    if (id_read (h, buf, s[i].off, end) == -1) {
      snprintf (why, len, "reading the block at offset %llu: %s",
                (unsigned long long) s[i].off,
                nbd_get_error () ? nbd_get_error () : "no answer in time");
      return -1;
    }
    if (id_hash (buf, NBD_ID_BLOCK) == s[i].hash)
      continue;
    /* Differs: unless foliod began to write it meanwhile (on another
     * connection), which dropped the sample.  A write that began before
     * the sample was taken had ended before its read began (and was
     * not abandoned: no sample is taken while writes are in doubt). */
    lock_or_die (&nb->id_lock);
    unsigned k = id_slot (nb, s[i].off);
    bool same = nb->id[k].used && nb->id[k].off == s[i].off &&
                nb->id[k].hash == s[i].hash;
    unlock_or_die (&nb->id_lock);
    if (!same)
      continue;
    snprintf (why, len, "the block at offset %llu differs from what it "
              "served before: another image", (unsigned long long) s[i].off);
    return 1;
  }
  return 0;
}
