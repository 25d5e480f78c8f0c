/* The ram store: folio memory, slot table and bitmaps in one shared
 * mapping of a memfd, so that an upgrade in place can hand the whole
 * cache to the new process (SCM_RIGHTS) instead of writing it back.  The
 * memory is populated in the background once the server listens
 * (store_ram_populate), not when the store is made.
 *
 * The memfd's layout, versioned and self-describing as the pmem store's
 * (src/store/pmem-layout.h), so that a process never misreads one made
 * by another version:
 *
 *   0          header (RAM_HEADER_BYTES): magic, version, geometry, the
 *              export's size and name, flags, a checksum of it all
 *   8 KiB      slot table: per slot the folio index (STORE_NO_FOLIO: free)
 *   ...        slot bitmaps: per slot the FP_* planes, bitmap_words words
 *   2 MiB-aligned: folio data, nslots * folio_size
 *
 * The discipline.  While a process serves, only the slot table, the
 * bitmaps and the data change, as the cache changes them; the header says
 * nothing (it is written only by store_ram_keep).  store_ram_keep runs
 * once the cache is quiesced (no request, writeback, readahead in flight:
 * the upgrade stopped them) and then stamps the header RAM_FLAG_HANDED
 * with its checksum: from then on the slot table and the bitmaps are
 * exactly the cache's state, and the data is what they describe.  A
 * memfd is adopted (store_ram_adopt) only when its header is handed,
 * sound, of this version, and of the export's geometry and size; else
 * the adopter refuses it (the old process keeps serving it).  A process
 * that adopted one and died before it served changed it at most as its
 * writeback thread does, block by block (dirty to unstable to clean, the
 * data untouched), so the old process can adopt it again.  Nothing here
 * survives the host or the death of the last process holding the memfd:
 * the ram store is not durable (no STORE_DURABLE). */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "foliod/store.h"
#include "foliod/util.h"

/* One madvise per chunk, each holding the process's mmap_lock for as
 * long as it takes: one huge page, so that a thread that needs the lock
 * for writing (a thread's stack, a large malloc) waits for at most one
 * huge page's faults, and destroy for one chunk. */
#define POPULATE_CHUNK (2u << 20)

#define RAM_MAGIC        "FOLIODRM"
#define RAM_HEADER_BYTES 8192u
#define RAM_DATA_ALIGN   (2u << 20)   /* huge pages where shmem has them */
#define RAM_NAME_MAX     4097         /* EXPORT_NAME_MAX and its NUL */
#define RAM_FLAG_HANDED  1u           /* stamped by store_ram_keep */
/* The durability ledger's facts (set_doubt, set_fenced, set_pt_lost),
 * handed over with the cache: nothing here outlives the memfd, but an
 * upgrade must not forget what a restart of a durable store remembers. */
#define RAM_FLAG_DOUBT   2u
#define RAM_FLAG_FENCED  4u
#define RAM_FLAG_PT_LOST 8u
#define RAM_FACTS (RAM_FLAG_DOUBT | RAM_FLAG_FENCED | RAM_FLAG_PT_LOST)

struct ram_header {
  char magic[8];
  uint32_t version;         /* STORE_RAM_LAYOUT_VERSION */
  uint32_t header_bytes;    /* sizeof (struct ram_header) of its writer */
  uint32_t flags;           /* RAM_FLAG_* */
  uint32_t nslots, folio_size, block_size, bitmap_words;
  uint32_t pad;
  uint64_t slots_off, bitmaps_off, data_off, total_size;
  uint64_t export_size;
  char name[RAM_NAME_MAX];
  char pad2[7];
  uint64_t sum;             /* ram_header_sum of every byte before it */
};
_Static_assert (sizeof (struct ram_header) <= RAM_HEADER_BYTES,
                "the ram store header outgrew its room");

/* The FP_* planes are in the memfd in enum folio_plane's order. */
_Static_assert (FP_UPTODATE == 0 && FP_DIRTY == 1 && FP_UNSTABLE == 2 &&
                FP_NPLANES == 3, "ram layout: the plane order changed "
                "(bump STORE_RAM_LAYOUT_VERSION)");

/* Offsets, from the geometry alone. */
struct ram_layout {
  uint32_t bitmap_words;
  uint64_t slots_off, bitmaps_off, data_off, total_size;
};

static const struct store_ops ram_ops;

struct store_ram {
  struct store s;   /* first: the base */
  int fd;           /* the memfd */
  unsigned char *base;
  struct ram_layout l;
  struct ram_header *hdr;
  uint64_t *slots;
  unsigned char *data;
  size_t data_len;
  uint64_t *bitmaps;
  uint32_t block_size;
  int kept_fd;      /* store_ram_keep: the fd to hand over, else -1 */
  bool adopted;     /* handed over: recover hands its slots back */
  atomic_uint facts; /* RAM_FACTS: the header gets them at the keep */
  /* The populating thread, if started. */
  pthread_t populator;
  bool populating;
  atomic_bool populate_stop;
  store_populated_fn *populated;
  void *populated_arg;
};

static uint64_t
align_up (uint64_t x, uint64_t a)
{
  return (x + a - 1) / a * a;
}

static void
ram_layout_compute (struct ram_layout *l, uint32_t nslots,
                    uint32_t folio_size, uint32_t block_size)
{
  l->bitmap_words = store_bitmap_words (folio_size / block_size);
  l->slots_off = RAM_HEADER_BYTES;
  l->bitmaps_off = align_up (l->slots_off + (uint64_t) nslots * 8, 64);
  l->data_off = align_up (l->bitmaps_off +
                          (uint64_t) nslots * l->bitmap_words * 8,
                          RAM_DATA_ALIGN);
  l->total_size = l->data_off + (uint64_t) nslots * folio_size;
}

/* FNV-1a, 64 bits: a torn or foreign header does not pass. */
static uint64_t
ram_header_sum (const struct ram_header *h)
{
  const unsigned char *p = (const unsigned char *) h;
  uint64_t x = 0xcbf29ce484222325ull;

  for (size_t i = 0; i < offsetof (struct ram_header, sum); i++)
    x = (x ^ p[i]) * 0x100000001b3ull;
  return x;
}

static void *
ram_data (struct store *s, uint32_t slot)
{
  struct store_ram *r = (struct store_ram *) s;
  return r->data + (size_t) slot * s->folio_size;
}

static uint64_t *
ram_bitmap (struct store *s, uint32_t slot)
{
  struct store_ram *r = (struct store_ram *) s;
  return r->bitmaps + (size_t) slot * s->bitmap_words;
}

/* The slot table is the cache's folio map, kept where the next process
 * finds it.  No order to keep: it is read only after a quiesce. */
static void
ram_set_index (struct store *s, uint32_t slot, uint64_t folio_index)
{
  struct store_ram *r = (struct store_ram *) s;
  r->slots[slot] = folio_index;
}

static int
ram_persist (struct store *s, const void *p, size_t len)
{
  (void) s; (void) p; (void) len;
  return 0;
}

/* A store handed over: every slot that holds a folio goes back to the
 * cache with its bits, as they were at the quiesce (or as the writeback
 * of a process that died before serving left them: unstable blocks stay
 * unstable, written but not flushed yet).  A fresh store: nothing. */
static int
ram_recover (struct store *s, store_recover_fn fn, void *arg,
             struct store_recovery *out)
{
  struct store_ram *r = (struct store_ram *) s;
  uint32_t blocks = r->s.folio_size / r->block_size;

  if (!r->adopted)
    return 0;
  for (uint32_t i = 0; i < s->nslots; i++) {
    uint64_t *bits = ram_bitmap (s, i);
    int e;
    if (r->slots[i] == STORE_NO_FOLIO)
      continue;
    for (uint32_t b = 0; b < blocks; b++) {
      uint32_t d = FP_DIRTY * blocks + b, u = FP_UNSTABLE * blocks + b;
      out->dirty_blocks += (bits[d / 64] >> (d % 64)) & 1;
      out->unstable_blocks += (bits[u / 64] >> (u % 64)) & 1;
    }
    e = fn (arg, i, r->slots[i], bits);
    if (e != 0)
      return e;
    out->folios++;
  }
  return 0;
}

/* was_clean: handed over by store_ram_keep, every bit is true. */
static void
ram_info (struct store *s, struct store_info *out)
{
  struct store_ram *r = (struct store_ram *) s;
  unsigned f = atomic_load (&r->facts);

  out->granularity = "none";
  out->mechanism = "memfd";
  out->was_clean = r->adopted;
  out->formatted = !r->adopted;
  out->doubt = (f & RAM_FLAG_DOUBT) != 0;
  out->fenced = (f & RAM_FLAG_FENCED) != 0;
  out->pt_lost = (f & RAM_FLAG_PT_LOST) != 0;
}

static int
ram_set_fact (struct store *s, unsigned fact, bool on)
{
  struct store_ram *r = (struct store_ram *) s;

  if (on)
    atomic_fetch_or (&r->facts, fact);
  else
    atomic_fetch_and (&r->facts, ~fact);
  return 0;
}

static int
ram_set_doubt (struct store *s, bool doubt)
{
  return ram_set_fact (s, RAM_FLAG_DOUBT, doubt);
}

static int
ram_set_fenced (struct store *s, bool fenced)
{
  return ram_set_fact (s, RAM_FLAG_FENCED, fenced);
}

static int
ram_set_pt_lost (struct store *s, bool lost)
{
  return ram_set_fact (s, RAM_FLAG_PT_LOST, lost);
}

static void
ram_destroy (struct store *s)
{
  struct store_ram *r = (struct store_ram *) s;

  if (r->populating) {
    atomic_store (&r->populate_stop, true);
    pthread_join (r->populator, NULL);
  }
  munmap (r->base, r->l.total_size);
  close (r->fd);
  if (r->kept_fd >= 0)
    close (r->kept_fd);
  free (r);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23          /* Linux 5.14; older headers */
#endif

/* Fault every page of the mapping in, in the background.  A cache fills
 * its memory and keeps it (evicted slots are reused, never freed), so this
 * only brings the cost forward: otherwise the first pass over a cold cache
 * pays it in the request path, the kernel zeroing each page as a writer's
 * copy first touches it (streaming 4 GiB through a 1 GiB cache: over half
 * of the daemon's CPU in clear_page_erms; with the memory populated, the
 * stream runs as fast as it does on its second pass).  Doing it before
 * listening cost 4 s per GiB at start, so a thread at SCHED_IDLE does it
 * chunk by chunk after: requests that touch a page first fault it in
 * themselves, as without population.  MADV_POPULATE_WRITE faults pages in
 * writable without writing to them, so it cannot race with a request
 * writing the same page.  Kernels before 5.14 (EINVAL) have no such
 * operation; writing to each page would race with requests, so there the
 * pages are faulted in on demand only. */
static void *
ram_populate_main (void *arg)
{
  struct store_ram *r = arg;
  uint64_t start = now_ms ();
  size_t off = 0;
  int err = 0;

  /* At the normal priority, resting after each chunk as long as it
   * took (at most half a core), never SCHED_IDLE or nice 19: such a
   * thread preempted inside madvise holds mmap_lock for reading and gets
   * no CPU again until the host idles (nice 19: until every other task
   * has had its share), while every mmap, brk and thread start of foliod
   * waits behind it, and page faults behind those: the first client
   * waited for the whole population (27 s for 256 MiB under 12
   * CPU-bound threads on 2 cores; 6 s at nice 19 under twice that). */
  while (off < r->data_len && !atomic_load (&r->populate_stop)) {
    size_t n = r->data_len - off < POPULATE_CHUNK ? r->data_len - off
                                                  : POPULATE_CHUNK;
    uint64_t t0 = now_ms ();
    if (madvise (r->data + off, n, MADV_POPULATE_WRITE) == -1) {
      err = errno;     /* EINVAL: an old kernel; ENOMEM: not that much memory */
      break;
    }
    off += n;
    uint64_t took = now_ms () - t0;
    if (took > 0)
      usleep ((useconds_t) (took < 100 ? took : 100) * 1000);
  }
  if (r->populated && !atomic_load (&r->populate_stop))
    r->populated (r->populated_arg, err, off, now_ms () - start);
  return NULL;
}

int
store_ram_populate (struct store *s, store_populated_fn *done, void *arg)
{
  struct store_ram *r = (struct store_ram *) s;
  int e;

  if (s->ops != &ram_ops || r->populating) {
    errno = EINVAL;
    return -1;
  }
  r->populated = done;
  r->populated_arg = arg;
  e = thread_start (&r->populator, ram_populate_main, r, "populate");
  if (e) {
    errno = e;
    return -1;
  }
  r->populating = true;
  return 0;
}

static const struct store_ops ram_ops = {
  .name = "ram",
  .data = ram_data,
  .bitmap = ram_bitmap,
  .set_index = ram_set_index,
  .persist = ram_persist,
  .recover = ram_recover,
  .info = ram_info,
  .set_doubt = ram_set_doubt,
  .set_fenced = ram_set_fenced,
  .set_pt_lost = ram_set_pt_lost,
  .destroy = ram_destroy,
};

/* The base of r, which is r: its first member (a cast, not &r->s, so
 * that gcc -fanalyzer follows the allocation out to the caller). */
_Static_assert (offsetof (struct store_ram, s) == 0, "s comes first");
#define RAM_BASE(r) ((struct store *) (r))

/* Map fd (total_size bytes) for geometry l; r's fields set.  0 or -1. */
static int
ram_map (struct store_ram *r, int fd, uint32_t nslots, uint32_t folio_size)
{
  r->base = mmap (NULL, r->l.total_size, PROT_READ | PROT_WRITE, MAP_SHARED,
                  fd, 0);
  if (r->base == MAP_FAILED)
    return -1;
  /* Huge pages where the kernel gives them to shmem (shmem_enabled):
   * fewer faults to populate, fewer TLB misses after. */
  madvise (r->base, r->l.total_size, MADV_HUGEPAGE);
  r->fd = fd;
  r->kept_fd = -1;
  r->s.ops = &ram_ops;
  r->s.caps = STORE_EARLY_DATA;   /* nothing survives a crash */
  r->s.nslots = nslots;
  r->s.folio_size = folio_size;
  r->s.bitmap_words = r->l.bitmap_words;
  r->hdr = (struct ram_header *) r->base;
  r->slots = (uint64_t *) (r->base + r->l.slots_off);
  r->bitmaps = (uint64_t *) (r->base + r->l.bitmaps_off);
  r->data = r->base + r->l.data_off;
  r->data_len = (size_t) nslots * folio_size;
  return 0;
}

struct store *
store_ram_create (uint32_t nslots, uint32_t folio_size, uint32_t block_size)
{
  struct store_ram *r = calloc (1, sizeof *r);
  int fd = -1;

  if (r == NULL)
    return NULL;
  ram_layout_compute (&r->l, nslots, folio_size, block_size);
  /* The memfd is sparse: its pages come as they are touched (or
   * populated), as an anonymous mapping's did. */
  fd = memfd_create ("foliod-cache", MFD_CLOEXEC);
  if (fd < 0 || ftruncate (fd, (off_t) r->l.total_size) == -1 ||
      ram_map (r, fd, nslots, folio_size) == -1) {
    if (fd >= 0)
      close (fd);
    free (r);
    errno = ENOMEM;
    return NULL;
  }
  /* Every slot free; the header says "not handed" (all zeros). */
  for (uint32_t i = 0; i < nslots; i++)
    r->slots[i] = STORE_NO_FOLIO;
  r->block_size = block_size;
  return RAM_BASE (r);
}

int
store_ram_keep (struct store *s, const char *name, uint64_t export_size)
{
  struct store_ram *r = (struct store_ram *) s;
  struct ram_header *h;
  int fd;

  if (s->ops != &ram_ops || strlen (name) >= RAM_NAME_MAX ||
      r->kept_fd >= 0) {
    errno = EINVAL;
    return -1;
  }
  if (r->populating) {          /* it only faults pages in: done now */
    atomic_store (&r->populate_stop, true);
    pthread_join (r->populator, NULL);
    r->populating = false;
  }
  fd = fcntl (r->fd, F_DUPFD_CLOEXEC, 3);
  if (fd < 0)
    return -1;
  h = r->hdr;
  memset (h, 0, sizeof *h);
  memcpy (h->magic, RAM_MAGIC, sizeof h->magic);
  h->version = STORE_RAM_LAYOUT_VERSION;
  h->header_bytes = sizeof *h;
  h->flags = RAM_FLAG_HANDED | (atomic_load (&r->facts) & RAM_FACTS);
  h->nslots = s->nslots;
  h->folio_size = s->folio_size;
  h->block_size = r->block_size;
  h->bitmap_words = r->l.bitmap_words;
  h->slots_off = r->l.slots_off;
  h->bitmaps_off = r->l.bitmaps_off;
  h->data_off = r->l.data_off;
  h->total_size = r->l.total_size;
  h->export_size = export_size;
  strcpy (h->name, name);
  h->sum = ram_header_sum (h);
  r->kept_fd = fd;
  return 0;
}

void
store_ram_abandon (struct store *s)
{
  struct store_ram *r = (struct store_ram *) s;

  if (s == NULL || s->ops != &ram_ops)
    return;
  if (r->populating) {
    atomic_store (&r->populate_stop, true);
    pthread_join (r->populator, NULL);
  }
  free (r);
}

int
store_ram_kept_fd (struct store *s)
{
  return s->ops == &ram_ops ? ((struct store_ram *) s)->kept_fd : -1;
}

/* Map and check fd's header: 0 with *h mapped (munmap RAM_HEADER_BYTES),
 * or -1 with err. */
static int
ram_header_map (int fd, struct ram_header **hp, char *err, size_t errlen)
{
  struct ram_header *h;
  struct stat st;

  if (fstat (fd, &st) == -1 || st.st_size < (off_t) RAM_HEADER_BYTES) {
    snprintf (err, errlen, "not a ram store handed over (%s)",
              strerror (errno ? errno : EINVAL));
    return -1;
  }
  h = mmap (NULL, RAM_HEADER_BYTES, PROT_READ, MAP_SHARED, fd, 0);
  if (h == MAP_FAILED) {
    snprintf (err, errlen, "mapping its header: %s", strerror (errno));
    return -1;
  }
  if (memcmp (h->magic, RAM_MAGIC, sizeof h->magic) != 0)
    snprintf (err, errlen, "not a ram store (no magic)");
  else if (h->version != STORE_RAM_LAYOUT_VERSION)
    snprintf (err, errlen, "ram store layout version %u, this foliod reads "
              "%u", h->version, STORE_RAM_LAYOUT_VERSION);
  else if (h->header_bytes != sizeof *h || h->sum != ram_header_sum (h) ||
           h->name[RAM_NAME_MAX - 1] != '\0')
    snprintf (err, errlen, "its header is damaged");
  else if (!(h->flags & RAM_FLAG_HANDED))
    snprintf (err, errlen, "it was not handed over (not quiesced)");
  else if ((uint64_t) st.st_size != h->total_size)
    snprintf (err, errlen, "its size %lld is not its header's %llu",
              (long long) st.st_size, (unsigned long long) h->total_size);
  else {
    *hp = h;
    return 0;
  }
  munmap (h, RAM_HEADER_BYTES);
  errno = EINVAL;
  return -1;
}

int
store_ram_handed_name (int fd, char *name, size_t len, char *err,
                       size_t errlen)
{
  struct ram_header *h;

  if (ram_header_map (fd, &h, err, errlen) == -1)
    return -1;
  snprintf (name, len, "%s", h->name);
  munmap (h, RAM_HEADER_BYTES);
  return 0;
}

struct store *
store_ram_adopt (int fd, uint32_t nslots, uint32_t folio_size,
                 uint32_t block_size, uint64_t export_size,
                 char *err, size_t errlen)
{
  struct store_ram *r;
  struct ram_header *h;
  struct ram_layout l;

  if (ram_header_map (fd, &h, err, errlen) == -1)
    return NULL;
  ram_layout_compute (&l, nslots, folio_size, block_size);
  if (h->nslots != nslots || h->folio_size != folio_size ||
      h->block_size != block_size || h->export_size != export_size ||
      h->bitmap_words != l.bitmap_words || h->slots_off != l.slots_off ||
      h->bitmaps_off != l.bitmaps_off || h->data_off != l.data_off ||
      h->total_size != l.total_size) {
    snprintf (err, errlen, "the cache handed over has another geometry "
              "(%u folios of %u bytes, blocks of %u, export of %llu bytes; "
              "now %u, %u, %u, %llu): cache-size, folio-size and "
              "block-size change at a restart, not an upgrade",
              h->nslots, h->folio_size, h->block_size,
              (unsigned long long) h->export_size, nslots, folio_size,
              block_size, (unsigned long long) export_size);
    munmap (h, RAM_HEADER_BYTES);
    errno = EINVAL;
    return NULL;
  }
  unsigned facts = h->flags & RAM_FACTS;
  munmap (h, RAM_HEADER_BYTES);
  r = calloc (1, sizeof *r);
  if (r == NULL) {
    snprintf (err, errlen, "out of memory");
    errno = ENOMEM;
    return NULL;
  }
  r->l = l;
  fd = fcntl (fd, F_DUPFD_CLOEXEC, 3);      /* ours: the caller keeps its */
  if (fd < 0 || ram_map (r, fd, nslots, folio_size) == -1) {
    snprintf (err, errlen, "mapping the cache handed over: %s",
              strerror (errno));
    if (fd >= 0)
      close (fd);
    free (r);
    return NULL;
  }
  for (uint32_t i = 0; i < nslots; i++)
    if (r->slots[i] != STORE_NO_FOLIO &&
        r->slots[i] >= (export_size + folio_size - 1) / folio_size) {
      snprintf (err, errlen, "slot %u holds folio %llu, past the export",
                i, (unsigned long long) r->slots[i]);
      munmap (r->base, r->l.total_size);
      close (r->fd);
      free (r);
      errno = EINVAL;
      return NULL;
    }
  r->block_size = block_size;
  r->adopted = true;
  atomic_store (&r->facts, facts);
  return RAM_BASE (r);
}
