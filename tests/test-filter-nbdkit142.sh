#!/bin/bash
# nbdkit-folio-filter in Debian 13's nbdkit 1.42, with Debian 13's own
# clients (nbdsh 1.22, qemu-img 10), in the root tests/lib-trixie.sh
# makes.  nbdkit loads only a filter built against its own headers: the
# filter built again against 1.42's (make's $BUILD/nbdkit-folio-filter-1.42.so,
# from the root's nbdkit-plugin-dev; this test makes it when "all" did
# not, the root being new).
#  - qemu-img 10 writes 24 MiB into nbdkit's memory plugin through a 4 MiB
#    cache and reads the export back in the same nbdkit: every byte;
#  - nbdsh writes, FUA-writes, zeroes and trims through a 1 MiB cache in
#    front of the file plugin, reads back, FLUSHes; after nbdkit exits the
#    file holds what was written;
#  - a tiny cache in front of a plugin whose flush fails (the client
#    of test-filter-flush-error.sh): FLUSH fails, every byte still reads
#    back, what was written back before the failed flush is written again;
#  - installed in nbdkit's filter directory, --filter=folio finds it by
#    name.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-trixie.sh"
filter_init filter-nbdkit142
# An ASan build's filter needs the host's libasan preloaded into nbdkit,
# which the Debian 13 root has not.
[ "${SAN:-}" != 1 ] || skip "sanitizer build: the Debian 13 root has no libasan for nbdkit"
requires make
trixie_root

F=${FILTER142:-$BUILD/nbdkit-folio-filter-1.42.so}
env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL make -s -C "$TOP" BUILD="$BUILD" \
  NBDKIT142_INCLUDE="$TRIXIE/usr/include" "$F" >"$tmp/make.out" 2>&1 ||
  { cat "$tmp/make.out"; fail "building $F"; }

ver=$(trixie_run nbdkit --version)
case $ver in
  "nbdkit 1.42."*) echo "peer: $ver" ;;
  *) fail "the Debian 13 root's nbdkit is not 1.42: $ver" ;;
esac

# nb142 TIMEOUT OUT ARGS...: trixie's nbdkit on a private socket with the
# filter; OUT gets its output; fail on a non-zero exit.
nb142 () {
  local t=$1 out=$2
  shift 2
  timeout $((t * TSCALE)) bash -c '. "$1"; shift; trixie_run "$@"' sh \
    "$TOP/tests/lib-trixie.sh" nbdkit -U - --filter="$F" "$@" >"$out" 2>&1 ||
    { cat "$out"; fail "nbdkit 1.42 with the filter: $*"; }
}
export TRIXIE TOP

# qemu-img 10 through a 4 MiB cache, memory plugin.
head -c 24M /dev/urandom > "$tmp/src.img"
nb142 120 "$tmp/qemu.out" memory 64M cache-size=4M \
  --run "qemu-img convert -n -f raw -O raw $tmp/src.img \"\$uri\" &&
         qemu-img convert -f raw -O raw \"\$uri\" $tmp/back.img"
cmp -n $((24 << 20)) "$tmp/src.img" "$tmp/back.img" ||
  fail "qemu-img read back other data than it wrote through the filter"
echo "qemu-img 10: 24 MiB through a 4 MiB cache read back intact"

# nbdsh 1.22: writes, FUA, zero, trim, flush over the file plugin.
truncate -s 8M "$tmp/file.img"
cat > "$tmp/io.py" <<'EOF2'
import os, random, sys
import nbd
h = nbd.NBD()
h.connect_uri(os.environ["uri"])
rng = random.Random(42)
size = 8 << 20
model = bytearray(size)
for k in range(300):                        # 4 KiB-ish, unaligned too
    n = rng.choice([512, 4096, 4096, 65536, 1000])
    off = rng.randrange(0, size - n)
    d = rng.randbytes(n)
    h.pwrite(d, off, nbd.CMD_FLAG_FUA if k % 50 == 0 else 0)
    model[off:off + n] = d
h.zero(1 << 20, 2 << 20)
model[2 << 20:3 << 20] = bytes(1 << 20)
h.trim(64 << 10, 5 << 20)
model[5 << 20:(5 << 20) + (64 << 10)] = bytes(64 << 10)   # cache zeroes it
if h.pread(size, 0) != model:
    sys.exit("FAIL: read back differs before FLUSH")
h.flush()
if h.pread(size, 0) != model:
    sys.exit("FAIL: read back differs after FLUSH")
open(sys.argv[1], "wb").write(model)
h.shutdown()
EOF2
nb142 120 "$tmp/io.out" file "$tmp/file.img" cache-size=1M \
  --run "uri=\$uri python3 $tmp/io.py $tmp/file.model"
cmp "$tmp/file.img" "$tmp/file.model" ||
  fail "the file lacks what nbdsh wrote and flushed through the filter"
echo "nbdsh 1.22: writes, FUA, zero, trim, flush reached the file"

# A tiny cache and a failing flush.
filter_flush_error_files
nb142 120 "$tmp/fe.out" --filter=log sh "$tmp/plugin.sh" cache-size=1M \
  dirty-expire=600000 logfile="$plog" \
  --run "uri=\$uri python3 $tmp/fe.py $fail_file $plog $tmp/model"
cat "$tmp/fe.out"
cmp "$img" "$tmp/model" || fail "the file lacks data after exit"
echo "failing flush: every byte in the file after exit"

# By name, from nbdkit's filter directory (a copy bound over it in the
# test's own mount namespace: the root is not changed).
fdir=$(trixie_run nbdkit --dump-config | sed -n 's/^filterdir=//p')
[ -n "$fdir" ] || fail "no filterdir in nbdkit --dump-config"
mkdir "$tmp/filters"
cp "$F" "$tmp/filters/nbdkit-folio-filter.so"
cat > "$tmp/byname.sh" <<EOF2
mount --bind $tmp/filters $fdir || exit 1
nbdkit --filter=folio null --help | grep -q '^filter: folio ' || exit 1
exec nbdkit -U - --filter=folio memory 1M cache-size=256K \
  --run 'uri=\$uri python3 $tmp/byname.py'
EOF2
cat > "$tmp/byname.py" <<'EOF2'
import os
import nbd
h = nbd.NBD()
h.connect_uri(os.environ["uri"])
h.pwrite(b"x" * 4096, 8192)
assert h.pread(4096, 8192) == b"x" * 4096
h.shutdown()
EOF2
timeout $((60 * TSCALE)) bash -c '. "$1"; shift; trixie_run "$@"' sh \
  "$TOP/tests/lib-trixie.sh" sh "$tmp/byname.sh" >"$tmp/name.out" 2>&1 ||
  { cat "$tmp/name.out"; fail "nbdkit --filter=folio by name"; }
echo "nbdkit 1.42 --filter=folio (by name) works"
