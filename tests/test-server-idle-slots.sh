#!/bin/bash
# Clients that connect and idle cannot hold every slot (issue 34 item 7c).
# With idle-timeout off (the default) and max-connections 4, one client
# takes all 4 slots: 3 connections finish the handshake and never send a
# request, one reads a block.  A new client must get in: once the last
# slots are taken, a connection that has sent no request within
# handshake-timeout (2 s here) is closed.  The one that has sent a
# request is kept (an idle kernel client is never dropped).  Before, the
# new client was refused for as long as the idle ones stayed.
. "$(dirname "$0")/lib.sh"
lib_init server-idle-slots
requires python3

truncate -s 1M "$tmp/img"
start_foliod --max-connections 4 --max-connections-per-client 8 \
  --handshake-timeout 2 --export "disk0=file:$tmp/img"

TOP=${TOP:-$PWD} SOCK=$SOCK TSCALE=${TSCALE:-1} timeout $((120 * ${TSCALE:-1})) python3 - <<'PY' ||
import os, sys, time
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
import nbdraw
sock = os.environ["SOCK"]
busy = nbdraw.connect(sock, "disk0")
nbdraw.send_req(busy, nbdraw.CMD_READ, 1, 0, 4096)
assert nbdraw.simple_reply(busy, 4096)[0] == 0, "first read failed"
idle = [nbdraw.connect(sock, "disk0") for _ in range(3)]
# Every slot taken: wait (up to 60 s) for a new client to get in.
end = time.time() + 60 * int(os.environ["TSCALE"])
new = None
while new is None and time.time() < end:
    try:
        new = nbdraw.connect(sock, "disk0", timeout=5)
    except (EOFError, OSError, ValueError):
        time.sleep(0.5)
if new is None:
    sys.exit("a new client was refused for 60 s: 3 idle connections "
             "without a request hold the slots")
nbdraw.send_req(new, nbdraw.CMD_READ, 2, 0, 4096)
assert nbdraw.simple_reply(new, 4096)[0] == 0, "the new client's read failed"
nbdraw.send_req(busy, nbdraw.CMD_READ, 3, 4096, 4096)
assert nbdraw.simple_reply(busy, 4096)[0] == 0, \
    "the connection that had sent a request was dropped"
print("new client served; the connection with a request kept")
PY
  fail "idle connections hold every slot"
grep -q "no request in 2 s while the server is nearly full" "$FOLIOD_LOG" ||
  fail "the close of idle connections is not logged"
stop_foliod
