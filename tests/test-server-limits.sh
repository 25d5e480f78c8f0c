#!/bin/bash
# Request size, idle and per-client limits (issue 12):
#  1. 64 MiB reads and writes work (nbdkit's maximum; nbd-tester-client's
#     integrityhuge sends them) and 64 MiB is advertised as the maximum
#     block size; a larger read or write is answered EINVAL and the
#     connection goes on (a write's payload is skipped); with buffer
#     budgets smaller than one request, too.
#  2. max-connections-per-client: clients from 127.0.0.1 that connect and
#     idle cannot take every connection; a client from 127.0.0.2 still
#     gets in, and the refusals are logged.
#  3. idle-timeout closes a connection that sends nothing, but not one
#     that keeps sending requests.
. "$(dirname "$0")/lib.sh"
lib_init server-limits
requires nbdsh python3

port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.2", 0))' 2>/dev/null ||
  skip "cannot bind 127.0.0.2"

truncate -s 160M "$tmp/img"
# Budgets far below one request: a connection with nothing in flight
# still gets its 64 MiB request (no deadlock).
start_foliod --listen "127.0.0.1:$port" --max-connections 6 \
  --max-connections-per-client 4 --max-conn-buffer 1M --max-buffer-total 1M \
  --export "disk0=file:$tmp/img,cache-size=32M"

# --- 1. 64 MiB requests ----------------------------------------------------
timeout $((120 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
import os
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 64 << 20, h.get_block_size(nbd.SIZE_MAXIMUM)
d = os.urandom(64 << 20)
h.pwrite(d, 4096)
assert h.pread(64 << 20, 4096) == d, "64 MiB read back differs"
h.flush()
' || fail "64 MiB requests"

cat > "$tmp/raw.py" <<'PY'
import os, sys, time
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
import nbdraw
EINVAL = 22
sock, part = os.environ["SOCK"], sys.argv[1]
tcp = ("127.0.0.1", int(os.environ["PORT"]))

def still_serves(s, what):
    nbdraw.send_req(s, nbdraw.CMD_READ, 9, 4096, 4096)
    err, _ = nbdraw.simple_reply(s, 4096)
    assert err == 0, "%s: read failed with %d" % (what, err)

if part == "big":
    s = nbdraw.connect(sock, "disk0")
    assert s.block_max == 64 << 20, s.block_max
    big = (64 << 20) + 4096
    nbdraw.send_req(s, nbdraw.CMD_READ, 1, 0, big)
    assert nbdraw.simple_reply(s, big)[0] == EINVAL, "oversized read"
    nbdraw.send_req(s, nbdraw.CMD_WRITE, 2, 0, big, b"\x5a" * big)
    assert nbdraw.simple_reply(s, 0)[0] == EINVAL, "oversized write"
    still_serves(s, "after oversized requests")
elif part == "pipeline":
    # Two connections pipeline 16 writes, then 16 reads, of 512 KiB each
    # over 1M budgets: paused and resumed by their own replies and by each
    # other's (the total); the data must come back right.
    import threading
    n, size = 16, 512 << 10
    def pipeline(i, errs):
        try:
            s = nbdraw.connect(sock, "disk0")
            base = (100 << 20) + i * n * size
            data = [os.urandom(size) for _ in range(n)]
            for k in range(n):
                nbdraw.send_req(s, nbdraw.CMD_WRITE, k, base + k * size, size,
                                data[k])
            assert all(nbdraw.simple_reply(s, 0)[0] == 0 for _ in range(n))
            for k in range(n):   # one at a time: replies in order
                nbdraw.send_req(s, nbdraw.CMD_READ, k, base + k * size, size)
                err, got = nbdraw.simple_reply(s, size)
                assert err == 0 and got == data[k], "read back differs"
        except Exception as e:
            errs.append(repr(e))
    errs = []
    ts = [threading.Thread(target=pipeline, args=(i, errs)) for i in range(2)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert not errs, errs
elif part == "per-client":
    idle = [nbdraw.connect(tcp, "disk0") for _ in range(4)]
    for _ in range(3):   # over the per-client cap: closed at once
        try:
            nbdraw.connect(tcp, "disk0")
            raise AssertionError("connection over the per-client cap served")
        except (EOFError, ConnectionError):
            pass
    other = nbdraw.connect(tcp, "disk0", bind="127.0.0.2")
    still_serves(other, "client from 127.0.0.2")
    for s in idle:
        still_serves(s, "client under the cap")
elif part == "idle":
    busy = nbdraw.connect(sock, "disk0")
    idle = nbdraw.connect(sock, "disk0")
    for _ in range(12):   # 6 s of requests: never idle for 2 s
        still_serves(busy, "busy connection")
        time.sleep(0.5)
    idle.settimeout(30)   # closed within the idle timeout (2 s)
    assert idle.recv(1) == b"", "idle connection got data"
    still_serves(busy, "busy connection at the end")
print(part, "ok")
PY
raw () {
  TOP=$TOP SOCK=$SOCK PORT=$port timeout $((120 * TSCALE)) \
    python3 "$tmp/raw.py" "$1" || fail "$1"
}
raw big
raw pipeline

# --- 2. per-client cap -----------------------------------------------------
raw per-client
grep -q "refusing connection from 127.0.0.1:.*per client" "$FOLIOD_LOG" ||
  fail "per-client refusal not logged"

stop_foliod

# --- 3. idle timeout ---------------------------------------------------------
start_foliod --idle-timeout 2 --export "disk0=file:$tmp/img,cache-size=32M"
raw idle
grep -q "closed: idle timeout" "$FOLIOD_LOG" || fail "idle close not logged"
foliod_alive
stop_foliod
echo OK
