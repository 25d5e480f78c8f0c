#!/bin/bash
# nbdkit --filter=folio, by name, once installed: make install-files
# (PREFIX=/usr, into a scratch DESTDIR) puts nbdkit-folio-filter.so in
# the directory nbdkit looks in (its --dump-config filterdir), and with
# that directory bound over nbdkit's own (in a private mount namespace:
# the host is not changed) nbdkit finds the filter by name, which then
# caches: a write and its read back through --filter=folio.
. "$(dirname "$0")/lib.sh"
filter_init filter-by-name
requires nbdsh unshare make

fdir=$(nbdkit --dump-config | sed -n 's/^filterdir=//p')
[ -n "$fdir" ] || fail "no filterdir in nbdkit --dump-config"
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$TOP" BUILD="$BUILD" \
  ${FILTERDIR:+FILTERDIR="$FILTERDIR"} DESTDIR="$tmp/dest" PREFIX=/usr \
  install-files >"$tmp/make.out" 2>&1 || { cat "$tmp/make.out"; fail "make install-files"; }
[ -f "$tmp/dest$fdir/nbdkit-folio-filter.so" ] ||
  fail "make install-files did not put the filter in nbdkit's filterdir $fdir:" \
       "$(cd "$tmp/dest" && find . -name 'nbdkit-folio-filter.so')"
# The installed copy is the one under test (not $FILTER).
cmp -s "$tmp/dest$fdir/nbdkit-folio-filter.so" "$FILTER" ||
  fail "the installed filter is not $FILTER"

timeout $((60 * TSCALE)) unshare --mount -- sh -c '
  mount --make-rprivate / && mount --bind "$1" "$2" && shift 2 && exec "$@"' sh \
  "$tmp/dest$fdir" "$fdir" env "${NBDKIT_ENV[@]}" nbdkit -U - --filter=folio \
  memory 1M cache-size=256K \
  --run 'env -u LD_PRELOAD nbdsh -u "$uri" -c "h.pwrite(b\"x\" * 4096, 8192); assert h.pread(4096, 8192) == b\"x\" * 4096"' \
  >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "nbdkit --filter=folio (by name)"; }
check_sanitizer_log "$tmp/out"
echo "nbdkit --filter=folio finds the installed filter by name"
