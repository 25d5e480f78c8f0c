#!/bin/bash
# nbdkit's nbd plugin as a client of foliod: nbdkit re-exports foliod's
# disk0, and I/O through it (write, read, zero, trim, flush, extents)
# lands in foliod, seen by a direct client and by the backing file.
. "$(dirname "$0")/lib.sh"
lib_init clients-nbdkit
requires nbdkit nbdsh nbdinfo

truncate -s 32M "$tmp/img"
start_foliod --export "disk0=file:$tmp/img,cache-size=16M"
rm -f "$tmp/k.sock"
timeout $((120 * TSCALE)) nbdkit -f -U "$tmp/k.sock" nbd socket="$SOCK" export=disk0 \
  >"$tmp/nbdkit.log" 2>&1 &
nbdkit_pid=$!
track $nbdkit_pid
wait_for_socket "$tmp/k.sock" $((20 * TSCALE))
K="nbd+unix:///?socket=$tmp/k.sock"

[ "$(timeout 30 nbdinfo --size "$K")" = $((32 * 1024 * 1024)) ] || fail "size through nbdkit"
OUT=$tmp/d timeout 60 nbdsh -u "$K" -c '
import os
d = os.urandom(130000)
h.pwrite(d, 777)
assert h.pread(130000, 777) == d
h.pwrite(b"\xee" * 65536, 1 << 20, nbd.CMD_FLAG_FUA)
h.zero(65536, 4 << 20)
h.trim(1 << 20, 8 << 20)
h.flush()
assert h.pread(65536, 4 << 20) == bytes(65536)
open(os.environ["OUT"], "wb").write(d)
' || fail "I/O through nbdkit"
# A direct client of foliod sees the same data.
OUT=$tmp/d timeout 60 nbdsh -u "$(uri disk0)" -c '
import os
d = open(os.environ["OUT"], "rb").read()
assert h.pread(len(d), 777) == d
assert h.pread(65536, 1 << 20) == b"\xee" * 65536
' || fail "direct client does not see writes made through nbdkit"
timeout 30 nbdinfo --map "$K" | grep -q "hole" || fail "extents through nbdkit show no hole"

kill "$nbdkit_pid" 2>/dev/null || true
wait "$nbdkit_pid" 2>/dev/null || true
stop_foliod
python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); assert d[1<<20:(1<<20)+65536] == b"\xee"*65536' "$tmp/img" ||
  fail "backing file"
echo OK
