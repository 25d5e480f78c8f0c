#!/bin/bash
# max-connections-per-client on a Unix socket counts per process (issue 34
# item 7d): with a limit of 2, two processes of the same user get 2
# connections each (they used to share 2, as one uid), and a third
# connection of one process is still refused.
. "$(dirname "$0")/lib.sh"
lib_init server-per-pid
requires python3

truncate -s 1M "$tmp/img"
start_foliod --max-connections-per-client 2 --export "disk0=file:$tmp/img"

# conns N: open N connections from one process; prints how many got the
# server's greeting (a refused one is closed at once), then holds them
# until stdin closes.
cat > "$tmp/conns.py" <<'PY'
import socket, sys
got, held = 0, []
for _ in range(int(sys.argv[2])):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    s.settimeout(10)
    try:
        b = s.recv(18, socket.MSG_WAITALL)
    except OSError:
        b = b""
    if len(b) == 18 and b[:8] == b"NBDMAGIC":
        got += 1
        held.append(s)
print(got, flush=True)
sys.stdin.read()
PY
mkfifo "$tmp/hold"
exec 3<>"$tmp/hold"
python3 "$tmp/conns.py" "$SOCK" 2 <"$tmp/hold" >"$tmp/a" &
track $!
wait_for_text "$tmp/a" . "first process"
python3 "$tmp/conns.py" "$SOCK" 3 <"$tmp/hold" >"$tmp/b" &
track $!
wait_for_text "$tmp/b" . "second process"
echo "first process: $(cat "$tmp/a") of 2 served; second: $(cat "$tmp/b") of 3"
[ "$(cat "$tmp/a")" = 2 ] || fail "the first process got $(cat "$tmp/a") of 2 connections"
[ "$(cat "$tmp/b")" = 2 ] ||
  fail "the second process (same uid) got $(cat "$tmp/b") of 3 connections, not 2"
exec 3>&-
stop_foliod
