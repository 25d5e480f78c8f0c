/* The ram store: folio memory in one anonymous mapping, populated when
 * the store is made, bitmaps in one array. */
#include <errno.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "foliod/store.h"

struct store_ram {
  struct store s;   /* first: the base */
  unsigned char *data;
  size_t data_len;
  uint64_t *bitmaps;
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

  munmap (r->data, r->data_len);
  free (r->bitmaps);
  free (r);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23          /* Linux 5.14; older headers */
#endif

/* Fault every page of the mapping in now.  A cache fills its memory and
 * keeps it (evicted slots are reused, never freed), so this only brings
 * the cost forward: otherwise the first pass over a cold cache pays it in
 * the request path, the kernel zeroing each page as a writer's copy first
 * touches it (streaming 4 GiB through a 1 GiB cache: over half of the
 * daemon's CPU in clear_page_erms; with the memory here, the stream runs
 * as fast as it does on its second pass).  It also makes a cache larger
 * than the host's memory fail at start (ENOMEM) rather than in the
 * middle of a write.  Kernels before 5.14: a write to every page. */
static int
ram_populate (unsigned char *p, size_t len)
{
  long page = sysconf (_SC_PAGESIZE);

  if (madvise (p, len, MADV_POPULATE_WRITE) == 0)
    return 0;
  if (errno != EINVAL)
    return -1;                  /* ENOMEM, EFAULT: no memory for it */
  for (size_t off = 0; off < len; off += (size_t) (page > 0 ? page : 4096))
    p[off] = 0;
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
  if (r->data == MAP_FAILED || r->bitmaps == NULL ||
      ram_populate (r->data, r->data_len) == -1) {
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
