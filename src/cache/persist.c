/* The store's persistence, as the protocol in store.h orders it: a
 * folio's data, then its bits, then a sync (see the contract in
 * store-pmem.c).  No-ops on a store that is not persistent.  The bottom
 * of the cache: it calls nothing of the cache's. */
#include <errno.h>

#include "cache/cache-int.h"

void
folio_persist_data (struct cache *c, struct folio *f, uint32_t start,
                    uint32_t end)
{
  if (store_has (c->store, STORE_DURABLE) && end > start)
    (void) c->store->ops->persist (c->store,
                                   f->data + block_pos (c, start),
                                   (size_t) block_pos (c, end - start));
}

void
folio_persist_bits_slow (struct cache *c, struct folio *f)
{
  (void) c->store->ops->persist (c->store, f->bits,
                                 c->store->bitmap_words * sizeof *f->bits);
}

int
cache_store_sync (struct cache *c)
{
  if (!store_has (c->store, STORE_DURABLE))
    return 0;
  if (store_sync (c->store) == 0)
    return 0;
  int err = errno;
  ledger_store_sync_failed (c, err);
  errno = err;
  return -1;
}
