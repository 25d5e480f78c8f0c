#!/bin/bash
# The log under attack: what clients send is escaped before it is logged
# (an export name with a newline cannot forge a line), and a storm of one
# kind of line (connections refused over max-connections, as fast as a
# client can connect) is rate-limited: a bounded number of lines and a
# "similar messages suppressed" line instead of one line per refusal.
. "$(dirname "$0")/lib.sh"
lib_init daemon-log
requires python3
BAD=$BUILD/tests/tools/bad-client
[ -x "$BAD" ] || fail "bad-client not built: $BAD"

truncate -s 8M "$tmp/img"
start_foliod --log-level debug --max-connections 1 \
  --export "disk0=file:$tmp/img,cache-size=8M"

# Forged log lines: GO, then EXPORT_NAME, with a newline in the name.
timeout $((30 * TSCALE)) "$BAD" "$SOCK" disk0 log-forgery ||
  fail "case log-forgery"
foliod_alive
grep -q 'x\\x0a2026-12-03T00:00:00.000 foliod\[1\] error: forged' "$FOLIOD_LOG" ||
  fail "the export name was not logged escaped"
if grep -q '^2026-12-03T00:00:00.000 foliod\[1\]' "$FOLIOD_LOG"; then
  fail "a client forged a log line"
fi

# The storm: one client holds the only slot, another connects and is
# refused as fast as it can for 3 s.
python3 - "$SOCK" <<'PY' > "$tmp/storm.out" || fail "storm client failed"
import socket, sys, time
hold = socket.socket(socket.AF_UNIX)
hold.connect(sys.argv[1])
hold.recv(18)                          # the greeting: the slot is ours
n, end = 0, time.monotonic() + 3
while time.monotonic() < end:
    s = socket.socket(socket.AF_UNIX)
    try:
        s.connect(sys.argv[1])
        n += 1
    except OSError:
        pass
    s.close()
print("connections refused:", n)
PY
cat "$tmp/storm.out"
n=$(awk '{ print $3 }' "$tmp/storm.out")
[ "$n" -ge 3000 ] || fail "the storm was too weak to tell ($n connections)"
# Let a second pass so that the last drops are reported, then log a line.
sleep 1.2
timeout 10 "$BAD" "$SOCK" disk0 log-forgery >/dev/null 2>&1 || true
foliod_alive
stop_foliod
lines=$(grep -c "refusing connection" "$FOLIOD_LOG" || true)
total=$(wc -l < "$FOLIOD_LOG")
echo "$n refusals: $lines refusal lines, $total lines in all"
[ "$total" -lt 2000 ] || fail "$total log lines for $n refused connections"
grep -q "similar messages suppressed: refusing connection" "$FOLIOD_LOG" ||
  fail "no suppressed line"
echo OK
