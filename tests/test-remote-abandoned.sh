#!/bin/bash
# A write foliod gave up on (no answer within request-timeout) may still
# be carried out by the remote at any later time: NBD cannot cancel it.
# No FLUSH may then report its range durable (foliod(8), "Writes in
# doubt").  The remote here is a file behind an nbdkit sh script whose
# FIRST write sleeps past the timeout: A for block 0 times out; the client
# writes B there and FLUSHes, which must fail while A is in doubt; A lands;
# `foliod clear-doubt` (the operator knows the remote is done) makes
# foliod write B again; after a clean stop the remote has B, not A.
. "$(dirname "$0")/lib.sh"
lib_init remote-abandoned
. "$(dirname "$0")/lib-remote.sh"

ctl=$tmp/ctl.sock
img=$tmp/remote.img
truncate -s 16M "$img"
held_write_plugin "$img" "$tmp/plugin.sh"
# -t 1: see test-remote-hang.sh (nbdkit 1.32 and a cut connection).
start_remote "$tmp/remote.sock" -t 1 sh "$tmp/plugin.sh"
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri),request-timeout=2000,cache-size=16M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

# A: written, then a FLUSH that times out on the held write.
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"A" * 4096, 0)
try:
    h.flush()
    raise SystemExit("the flush of A succeeded though the remote held it")
except nbd.Error as e:
    print("flush of A failed as expected:", e)
' || fail "write A"
[ -d "$tmp/first-write" ] || fail "A never reached the remote"
[ ! -e "$tmp/first-write/landed" ] || fail "A landed too early for the test"

# B on the same block while A is in doubt: its FLUSH must not succeed.
# 256 KiB: too many blocks for a flush by FUA writes, so B is written and
# then the backing flush refused (B stays unstable, not dirty).
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"B" * 262144, 0)
ok = False
try:
    h.flush()
    ok = True
except nbd.Error as e:
    print("flush of B failed:", e)
if ok:
    raise SystemExit("FLUSH of B succeeded while A could still land")
' || fail "a FLUSH reported B durable while the abandoned write A was in doubt"
foliod_alive

# A lands on the remote.
for ((i = 0; i < 200 * TSCALE; i++)); do
  [ -e "$tmp/first-write/landed" ] && break
  sleep 0.1
done
[ -e "$tmp/first-write/landed" ] || fail "A never landed"
sleep 0.5

# Still in doubt: foliod cannot know; the operator can.
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
try:
    h.flush()
    raise SystemExit("FLUSH succeeded before the doubt was cleared")
except nbd.Error:
    pass
' || fail "doubt cleared by itself"
# The daemon said so (its status timer looks every 10 s).
wait_for_text "$FOLIOD_LOG" "in doubt.*clear-doubt disk0" \
  "no log line about the write in doubt" 300

[ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 1 ] ||
  fail "foliod_backing_writes_in_doubt is not 1"
"$FOLIOD" clear-doubt disk0 --control "$ctl" || fail "foliod clear-doubt"
[ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 0 ] ||
  fail "foliod_backing_writes_in_doubt is not 0 after clear-doubt"

# Now B is written again and flushed (the backing may still be probing:
# retry a few times).
flush_until_ok disk0
stop_foliod
stop_remote
head -c 262144 "$img" | tr -d B | wc -c | grep -qx 0 ||
  fail "the remote has $(head -c 1 "$img") in block 0, not B: the abandoned write landed over the flushed one"
echo OK
