/* The ram store's memfd (src/store/store-ram.c), as an upgrade in place
 * hands it over:
 *   - store_ram_keep stamps it; store_ram_adopt of that fd with the same
 *     geometry maps the same memory: recover hands back exactly the slots
 *     that held folios, with their bits and data;
 *   - a memfd that was not kept, or is of another geometry, another
 *     export size, another layout version or has a damaged header, is
 *     refused (never misread);
 *   - a fresh store recovers nothing.
 */
#define _GNU_SOURCE
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "foliod/store.h"

#define NSLOTS 16
#define FOLIO  65536u
#define BLOCK  4096u
#define EXPORT ((uint64_t) 64 * FOLIO)

struct seen {
  unsigned n;
  uint32_t slot[NSLOTS];
  uint64_t folio[NSLOTS];
  uint64_t bits0[NSLOTS];
};

static int
collect (void *arg, uint32_t slot, uint64_t folio_index, uint64_t *bits)
{
  struct seen *s = arg;

  s->slot[s->n] = slot;
  s->folio[s->n] = folio_index;
  s->bits0[s->n] = bits[0];
  s->n++;
  return 0;
}

/* A store whose slots 3 and 7 hold folios 10 and 42, kept for "disk0";
 * returns it, *fd its kept fd. */
static struct store *
kept_store (int *fd)
{
  struct store *s = store_ram_create (NSLOTS, FOLIO, BLOCK);

  assert_non_null (s);
  s->ops->set_index (s, 3, 10);
  s->ops->bitmap (s, 3)[0] = 0xffff | (1ull << 16);  /* uptodate, 1 dirty */
  memset (s->ops->data (s, 3), 0xa5, FOLIO);
  s->ops->set_index (s, 7, 42);
  s->ops->bitmap (s, 7)[0] = 0x1;
  memset (s->ops->data (s, 7), 0x5a, BLOCK);
  s->ops->set_index (s, 9, 5);
  s->ops->set_index (s, 9, STORE_NO_FOLIO);     /* evicted: free again */
  assert_int_equal (store_ram_keep (s, "disk0", EXPORT), 0);
  *fd = store_ram_kept_fd (s);
  assert_true (*fd >= 0);
  return s;
}

static void
test_adopt_same (void **state)
{
  int fd;
  struct store *old = kept_store (&fd), *s;
  struct store_recovery rec;
  struct store_info info;
  struct seen seen = { 0 };
  char name[64], err[256];

  assert_int_equal (store_ram_handed_name (fd, name, sizeof name, err,
                                           sizeof err), 0);
  assert_string_equal (name, "disk0");
  s = store_ram_adopt (fd, NSLOTS, FOLIO, BLOCK, EXPORT, err, sizeof err);
  assert_non_null (s);
  store_destroy (old);            /* the adopted one maps its own copy */
  store_get_info (s, &info);
  assert_true (info.was_clean);
  assert_int_equal (store_recover (s, collect, &seen, &rec), 0);
  assert_int_equal (seen.n, 2);
  assert_int_equal (rec.folios, 2);
  assert_int_equal (rec.dirty_blocks, 1);
  assert_int_equal (seen.slot[0], 3);
  assert_int_equal (seen.folio[0], 10);
  assert_true (seen.bits0[0] == (0xffff | (1ull << 16)));
  assert_int_equal (seen.slot[1], 7);
  assert_int_equal (seen.folio[1], 42);
  assert_int_equal (((unsigned char *) s->ops->data (s, 3))[FOLIO - 1], 0xa5);
  assert_int_equal (((unsigned char *) s->ops->data (s, 7))[0], 0x5a);
  store_destroy (s);
}

static void
test_refused (void **state)
{
  int fd;
  struct store *old = kept_store (&fd);
  char err[256];
  unsigned char *h;

  /* Another geometry, another export size. */
  assert_null (store_ram_adopt (fd, NSLOTS * 2, FOLIO, BLOCK, EXPORT, err,
                                sizeof err));
  assert_non_null (strstr (err, "geometry"));
  assert_null (store_ram_adopt (fd, NSLOTS, FOLIO, BLOCK / 2, EXPORT, err,
                                sizeof err));
  assert_null (store_ram_adopt (fd, NSLOTS, FOLIO, BLOCK, EXPORT * 2, err,
                                sizeof err));
  /* Another layout version: the word after the magic. */
  h = mmap (NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  assert_true (h != MAP_FAILED);
  h[8] = STORE_RAM_LAYOUT_VERSION + 1;
  assert_null (store_ram_adopt (fd, NSLOTS, FOLIO, BLOCK, EXPORT, err,
                                sizeof err));
  assert_non_null (strstr (err, "version"));
  h[8] = STORE_RAM_LAYOUT_VERSION;
  /* A damaged header: a byte of the name. */
  h[64] ^= 1;
  assert_null (store_ram_adopt (fd, NSLOTS, FOLIO, BLOCK, EXPORT, err,
                                sizeof err));
  assert_non_null (strstr (err, "damaged"));
  munmap (h, 4096);
  store_destroy (old);
}

static void
test_not_kept (void **state)
{
  struct store *s = store_ram_create (NSLOTS, FOLIO, BLOCK);
  struct store_recovery rec;
  struct seen seen = { 0 };
  char err[256], name[64];
  int fd;

  assert_non_null (s);
  assert_int_equal (store_ram_kept_fd (s), -1);
  s->ops->set_index (s, 1, 1);
  assert_int_equal (store_recover (s, collect, &seen, &rec), 0);
  assert_int_equal (seen.n, 0);              /* a fresh store: nothing */
  /* Its memfd, not stamped (a process that never quiesced it). */
  fd = memfd_create ("not-kept", MFD_CLOEXEC);
  assert_true (fd >= 0);
  assert_int_equal (ftruncate (fd, 1 << 20), 0);
  assert_int_equal (store_ram_handed_name (fd, name, sizeof name, err,
                                           sizeof err), -1);
  assert_null (store_ram_adopt (fd, NSLOTS, FOLIO, BLOCK, EXPORT, err,
                                sizeof err));
  close (fd);
  store_destroy (s);
}

int
main (void)
{
  const struct CMUnitTest tests[] = {
    cmocka_unit_test (test_adopt_same),
    cmocka_unit_test (test_refused),
    cmocka_unit_test (test_not_kept),
  };
  return cmocka_run_group_tests (tests, NULL, NULL);
}
