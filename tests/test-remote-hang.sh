#!/bin/bash
# A remote that stops answering (SIGSTOP on nbdkit): requests to it fail
# after request-timeout instead of holding their workers forever; 16 of
# them at once leave workers for a second export on a local file, which
# keeps serving while they hang; FLUSH on the hung export fails instead of
# hanging.  After SIGCONT foliod reconnects: the dirty data flushes and is
# in the remote.
. "$(dirname "$0")/lib.sh"
lib_init remote-hang
. "$(dirname "$0")/lib-remote.sh"
requires python3

ctl=$tmp/ctl.sock
truncate -s 16M "$tmp/local.img"
# -t 1: nbdkit 1.32 aborts (raw_send_socket: Assertion `sock >= 0') when
# a client that closed its connection had several requests in flight on
# it, as foliod does with a connection whose request hung; one thread per
# connection in nbdkit avoids that race.
start_remote "$tmp/remote.sock" -t 1 memory 64M
# The dirty data stays dirty until a flush (no background writeback).
start_foliod --control "$ctl" --workers 16 \
  --export "hung=$(remote_uri),request-timeout=2000,cache-size=16M,dirty-expire=3600000,dirty-background=100,dirty-limit=100" \
  --export "local=$tmp/local.img,cache-size=8M"

# Data in the remote, and dirty data (written after the flush) in foliod.
nbdsh -u "$(uri hung)" -c '
h.pwrite(b"\x11" * 1048576, 0)
h.flush()
h.pwrite(b"\x22" * 65536, 4 << 20)
' || fail "writes before the hang"

kill -STOP "$REMOTE_PID"
echo "remote stopped"

# 16 read misses at the hung export (one connection, aio), then, while
# they hang, I/O on the local export; then wait for the 16 to end and a
# FLUSH on the hung export.  Times are printed; the checks are about order
# and outcome: the local I/O is done before any hung read has ended, every
# hung read and the flush end with an error.
cat > "$tmp/hang.py" <<'PY'
import os, sys, time
import nbd

hung, local = nbd.NBD(), nbd.NBD()
hung.connect_uri(os.environ["HUNG"])
local.connect_uri(os.environ["LOCAL"])
t0 = time.monotonic()
bufs = [nbd.Buffer(65536) for _ in range(16)]
cookies = [hung.aio_pread(bufs[i], (8 << 20) + i * 65536) for i in range(16)]
local.pwrite(b"\x33" * 65536, 1 << 20)
assert local.pread(65536, 1 << 20) == b"\x33" * 65536
local.flush()
assert local.pread(4096, 12 << 20) == bytes(4096)
t_local = time.monotonic() - t0
while hung.poll(0) > 0:     # take in the replies that have come already
    pass
ended = {}                  # cookie -> "ok" or "error"
def done(c):
    if c not in ended:
        try:
            if hung.aio_command_completed(c):
                ended[c] = "ok"
        except nbd.Error:
            ended[c] = "error"
    return c in ended
pending_after_local = sum(1 for c in cookies if not done(c))
while len(ended) < 16 and time.monotonic() - t0 < 60:
    hung.poll(100)
    for c in cookies:
        done(c)
left = [c for c in cookies if c not in ended]
errors = sum(1 for v in ended.values() if v == "error")
t_hung = time.monotonic() - t0
print("local I/O done after %.2f s with %d hung reads pending; "
      "%d hung reads ended with an error, %d not at all, after %.2f s"
      % (t_local, pending_after_local, errors, len(left), t_hung))
assert not left, "hung reads never ended"
assert errors == 16, "hung reads did not all fail"
assert pending_after_local == 16, "the local export waited for the hung one"
t1 = time.monotonic()
try:
    hung.flush()
    sys.exit("flush on the hung export succeeded")
except nbd.Error as e:
    print("flush failed after %.2f s: %s" % (time.monotonic() - t1, e))
PY
HUNG=$(uri hung) LOCAL=$(uri local) timeout $((120 * TSCALE)) \
  python3 "$tmp/hang.py" || fail "hung remote: see above"
foliod_alive

kill -CONT "$REMOTE_PID"
echo "remote continued"
# Reconnect probes run every 2 s; a flush succeeds once one got through.
flush_until_ok hung
"$FOLIOD" stats --control "$ctl" --prometheus > "$tmp/stats.prom" ||
  fail "foliod stats"
dirty=$(awk '$1 == "foliod_dirty_bytes{export=\"hung\"}" {print $2}' "$tmp/stats.prom")
[ "$dirty" = 0 ] || fail "dirty data left: '$dirty'"
# The remote itself has both writes.
timeout $((60 * TSCALE)) nbdsh -u "$(remote_uri)" -c '
assert h.pread(1048576, 0) == b"\x11" * 1048576, "flushed data"
assert h.pread(65536, 4 << 20) == b"\x22" * 65536, "dirty data"
' || fail "the remote lacks the data written before the hang"
stop_foliod
stop_remote
echo OK
