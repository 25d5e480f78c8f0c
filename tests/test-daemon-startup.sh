#!/bin/bash
# Start-up order: bind, open the exports, ready, then populate the cache.
#  - a second foliod on a busy port fails before it creates its image, and
#    says "Address already in use" with the address once;
#  - the ready line (and a first client) come before the ram cache is
#    populated, which a background thread does after ("cache populated");
#  - a detached foliod (no -f) writes nothing more to the terminal after
#    its ready line: log lines go to log-file (or syslog).
. "$(dirname "$0")/lib.sh"
lib_init daemon-startup
requires nbdinfo nbdsh

# A busy port: held by a plain listening socket.
port_file=$tmp/port
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen()
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
time.sleep(600)' "$port_file" &
track $!
for ((i = 0; i < 100; i++)); do [ -s "$port_file" ] && break; sleep 0.1; done
port=$(cat "$port_file")
rc=0
timeout 60 "$FOLIOD" --foreground --listen "127.0.0.1:$port" \
  --export "d=file:$tmp/new.img,create-size=64M,cache-size=64M" \
  >"$tmp/busy.log" 2>&1 || rc=$?
cat "$tmp/busy.log"
[ "$rc" -ne 0 ] || fail "foliod started on a busy port"
[ -e "$tmp/new.img" ] && fail "foliod created its image before finding the port busy"
n=$(grep -o "127.0.0.1:$port" "$tmp/busy.log" | wc -l)
grep -q "Address already in use" "$tmp/busy.log" || fail "no 'Address already in use'"
[ "$n" -eq 1 ] || fail "the address is said $n times"

# Ready before populated, and a client served meanwhile (the populating
# thread rests half the time: on a busy host it may take minutes).
truncate -s 64M "$tmp/disk.img"
start_foliod --export "disk0=file:$tmp/disk.img,cache-size=1G"
nbdsh -u "$(uri disk0)" -c 'h.pwrite(b"x" * 4096, 0); assert h.pread(4096, 0) == b"x" * 4096'
wait_for_text "$FOLIOD_LOG" "export disk0: cache populated: 1073741824 bytes" \
  "no 'cache populated' line for the whole cache" 3000
ready=$(grep -n "ready:" "$FOLIOD_LOG" | head -n1 | cut -d: -f1)
populated=$(grep -n "cache populated" "$FOLIOD_LOG" | head -n1 | cut -d: -f1)
[ "$ready" -lt "$populated" ] || fail "populated (line $populated) before ready (line $ready)"
stop_foliod

# Detached: the terminal (here a file) gets the start-up lines up to the
# ready line, nothing after; log-file gets what comes later.
rm -f "$tmp/sock"
timeout 60 "$FOLIOD" --unix "$tmp/sock" --pidfile "$tmp/pid" \
  --log-file "$tmp/later.log" --export "disk0=file:$tmp/disk.img,cache-size=64M" \
  </dev/null >"$tmp/term" 2>&1 || fail "foliod (detaching) failed: $(cat "$tmp/term")"
pid=$(cat "$tmp/pid")
track "$pid"
cat "$tmp/term"
tail -n1 "$tmp/term" | grep -q "ready:" || fail "the terminal's last line is not the ready line"
before=$(stat -c %s "$tmp/term")
nbdinfo "$(uri disk0 "$tmp/sock")" >/dev/null || fail "detached foliod does not serve"
kill -USR1 "$pid"
for ((i = 0; i < 100 * TSCALE; i++)); do
  grep -q "cache populated" "$tmp/later.log" 2>/dev/null &&
    grep -q "disk0" "$tmp/later.log" && grep -qi "hit" "$tmp/later.log" && break
  sleep 0.1
done
kill -TERM "$pid"
wait_gone "$pid" 600 || fail "detached foliod still running after SIGTERM"
cat "$tmp/later.log"
[ "$(stat -c %s "$tmp/term")" -eq "$before" ] ||
  fail "detached foliod wrote to the terminal after ready: $(tail -c +$((before + 1)) "$tmp/term")"
grep -q "cache populated" "$tmp/later.log" || fail "log-file lacks the lines after ready"
grep -q "stopped: all data written back" "$tmp/later.log" || fail "log-file lacks the stop line"

# Detached without log-file: nothing after the ready line on the terminal
# either (the lines go to syslog).
rm -f "$tmp/sock" "$tmp/pid"
timeout 60 "$FOLIOD" --unix "$tmp/sock" --pidfile "$tmp/pid" \
  --export "disk0=file:$tmp/disk.img,cache-size=64M" \
  </dev/null >"$tmp/term2" 2>&1 || fail "foliod (detaching) failed: $(cat "$tmp/term2")"
pid=$(cat "$tmp/pid")
track "$pid"
before=$(stat -c %s "$tmp/term2")
nbdinfo "$(uri disk0 "$tmp/sock")" >/dev/null || fail "detached foliod does not serve"
kill -USR1 "$pid"
kill -TERM "$pid"
wait_gone "$pid" 600 || true
[ "$(stat -c %s "$tmp/term2")" -eq "$before" ] ||
  fail "detached foliod wrote to the terminal after ready: $(tail -c +$((before + 1)) "$tmp/term2")"
echo OK
