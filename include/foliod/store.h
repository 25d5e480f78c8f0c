/* Stores: where folio memory (and folio metadata) lives.
 *
 * The cache has nslots slots of folio_size bytes.  A store hands out, per
 * slot, the data and the state bitmap (uptodate bits then dirty bits), and
 * records which folio a slot holds.  The ram store keeps all of it in
 * anonymous memory; a persistent store maps a file so that dirty data and
 * its bitmap survive a crash, and needs persist() called after data and
 * again after the bitmap changes (data first, then the dirty bit).
 */
#ifndef FOLIOD_STORE_H
#define FOLIOD_STORE_H

#include <stddef.h>
#include <stdint.h>

#define STORE_NO_FOLIO UINT64_MAX

struct store;

struct store_ops {
  const char *name;
  /* Folio memory of a slot: folio_size bytes. */
  void *(*data) (struct store *s, uint32_t slot);
  /* State bitmap of a slot: 3 * blocks_per_folio bits: uptodate, dirty,
   * unstable. */
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
