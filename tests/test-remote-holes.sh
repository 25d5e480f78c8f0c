#!/bin/bash
# Remote holes cost no remote reads: the remote is  nbdkit memory 1G  (all
# hole) with 1 MiB of data written at 512 MiB; a client reads all 1 GiB
# through foliod.  nbdkit's log filter shows every request the remote got:
# the only reads must be of that 1 MiB (read once), and foliod's
# backing-read counter must say 1 MiB too.
. "$(dirname "$0")/lib.sh"
lib_init remote-holes
. "$(dirname "$0")/lib-remote.sh"

MiB=$((1 << 20))
ctl=$tmp/ctl.sock
start_remote "$tmp/remote.sock" --filter=log memory 1G logfile="$tmp/remote-requests.log"
head -c $MiB /dev/urandom > "$tmp/blob"
timeout $((60 * TSCALE)) nbdsh -u "$(remote_uri)" \
  -c "h.pwrite(open('$tmp/blob', 'rb').read(), 512 << 20)" -c 'h.flush()' ||
  fail "cannot write to the remote"
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=64M"

t0=$(date +%s%N)
BLOB=$tmp/blob URI=$(uri disk0) timeout $((120 * TSCALE)) nbdsh -c '
import os
blob = open(os.environ["BLOB"], "rb").read()
h.connect_uri(os.environ["URI"])
assert h.get_size() == 1 << 30
# One reused buffer (a fresh 32 MiB per read costs the client seconds of
# page faults on a busy machine).
chunk = 32 << 20
buf = nbd.Buffer(chunk)
for off in range(0, 1 << 30, chunk):
    c = h.aio_pread(buf, off)
    while not h.aio_command_completed(c):
        h.poll(-1)
    if off == 512 << 20:
        got = buf.to_bytearray()
        assert got[:1 << 20] == blob, "data at 512 MiB"
        assert got[1 << 20:] == bytes(chunk - (1 << 20)), "data after 513 MiB"
    else:
        assert buf.is_zero(), "hole at %d reads as data" % off
h.shutdown()
' || fail "reading 1 GiB through foliod"
ms=$(( ($(date +%s%N) - t0) / 1000000 ))

read_bytes=$(foliod_stat "$ctl" foliod_backing_read_bytes_total)
foliod_alive
stop_foliod
stop_remote

# Reads the remote served: offset and count of each, from the log filter.
python3 - "$tmp/remote-requests.log" $((512 * MiB)) $MiB <<'PY' || fail "remote reads beyond the data"
import re, sys
lo, n = int(sys.argv[2]), int(sys.argv[3])
reads, extents = [], 0
for line in open(sys.argv[1]):
    m = re.search(r" Read id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)", line)
    if m:
        reads.append((int(m.group(1), 16), int(m.group(2), 16)))
    elif " Extents id=" in line:
        extents += 1
total = sum(c for _, c in reads)
print("remote: %d reads, %d bytes; %d block status requests" % (len(reads), total, extents))
outside = [(o, c) for o, c in reads if o < lo or o + c > lo + n]
assert not outside, "reads outside the data: %r" % outside[:5]
assert total == n, "remote read %d bytes, expected %d (each data byte once)" % (total, n)
PY
[ "$read_bytes" = $MiB ] || fail "foliod counted $read_bytes backing read bytes, expected $MiB"
echo "1 GiB read through foliod in $ms ms; remote read $read_bytes bytes"
echo OK
