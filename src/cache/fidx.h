/* The folio index: a sparse radix tree from folio number to folio, with
 * marks propagated up the tree so that walking the marked folios in offset
 * order costs time proportional to them, not to the size of the export (an
 * idle flush on a 1 TiB export looks at the root only).  Two marks, as the
 * kernel's page cache tags: FIDX_DIRTY (the folio has dirty blocks) and
 * FIDX_TOWRITE (a flush's pass must write it: the dirty set when the pass
 * began, so that a writer cannot keep the pass going).
 *
 * 64 slots per node.  The height is fixed at init from the largest folio
 * number, so inserting never reshapes the tree.  Not thread-safe: the cache
 * calls it under its index lock.
 */
#ifndef FOLIOD_FIDX_H
#define FOLIOD_FIDX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct fidx_node;

enum fidx_mark {
  FIDX_DIRTY,
  FIDX_TOWRITE,
  FIDX_MARKS
};

struct fidx {
  struct fidx_node *root;
  unsigned height;    /* levels; leaves at level height-1 */
  uint64_t max_index; /* largest folio number that may be inserted */
  size_t count;       /* entries */
  size_t nodes;       /* allocated nodes, for memory accounting */
  void *(*node_calloc) (size_t n, size_t size); /* calloc; tests inject
                                                  failures here */
};

void fidx_init (struct fidx *x, uint64_t max_index);
void fidx_destroy (struct fidx *x);

void *fidx_get (const struct fidx *x, uint64_t index);
/* Returns 0, or -1 with errno ENOMEM.  index must be absent. */
int fidx_insert (struct fidx *x, uint64_t index, void *item);
/* Removes and returns the item (NULL if absent); also drops its mark. */
void *fidx_remove (struct fidx *x, uint64_t index);
/* Puts item where index's entry is (which must be there) and returns the
 * old one; allocates nothing, keeps the mark. */
void *fidx_replace (struct fidx *x, uint64_t index, void *item);
/* Set or clear mark m of index's entry (nothing if it is absent). */
void fidx_mark (struct fidx *x, uint64_t index, enum fidx_mark m, bool on);
/* The dirty mark: fidx_mark (x, index, FIDX_DIRTY, on). */
void fidx_set_mark (struct fidx *x, uint64_t index, bool on);
/* Mark every entry that has mark from with mark to as well (under the
 * index lock: the snapshot is of one instant).  Returns how many. */
size_t fidx_tag (struct fidx *x, enum fidx_mark from, enum fidx_mark to);

/* First entry (dirty-marked only, if marked) with index in [*index, end).
 * Sets *index to its index.  NULL if none. */
void *fidx_find (const struct fidx *x, uint64_t *index, uint64_t end,
                 bool marked);
/* The same for entries with mark m. */
void *fidx_find_marked (const struct fidx *x, uint64_t *index, uint64_t end,
                        enum fidx_mark m);

#endif /* FOLIOD_FIDX_H */
