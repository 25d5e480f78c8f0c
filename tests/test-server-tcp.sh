#!/bin/bash
# TCP listeners: IPv4 and IPv6 loopback on the same port, both serving the
# export (nbd://127.0.0.1:PORT/disk0 and nbd://[::1]:PORT/disk0), data
# written over one visible over the other.  IPv6 is skipped if the host has
# no ::1.
. "$(dirname "$0")/lib.sh"
lib_init server-tcp
requires nbdsh nbdinfo python3

# A free port (a tiny race with other programs remains).
free_port () {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
have_v6=0
python3 -c 'import socket; s=socket.socket(socket.AF_INET6); s.bind(("::1", 0))' 2>/dev/null && have_v6=1

truncate -s 16M "$tmp/img"
port=$(free_port)
args=(--listen "127.0.0.1:$port")
[ $have_v6 = 1 ] && args+=(--listen "[::1]:$port")
start_foliod "${args[@]}" --export "disk0=file:$tmp/img,cache-size=8M"

v4="nbd://127.0.0.1:$port/disk0"
[ "$(timeout 30 nbdinfo --size "$v4")" = $((16 * 1024 * 1024)) ] || fail "IPv4 size"
timeout 30 nbdsh -u "$v4" -c 'h.pwrite(b"tcp4" * 1024, 12345); h.flush()'
if [ $have_v6 = 1 ]; then
  v6="nbd://[::1]:$port/disk0"
  timeout 30 nbdsh -u "$v6" -c 'assert h.pread(4096, 12345) == b"tcp4" * 1024' ||
    fail "IPv6 client does not see the IPv4 client's write"
  grep -q "listening on \[::1\]:$port" "$FOLIOD_LOG" || fail "IPv6 listener not logged"
else
  echo "no IPv6 loopback: IPv6 part skipped"
fi
grep -q "new connection from 127.0.0.1:" "$FOLIOD_LOG" || fail "peer address not logged"
stop_foliod
python3 -c 'import sys; d=open(sys.argv[1],"rb").read(); assert d[12345:12345+4096] == b"tcp4"*1024' "$tmp/img" ||
  fail "backing file"
echo OK
