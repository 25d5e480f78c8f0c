#!/bin/bash
# A clean (warm) store is trusted only while its backing file is as the
# clean shutdown left it (issue 23 item 4): the image edited while foliod
# was down (dd conv=notrunc: same inode, same size) must read back as
# edited, not as the old cached blocks; the log says why the warm cache
# was dropped.  Unchanged, the warm cache is kept.
. "$(dirname "$0")/lib.sh"
lib_init pmem-warm
requires nbdsh

img=$tmp/img
st=$tmp/store
keys=store=pmem:$st,cache-size=4M
truncate -s 8M "$img"
pattern () { head -c "$2" /dev/zero | tr '\0' "$1"; }

start_foliod --export "d=file:$img,$keys"
timeout 30 nbdsh -u "$(uri d)" \
  -c 'h.pwrite(b"A" * 65536, 0); h.pread(65536, 1 << 20); h.flush()' ||
  fail "write"
stop_foliod

# Unchanged: warm.
start_foliod --export "d=file:$img,$keys"
grep -q "last shutdown clean; recovered [1-9].*(warm: every block kept)" \
  "$FOLIOD_LOG" || fail "an unchanged backing lost its warm cache"
stop_foliod

# Edited while foliod was down: the new data, not the cached.
: > "$FOLIOD_LOG"
pattern B 65536 | dd of="$img" bs=64k conv=notrunc status=none
pattern C 4096 | dd of="$img" bs=4k seek=$((1 << 20 >> 12)) conv=notrunc \
  status=none
start_foliod --export "d=file:$img,$keys"
timeout 30 nbdsh -u "$(uri d)" -c '
assert h.pread(65536, 0) == b"B" * 65536, "stale block 0: %r" % h.pread(8, 0)
assert h.pread(4096, 1 << 20) == b"C" * 4096, "stale block at 1 MiB"
' || fail "the warm cache hid the edited backing"
grep -q "last shutdown clean, but the backing changed; recovered 0 folios" \
  "$FOLIOD_LOG" || fail "the warm cache was not dropped"
grep -q "warm cache is dropped: the backing file changed while foliod was down" \
  "$FOLIOD_LOG" || fail "no log line saying why the warm cache was dropped"
stop_foliod
echo ok
