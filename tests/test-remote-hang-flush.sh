#!/bin/bash
# One FLUSH on a hung remote fails within one request-timeout, as
# foliod.conf(5) says: once a request went unanswered for request-timeout
# the backing is down and the rest of that FLUSH (more writes, the
# backing's flush) fails fast instead of waiting a timeout of its own.
# The bound checked is the documented one with a generous margin (1.5x),
# a contract, not a performance figure.
. "$(dirname "$0")/lib.sh"
lib_init remote-hang-flush
. "$(dirname "$0")/lib-remote.sh"
requires python3

timeout_ms=4000
# -t 1: see test-remote-hang.sh.  One connection: the writeback's
# requests in flight share it, and when one hangs the others are cut
# with it; they used to reconnect, which waits for the handshake of the
# hung remote, a second timeout in the same FLUSH.
start_remote "$tmp/remote.sock" -t 1 memory 64M
start_foliod --control "$tmp/ctl.sock" --export "disk0=$(remote_uri),request-timeout=$timeout_ms,cache-size=16M,connections=1,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

# 1 MiB dirty in 256 blocks apart (before the hang, and more after):
# written back by the FLUSH below, by several requests at once.
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"\x11" * 4096, 0)
h.flush()
for i in range(256):
    h.pwrite(b"\x22" * 4096, (1 << 20) + i * 65536)
' || fail "writes before the hang"

kill -STOP "$REMOTE_PID"
echo "remote stopped"

cat > "$tmp/flush.py" <<'PY'
import os, sys, time
import nbd

h = nbd.NBD()
h.connect_uri(os.environ["URI"])
for i in range(256):
    h.pwrite(b"\x33" * 4096, (1 << 20) + i * 65536 + 4096)
t0 = time.monotonic()
try:
    h.flush()
    sys.exit("flush on the hung remote succeeded")
except nbd.Error as e:
    t = time.monotonic() - t0
print("flush failed after %.2f s (request-timeout %.1f s)"
      % (t, int(os.environ["TIMEOUT_MS"]) / 1000))
bound = 1.5 * int(os.environ["TIMEOUT_MS"]) / 1000 * int(os.environ["TSCALE"])
if t > bound:
    sys.exit("FLUSH took %.2f s: more than one request-timeout (bound %.1f s)"
             % (t, bound))
PY
URI=$(uri disk0) TIMEOUT_MS=$timeout_ms TSCALE=$TSCALE \
  timeout $((120 * TSCALE)) python3 "$tmp/flush.py" || fail "FLUSH on a hung remote"
foliod_alive
kill -CONT "$REMOTE_PID"
# Writes cut with their connection are in doubt (foliod(8)): the remote
# is back and done with them, which only the operator can tell foliod.
"$FOLIOD" clear-doubt disk0 --control "$tmp/ctl.sock" || fail "clear-doubt"
flush_until_ok disk0
stop_foliod
stop_remote
echo OK
