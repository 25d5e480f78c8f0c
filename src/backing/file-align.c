/* statx(STATX_DIOALIGN) on its own: glibc 2.36's struct statx lacks the
 * dio fields, so this file uses the kernel's struct and the raw syscall,
 * away from <sys/stat.h>. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>
#include <linux/stat.h>

#include "backing/file-private.h"

int
file_statx_dioalign (int fd, uint32_t *offset_align, uint32_t *mem_align)
{
#if defined(SYS_statx) && defined(STATX_DIOALIGN)
  struct statx sx;

  memset (&sx, 0, sizeof sx);
  if (syscall (SYS_statx, fd, "", AT_EMPTY_PATH, STATX_DIOALIGN, &sx) == -1)
    return 0;
  if (!(sx.stx_mask & STATX_DIOALIGN))
    return 0;
  if (sx.stx_dio_offset_align == 0)
    return -1;
  *offset_align = sx.stx_dio_offset_align;
  *mem_align = sx.stx_dio_mem_align ? sx.stx_dio_mem_align : 1;
  return 1;
#else
  (void) fd; (void) offset_align; (void) mem_align;
  return 0;
#endif
}
