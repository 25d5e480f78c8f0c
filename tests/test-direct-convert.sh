#!/bin/bash
# qemu-img convert of a 1 GiB image into foliod with direct-threshold=1M
# (issue 6): the bulk of the copy bypasses the cache (passthrough write
# bytes in `foliod stats`, the cache stays nearly empty) and qemu-img
# compare says the export equals the source, before and after foliod stops
# (then the file itself is compared).
. "$(dirname "$0")/lib.sh"
lib_init direct-convert 2600
requires qemu-img python3

MiB=$((1024 * 1024))
size=$((1024 * MiB))
src=$tmp/src.img dst=$tmp/dst.img
# Sparse-ish source: 24 extents of random data, 1..12 MiB at random
# offsets (some unaligned), a few small ones, holes in between.
truncate -s "$size" "$src"
python3 - "$src" <<'EOF'
import os, random, sys
rng = random.Random()
with open(sys.argv[1], "r+b") as f:
    for i in range(24):
        n = rng.randint(1, 12) << 20
        if i % 6 == 0:
            n = rng.randint(1, 300000)          # small, below the threshold
        off = rng.randrange((1 << 30) - n)
        if i % 3 == 0:
            off -= off % 4096
        f.seek(off)
        f.write(os.urandom(n))
EOF
truncate -s "$size" "$dst"
start_foliod --control "$tmp/ctl" \
  --export "disk0=file:$dst,direct-threshold=1M,cache-size=256M"

metric () {
  "$FOLIOD" stats --control "$tmp/ctl" --prometheus |
    awk -v n="$1" '$1 == n "{export=\"disk0\"}" {print $2}'
}

timeout $((300 * TSCALE)) qemu-img convert -n -f raw -O raw "$src" "$(uri disk0)" ||
  fail "qemu-img convert"
cw=$(metric foliod_client_write_bytes_total)
pw=$(metric foliod_passthrough_write_bytes_total)
po=$(metric foliod_passthrough_write_ops_total)
cached=$(metric foliod_cached_bytes)
echo "client wrote $cw bytes; passthrough writes $po ($pw bytes); cached $cached bytes"
[ "$cw" -gt $((24 * MiB)) ] || fail "qemu-img wrote only $cw bytes"
# The small extents and the short tail requests of big ones may be cached
# (at most ~1 MiB per extent); the bulk must not be.  Through the cache
# the whole copy (over 100 MiB) would stay cached in this 256 MiB cache.
[ $((pw * 4)) -ge $((cw * 3)) ] ||
  fail "only $pw of $cw written bytes went direct"
[ "$cached" -le $((40 * MiB)) ] ||
  fail "the copy filled the cache: $cached bytes cached"

timeout $((300 * TSCALE)) qemu-img compare -f raw -F raw "$src" "$(uri disk0)" ||
  fail "qemu-img compare: the export differs from the source"
pr=$(metric foliod_passthrough_read_bytes_total)
echo "compare: passthrough reads $pr bytes"
stop_foliod
cmp "$src" "$dst" || fail "the backing file differs from the source"
echo ok
