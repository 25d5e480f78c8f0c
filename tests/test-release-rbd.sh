#!/bin/bash
# Moving an rbd volume between two foliods (issue 35 item 3), each with
# its own state directory and ssd store, on the one-node Ceph cluster:
#  - A holds rbd/img's exclusive lock with 1 MiB dirty in its cache; B is
#    refused the image;
#  - `foliod release disk0` on A writes the 1 MiB back and gives the lock
#    up (rbd lock ls shows none);
#  - A is then killed with SIGKILL (a host lost right after its release):
#    B starts at once (no dead lock to wait out), reads A's data, writes;
#  - the image, read with rbd export after B stopped, holds A's data and
#    B's write.
# kill -9 at other points of the hand-off (A during its release, B during
# its start): tests/test-release-rbd-kill.sh.
. "$(dirname "$0")/lib.sh"
lib_init release-rbd
. "$(dirname "$0")/lib-ceph.sh"

ceph_up 64M
mkdir -p "$tmp/stA" "$tmp/stB"
keep_dirty="cache-size=8M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"
SOCK_PATH=$tmp/sockA start_foliod --pidfile "$tmp/pidA" --state-dir "$tmp/stA" \
  --control "$tmp/ctlA" \
  --export "disk0=$(rbd_backing),store=ssd:$tmp/stA/disk0.log,$keep_dirty"
A_SOCK=$SOCK
random_file "$tmp/data" 1
nbdcopy "$tmp/data" "$(uri disk0 "$A_SOCK")" || fail "write through A"
dirty=$(foliod_stat "$tmp/ctlA" foliod_dirty_bytes)
[ "$dirty" -eq 1048576 ] || fail "expected 1 MiB dirty in A, got $dirty"

rc=0
timeout $((60 * TSCALE)) "$FOLIOD" --foreground --unix "$tmp/sock-b0" \
  --state-dir "$tmp/stB" --export "disk0=$(rbd_backing),cache-size=8M" \
  >"$tmp/b0.log" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "B started on rbd/img while A holds it (rc $rc)"
grep -q "holds its exclusive lock" "$tmp/b0.log" || fail "B's refusal: $(cat "$tmp/b0.log")"

"$FOLIOD" release disk0 --control "$tmp/ctlA" > "$tmp/release.out" ||
  fail "release on A"
cat "$tmp/release.out"
grep -q "1048576 dirty bytes written back" "$tmp/release.out" ||
  fail "the release did not write back the 1 MiB"
if rbd_cmd lock ls rbd/img | grep -q "exclusive lock"; then
  fail "A still holds the lock after its release"
fi

# A host lost right after its release: B need not wait for anything.
kill9_foliod "$tmp/pidA"
SOCK_PATH=$tmp/sockB start_foliod --state-dir "$tmp/stB" \
  --export "disk0=$(rbd_backing),store=ssd:$tmp/stB/disk0.log,cache-size=8M"
nbdcopy "$(uri disk0)" "$tmp/b-read" || fail "read through B"
cmp -n 1048576 "$tmp/b-read" "$tmp/data" || fail "B does not read A's data"
nbdsh -u "$(uri disk0)" -c 'h.pwrite(b"B" * 4096, 4096); h.flush()' ||
  fail "B cannot write"
stop_foliod
dd if=/dev/zero bs=4096 count=1 status=none | tr '\0' B |
  dd of="$tmp/data" bs=4096 seek=1 conv=notrunc status=none
rbd_cmd export rbd/img "$tmp/image" >/dev/null 2>&1 || fail "rbd export"
cmp -n 1048576 "$tmp/image" "$tmp/data" || fail "the image lacks A's data or B's write"
echo OK
