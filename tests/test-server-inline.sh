#!/bin/bash
# Run-to-completion: a read or write the cache answers from memory is
# answered by the thread that read it (foliod_requests_inline_total), a
# miss or a write that must read a partial block first goes to a worker,
# and both kinds mix on one connection with the right data.  Then four
# connections write and read the same two folios at once, with writeback
# running under them (a folio being written back makes an inline attempt
# fall back): every block read is whole (one write's data), every
# connection reads its own last writes, and after a flush the backing file
# holds them.
. "$(dirname "$0")/lib.sh"
lib_init server-inline
requires nbdsh python3

truncate -s 64M "$tmp/img"
# Data in the backing at 32 MiB and 40 MiB, so that reading it must miss.
python3 -c '
import sys; f = open(sys.argv[1], "r+b")
f.seek(32 << 20); f.write(b"\x5a" * 65536)
f.seek(40 << 20); f.write(b"\x6b" * 65536)' "$tmp/img"
ctl=$tmp/ctl.sock
start_foliod --control "$ctl" --export \
  "disk0=file:$tmp/img,cache-size=16M,folio-size=64K,block-size=4K,dirty-expire=3600000,dirty-background=100,dirty-limit=100"
U=$(uri disk0)

stat () {
  "$FOLIOD" stats --control "$ctl" --prometheus > "$tmp/stats" || fail "foliod stats"
  awk -v n="$1" '$1 == n {print $2}' "$tmp/stats"
}

# One connection, one request at a time (reads under 64 KiB: a longer
# structured read asks the backing's map for holes, on a worker).
inline0=$(stat foliod_requests_inline_total)
req0=$(stat foliod_requests_total)
URI=$U timeout $((60 * TSCALE)) nbdsh -c '
import os
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
h.pwrite(b"\x01" * 65536, 0)                # whole blocks: inline
assert h.pread(32768, 0) == b"\x01" * 32768  # hit: inline
assert h.pread(4096, 32 << 20) == b"\x5a" * 4096   # miss: a worker
assert h.pread(4096, 32 << 20) == b"\x5a" * 4096   # now a hit: inline
h.pwrite(b"\x02" * 512, (40 << 20) + 512)   # partial block not cached: worker
assert h.pread(4096, 40 << 20) == \
    b"\x6b" * 512 + b"\x02" * 512 + b"\x6b" * 3072  # hit: inline
h.pwrite(b"\x03" * 4096, 8192, nbd.CMD_FLAG_FUA)  # FUA: a worker
h.shutdown()
' || fail "one-connection workload"
inline=$(( $(stat foliod_requests_inline_total) - inline0 ))
reqs=$(( $(stat foliod_requests_total) - req0 ))
[ "$reqs" = 7 ] || fail "$reqs requests counted, expected 7"
[ "$inline" = 4 ] || fail "$inline requests answered inline, expected 4 (hits and the whole-block write)"
python3 -c '
import sys; f = open(sys.argv[1], "rb"); f.seek(8192)
assert f.read(4096) == b"\x03" * 4096, "FUA write not in the backing"' "$tmp/img" ||
  fail "FUA write not in the backing"
stop_foliod

# Four connections on the same 128 KiB (two folios), writeback every few
# ms so that folios are busy under the inline attempts.
truncate -s 0 "$tmp/img"; truncate -s 64M "$tmp/img"
start_foliod --control "$ctl" --workers 4 --export \
  "disk0=file:$tmp/img,cache-size=16M,folio-size=64K,block-size=4K,dirty-expire=1,writeback-interval=2"
cat > "$tmp/race.py" <<'PY'
import os, random, struct
n = int(os.environ["N"])
rng = random.Random(n)
B, NB = 4096, 32                 # 32 blocks of 4 KiB: two 64 KiB folios
mine = [b for b in range(NB) if b % 4 == n]
def block(tag):                  # a block is one 8-byte tag repeated
    return struct.pack("<Q", tag) * (B // 8)
def whole(data, off):
    tag = data[:8]
    assert data == tag * (B // 8), "torn block at %d" % off
    return struct.unpack("<Q", tag)[0]
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
last = {}
seq = 0
for rnd in range(150):
    cookies, reads = [], []
    for b in rng.sample(mine, 4):
        seq += 1
        tag = (n << 56) | (b << 40) | seq
        last[b] = tag
        cookies.append(h.aio_pwrite(block(tag), b * B))
    for k in range(8):           # anyone's blocks, and a miss now and then
        b = rng.randrange(NB)
        off = b * B if k else (1 << 20) + rng.randrange(4096) * B
        buf = nbd.Buffer(B)
        reads.append((off, buf, h.aio_pread(buf, off)))
    while cookies:
        h.poll(-1)
        cookies = [c for c in cookies if not h.aio_command_completed(c)]
    for off, buf, c in reads:
        while not h.aio_command_completed(c):
            h.poll(-1)
        tag = whole(buf.to_bytearray(), off)
        if off < NB * B and tag:
            assert tag >> 56 == off // B % 4 and (tag >> 40) & 0xffff == off // B, \
                "block %d holds another block's data" % (off // B)
    # My own writes are all answered: reading them back gives the last.
    for b in mine:
        if b in last:
            got = whole(h.pread(B, b * B), b * B)
            assert got == last[b], "block %d: %x, last written %x" % (b, got, last[b])
h.flush()
h.shutdown()
with open(os.environ["OUT"], "w") as f:
    for b, tag in sorted(last.items()):
        f.write("%d %d\n" % (b, tag))
print("client", n, "ok")
PY
inline0=$(stat foliod_requests_inline_total)
req0=$(stat foliod_requests_total)
pids=()
for n in 0 1 2 3; do
  N=$n URI=$(uri disk0) OUT=$tmp/last$n timeout $((120 * TSCALE)) \
    nbdsh -c "exec(open('$tmp/race.py').read())" > "$tmp/race$n.log" 2>&1 &
  pids+=($!); track $!
done
for n in 0 1 2 3; do
  wait "${pids[$n]}" || { cat "$tmp/race$n.log"; fail "racing client $n"; }
done
inline=$(( $(stat foliod_requests_inline_total) - inline0 ))
reqs=$(( $(stat foliod_requests_total) - req0 ))
echo "racing clients: $reqs requests, $inline inline"
[ "$inline" -gt 0 ] && [ "$inline" -lt "$reqs" ] ||
  fail "$inline of $reqs requests inline: expected some of each kind"
# After the flushes, the backing file holds each block's last write.
cat "$tmp"/last? | python3 -c '
import struct, sys
f = open(sys.argv[1], "rb")
for line in sys.stdin:
    b, tag = map(int, line.split())
    f.seek(b * 4096)
    assert f.read(4096) == struct.pack("<Q", tag) * 512, "block %d not in the backing" % b
' "$tmp/img" || fail "backing file lacks the last writes after flush"
foliod_alive
stop_foliod
echo OK
