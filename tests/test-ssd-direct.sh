#!/bin/bash
# Writes that bypass the cache (direct-threshold) over blocks the store's
# log holds dirty.
#  - FUA: answered once it is on the backing, and the cached copy follows
#    (clean).  A kill -9 right after must not bring the log's older record
#    of that block back over it: the FUA write waits for the store too.
#    Same for a WRITE_ZEROES with FUA.
#  - Not FUA (issue 33 item 17): foliod(8) promises that a crash before
#    the backing's flush brings the new version back, never an older one.
#    After a kill -9 (the file backing keeps what it was given) the log's
#    older record must not come back over the backing's newer data: a
#    write, a zero, and an unaligned write half over a dirty block.
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

# Not FUA: blocks at 4M, 5M and 6M+4K dirty and FLUSHed (in the log),
# then written over directly, no FLUSH after.
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" -c '
for off in (4 << 20, 5 << 20, (6 << 20) + 4096):
    h.pwrite(b"A" * 4096, off)
h.flush()
h.pwrite(b"C" * (128 << 10), 4 << 20)
h.zero(128 << 10, 5 << 20)
h.pwrite(b"D" * (128 << 10), (6 << 20) + 6144)
assert h.pread(4096, 4 << 20) == b"C" * 4096
assert h.pread(4096, 5 << 20) == bytes(4096)
assert h.pread(4096, (6 << 20) + 4096) == b"A" * 2048 + b"D" * 2048' ||
  fail "direct writes, not FUA"
kill9_foliod "$pidf"
start_foliod "${args[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" -c '
got = h.pread(4096, 4 << 20)
assert got == b"C" * 4096, "direct write: %r came back" % got[:1]
got = h.pread(4096, 5 << 20)
assert got == bytes(4096), "direct zero: %r came back" % got[:1]
got = h.pread(4096, (6 << 20) + 4096)
assert got == b"A" * 2048 + b"D" * 2048, "unaligned direct write: %r came back" % got[2048:2049]' ||
  fail "after kill -9: an older logged version came back over a direct write"
stop_foliod
echo ok
