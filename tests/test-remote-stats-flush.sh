#!/bin/bash
# foliod stats answers while a 'foliod flush' waits for a remote that is
# gone: the flush (which waits the remote's retry-timeout) runs on the
# control socket's job thread, not in the thread that answers stats.
# Checked by order, not by time: stats must answer while the flush is
# still under way (it used to answer only after the flush had failed).
. "$(dirname "$0")/lib.sh"
lib_init remote-stats-flush
. "$(dirname "$0")/lib-remote.sh"

start_remote "$tmp/remote.sock" memory 64M
start_foliod --control "$tmp/ctl.sock" --export "disk0=$(remote_uri),cache-size=16M,retry-timeout=15000,dirty-expire=3600000,dirty-background=100,dirty-limit=100"
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
for i in range(16):
    h.pwrite(b"\x22" * 4096, (1 << 20) + i * 65536)
' || fail "writes"

stop_remote KILL
echo "remote killed"
"$FOLIOD" flush disk0 --control "$tmp/ctl.sock" > "$tmp/flush.out" 2>&1 &
flush_pid=$!
track "$flush_pid"
wait_for_text "$FOLIOD_LOG" "control: flush disk0" "the flush did not start"

timeout $((60 * TSCALE)) "$FOLIOD" stats --control "$tmp/ctl.sock" \
  > "$tmp/stats.out" 2>&1 || fail "foliod stats: $(cat "$tmp/stats.out")"
kill -0 "$flush_pid" 2>/dev/null ||
  fail "stats answered only after the flush had ended: $(cat "$tmp/flush.out")"
grep -q disk0 "$tmp/stats.out" || fail "stats does not name disk0"
echo "stats answered while the flush waited for the remote"

wait "$flush_pid" &&
  fail "the flush succeeded with the remote gone: '$(cat "$tmp/flush.out")'; stats before: $(grep -i 'dirty\|written' "$tmp/stats.out" | tr '\n' ' ')"
echo "flush: $(cat "$tmp/flush.out")"
grep -q "ERROR\|flush disk0" "$tmp/flush.out" || fail "the flush said nothing"
# Another control client still gets its answer after a job's.
"$FOLIOD" stats --control "$tmp/ctl.sock" > /dev/null || fail "stats after"
foliod_alive
# The remote is gone with the data: a stop cannot write it back.
pkill -KILL -P "$FOLIOD_PID"    # foliod, under start_foliod's timeout
wait "$FOLIOD_PID" 2>/dev/null || true
FOLIOD_PID=
echo OK
