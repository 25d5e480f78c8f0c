#!/bin/bash
# Read misses on a remote wait parked, without a worker: with 2 workers
# (one export may hold one of them), 32 concurrent 4 KiB misses at a
# remote with a read delay are all answered with the remote's data, and
# foliod_requests_parked_total counts them; read again, they are hits.
# Then the remote stops answering (SIGSTOP): parked misses fail after
# request-timeout (the wait is bounded without a worker watching it) and
# foliod keeps serving; after SIGCONT the same reads succeed.
. "$(dirname "$0")/lib.sh"
lib_init remote-parked
. "$(dirname "$0")/lib-remote.sh"
requires python3 nbdcopy

ctl=$tmp/ctl.sock
# -t 1: see test-remote-hang.sh (nbdkit 1.32 and a client that drops a
# connection with requests in flight).
start_remote "$tmp/remote.sock" -t 1 --filter=delay memory 16M rdelay=20ms
head -c 16M /dev/urandom > "$tmp/data"
nbdcopy "$tmp/data" "$(remote_uri)" || fail "cannot fill the remote"
start_foliod --control "$ctl" --workers 2 \
  --export "disk0=$(remote_uri),request-timeout=2000,cache-size=32M,folio-size=64K,block-size=4K"

cat > "$tmp/reads.py" <<'PY'
import os, random, sys, time
import nbd
data = open(os.environ["DATA"], "rb").read()
base, n, expect = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
offs = [base + i * 65536 + random.Random(i).randrange(16) * 4096 for i in range(n)]
bufs = [nbd.Buffer(4096) for _ in offs]
cookies = [h.aio_pread(b, o) for b, o in zip(bufs, offs)]
t0, ended = time.monotonic(), {}
while len(ended) < n and time.monotonic() - t0 < 60:
    h.poll(100)
    for c in cookies:
        if c not in ended:
            try:
                if h.aio_command_completed(c):
                    ended[c] = "ok"
            except nbd.Error:
                ended[c] = "error"
assert len(ended) == n, "%d of %d reads never ended" % (n - len(ended), n)
for c, b, o in zip(cookies, bufs, offs):
    if expect == "ok":
        assert ended[c] == "ok", "read at %d failed" % o
        assert b.to_bytearray() == data[o:o + 4096], "wrong data at %d" % o
    else:
        assert ended[c] == "error", "read at %d did not fail" % o
print("%d reads: %s" % (n, expect))
PY
reads () {
  DATA=$tmp/data URI=$(uri disk0) timeout $((120 * TSCALE)) \
    nbdsh -c "import sys; sys.argv = ['x'] + '$*'.split(); exec(open('$tmp/reads.py').read())"
}

parked0=$(foliod_stat "$ctl" foliod_requests_parked_total)
[ -n "$parked0" ] || fail "no foliod_requests_parked_total counter"
reads 0 32 ok || fail "concurrent misses"
parked=$(( $(foliod_stat "$ctl" foliod_requests_parked_total) - parked0 ))
echo "$parked of 32 misses parked"
[ "$parked" -gt 0 ] || fail "no miss was parked"
hits0=$(foliod_stat "$ctl" foliod_read_hits_total)
reads 0 32 ok || fail "the same reads again"
hits=$(( $(foliod_stat "$ctl" foliod_read_hits_total) - hits0 ))
[ "$hits" = 32 ] || fail "$hits of 32 second reads were hits"

kill -STOP "$REMOTE_PID"
reads $((4 << 20)) 16 error || fail "misses at a stopped remote"
foliod_alive
reads 0 32 ok || fail "hits while the remote is stopped"
kill -CONT "$REMOTE_PID"
# The backing counts as down now; reads succeed again once it reconnects
# (one probe at a time): retry for a while.
for ((i = 0; i < 30 * TSCALE; i++)); do
  reads $((4 << 20)) 16 ok > /dev/null 2>&1 && break
  sleep 1
done
reads $((4 << 20)) 16 ok || fail "misses after SIGCONT"
foliod_alive
stop_foliod
echo OK
