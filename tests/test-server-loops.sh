#!/bin/bash
# Several event loops (--loops): the main thread hands each new
# connection to the loop that owns the fewest, so four clients held open
# on two loops are two and two (`foliod stats` has a line per loop), and
# a write on one loop is read back on the other.  Every thread has a
# name of foliod's own (/proc/PID/task/*/comm): the main thread
# "foliod", then foliod-loop/N, worker/N, wb, wb-help/N, ra/N, ...
# (libmicrohttpd names its metrics thread MHD-single itself).  The
# default number of loops is the CPUs foliod may run on, at most 8.
. "$(dirname "$0")/lib.sh"
lib_init server-loops
requires nbdsh python3

img=$tmp/img
truncate -s 64M "$img"
ctl=$tmp/ctl.sock

# thread_names PID: the comm of every thread, one a line.
thread_names () {
  local t
  # A thread that ended between the listing and the read (a short-lived
  # helper; seen under ASan) is no longer one.
  for t in /proc/"$1"/task/*; do cat "$t/comm" 2>/dev/null || true; done
}

# ThreadSanitizer's own background thread inherits the main thread's name.
mains=1
{ grep -qa ThreadSanitizer "$FOLIOD" || ldd "$FOLIOD" 2>/dev/null | grep -q libtsan; } && mains=2

# check_names PID: every thread has a foliod name; only the main thread
# is "foliod".
check_names () {
  thread_names "$1" > "$tmp/comm"
  grep -vxE 'foliod|foliod-loop/[0-9]+|worker/[0-9]+|wb|wb-help/[0-9]+|ra/[0-9]+|nbd-poll/[0-9]+|control|control-job|closer|populate|metrics|MHD-single' \
    "$tmp/comm" > "$tmp/unnamed" && fail "threads without a foliod name: $(sort "$tmp/unnamed" | uniq -c | tr '\n' ' ')"
  [ "$(grep -cx foliod "$tmp/comm")" = "$mains" ] ||
    fail "$(grep -cx foliod "$tmp/comm") threads named foliod (the main thread only)"
}

start_foliod --loops 2 --control "$ctl" --pidfile "$tmp/pid" \
  --export "disk=$img,cache-size=16M"
pid=$(cat "$tmp/pid")
check_names "$pid"
[ "$(grep -c '^foliod-loop/' "$tmp/comm")" = 2 ] ||
  fail "loop threads: $(grep '^foliod-loop/' "$tmp/comm" | tr '\n' ' ')"
for n in worker/0 wb wb-help/0 control; do
  grep -qx "$n" "$tmp/comm" || fail "no thread named $n: $(sort "$tmp/comm" | tr '\n' ' ')"
done

# Four connections at once; a write on the first is read on the last
# (another loop); the stats are taken while all four are open.
python3 - "$(uri disk)" "$FOLIOD" "$ctl" "$tmp/stats" <<'PY' || fail "four clients"
import nbd, subprocess, sys
hs = []
for i in range(4):
    hs.append(nbd.NBD())
for x in hs:
    x.connect_uri(sys.argv[1])
for i, x in enumerate(hs):
    x.pwrite(bytes([i + 1]) * 4096, i * 4096)
for i, x in enumerate(hs):
    assert hs[-1 - i].pread(4096, i * 4096) == bytes([i + 1]) * 4096
out = subprocess.run([sys.argv[2], "stats", "--control", sys.argv[3]],
                     check=True, capture_output=True, text=True).stdout
open(sys.argv[4], "w").write(out)
PY
cat "$tmp/stats"
for l in 0 1; do
  grep -qE "^loop $l: 2 open, [2-9][0-9]* accepted, [0-9]+ requests$" "$tmp/stats" ||
    fail "loop $l does not serve two of the four: $(grep '^loop' "$tmp/stats" | tr '\n' ' ')"
done
"$FOLIOD" stats --control "$ctl" --prometheus > "$tmp/prom" || fail "stats --prometheus"
grep -qE '^foliod_loop_connections_accepted_total\{loop="1"\} [1-9]' "$tmp/prom" ||
  fail "no per-loop counter in the Prometheus text"
stop_foliod

# The default: one loop per CPU foliod may use (taskset shows it fewer
# where it can), at most 8.
cpus=$(nproc)
want=$(( cpus > 8 ? 8 : cpus ))
start_foliod --control "$ctl" --pidfile "$tmp/pid" --export "disk=$img"
pid=$(cat "$tmp/pid")
check_names "$pid"
[ "$(grep -c '^foliod-loop/' "$tmp/comm")" = "$want" ] ||
  fail "default loops: $(grep -c '^foliod-loop/' "$tmp/comm"), expected $want ($cpus CPUs)"
stop_foliod
echo OK
