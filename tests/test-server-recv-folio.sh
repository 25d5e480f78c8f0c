#!/bin/bash
# Writes received straight into folio memory (cache_write_prepare): the
# whole folios of a write arrive in folios that no one sees until the
# payload is complete.  A write paused mid-payload leaves the old data
# readable; clients that die mid-payload leave no trace (and no folio
# held: fifty of them, each holding 16 folios, in a 96 MiB cache); edges
# that are not whole folios go through the request buffer; writers on
# four connections and a reader of blocks being rewritten see every 4 KiB
# block whole (one write's data); after a flush the backing file holds the
# last data.
. "$(dirname "$0")/lib.sh"
lib_init server-recv-folio
requires python3

truncate -s 64M "$tmp/img"
start_foliod --export "disk0=file:$tmp/img,cache-size=96M,folio-size=64K,block-size=4K"

TOP=$TOP SOCK=$SOCK IMG=$tmp/img STOPPED=$tmp/stopped timeout $((240 * TSCALE)) python3 - <<'PY' || fail "recv-folio checks"
import os, sys, threading, time
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
import nbdraw
from nbdraw import CMD_READ, CMD_WRITE, CMD_FLUSH, send_req, simple_reply

SOCK = os.environ["SOCK"]
MiB = 1 << 20

def conn():
    return nbdraw.connect(SOCK, "disk0")

def write(s, off, data):
    send_req(s, CMD_WRITE, 1, off, len(data), data)
    err, _ = simple_reply(s, 0)
    assert err == 0, "write at %d: error %d" % (off, err)

def read(s, off, n):
    send_req(s, CMD_READ, 2, off, n)
    err, data = simple_reply(s, n)
    assert err == 0, "read at %d: error %d" % (off, err)
    return data

def pat(tag, n):
    return (bytes([tag]) * 4096) * (n // 4096) + bytes([tag]) * (n % 4096)

r = conn()
# 1 MiB + 4 KiB at 4 KiB: 16 whole folios and two edges.
off, n = 4096, MiB + 4096
a, b = pat(0xa1, n), os.urandom(n)
w = conn()
write(w, off, a)
assert read(r, off, n) == a, "plain write"

# Paused mid-payload: the old data stays; then the rest arrives.
send_req(w, CMD_WRITE, 3, off, n, b[:600 * 1024])
time.sleep(0.3)
assert read(r, off, n) == a, "half a payload was visible"
w.sendall(b[600 * 1024:])
err, _ = simple_reply(w, 0)
assert err == 0
assert read(r, off, n) == b, "completed write"

# Clients that die mid-payload: nothing of theirs, ever.
for i in range(50):
    d = conn()
    send_req(d, CMD_WRITE, 4, off if i % 2 else 2 * MiB, MiB,
             pat(0xd0 + i % 16, MiB)[: (i * 37 % 1000 + 1) * 1024])
    d.close()
    assert read(r, off, n) == b, "dead client %d left data" % i
assert read(r, 2 * MiB, MiB) == bytes(MiB), "dead client data at 2 MiB"

# Four writers, aligned and not, each in its region, reading back; one
# reader of a region two of them rewrite with one byte value per write.
stop, errors, last = False, [], {}
shared = 32 * MiB
def writer(k):
    try:
        s, rng, i = conn(), 8 * MiB + k * 4 * MiB, 0
        while not stop:
            o = rng + (i * 3 * 65536 + (k % 2) * 4096) % (2 * MiB)
            data = os.urandom(MiB)
            write(s, o, data)
            assert read(s, o, MiB) == data, "writer %d read back" % k
            last[(k, o)] = data
            if k < 2:
                write(s, shared + (i % 4) * 65536, pat(1 + (i + k * 7) % 250, MiB))
            i += 1
    except Exception as e:
        errors.append(repr(e))
def reader():
    try:
        s = conn()
        while not stop:
            d = read(s, shared, 2 * MiB)
            for j in range(0, len(d), 4096):
                blk = d[j:j + 4096]
                assert blk.count(blk[0]) == 4096, "torn block at %d" % j
    except Exception as e:
        errors.append(repr(e))
ts = [threading.Thread(target=writer, args=(k,)) for k in range(4)]
ts.append(threading.Thread(target=reader))
for t in ts: t.start()
time.sleep(8)
stop = True
for t in ts: t.join()
assert not errors, errors
send_req(r, CMD_FLUSH, 5, 0, 0)
assert simple_reply(r, 0)[0] == 0
with open(os.environ["IMG"], "rb") as f:
    f.seek(off)
    assert f.read(n) == b, "backing at 4 KiB"
# The regions overlap between writes: check the latest write of each
# offset where no later write of the same writer overlapped it.
    for (k, o), data in last.items():
        later = [p for (kk, p) in last if kk == k and p != o and abs(p - o) < MiB]
        if later:
            continue
        f.seek(o)
        assert f.read(MiB) == data, "backing of writer %d at %d" % (k, o)
print("ok")
PY
foliod_alive
stop_foliod
