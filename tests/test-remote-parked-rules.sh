#!/bin/bash
# Parked misses keep the read rules (issue 24 item 4).  A client with
# simple replies (as the kernel's nbd-client: every read of it is a
# parked miss) reads through foliod from a remote (nbdkit memory, with
# the log filter listing every request the remote got):
#  1. 4 KiB sequential reads are seen by readahead: windows are fetched
#     ahead of the reader (foliod_readahead_bytes_total > 0);
#  2. 4 KiB reads of a region that is a hole on the remote read nothing
#     from the remote (the map answers them);
#  3. 512-byte reads of one block not cached, repeated, fetch that block
#     once (the fetch is rounded out to whole blocks, which are cached);
#  4. random 4 KiB reads of a hole that foliod has not mapped yet: the map
#     is asked for in the background, and only the first reads (at most 16
#     of 64) go to the remote;
# and the data is the remote's throughout.
. "$(dirname "$0")/lib.sh"
lib_init remote-parked-rules
. "$(dirname "$0")/lib-remote.sh"

MiB=$((1 << 20))
ctl=$tmp/ctl.sock
start_remote "$tmp/remote.sock" --filter=log memory 64M \
  logfile="$tmp/remote-requests.log"
# Data at [0, 8 MiB) and [40 MiB, 41 MiB); the rest is a hole.
head -c $((8 * MiB)) /dev/urandom > "$tmp/data0"
head -c $MiB /dev/urandom > "$tmp/data40"
timeout $((60 * TSCALE)) nbdsh -u "$(remote_uri)" \
  -c "h.pwrite(open('$tmp/data0', 'rb').read(), 0)" \
  -c "h.pwrite(open('$tmp/data40', 'rb').read(), 40 << 20)" -c 'h.flush()' ||
  fail "cannot write to the remote"
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=32M"
: > "$tmp/remote-requests.log"   # what foliod asks from here on

# simple_reads OFF LEN BS [REPEAT]: read [OFF, OFF+LEN) in BS reads one at
# a time with simple replies (REPEAT times each) and check the data.
simple_reads () {
  URI=$(uri disk0) D0=$tmp/data0 D40=$tmp/data40 OFF=$1 LEN=$2 BS=$3 \
    REP=${4:-1} timeout $((120 * TSCALE)) nbdsh -c - <<'PY'
import os
off, n, bs, rep = (int(os.environ[k]) for k in ("OFF", "LEN", "BS", "REP"))
img = bytearray(64 << 20)
img[0:8 << 20] = open(os.environ["D0"], "rb").read()
img[40 << 20:41 << 20] = open(os.environ["D40"], "rb").read()
h = nbd.NBD()
h.set_request_structured_replies(False)
h.connect_uri(os.environ["URI"])
assert not h.get_structured_replies_negotiated()
for o in range(off, off + n, bs):
    for _ in range(rep):
        assert h.pread(bs, o) == img[o:o + bs], "wrong data at %d" % o
h.shutdown()
PY
}

# remote_reads LO HI: bytes of the remote's reads that overlap [LO, HI),
# and how many reads.
remote_reads () {
  python3 - "$tmp/remote-requests.log" "$1" "$2" <<'PY'
import re, sys
lo, hi = int(sys.argv[2]), int(sys.argv[3])
n = total = 0
for line in open(sys.argv[1]):
    m = re.search(r" Read id=\d+ offset=(0x[0-9a-f]+) count=(0x[0-9a-f]+)", line)
    if m:
        o, c = int(m.group(1), 16), int(m.group(2), 16)
        if o < hi and lo < o + c:
            n += 1
            total += min(hi, o + c) - max(lo, o)
print(total, n)
PY
}

# --- 1. sequential 4 KiB reads feed readahead ------------------------------
simple_reads 0 $((8 * MiB)) 4096 || fail "sequential 4 KiB reads"
ra=$(foliod_stat "$ctl" foliod_readahead_bytes_total)
parked=$(foliod_stat "$ctl" foliod_requests_parked_total)
echo "sequential 4 KiB simple reads: readahead_bytes=$ra requests_parked=$parked"
[ "$ra" -gt 0 ] || fail "parked 4 KiB sequential reads started no readahead"

# --- 2. holes are not read -------------------------------------------------
simple_reads $((16 * MiB)) $((4 * MiB)) 4096 || fail "4 KiB reads of a hole"
read -r hole_bytes hole_reads < <(remote_reads $((16 * MiB)) $((20 * MiB)))
echo "hole [16 MiB, 20 MiB): the remote read $hole_bytes bytes in $hole_reads reads"
[ "$hole_bytes" -eq 0 ] || fail "the remote read $hole_bytes bytes of a hole"

# --- 3. sub-block reads of one block fetch it once -------------------------
simple_reads $((40 * MiB + 8192)) 512 512 8 || fail "512-byte reads"
read -r blk_bytes blk_reads < <(remote_reads $((40 * MiB + 8192)) $((40 * MiB + 8704)))
echo "8 reads of 512 bytes at 40 MiB + 8 KiB: the remote read them $blk_reads times"
[ "$blk_reads" -eq 1 ] || fail "8 reads of 512 bytes fetched $blk_reads times"

# --- 4. a map not known yet is asked for in the background ----------------
# A fresh foliod (nothing mapped) and random 4 KiB reads of a hole: the
# first may be read as data (the map is not known without asking), the
# map asked for meanwhile answers the rest.
foliod_alive
stop_foliod
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=32M"
: > "$tmp/remote-requests.log"
URI=$(uri disk0) timeout $((120 * TSCALE)) nbdsh -c - <<'PY' || fail "random reads of a hole"
import os, random
h = nbd.NBD()
h.set_request_structured_replies(False)
h.connect_uri(os.environ["URI"])
offs = [(48 << 20) + i * 65536 for i in range(64)]
random.Random(3).shuffle(offs)
for o in offs:
    assert h.pread(4096, o) == bytes(4096), "hole at %d reads as data" % o
h.shutdown()
PY
read -r rnd_bytes rnd_reads < <(remote_reads $((48 * MiB)) $((52 * MiB)))
echo "64 random 4 KiB reads of a hole not yet mapped: the remote read $rnd_reads times"
[ "$rnd_reads" -le 16 ] || fail "$rnd_reads of 64 reads of a hole went to the remote"

foliod_alive
stop_foliod
stop_remote
