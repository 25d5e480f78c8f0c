/* Statistics counters: bumped by any thread, read by the stats getters.
 *
 * An object keeps its counters as _Atomic uint64_t fields of a struct
 * member named st; STAT_ADD (obj, field, n) and STAT_GET (obj, field)
 * work on obj->st.field.  Relaxed order: a counter orders no other
 * memory, and a reader only wants a value that is recent.
 */
#ifndef FOLIOD_STAT_H
#define FOLIOD_STAT_H

#include <stdatomic.h>
#include <stdint.h>

#define STAT_ADD(obj, field, n) \
  atomic_fetch_add_explicit (&(obj)->st.field, (n), memory_order_relaxed)
#define STAT_SUB(obj, field, n) \
  atomic_fetch_sub_explicit (&(obj)->st.field, (n), memory_order_relaxed)
#define STAT_GET(obj, field) \
  atomic_load_explicit (&(obj)->st.field, memory_order_relaxed)

#endif /* FOLIOD_STAT_H */
