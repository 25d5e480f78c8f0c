/* Make or hold a pmem store for the scripts, until the cache makes them:
 *   pmem-store make PATH DIRTY_BLOCKS clean|unclean
 *     a store of 8 slots of 64 KiB (4 KiB blocks) for "file:/backing"
 *     (1 MiB), DIRTY_BLOCKS dirty blocks in slot 0 onwards;
 *   pmem-store hold PATH
 *     open that store, print "held", keep it until stdin closes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "foliod/store.h"
#include "store/pmem-layout.h"

static struct store *
tool_open (const char *path)
{
  struct store_config cfg = {
    .path = path, .nslots = 8, .folio_size = 65536, .block_size = 4096,
    .export_size = 1 << 20, .backing_spec = "file:/backing",
    .backing_size = 1 << 20,
  };
  char err[1024];
  struct store *s = store_pmem_open (&cfg, err, sizeof err);

  if (s == NULL)
    fprintf (stderr, "pmem-store: %s\n", err);
  return s;
}

/* Block b of the folio in slot b / 16 is dirty (and uptodate). */
static void
tool_dirty (struct store *s, unsigned n)
{
  for (unsigned b = 0; b < n && b < 8 * 16; b++) {
    uint32_t slot = b / 16, blk = b % 16;
    uint64_t *bits = s->ops->bitmap (s, slot);
    unsigned char *d = s->ops->data (s, slot);
    if (blk == 0)
      s->ops->set_index (s, slot, slot);
    memset (d + blk * 4096, 'a' + blk, 4096);
    s->ops->persist (s, d + blk * 4096, 4096);
    pmem_plane_assign (bits, 16, FP_UPTODATE, blk, true);
    pmem_plane_assign (bits, 16, FP_DIRTY, blk, true);
    s->ops->persist (s, bits, 8);
  }
}

int
main (int argc, char **argv)
{
  struct store *s;
  int r = 0;

  if (argc < 3 || (strcmp (argv[1], "make") == 0 && argc != 5)) {
    fprintf (stderr, "usage: pmem-store make PATH DIRTY clean|unclean | "
             "hold PATH\n");
    return 2;
  }
  s = tool_open (argv[2]);
  if (s == NULL)
    return 1;
  if (strcmp (argv[1], "make") == 0) {
    tool_dirty (s, (unsigned) atoi (argv[3]));
    if (strcmp (argv[4], "clean") == 0)
      r = store_mark_clean (s);
  } else {
    printf ("held\n");
    fflush (stdout);
    while (getchar () != EOF)
      ;
  }
  store_destroy (s);
  return r == 0 ? 0 : 1;
}
