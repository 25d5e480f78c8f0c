#!/bin/bash
# The control socket serves everyone at once: clients that dribble a byte
# a second (never finishing their line) do not hold up `foliod stats` for
# the others, are dropped after their 5 s deadline, and a request line
# over the limit gets an error instead of being read forever.  A control
# socket that closes without an answer fails the command.
. "$(dirname "$0")/lib.sh"
lib_init daemon-control
requires python3

truncate -s 8M "$tmp/img"
ctl=$tmp/ctl
start_foliod --control "$ctl" --export "disk0=file:$tmp/img,cache-size=8M"

# Three slow clients, one byte a second for 8 s; each notes when the
# daemon closed it.
cat > "$tmp/slow.py" <<'PY'
import socket, sys, time
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
start = time.monotonic()
try:
    for b in b"statsstats":
        s.send(bytes([b]))
        time.sleep(1)
    print("not closed after %.0f s" % (time.monotonic() - start))
except OSError:
    print("closed after %.0f s" % (time.monotonic() - start))
PY
slow=()
for i in 1 2 3; do
  timeout 30 python3 "$tmp/slow.py" "$ctl" > "$tmp/slow$i.out" 2>&1 &
  slow+=($!)
  track $!
done
sleep 1.5
for i in 1 2 3 4 5; do
  timeout 5 "$FOLIOD" stats --control "$ctl" --prometheus > "$tmp/stats" ||
    fail "foliod stats #$i did not answer within 5 s beside slow clients"
  grep -q '^foliod_export_size_bytes{export="disk0"} 8388608$' "$tmp/stats" ||
    fail "stats #$i: wrong answer"
  sleep 0.5
done

# An endless line: an error, not a hang.
python3 - "$ctl" > "$tmp/long.out" <<'PY' || fail "long line client failed"
import socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(10)
s.connect(sys.argv[1])
try:
    s.sendall(b"x" * 4096)
except OSError:
    pass
print(s.recv(100).decode().strip())
PY
grep -q "ERROR request too long" "$tmp/long.out" ||
  fail "over-long request: $(cat "$tmp/long.out")"

wait "${slow[@]}"
for i in 1 2 3; do
  grep -q "closed after [4-7] s" "$tmp/slow$i.out" ||
    fail "slow client $i: $(cat "$tmp/slow$i.out")"
done
timeout 5 "$FOLIOD" flush disk0 --control "$ctl" > "$tmp/flush" || fail "foliod flush"
grep -q "^OK disk0" "$tmp/flush" || fail "flush: $(cat "$tmp/flush")"
stop_foliod

# A foliod that dies before it answers (a kill, a crash under a flush):
# the client fails and says so.  It printed nothing and exited 0, and a
# script's "foliod flush disk0 && ..." went on as if the flush had
# succeeded.  Played by a socket that reads the request and closes.
cat > "$tmp/mute.py" <<'PY'
import os, socket, sys
s = socket.socket(socket.AF_UNIX)
s.bind(sys.argv[1])
s.listen(4)
print("ready", flush=True)
for _ in range(2):
    c, _ = s.accept()
    c.recv(512)
    c.close()
PY
rm -f "$tmp/mute"
timeout 60 python3 "$tmp/mute.py" "$tmp/mute" > "$tmp/mute.out" &
mute=$!
track $mute
wait_for_text "$tmp/mute.out" ready "the mute socket did not start"
for cmd in "flush disk0" "clear-doubt disk0"; do
  # shellcheck disable=SC2086
  if timeout 10 "$FOLIOD" $cmd --control "$tmp/mute" > "$tmp/mute.cli" 2>&1; then
    fail "foliod $cmd exited 0 though nothing answered: '$(cat "$tmp/mute.cli")'"
  fi
  grep -q "closed without an answer" "$tmp/mute.cli" ||
    fail "foliod $cmd does not say why it failed: $(cat "$tmp/mute.cli")"
done
wait $mute
echo OK
