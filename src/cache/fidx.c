/* Sparse radix tree with marks; see fidx.h. */
#include <assert.h>
#include <errno.h>
#include <stdlib.h>

#include "cache/fidx.h"

#define FIDX_BITS 6
#define FIDX_SLOTS (1u << FIDX_BITS)

struct fidx_node {
  uint64_t present; /* slot i holds a child or an item */
  uint64_t marked[FIDX_MARKS]; /* slot i has mark m (inner: some
                                  * descendant has) */
  void *slots[FIDX_SLOTS];
};

static unsigned
slot_of (uint64_t index, unsigned shift)
{
  return (index >> shift) & (FIDX_SLOTS - 1);
}

static unsigned
leaf_shift (const struct fidx *x, unsigned level)
{
  return (x->height - 1 - level) * FIDX_BITS;
}

void
fidx_init (struct fidx *x, uint64_t max_index)
{
  unsigned bits = 0;

  while (bits < 64 && (max_index >> bits) != 0)
    bits++;
  x->root = NULL;
  x->height = bits ? (bits + FIDX_BITS - 1) / FIDX_BITS : 1;
  x->max_index = max_index;
  x->count = 0;
  x->nodes = 0;
  x->node_calloc = calloc;
}

static struct fidx_node *
node_alloc (struct fidx *x)
{
  struct fidx_node *n = x->node_calloc (1, sizeof *n);

  if (n)
    x->nodes++;
  return n;
}

static void
node_free (struct fidx_node *n, unsigned levels_below)
{
  if (n == NULL)
    return;
  if (levels_below > 0) {
    uint64_t bits = n->present;
    while (bits) {
      unsigned s = __builtin_ctzll (bits);
      node_free (n->slots[s], levels_below - 1);
      bits &= bits - 1;
    }
  }
  free (n);
}

void
fidx_destroy (struct fidx *x)
{
  node_free (x->root, x->height - 1);
  x->root = NULL;
  x->count = x->nodes = 0;
}

void *
fidx_get (const struct fidx *x, uint64_t index)
{
  const struct fidx_node *n = x->root;

  if (index > x->max_index)
    return NULL;
  for (unsigned level = 0; n != NULL; level++) {
    unsigned s = slot_of (index, leaf_shift (x, level));
    if (!(n->present & (1ull << s)))
      return NULL;
    if (level == x->height - 1)
      return n->slots[s];
    n = n->slots[s];
  }
  return NULL;
}

/* A node's present bit for slot s is set only once the child there
 * exists: a failed allocation leaves the tree as it was for lookups (an
 * empty node may stay behind; it is freed with the tree). */
int
fidx_insert (struct fidx *x, uint64_t index, void *item)
{
  struct fidx_node **np = &x->root;

  assert (index <= x->max_index && item != NULL);
  if (*np == NULL && (*np = node_alloc (x)) == NULL)
    return -1;
  for (unsigned level = 0;; level++) {
    struct fidx_node *n = *np;
    unsigned s = slot_of (index, leaf_shift (x, level));

    if (level == x->height - 1) {
      assert (!(n->present & (1ull << s)));
      n->slots[s] = item;
      n->present |= 1ull << s;
      x->count++;
      return 0;
    }
    if (n->slots[s] == NULL && (n->slots[s] = node_alloc (x)) == NULL)
      return -1;
    n->present |= 1ull << s;
    np = (struct fidx_node **) &n->slots[s];
  }
}

/* Fill path[] with the nodes from the root to the leaf holding index.
 * Returns false if index is absent. */
static bool
fidx_path (const struct fidx *x, uint64_t index, struct fidx_node **path)
{
  struct fidx_node *n = x->root;

  if (index > x->max_index)
    return false;
  for (unsigned level = 0; level < x->height; level++) {
    unsigned s = slot_of (index, leaf_shift (x, level));
    if (n == NULL || !(n->present & (1ull << s)))
      return false;
    path[level] = n;
    n = n->slots[s];
  }
  return true;
}

/* After mark m of a slot in path[level] changed, fix the ancestors. */
static void
marks_propagate (const struct fidx *x, struct fidx_node **path,
                 uint64_t index, unsigned level, enum fidx_mark m)
{
  while (level > 0) {
    bool any = path[level]->marked[m] != 0;
    unsigned s = slot_of (index, leaf_shift (x, level - 1));
    uint64_t bit = 1ull << s;
    if (any == !!(path[level - 1]->marked[m] & bit))
      return;
    path[level - 1]->marked[m] ^= bit;
    level--;
  }
}

void
fidx_mark (struct fidx *x, uint64_t index, enum fidx_mark m, bool on)
{
  struct fidx_node *path[11];
  unsigned leaf = x->height - 1;
  uint64_t bit;

  if (!fidx_path (x, index, path))
    return;
  bit = 1ull << slot_of (index, 0);
  if (on)
    path[leaf]->marked[m] |= bit;
  else
    path[leaf]->marked[m] &= ~bit;
  marks_propagate (x, path, index, leaf, m);
}

void
fidx_set_mark (struct fidx *x, uint64_t index, bool on)
{
  fidx_mark (x, index, FIDX_DIRTY, on);
}

size_t
fidx_tag (struct fidx *x, enum fidx_mark from, enum fidx_mark to)
{
  size_t n = 0;

  for (uint64_t i = 0; fidx_find_marked (x, &i, x->max_index + 1, from);
       i++, n++)
    fidx_mark (x, i, to, true);
  return n;
}

void *
fidx_remove (struct fidx *x, uint64_t index)
{
  struct fidx_node *path[11];
  if (!fidx_path (x, index, path))
    return NULL;
  assert (x->height >= 1);      /* a tree has a root level */
  void *item = path[x->height - 1]->slots[slot_of (index, 0)];
  for (unsigned m = 0; m < FIDX_MARKS; m++)
    fidx_mark (x, index, m, false);
  for (int level = x->height - 1; level >= 0; level--) {
    unsigned s = slot_of (index, leaf_shift (x, level));
    path[level]->present &= ~(1ull << s);
    path[level]->slots[s] = NULL;
    if (path[level]->present != 0)
      break;
    /* The node is empty: free it and clear its slot in the parent. */
    free (path[level]);
    x->nodes--;
    if (level == 0)
      x->root = NULL;
  }
  x->count--;
  return item;
}

void *
fidx_replace (struct fidx *x, uint64_t index, void *item)
{
  struct fidx_node *path[11];
  bool present = fidx_path (x, index, path);

  assert (present && item != NULL);
  assert (x->height >= 1);      /* a tree has a root level */
  (void) present;
  void **slot = &path[x->height - 1]->slots[slot_of (index, 0)];
  void *old = *slot;
  *slot = item;
  return old;
}

/* m == FIDX_MARKS: any entry. */
static void *
node_find (const struct fidx_node *n, unsigned shift, uint64_t base,
           uint64_t start, uint64_t end, unsigned m, uint64_t *found)
{
  unsigned first = (unsigned) ((start - base) >> shift);
  uint64_t bits = (m < FIDX_MARKS ? n->marked[m] : n->present) &
                  (~0ull << first);

  while (bits) {
    unsigned s = __builtin_ctzll (bits);
    uint64_t child_base = base + ((uint64_t) s << shift);
    if (child_base >= end)
      return NULL;
    if (shift == 0) {
      *found = child_base;
      return n->slots[s];
    }
    void *r = node_find (n->slots[s], shift - FIDX_BITS, child_base,
                         start > child_base ? start : child_base, end,
                         m, found);
    if (r)
      return r;
    bits &= bits - 1;
  }
  return NULL;
}

static void *
find_from (const struct fidx *x, uint64_t *index, uint64_t end, unsigned m)
{
  if (x->root == NULL || *index > x->max_index || *index >= end)
    return NULL;
  return node_find (x->root, leaf_shift (x, 0), 0, *index, end, m, index);
}

void *
fidx_find (const struct fidx *x, uint64_t *index, uint64_t end, bool marked)
{
  return find_from (x, index, end, marked ? FIDX_DIRTY : FIDX_MARKS);
}

void *
fidx_find_marked (const struct fidx *x, uint64_t *index, uint64_t end,
                  enum fidx_mark m)
{
  return find_from (x, index, end, m);
}
