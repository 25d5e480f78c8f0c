#!/bin/bash
# Out of file descriptors (issue 23 item 7): foliod runs with a small
# RLIMIT_NOFILE (soft = hard, so it cannot raise it) and the default
# max-connections.  It warns at start that the limit cannot hold the
# connections; clients that open more connections than it has descriptors
# make accept fail with EMFILE, and the loop must back off instead of
# spinning on the readable listener (CPU over 2 s from /proc/PID/stat must
# stay far below a core: a spin detector, generous bound); one log line
# says why; once the clients close, new clients are served.  A soft limit
# below the hard one is raised at start.
. "$(dirname "$0")/lib.sh"
lib_init server-emfile
requires nbdinfo python3 prlimit

truncate -s 16M "$tmp/img"
# A wrapper so that the pid start_foliod waits for runs foliod itself
# under the limit (exec keeps the pid).
cat > "$tmp/foliod-lowfd" <<SH
#!/bin/bash
ulimit -n 40 || exit 99
exec "$FOLIOD" "\$@"
SH
chmod +x "$tmp/foliod-lowfd"
FOLIOD=$tmp/foliod-lowfd start_foliod --export "disk0=file:$tmp/img,cache-size=8M"
pid=$(pgrep -P "$FOLIOD_PID" | head -n1)
[ -n "$pid" ] || fail "no foliod under timeout $FOLIOD_PID"
grep -q "^Max open files *40 *40" "/proc/$pid/limits" ||
  fail "limit not applied: $(grep 'Max open files' "/proc/$pid/limits")"

grep -q "open files.*max-connections" "$FOLIOD_LOG" ||
  fail "no warning that the descriptor limit cannot hold max-connections"

# Hold 80 connections open (more than 40 descriptors) until told to stop.
cat > "$tmp/hold.py" <<'PY'
import os, socket, sys, time
socks = []
for i in range(80):
    s = socket.socket(socket.AF_UNIX)
    s.connect(sys.argv[1])
    socks.append(s)
open(sys.argv[2], "w").close()
while not os.path.exists(sys.argv[3]):
    time.sleep(0.05)
for s in socks:
    s.close()
PY
python3 "$tmp/hold.py" "$SOCK" "$tmp/held" "$tmp/release" &
holder=$!
track "$holder"
for ((i = 0; i < 200; i++)); do [ -e "$tmp/held" ] && break; sleep 0.05; done
[ -e "$tmp/held" ] || fail "could not open the connections"
# Let foliod reach EMFILE.
wait_for_text "$FOLIOD_LOG" "Too many open files" "accept never hit EMFILE"

ticks () { awk '{ print $14 + $15 }' "/proc/$pid/stat"; }
t0=$(ticks)
sleep 2
t1=$(ticks)
hz=$(getconf CLK_TCK)
used=$(( (t1 - t0) * 100 / (2 * hz) ))
echo "foliod CPU while out of descriptors: $used % of one core"
[ "$used" -lt 20 ] || fail "foliod spins at $used % of a core on EMFILE"
n=$(grep -c "Too many open files" "$FOLIOD_LOG")
[ "$n" -le 3 ] || fail "$n EMFILE log lines in 2 s: not rate-limited"

touch "$tmp/release"
wait "$holder" || fail "holder failed"
timeout 30 nbdinfo --size "$(uri disk0)" >/dev/null ||
  fail "no client served after the connections closed"
foliod_alive
grep -E "open files|Too many" "$FOLIOD_LOG"
stop_foliod

# A soft limit below the hard one is raised to it at start: 300 holds the
# default max-connections, so no warning then.
cat > "$tmp/foliod-lowfd" <<SH
#!/bin/bash
ulimit -Sn 30 && ulimit -Hn 300 || exit 99
exec "$FOLIOD" "\$@"
SH
rm -f "$tmp/foliod.log"
FOLIOD=$tmp/foliod-lowfd start_foliod --export "disk0=file:$tmp/img,cache-size=8M"
pid=$(pgrep -P "$FOLIOD_PID" | head -n1)
grep -q "^Max open files *300 *300" "/proc/$pid/limits" ||
  fail "soft limit not raised: $(grep 'Max open files' "/proc/$pid/limits")"
grep -q "open files" "$FOLIOD_LOG" && fail "warning though the limit suffices"
stop_foliod
