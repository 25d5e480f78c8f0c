#!/bin/bash
# Issue 33 item 4b: writes that bypass the cache (cache=none) made while
# a write is in doubt.  The remote is a file behind an nbdkit sh script
# whose FIRST write sleeps past request-timeout: A is abandoned (in
# doubt); the client writes C elsewhere, which reaches the remote, and
# FLUSH fails while A is in doubt; `foliod stats` says why.  A lands,
# the operator runs `foliod clear-doubt`: nothing was lost, so FLUSH
# succeeds again (foliod(8)), stats shows no loss, and foliod stops
# cleanly with C on the remote.  (It used to count C lost at the clear
# and fail every FLUSH until the export was reopened.)
. "$(dirname "$0")/lib.sh"
lib_init remote-doubt-direct
. "$(dirname "$0")/lib-remote.sh"

ctl=$tmp/ctl.sock
img=$tmp/remote.img
truncate -s 16M "$img"
held_write_plugin "$img" "$tmp/plugin.sh"
# -t 1: see test-remote-hang.sh (nbdkit 1.32 and a cut connection).
start_remote "$tmp/remote.sock" -t 1 sh "$tmp/plugin.sh"
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri),cache=none,request-timeout=2000"

# A: abandoned (its write fails or times out).
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
try:
    h.pwrite(b"A" * 4096, 0)
except nbd.Error as e:
    print("write of A failed:", e)
' || fail "write A"
[ -d "$tmp/first-write" ] || fail "A never reached the remote"
[ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 1 ] ||
  fail "A is not in doubt"

# C elsewhere, straight to the remote (once the backing is back from the
# hang: its next probe comes 2 s after it); its FLUSH fails while A is in
# doubt.
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
import time
for i in range(30):
    try:
        h.pwrite(b"C" * 65536, 1048576)
        break
    except nbd.Error as e:
        print("write of C failed, again:", e)
        time.sleep(1)
else:
    raise SystemExit("C never written")
try:
    h.flush()
    raise SystemExit("FLUSH succeeded while A could still land")
except nbd.Error as e:
    print("flush failed as expected:", e)
' || fail "write C"
"$FOLIOD" stats --control "$ctl" > "$tmp/table" || fail "foliod stats"
grep -q "disk0: 1 write in doubt: FLUSH fails until 'foliod clear-doubt disk0'" \
  "$tmp/table" || { cat "$tmp/table"; fail "foliod stats does not say why FLUSH fails"; }

for ((i = 0; i < 200 * TSCALE; i++)); do
  [ -e "$tmp/first-write/landed" ] && break
  sleep 0.1
done
[ -e "$tmp/first-write/landed" ] || fail "A never landed"
sleep 0.5
"$FOLIOD" clear-doubt disk0 --control "$ctl" || fail "foliod clear-doubt"

flush_until_ok disk0
[ "$(foliod_stat "$ctl" foliod_passthrough_lost_writes)" = 0 ] ||
  fail "foliod_passthrough_lost_writes is not 0 after the clear"
[ "$(foliod_stat "$ctl" foliod_passthrough_unflushed_writes)" = 0 ] ||
  fail "C is still unflushed after a good FLUSH"
"$FOLIOD" stats --control "$ctl" > "$tmp/table" || fail "foliod stats"
! grep -q "FLUSH fails" "$tmp/table" ||
  { cat "$tmp/table"; fail "foliod stats still says FLUSH fails"; }
stop_foliod
grep -q "DIRTY DATA LOST" "$FOLIOD_LOG" && fail "the stop reported lost data"
stop_remote
[ "$(dd if="$img" bs=65536 skip=16 count=1 status=none | tr -d C | wc -c)" = 0 ] ||
  fail "C is not on the remote"
echo OK
