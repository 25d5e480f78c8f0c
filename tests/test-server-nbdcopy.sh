#!/bin/bash
# nbdcopy a 1 GiB random file into foliod and back out: the copy equals the
# source, and after SIGTERM the backing file does too.  The cache (256 MiB)
# is smaller than the data, so eviction and writeback run during the copy.
# (Files are compared with cmp: equal content, cheaper than two hashes.)
. "$(dirname "$0")/lib.sh"
SIZE_MIB=${NBDCOPY_MIB:-1024}
lib_init server-nbdcopy $((3 * SIZE_MIB))
requires nbdcopy

# Source and copy in $tmp (tmpfs when there is room), but the backing on
# a disk filesystem under /tmp: SEEK_HOLE on tmpfs costs time linear in
# the file size, which block status would pay on every call.
disk=$(mktemp -d /tmp/foliod-server-nbdcopy-img-XXXXXX)
trap 'rm -rf "$disk"; _lib_cleanup' EXIT
random_file "$tmp/src" "$SIZE_MIB"
truncate -s "${SIZE_MIB}M" "$disk/img"
start_foliod --export "disk0=file:$disk/img,cache-size=256M"

t0=$(date +%s%N)
timeout $((300 * TSCALE)) nbdcopy "$tmp/src" "$(uri disk0)" || fail "nbdcopy in"
t1=$(date +%s%N)
timeout $((300 * TSCALE)) nbdcopy "$(uri disk0)" "$tmp/out" || fail "nbdcopy out"
t2=$(date +%s%N)
echo "copy in: $(( (t1 - t0) / 1000000 )) ms, copy out: $(( (t2 - t1) / 1000000 )) ms for $SIZE_MIB MiB"
cmp "$tmp/src" "$tmp/out" || fail "copied-out data differs"
rm -f "$tmp/out"

stop_foliod
cmp "$tmp/src" "$disk/img" || fail "backing file differs after SIGTERM"
echo OK
