#!/bin/bash
# Buffer budgets far below one request (issue 12): a connection with
# nothing in flight still gets its request (no deadlock), and pipelined
# requests are paused and resumed by their own replies and by other
# connections' (the total) with the data intact.
. "$(dirname "$0")/lib.sh"
lib_init server-limits
requires nbdsh python3

truncate -s 160M "$tmp/img"
start_foliod --max-conn-buffer 1M --max-buffer-total 1M \
  --export "disk0=file:$tmp/img,cache-size=32M"

# A request larger than both budgets.
timeout $((120 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
import os
d = os.urandom(8 << 20)
h.pwrite(d, 4096)
assert h.pread(8 << 20, 4096) == d, "8 MiB read back differs"
' || fail "request larger than the budgets"

cat > "$tmp/raw.py" <<'PY'
import os, sys, time
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
import nbdraw
sock, part = os.environ["SOCK"], sys.argv[1]

if part == "pipeline":
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
print(part, "ok")
PY
raw () {
  TOP=$TOP SOCK=$SOCK timeout $((120 * TSCALE)) \
    python3 "$tmp/raw.py" "$1" || fail "$1"
}
raw pipeline

foliod_alive
stop_foliod
echo OK
