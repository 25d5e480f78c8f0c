/* Stores: where folio memory (and folio metadata) lives.
 *
 * The cache has nslots slots of folio_size bytes.  A store hands out, per
 * slot, the data and the state bitmap (enum folio_plane), and records
 * which folio a slot holds.  The ram store keeps all of it in
 * anonymous memory; a persistent store maps a file so that dirty data and
 * its bitmap survive a crash, and needs persist() called after data and
 * again after the bitmap changes (data first, then the dirty bit).
 */
#ifndef FOLIOD_STORE_H
#define FOLIOD_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_NO_FOLIO UINT64_MAX

/* The planes of a slot's state bitmap, blocks_per_folio bits each, one
 * after the other in this order (iomap's enum iomap_block_state). */
enum folio_plane {
  FP_UPTODATE,  /* the folio holds the block's data */
  FP_DIRTY,     /* newer than the backing: to be written back */
  FP_UNSTABLE,  /* written back, but the backing may still lose it */
  FP_NPLANES
};

/* uint64_t words of one slot's state bitmap. */
static inline uint32_t
store_bitmap_words (uint32_t blocks_per_folio)
{
  return (FP_NPLANES * blocks_per_folio + 63) / 64;
}

struct store;

struct store_ops {
  const char *name;
  /* Folio memory of a slot: folio_size bytes. */
  void *(*data) (struct store *s, uint32_t slot);
  /* State bitmap of a slot: bitmap_words words, FP_NPLANES planes. */
  uint64_t *(*bitmap) (struct store *s, uint32_t slot);
  /* Record that slot holds folio index (STORE_NO_FOLIO: free). */
  void (*set_index) (struct store *s, uint32_t slot, uint64_t folio_index);
  /* Make [p, p+len) inside the store durable.  0 or -1/errno. */
  int (*persist) (struct store *s, const void *p, size_t len);
  void (*destroy) (struct store *s);
};

struct store {
  const struct store_ops *ops;
  uint32_t nslots;
  uint32_t folio_size;
  uint32_t bitmap_words; /* uint64_t words per slot bitmap */
};

/* Anonymous memory for nslots folios of folio_size with block_size blocks. */
struct store *store_ram_create (uint32_t nslots, uint32_t folio_size,
                                uint32_t block_size);

static inline void
store_destroy (struct store *s)
{
  if (s)
    s->ops->destroy (s);
}

#endif /* FOLIOD_STORE_H */
