/* What the nbdkit plugin and the nbdkit filter share: the export they
 * serve, its configuration from key=value parameters, and every data
 * callback (a cache_*() call and its errors in nbdkit's terms).  The two
 * adapters differ only in where the backing comes from: the plugin opens
 * its own (backing=), the filter wraps the next plugin. */
#ifndef FOLIO_NBDKIT_H
#define FOLIO_NBDKIT_H

#include <stdint.h>

#include "foliod/export.h"

struct nbdkit_extents;

/* Largest request we advertise (NBD_INFO_BLOCK_SIZE maximum). */
#define FOLIO_MAX_REQUEST (32u * 1024 * 1024)

/* Shutdown writeback ends within this (export_close has the policy). */
#define FOLIO_SHUTDOWN_MS 60000

/* The one export an adapter serves to all its connections.  A global in
 * each adapter: nbdkit's API has no context pointer before .open. */
struct folio_nbdkit {
  struct export_config cfg; /* built from key=value pairs */
  int cfg_ready;            /* cfg initialised */
  struct export *export;    /* opened before the first connection */
};

/* -D folio.verbose=1: log every request. */
extern int folio_debug_verbose;

/* .load: the log sink, the configuration's defaults. */
void folio_nbdkit_load (struct folio_nbdkit *s);
/* .unload: write back what is still dirty, free everything. */
void folio_nbdkit_unload (struct folio_nbdkit *s);
/* .config: one key=value (export_config_set); 0 or -1 (reported). */
int folio_nbdkit_config (struct folio_nbdkit *s, const char *key,
                         const char *value);
/* .config_complete: export_config_check; 0 or -1 (reported). */
int folio_nbdkit_config_complete (struct folio_nbdkit *s);
/* config_help from the shared key table: every key (plugin), or the
 * cache's alone (filter: export_key_is_cache).  Built at the first call,
 * freed when the adapter is unloaded; NULL when out of memory. */
const char *folio_nbdkit_help (int filter);
/* --dump-plugin lines (folio_keys=..., one folio_key_K=help each). */
void folio_nbdkit_dump (int filter);
/* Once s->export is open: say in the debug log what it is. */
void folio_nbdkit_opened (struct folio_nbdkit *s);
/* After nbdkit's fork: (re)start writeback, fault the memory in. */
int folio_nbdkit_start (struct folio_nbdkit *s);
/* .cleanup: log the counters, write back and close the export. */
void folio_nbdkit_cleanup (struct folio_nbdkit *s);

/* The data callbacks, flags as nbdkit gives them (NBDKIT_FLAG_*). */
void folio_nbdkit_block_size (struct folio_nbdkit *s, uint32_t *minimum,
                              uint32_t *preferred, uint32_t *maximum);
int folio_nbdkit_pread (struct folio_nbdkit *s, void *buf, uint32_t count,
                        uint64_t offset);
int folio_nbdkit_pwrite (struct folio_nbdkit *s, const void *buf,
                         uint32_t count, uint64_t offset, uint32_t flags);
int folio_nbdkit_flush (struct folio_nbdkit *s);
int folio_nbdkit_trim (struct folio_nbdkit *s, uint32_t count,
                       uint64_t offset, uint32_t flags);
int folio_nbdkit_zero (struct folio_nbdkit *s, uint32_t count,
                       uint64_t offset, uint32_t flags);
int folio_nbdkit_cache (struct folio_nbdkit *s, uint32_t count,
                        uint64_t offset);
int folio_nbdkit_extents (struct folio_nbdkit *s, uint32_t count,
                          uint64_t offset, uint32_t flags,
                          struct nbdkit_extents *extents);

#endif /* FOLIO_NBDKIT_H */
