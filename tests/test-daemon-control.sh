#!/bin/bash
# The control socket serves everyone at once: clients that dribble a byte
# a second (never finishing their line) do not hold up `foliod stats` for
# the others, are dropped after their 5 s deadline, and a request line
# over the limit gets an error instead of being read forever.
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
echo OK
