/* The kinds of persistent store, by the name of store=KIND:PATH: the one
 * place outside a store that knows which stores exist. */
#include <stddef.h>
#include <string.h>

#include "foliod/store.h"
#include "store/ssd-layout.h"

static const struct store_kind kinds[] = {
  { "pmem", store_pmem_open, store_pmem_inspect, store_pmem_read_header },
  { "ssd", store_ssd_open, store_ssd_inspect, store_ssd_read_header },
};

#define NKINDS (sizeof kinds / sizeof kinds[0])

const struct store_kind *
store_kind_parse (const char *spec, const char **path)
{
  for (size_t i = 0; spec && i < NKINDS; i++) {
    size_t n = strlen (kinds[i].name);
    if (strncmp (spec, kinds[i].name, n) == 0 && spec[n] == ':' &&
        spec[n + 1] != '\0') {
      *path = spec + n + 1;
      return &kinds[i];
    }
  }
  return NULL;
}

const struct store_kind *
store_kind_probe (const char *path, struct store_header_info *h,
                  char *err, size_t errlen)
{
  char other[256] = "";

  for (size_t i = 0; i < NKINDS; i++)
    if (kinds[i].read_header (path, h, i == 0 ? err : other,
                              i == 0 ? errlen : sizeof other) == 0)
      return &kinds[i];
  return NULL;
}
