#!/bin/bash
# WRITE_ZEROES on a file backing keeps a sparse file sparse (issue 23 item
# 6): a zero request that allows holes (no NBD_CMD_FLAG_NO_HOLE) punches
# them, so 256 MiB zeroed over written data and over a fresh range leave
# the file's disk usage near 0; with NO_HOLE the range is allocated (du
# grows by it); every zeroed range reads back as zeroes.  qemu-img convert
# of a 64 MiB image (8 MiB of data) into a 1 GiB export leaves the file
# small, as nbdkit's file plugin does.
. "$(dirname "$0")/lib.sh"
lib_init file-zero-holes
requires nbdsh qemu-img python3

MiB=$((1024 * 1024))
img=$tmp/disk.img
truncate -s 1G "$img"

# used FILE: bytes allocated on disk.
used () { echo $(( $(stat -c %b "$1") * $(stat -c %B "$1") )); }

start_foliod --export "disk0=file:$img,cache-size=64M"

cat >"$tmp/t.py" <<'EOF'
import os, sys
MiB = 1 << 20
step = 32 * MiB

def zero(off, n, flags=0):
    for o in range(off, off + n, step):
        h.zero(min(step, off + n - o), o, flags)

def check_zero(off, n):
    for o in range(off, off + n, 4 * MiB):
        if h.pread(4 * MiB, o) != bytes(4 * MiB):
            sys.exit("range at %d does not read as zeroes" % o)

what = sys.argv[1]
if what == "write":                 # 32 MiB of data at 0: allocated
    for o in range(0, 32 * MiB, 4 * MiB):
        h.pwrite(os.urandom(4 * MiB), o)
elif what == "zero":                # holes allowed: over the data and past it
    zero(0, 256 * MiB)
    check_zero(0, 256 * MiB)
elif what == "zero-nohole":
    zero(512 * MiB, 256 * MiB, nbd.CMD_FLAG_NO_HOLE)
    check_zero(512 * MiB, 256 * MiB)
h.flush()
EOF
run () {
  nbdsh -u "$(uri disk0)" -c "import sys; sys.argv = ['t', '$1']" \
    -c "exec(open('$tmp/t.py').read())" || fail "nbdsh $1"
}

run write
u0=$(used "$img")
echo "after writing 32 MiB: $u0 bytes used"
[ "$u0" -ge $((32 * MiB)) ] || fail "the data is not on disk: $u0 bytes used"
run zero
u1=$(used "$img")
echo "after zeroing 256 MiB (holes allowed): $u1 bytes used"
[ "$u1" -le $((4 * MiB)) ] ||
  fail "zeroing with holes allowed left $u1 bytes allocated (want ~0)"
run zero-nohole
u2=$(used "$img")
echo "after zeroing 256 MiB with NO_HOLE: $u2 bytes used"
[ "$u2" -ge $((u1 + 256 * MiB)) ] ||
  fail "zeroing with NO_HOLE did not allocate: $u2 bytes used"
stop_foliod

# qemu-img convert into a larger, fresh export.
rm -f "$img"
truncate -s 1G "$img"
truncate -s 64M "$tmp/src.img"
python3 - "$tmp/src.img" <<'EOF'
import os, sys
with open(sys.argv[1], "r+b") as f:
    for off in (0, 20 << 20, 50 << 20, 60 << 20):
        f.seek(off)
        f.write(os.urandom(2 << 20))
EOF
start_foliod --export "disk0=file:$img,cache-size=64M"
timeout $((300 * TSCALE)) qemu-img convert -n -f raw -O raw \
  "$tmp/src.img" "$(uri disk0)" || fail "qemu-img convert"
timeout $((300 * TSCALE)) qemu-img compare -f raw -F raw \
  "$tmp/src.img" "$(uri disk0)" || fail "qemu-img compare"
stop_foliod
u3=$(used "$img")
echo "after qemu-img convert of 64 MiB (8 MiB data) into 1 GiB: $u3 bytes used"
[ "$u3" -le $((24 * MiB)) ] ||
  fail "qemu-img convert left $u3 bytes allocated (want about 8 MiB)"
cmp -n $((64 * MiB)) "$tmp/src.img" "$img" || fail "the file differs from the source"
cmp -i $((64 * MiB)) -n $((960 * MiB)) "$img" /dev/zero ||
  fail "the file past the copy is not zero"
