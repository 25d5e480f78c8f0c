#!/bin/bash
# Maintenance through the lock holder (issue 33 item 6).  librbd forwards
# another client's maintenance operations to the image's lock owner,
# whose librbd carries them out (Ceph 16.2 does so even with the lock
# taken by rbd_lock_acquire): `rbd resize --allow-shrink` shrinks the
# image under foliod, `rbd feature disable ... exclusive-lock` lets a
# second writer in.  foliod must notice at once and stop acknowledging:
# after each, a write and a FLUSH through foliod fail, a read fails (the
# cache would disagree with the image), `foliod stats` and the log say
# why.  (Before: foliod went on acknowledging writes and FLUSHes, and
# served its cache at the old size.)
. "$(dirname "$0")/lib.sh"
lib_init rbd-maint
. "$(dirname "$0")/lib-ceph.sh"
requires nbdsh

ceph_up 16M
rbd_cmd create --size 16M rbd/img2 || fail "rbd create img2"

# served IMAGE: foliod on IMAGE with 1 MiB written and FLUSHed.
served () {
  start_foliod --control "$tmp/ctl" \
    --export "disk0=$(rbd_backing "$1"),cache-size=4M,request-timeout=10000"
  nbdsh -u "$(uri disk0)" -c 'h.pwrite(b"A" * 1048576, 0)' -c 'h.flush()' ||
    fail "write through foliod"
}

# refuses WHAT: foliod no longer acknowledges, and says why.
refuses () {
  local i
  # The update watch fires at once; the check takes a round trip.
  for ((i = 0; i < 50 * TSCALE; i++)); do
    [ "$(foliod_stat "$tmp/ctl" foliod_fenced)" = 1 ] && break
    sleep 0.1
  done
  nbdsh -u "$(uri disk0)" -c 'h.pwrite(b"C" * 4096, 0)' -c 'h.flush()' \
    2>/dev/null && fail "foliod acknowledged a write and a FLUSH after $1"
  nbdsh -u "$(uri disk0)" -c 'h.flush()' 2>/dev/null &&
    fail "foliod acknowledged a FLUSH after $1"
  nbdsh -u "$(uri disk0)" -c 'h.pread(4096, 0)' >/dev/null 2>&1 &&
    fail "foliod served its cache after $1"
  [ "$(foliod_stat "$tmp/ctl" foliod_fenced)" = 1 ] || fail "not fenced after $1"
  "$FOLIOD" stats --control "$tmp/ctl" > "$tmp/table" || fail "foliod stats"
  grep "disk0: fenced: " "$tmp/table" || { cat "$tmp/table"; fail "foliod stats does not say why"; }
  grep "no longer owns the image" "$FOLIOD_LOG" | tail -1
  kill -TERM "$FOLIOD_PID"
  wait_gone "$FOLIOD_PID" 600 || fail "foliod still running after SIGTERM"
  wait "$FOLIOD_PID" || true
  FOLIOD_PID=
  check_sanitizer_log "$FOLIOD_LOG"
}

served img
rbd_cmd resize --allow-shrink --size 8M rbd/img || fail "rbd resize"
refuses "a shrink by another client"
grep -q "another client resized the image" "$FOLIOD_LOG" || fail "no log of the resize"

served img2
rbd_cmd feature disable rbd/img2 fast-diff object-map exclusive-lock ||
  fail "rbd feature disable"
rbd_cmd bench --io-type write --io-size 4096 --io-total 8192 rbd/img2 \
  >/dev/null || fail "the second writer could not write"
refuses "the exclusive-lock feature was disabled"
grep -q "disabled the image's exclusive-lock feature" "$FOLIOD_LOG" ||
  fail "no log of the feature's removal"
echo OK
