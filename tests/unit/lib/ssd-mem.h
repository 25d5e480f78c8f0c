/* An ssd store's device in memory, for the cache tests that run the ssd
 * store (store_ssd_open_dev): mem[0, size) holds the device's header and
 * then its bytes.  Every write is durable at once (foliod killed, the
 * disk survives): a copy of mem is the disk after a "crash". */
#ifndef FOLIOD_TEST_SSD_MEM_H
#define FOLIOD_TEST_SSD_MEM_H

#include <stddef.h>

#include "store/ssd-layout.h"

struct ssd_dev *ssd_mem_dev (unsigned char *mem, size_t size);

#endif /* FOLIOD_TEST_SSD_MEM_H */
