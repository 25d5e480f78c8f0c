#!/bin/bash
# Four clients at once, each writing and verifying its own range with
# several requests in flight (replies may come out of order); then the
# multi-conn promise: a write completed on one connection is seen by reads
# on another, and a FLUSH on one connection makes it durable (in the
# backing file) even though it was written on another.  FUA writes are in
# the backing file when their reply arrives.
. "$(dirname "$0")/lib.sh"
lib_init server-parallel
requires nbdsh

MiB=$((1024 * 1024))
truncate -s 80M "$tmp/img"
# Writeback only on demand (large expiry), so that what reaches the file
# before a flush tells us something.
start_foliod --workers 4 \
  --export "disk0=file:$tmp/img,cache-size=64M,dirty-expire=600000,dirty-background=90,dirty-limit=95"
U=$(uri disk0)

cat > "$tmp/client.py" <<'PY'
import os, random
n = int(os.environ["N"])
rng = random.Random(n)
base, span = n * (16 << 20), 16 << 20
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
assert h.can_multi_conn()
model = bytearray(span)
for rnd in range(8):
    cookies = []
    # 24 writes in flight at once, each in its own slot: overlapping
    # writes in flight together have no defined order.
    slot = span // 24
    for k in range(24):
        ln = rng.choice([512, 4096, 65536, 130000, rng.randrange(1, 200000)])
        off = k * slot + rng.randrange(0, slot - ln)
        data = rng.randbytes(ln)
        model[off:off + ln] = data
        cookies.append(h.aio_pwrite(data, base + off))
    while cookies:
        h.poll(-1)
        for c in list(cookies):
            if h.aio_command_completed(c):
                cookies.remove(c)
    # Read back with reads in flight too.
    bufs = []
    for k in range(16):
        off = k * (span // 16)
        b = nbd.Buffer(span // 16)
        bufs.append((off, b, h.aio_pread(b, base + off)))
    for off, b, c in bufs:
        while not h.aio_command_completed(c):
            h.poll(-1)
        assert b.to_bytearray() == model[off:off + span // 16], \
            "client %d: wrong data at %d" % (n, base + off)
h.flush()
h.shutdown()
open(os.environ["OUT"], "wb").write(model)
print("client", n, "ok")
PY

pids=()
for n in 0 1 2 3; do
  N=$n URI=$U OUT=$tmp/model$n timeout $((180 * TSCALE)) \
    nbdsh -c "exec(open('$tmp/client.py').read())" > "$tmp/client$n.log" 2>&1 &
  pids+=($!); track $!
done
for n in 0 1 2 3; do
  wait "${pids[$n]}" || { cat "$tmp/client$n.log"; fail "client $n"; }
done
cat "$tmp"/client?.log

# Each range in the backing file is that client's model (all flushed).
for n in 0 1 2 3; do
  cmp <(tail -c +$(( n * 16 * MiB + 1 )) "$tmp/img" | head -c $((16 * MiB))) "$tmp/model$n" ||
    fail "range of client $n differs in the backing file after flush"
done

cat > "$tmp/multiconn.py" <<'PY'
import os
img = os.environ["IMG"]
def on_disk(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)
a, b = nbd.NBD(), nbd.NBD()
a.connect_uri(os.environ["URI"])
b.connect_uri(os.environ["URI"])
off, data = 70 << 20, os.urandom(1 << 20)
a.pwrite(data, off)
# Visible on the other connection at once: one cache for all of them.
assert b.pread(len(data), off) == data
# Not yet in the backing (writeback cache, no flush yet): this is what
# makes the next check mean something.
assert on_disk(off, len(data)) != data, "written through before flush?"
b.flush()
assert on_disk(off, len(data)) == data, "flush on b did not persist a's write"
# FUA: durable when the reply arrives.
off2, data2 = 75 << 20, os.urandom(65536 + 777)
a.pwrite(data2, off2, nbd.CMD_FLAG_FUA)
assert on_disk(off2, len(data2)) == data2, "FUA write not in the backing"
# Zero with FUA, likewise.
a.zero(65536, off2, nbd.CMD_FLAG_FUA)
assert on_disk(off2, 65536) == bytes(65536), "FUA zero not in the backing"
a.shutdown(); b.shutdown()
print("multi-conn ok")
PY
URI=$U IMG=$tmp/img timeout $((60 * TSCALE)) \
  nbdsh -c "exec(open('$tmp/multiconn.py').read())" || fail "multi-conn semantics"

foliod_alive
stop_foliod
echo OK
