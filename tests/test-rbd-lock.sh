#!/bin/bash
# One writer per image (issue 27): foliod A serves rbd:rbd/img and holds
# its exclusive lock.  A second foliod on the same image is refused at
# start, naming the image and the holder; another librbd writer (rbd
# bench) is refused too (EROFS) and A keeps the lock and keeps writing; a
# read-only export of the image alongside A works and reads what A
# flushed.  Then A stops (SIGTERM releases the lock) and a new foliod on
# the image starts and reads A's data: the move of a VM to another host.
. "$(dirname "$0")/lib.sh"
lib_init rbd-lock
. "$(dirname "$0")/lib-ceph.sh"

ceph_up 64M
start_foliod --export "disk0=$(rbd_backing),cache-size=8M"
random_file "$tmp/data" 1
nbdcopy "$tmp/data" "$(uri disk0)" || fail "write through A"
nbdsh -u "$(uri disk0)" -c 'h.flush()' || fail "flush through A"
rbd_cmd lock ls rbd/img | grep -q "exclusive lock" ||
  fail "A holds no exclusive lock on rbd/img"

# A second writer foliod: refused at start, with the reason.
rc=0
timeout $((60 * TSCALE)) "$FOLIOD" --foreground --unix "$tmp/sock-b" \
  --export "disk0=$(rbd_backing),cache-size=8M" >"$tmp/b.log" 2>&1 || rc=$?
cat "$tmp/b.log"
[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] || fail "a second foliod on rbd/img started (rc $rc)"
grep -q "rbd/img: image is in use: client .* holds its exclusive lock" "$tmp/b.log" ||
  fail "the refusal does not say why"

# Another librbd writer is refused while A holds the lock.
rbd_cmd bench --io-type write --io-size 4096 --io-total 8192 rbd/img \
  >"$tmp/bench.log" 2>&1 && fail "rbd bench wrote to an image A holds"
grep -q "Read-only file system" "$tmp/bench.log" || {
  cat "$tmp/bench.log"; fail "rbd bench failed, but not for the lock"; }
nbdsh -u "$(uri disk0)" -c 'h.pwrite(b"A" * 4096, 4096); h.flush()' ||
  fail "A cannot write after the other writer tried"
dd if=/dev/zero bs=4096 count=1 status=none | tr '\0' A |
  dd of="$tmp/data" bs=4096 seek=1 conv=notrunc status=none

# A read-only export alongside A: no lock needed, sees flushed data.
timeout --signal=KILL $((120 * TSCALE)) "$FOLIOD" --foreground \
  --unix "$tmp/sock-ro" \
  --export "ro=$(rbd_backing),cache-size=8M,read-only=true" \
  >"$tmp/ro.log" 2>&1 &
ro_pid=$!
track "$ro_pid"
wait_for_socket "$tmp/sock-ro" $((30 * TSCALE))
nbdcopy "$(uri ro "$tmp/sock-ro")" "$tmp/ro-read" || fail "read-only export"
cmp -n 1048576 "$tmp/ro-read" "$tmp/data" ||
  fail "the read-only export does not read what A flushed"
kill -TERM "$ro_pid"
wait "$ro_pid" || fail "the read-only foliod exited $?"

# The move: A stops and releases the lock, B takes it.
stop_foliod
rbd_cmd lock ls rbd/img | grep -q "exclusive lock" &&
  fail "the lock is still held after A stopped"
start_foliod --export "disk0=$(rbd_backing),cache-size=8M"
nbdcopy "$(uri disk0)" "$tmp/b-read" || fail "read through B"
cmp -n 1048576 "$tmp/b-read" "$tmp/data" || fail "B does not read A's data"
nbdsh -u "$(uri disk0)" -c 'h.pwrite(b"B" * 4096, 0); h.flush()' ||
  fail "B cannot write"
stop_foliod
echo OK
