#!/bin/bash
# SIGTERM with dirty data and a remote that cannot take it ends, and says
# what was lost:
#  1. the remote hangs (SIGSTOP): foliod exits 1 after shutdown-timeout,
#     the log names the export and the bytes lost;
#  2. the remote is gone (killed), 100 scattered dirty blocks,
#     retry-timeout=1000: foliod waits for the remote once, not once per
#     dirty run, and exits 1 naming the bytes lost;
#  3. the remote is gone at SIGTERM and comes back during the shutdown:
#     everything is written and foliod exits 0.
. "$(dirname "$0")/lib.sh"
lib_init remote-shutdown
. "$(dirname "$0")/lib-remote.sh"

keep_dirty="cache-size=32M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

# write_scattered N: N 4 KiB blocks of 0x5a, one every 256 KiB, unflushed.
write_scattered () {
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c "
for i in range($1):
    h.pwrite(b'\x5a' * 4096, i * 262144)
" || fail "writes"
}

# wait_exit SECONDS: wait for foliod to exit; sets rc and took (seconds).
wait_exit () {
  local i t0=$SECONDS
  for ((i = 0; i < $1 * 10 * TSCALE; i++)); do
    kill -0 "$FOLIOD_PID" 2>/dev/null || break
    sleep 0.1
  done
  kill -0 "$FOLIOD_PID" 2>/dev/null && fail "foliod still running $1 s after SIGTERM"
  rc=0
  wait "$FOLIOD_PID" || rc=$?
  took=$((SECONDS - t0))
  FOLIOD_PID=
  check_sanitizer_log "$FOLIOD_LOG"
}

# 1. Hung remote; request-timeout stays at its default (30 s): the
# shutdown deadline has to cut the request in flight.
start_remote "$tmp/remote.sock" memory 64M
start_foliod --shutdown-timeout 5 --export "disk0=$(remote_uri),$keep_dirty"
write_scattered 10
kill -STOP "$REMOTE_PID"
kill -TERM "$FOLIOD_PID"
wait_exit 40
kill -CONT "$REMOTE_PID"
echo "hung remote: foliod exited $rc after ${took} s"
[ "$rc" != 0 ] || fail "foliod exited 0 with its dirty data lost"
grep -E "export disk0: DIRTY DATA LOST: .* 40960 bytes lost" "$FOLIOD_LOG" ||
  fail "the log does not name the bytes lost"
stop_remote KILL
mv "$FOLIOD_LOG" "$tmp/foliod-1.log"

# 2. Gone remote, 100 dirty runs.  Before, each run waited its own
# retry-timeouts (minutes); now one wait, then the whole pass gives up.
start_remote "$tmp/remote.sock" memory 64M
start_foliod --export "disk0=$(remote_uri),retry-timeout=1000,$keep_dirty"
write_scattered 100
stop_remote KILL
kill -TERM "$FOLIOD_PID"
wait_exit 30
echo "gone remote: foliod exited $rc after ${took} s"
[ "$rc" != 0 ] || fail "foliod exited 0 with its dirty data lost"
grep -E "export disk0: DIRTY DATA LOST: .* 409600 bytes lost" "$FOLIOD_LOG" ||
  fail "the log does not name the bytes lost"
mv "$FOLIOD_LOG" "$tmp/foliod-2.log"

# 3. Gone at SIGTERM, back 2 s later (within retry-timeout): all written.
truncate -s 64M "$tmp/img"
start_remote "$tmp/remote.sock" file "$tmp/img"
start_foliod --export "disk0=$(remote_uri),retry-timeout=20000,$keep_dirty"
write_scattered 100
stop_remote KILL
kill -TERM "$FOLIOD_PID"
sleep 2
foliod_alive
start_remote "$tmp/remote.sock" file "$tmp/img"
wait_exit 60
echo "remote back during shutdown: foliod exited $rc after ${took} s"
[ "$rc" = 0 ] || fail "foliod exited $rc although the remote came back"
grep -q "stopped: all data written back" "$FOLIOD_LOG" || fail "no final writeback logged"
stop_remote
python3 - "$tmp/img" <<'PY' || fail "the remote lacks dirty blocks"
import sys
d = open(sys.argv[1], "rb").read()
bad = [i for i in range(100) if d[i * 262144:i * 262144 + 4096] != b"\x5a" * 4096]
sys.exit("blocks missing: %r" % bad[:10] if bad else 0)
PY
echo OK
