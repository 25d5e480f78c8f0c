/* SIGBUS from a store mapping: the store file was truncated under foliod
 * (flock does not stop truncate), or the media failed.  The process cannot
 * go on with that store (its data under the fault is gone, and every path
 * that reads the mapping would have to be told); what it can do is say
 * which store and why before it dies, instead of exit 135 and no line.
 * A SIGBUS elsewhere goes to the handler that was there before. */
#ifndef FOLIOD_PMEM_SIGBUS_H
#define FOLIOD_PMEM_SIGBUS_H

#include <stddef.h>

/* Watch [base, base + size), the store file path.  Returns a handle for
 * pmem_sigbus_forget (> 0), or 0 when the table is full (then a fault
 * there dies without the line). */
int pmem_sigbus_watch (const void *base, size_t size, const char *path);
void pmem_sigbus_forget (int handle);

#endif /* FOLIOD_PMEM_SIGBUS_H */
