/* backing_open: pick the implementation from the spec's scheme. */
#include <stdio.h>
#include <string.h>

#include "foliod/backing.h"

static int
has_prefix (const char *s, const char *prefix)
{
  return strncmp (s, prefix, strlen (prefix)) == 0;
}

static const char *const nbd_schemes[] = {
  "nbd://", "nbds://", "nbd+unix://", "nbds+unix://",
};

struct backing *
backing_open (const char *spec, const struct backing_opts *o,
              char *err, size_t errlen)
{
  const char *sep;
  size_t i;

  if (spec == NULL || *spec == '\0') {
    snprintf (err, errlen, "empty backing spec");
    return NULL;
  }
  for (i = 0; i < sizeof nbd_schemes / sizeof nbd_schemes[0]; i++)
    if (has_prefix (spec, nbd_schemes[i]))
      return backing_nbd_open (spec, o, err, errlen);
  if (has_prefix (spec, "rbd:"))
    return backing_rbd_open (spec + 4, o, err, errlen);
  if (has_prefix (spec, "file://"))
    return backing_file_open (spec + 7, o, err, errlen);
  if (has_prefix (spec, "file:"))
    return backing_file_open (spec + 5, o, err, errlen);
  /* "vsock://", "nbd+tcp://", "http://": a scheme we do not serve.  A
   * bare path containing "://" is unlikely; "file:" still reaches it. */
  sep = strstr (spec, "://");
  if (sep != NULL && strchr (spec, '/') > sep) {
    snprintf (err, errlen,
              "unsupported backing scheme \"%.*s\" (use file:PATH, nbd://, "
              "nbds://, nbd+unix://, nbds+unix:// or rbd:POOL/IMAGE)",
              (int) (sep - spec), spec);
    return NULL;
  }
  return backing_file_open (spec, o, err, errlen);
}
