#!/bin/bash
# Readahead over a slow remote (nbdkit --filter=delay rdelay=2ms):
#  1. a sequential read of 32 MiB in 64 KiB reads, one at a time, is
#     answered with prefetched data: readahead brings most of it ahead of
#     the reader (foliod_readahead_bytes_total), the reader then reads
#     those folios (foliod_readahead_hits_total), and nearly every read is
#     a hit; the data is the remote's;
#  2. random 4 KiB reads (another region, fixed seed) issue no window and
#     read from the remote exactly the blocks asked for;
#  3. readahead=0 turns it off;
#  4. dirty data survives readahead pressure: an 8 MiB cache with dirty
#     blocks written into (and around) a 48 MiB range that is then read
#     sequentially through it; the stream reads the written data, the
#     dirty blocks stay until the flush, and the remote's file holds them.
. "$(dirname "$0")/lib.sh"
lib_init remote-readahead
. "$(dirname "$0")/lib-remote.sh"

MiB=$((1024 * 1024))
random_file "$tmp/img" 64
cp "$tmp/img" "$tmp/model"
start_remote "$tmp/remote.sock" --filter=delay file "$tmp/img" rdelay=2ms
ctl=$tmp/ctl

stat () { foliod_stat "$ctl" "$1"; }

# seqread OFF LEN BS: read [OFF, OFF+LEN) in BS reads, one at a time,
# and compare with the model.
seqread () {
  URI=$(uri disk0) MODEL=$tmp/model OFF=$1 LEN=$2 BS=$3 nbdsh -c - <<'PY'
import os
off, n, bs = (int(os.environ[k]) for k in ("OFF", "LEN", "BS"))
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
with open(os.environ["MODEL"], "rb") as f:
    f.seek(off)
    want = f.read(n)
for o in range(0, n, bs):
    got = h.pread(bs, off + o)
    assert got == want[o:o + bs], "wrong data at %d" % (off + o)
h.shutdown()
PY
}

# --- 1. sequential: prefetched ---
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=64M"
seqread 0 $((32 * MiB)) 65536
ra=$(stat foliod_readahead_bytes_total)
hits=$(stat foliod_readahead_hits_total)
rh=$(stat foliod_read_hits_total)
rm=$(stat foliod_read_misses_total)
echo "sequential 32M: readahead $ra bytes, $hits folios read from it; reads: $rh hits, $rm misses"
[ -n "$ra" ] && [ "$ra" -ge $((24 * MiB)) ] || fail "readahead brought $ra bytes of 32M"
[ "$hits" -ge 384 ] || fail "the reader read only $hits of 512 folios from readahead"
[ "$rh" -ge $((rm * 4)) ] || fail "sequential reads: $rh hits, $rm misses"
# At most two windows (4M each) ahead of the reader.
[ "$(stat foliod_backing_read_bytes_total)" -le $((40 * MiB)) ] ||
  fail "readahead read far past the stream"

# --- 2. random reads: no readahead ---
w0=$(stat foliod_readahead_windows_total)
b0=$(stat foliod_backing_read_bytes_total)
URI=$(uri disk0) MODEL=$tmp/model nbdsh -c - <<'PY'
import os, random
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
model = open(os.environ["MODEL"], "rb").read()
rng = random.Random(11)
lo, blocks = 40 << 20, (24 << 20) // 4096
for b in rng.sample(range(blocks), 600):
    off = lo + b * 4096
    assert h.pread(4096, off) == model[off:off + 4096], "wrong data at %d" % off
h.shutdown()
PY
w1=$(stat foliod_readahead_windows_total)
b1=$(stat foliod_backing_read_bytes_total)
echo "600 random reads: $((w1 - w0)) windows, $((b1 - b0)) bytes from the remote"
[ "$w1" = "$w0" ] || fail "random reads issued $((w1 - w0)) readahead windows"
[ $((b1 - b0)) = $((600 * 4096)) ] || fail "random reads read $((b1 - b0)) bytes, not 600 blocks"
stop_foliod

# --- 3. readahead=0: off ---
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=64M,readahead=0"
seqread 0 $((4 * MiB)) 65536
[ "$(stat foliod_readahead_bytes_total)" = 0 ] || fail "readahead=0 read ahead"
stop_foliod

# --- 4. dirty data under readahead pressure ---
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=8M,dirty-expire=600000,writeback-interval=600000"
URI=$(uri disk0) MODEL=$tmp/model nbdsh -c - <<'PY'
import os, random
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
model = bytearray(open(os.environ["MODEL"], "rb").read())
rng = random.Random(5)
# 48 blocks of 4 KiB (192K: under dirty-background, 10% of 8M), in the
# range streamed next and around it, some in the same folios.
for i in range(48):
    off = rng.randrange(0, 56 << 20, 4096)
    buf = bytes([i + 1]) * 4096
    h.pwrite(buf, off)
    model[off:off + 4096] = buf
open(os.environ["MODEL"], "wb").write(model)
h.shutdown()
PY
d0=$(stat foliod_dirty_bytes)
[ "$d0" -gt 0 ] || fail "no dirty data before the stream"
seqread $((4 * MiB)) $((48 * MiB)) 65536
d1=$(stat foliod_dirty_bytes)
ra=$(stat foliod_readahead_bytes_total)
ev=$(stat foliod_evictions_total)
echo "stream of 48M through an 8M cache: dirty $d0 -> $d1 bytes, readahead $ra bytes, $ev evictions"
[ "$d1" = "$d0" ] || fail "the stream changed the dirty data: $d0 -> $d1 bytes"
[ "$ra" -ge $((16 * MiB)) ] || fail "readahead brought only $ra bytes"
seqread 0 $((64 * MiB)) $MiB              # the writes read back, all of it
"$FOLIOD" flush --control "$ctl" disk0 || fail "foliod flush"
[ "$(stat foliod_dirty_bytes)" = 0 ] || fail "dirty data after the flush"
stop_foliod
stop_remote
cmp "$tmp/img" "$tmp/model" || fail "the remote's file lacks the writes"
echo OK
