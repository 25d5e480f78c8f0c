/* The ram store: folio memory in one anonymous mapping, bitmaps in one
 * array.  The memory is populated in the background once the server
 * listens (store_ram_populate), not when the store is made. */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "foliod/store.h"
#include "foliod/util.h"

/* One madvise per chunk, each holding the process's mmap_lock for as
 * long as it takes: one huge page, so that a thread that needs the lock
 * for writing (a thread's stack, a large malloc) waits for at most one
 * huge page's faults, and destroy for one chunk. */
#define POPULATE_CHUNK (2u << 20)

static const struct store_ops ram_ops;

struct store_ram {
  struct store s;   /* first: the base */
  unsigned char *data;
  size_t data_len;
  uint64_t *bitmaps;
  /* The populating thread, if started. */
  pthread_t populator;
  bool populating;
  atomic_bool populate_stop;
  store_populated_fn *populated;
  void *populated_arg;
};

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

static void
ram_set_index (struct store *s, uint32_t slot, uint64_t folio_index)
{
  (void) s; (void) slot; (void) folio_index; /* nothing survives a crash */
}

static int
ram_persist (struct store *s, const void *p, size_t len)
{
  (void) s; (void) p; (void) len;
  return 0;
}

static void
ram_destroy (struct store *s)
{
  struct store_ram *r = (struct store_ram *) s;

  if (r->populating) {
    atomic_store (&r->populate_stop, true);
    pthread_join (r->populator, NULL);
  }
  munmap (r->data, r->data_len);
  free (r->bitmaps);
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
  .destroy = ram_destroy,
};

struct store *
store_ram_create (uint32_t nslots, uint32_t folio_size, uint32_t block_size)
{
  struct store_ram *r = calloc (1, sizeof *r);
  uint32_t blocks = folio_size / block_size;

  if (r == NULL)
    return NULL;
  r->s.ops = &ram_ops;
  r->s.caps = STORE_EARLY_DATA;   /* nothing survives a crash */
  r->s.nslots = nslots;
  r->s.folio_size = folio_size;
  r->s.bitmap_words = store_bitmap_words (blocks);
  r->data_len = (size_t) nslots * folio_size;
  r->data = mmap (NULL, r->data_len, PROT_READ | PROT_WRITE,
                  // cppcheck-suppress invalidFunctionArg ; MAP_ANONYMOUS: fd -1
                  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  /* Huge pages where the kernel allows: fewer faults to populate, fewer
   * TLB misses after. */
  if (r->data != MAP_FAILED)
    madvise (r->data, r->data_len, MADV_HUGEPAGE);
  r->bitmaps = calloc ((size_t) nslots * r->s.bitmap_words, sizeof (uint64_t));
  if (r->data == MAP_FAILED || r->bitmaps == NULL) {
    if (r->data != MAP_FAILED)
      munmap (r->data, r->data_len);
    free (r->bitmaps);
    free (r);
    errno = ENOMEM;
    return NULL;
  }
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic push     /* -fanalyzer: &r->s is r, its first member */
#pragma GCC diagnostic ignored "-Wanalyzer-malloc-leak"
#endif
  return &r->s;
#if defined __GNUC__ && !defined __clang__
#pragma GCC diagnostic pop
#endif
}
