#!/bin/bash
# A FUA write that bypasses the cache (direct-threshold) over a block the
# store's log holds dirty: answered once it is on the backing, and the
# cached copy follows (clean).  A kill -9 right after must not bring the
# log's older record of that block back over it: the FUA write waits for
# the store too.  Same for a WRITE_ZEROES with FUA.
. "$(dirname "$0")/lib.sh"
lib_init ssd-direct
requires nbdsh

pidf=$tmp/pid
slow=cache-size=8M,dirty-expire=3600000,writeback-interval=3600000
truncate -s 16M "$tmp/img"
args=(--pidfile "$pidf"
  --export "d=file:$tmp/img,store=ssd:$tmp/st,direct-threshold=128K,$slow")
start_foliod "${args[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" -c '
h.pwrite(b"A" * 4096, 0)
h.pwrite(b"A" * 4096, 1 << 20)
h.flush()
h.pwrite(b"B" * (128 << 10), 0, nbd.CMD_FLAG_FUA)
h.zero(128 << 10, 1 << 20, nbd.CMD_FLAG_FUA)
assert h.pread(4096, 0) == b"B" * 4096
assert h.pread(4096, 1 << 20) == bytes(4096)' || fail "writes"
kill9_foliod "$pidf"
start_foliod "${args[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" -c '
assert h.pread(4096, 0) == b"B" * 4096, "FUA direct write lost: the old record came back"
assert h.pread(4096, 1 << 20) == bytes(4096), "FUA zero lost: the old record came back"' ||
  fail "after kill -9"
stop_foliod
echo ok
