#!/bin/bash
# nbdkit-folio-filter in front of nbdkit's memory plugin, with a cache far
# smaller than the data (4 MiB for 32 MiB written):
#  - 32 MiB of random data written, read back before and after a FLUSH:
#    every byte as written (no dirty block is dropped to make room);
#  - nbdinfo --map: base:allocation says data where data was written,
#    dirty in the cache or not, and a hole where nothing was;
#  - the same workload through nbdkit's own cache filter
#    (cache-max-size=4M) is run too and its wrong MiB printed, as a
#    reference (not asserted: it is nbdkit's bug, see docs/internals.md).
. "$(dirname "$0")/lib.sh"
filter_init filter-memory
requires nbdsh nbdinfo python3

cat > "$tmp/rw.py" <<'EOF2'
import os, sys, random
MiB = 1 << 20
rng = random.Random(36)
data = rng.randbytes(32 * MiB)
for off in range(0, 32 * MiB, MiB):       # 1 MiB writes from offset 8 MiB
    h.pwrite(data[off:off + MiB], 8 * MiB + off)
def bad():
    return sum(1 for off in range(0, 32 * MiB, MiB)
               if h.pread(MiB, 8 * MiB + off) != data[off:off + MiB])
before = bad()
h.flush()
after = bad()
print("wrong MiB of 32: before flush %d, after flush %d" % (before, after))
sys.exit(1 if before or after else 0)
EOF2

# Ours: every byte back.
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
  --filter="$FILTER" memory 64M cache-size=4M \
  --run 'env -u LD_PRELOAD nbdsh -u "$uri" -c "exec(open(\"'"$tmp/rw.py"'\").read())"' \
  >"$tmp/ours.out" 2>"$tmp/ours.log" ||
  { cat "$tmp/ours.out" "$tmp/ours.log"; fail "folio filter: data read back differs"; }
cat "$tmp/ours.out"
check_sanitizer_log "$tmp/ours.log"

# base:allocation: 8..40 MiB and 64 KiB at 48 MiB data (the last written
# last and never flushed: dirty in the cache only), the rest a hole.  nbdkit's memory plugin reports
# holes itself, so a filter that passed extents through unchanged would
# call data still dirty in the cache a hole.
cat > "$tmp/map.sh" <<'EOF2'
set -e
nbdsh -u "$uri" -c '
h.pwrite(b"\x55" * (32 << 20), 8 << 20)
h.pwrite(b"\xaa" * (64 << 10), 48 << 20)   # stays dirty in the cache
'
nbdinfo --map "$uri"
EOF2
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
  --filter="$FILTER" memory 64M cache-size=4M dirty-expire=600000 \
  --run "env -u LD_PRELOAD uri=\$uri bash $tmp/map.sh" >"$tmp/map.out" 2>"$tmp/map.log" ||
  { cat "$tmp/map.out" "$tmp/map.log"; fail "nbdinfo --map failed"; }
cat "$tmp/map.out"
# The data extents must be exactly what was written.
python3 - "$tmp/map.out" <<'EOF2' || fail "base:allocation does not match what was written"
import sys
data = []
for line in open(sys.argv[1]):
    f = line.split()
    off, ln, typ = int(f[0]), int(f[1]), int(f[2])
    if typ & 1 == 0:
        if data and data[-1][1] == off:
            data[-1][1] = off + ln
        else:
            data.append([off, off + ln])
want = [[8 << 20, 40 << 20], [48 << 20, (48 << 20) + (64 << 10)]]
print("data extents:", data)
sys.exit(0 if data == want else 1)
EOF2

# The reference: nbdkit's own cache filter on the same workload.
ref=$(timeout $((120 * TSCALE)) nbdkit -U - --filter=cache memory 64M \
  cache-max-size=4M \
  --run 'nbdsh -u "$uri" -c "exec(open(\"'"$tmp/rw.py"'\").read())"' \
  2>/dev/null || true)
echo "nbdkit $(nbdkit --version | awk '{print $2}') --filter=cache cache-max-size=4M: ${ref:-no answer}"
