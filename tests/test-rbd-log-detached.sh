#!/bin/bash
# The rbd backing's warnings reach the log of a detached foliod (issue 32
# item 4, review F11): a detached foliod points stderr at /dev/null, and
# rbd's warnings at close went there.  A detached foliod with log-file
# serves an rbd image; the whole cluster goes away; on SIGTERM foliod
# gives up closing the image (nothing was dirty, so it still exits) and
# must say so in log-file, with the timestamp and level of its other
# lines.
. "$(dirname "$0")/lib.sh"
lib_init rbd-log-detached
. "$(dirname "$0")/lib-ceph.sh"
requires nbdinfo
trap _ceph_cleanup EXIT

ceph_up 16M
# The image given up is never closed: LeakSanitizer would report
# librbd's objects for it (as in test-rbd-osd.sh).
ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 start_detached \
  --log-file "$tmp/log" \
  --export "disk0=$(rbd_backing),cache-size=8M,request-timeout=3000"
pid=$DETACHED_PID
nbdinfo "$(uri disk0)" >/dev/null || fail "detached foliod does not serve"

"$CLUSTER" down "$CEPH_DIR"
kill -TERM "$pid"
wait_gone "$pid" 600 || fail "detached foliod still running after SIGTERM"
cat "$tmp/log"
grep -Eq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ foliod\[$pid\] warn: rbd:rbd/img[^ ]*: the cluster does not answer: image not closed cleanly" "$tmp/log" ||
  fail "rbd's warning at close is not in log-file"
echo OK
