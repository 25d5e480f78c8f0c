#!/bin/bash
# Socket activation: systemd-socket-activate listens on a Unix socket and a
# TCP port, starts foliod on the first connection and hands it the sockets
# (LISTEN_PID/LISTEN_FDS/LISTEN_FDNAMES).  Clients are served through both
# inherited sockets; the configured --unix is not used; SIGTERM still
# writes back and exits 0.
. "$(dirname "$0")/lib.sh"
lib_init service-activation
requires systemd-socket-activate nbdinfo nbdsh python3

truncate -s 32M "$tmp/img"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
FOLIOD_LOG=$tmp/foliod.log
timeout 120 systemd-socket-activate -l "$tmp/sock" -l "127.0.0.1:$port" \
  --fdname=nbd:nbdtcp \
  "$FOLIOD" --foreground --unix "$tmp/not-used.sock" \
  --export "disk0=$tmp/img,dirty-expire=3600000" >"$FOLIOD_LOG" 2>&1 &
FOLIOD_PID=$!
track $FOLIOD_PID
for i in $(seq 100); do [ -S "$tmp/sock" ] && break; sleep 0.1; done
[ -S "$tmp/sock" ] || fail "systemd-socket-activate did not listen"

# The first connection starts foliod; it must be served, not dropped.
timeout 30 nbdsh -u "nbd+unix:///disk0?socket=$tmp/sock" \
  -c 'h.pwrite(b"activated" * 1000, 4096)' || fail "first client not served"
grep -q "socket activation: 2 inherited sockets" "$FOLIOD_LOG" ||
  fail "foliod did not take the inherited sockets"
[ ! -e "$tmp/not-used.sock" ] || fail "configured --unix used despite activation"
timeout 30 nbdinfo "nbd://127.0.0.1:$port/disk0" | grep -q "export-size: 33554432" ||
  fail "TCP socket not served"
timeout 30 nbdsh -u "nbd://127.0.0.1:$port/disk0" \
  -c 'assert h.pread(9000, 4096) == b"activated" * 1000' ||
  fail "data written through the Unix socket not read back over TCP"

# Same process (systemd-socket-activate execs foliod): SIGTERM, exit 0,
# data on disk.
stop_foliod TERM
python3 - "$tmp/img" <<'PY' || fail "dirty data not written back after SIGTERM"
import sys
f = open(sys.argv[1], "rb"); f.seek(4096)
sys.exit(0 if f.read(9000) == b"activated" * 1000 else 1)
PY
echo OK
