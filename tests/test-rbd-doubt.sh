#!/bin/bash
# A write the rbd backing abandoned at request-timeout is a write in doubt
# as on nbd (issue 33 item 7): the only OSD stopped (SIGSTOP), a write
# and a FLUSH; foliod stats counts the write in doubt
# (foliod_backing_writes_in_doubt, 0 on main), FLUSH fails, and
# 'foliod clear-doubt' clears it; once the OSD continues FLUSH succeeds
# and the data reads back, through foliod and from the image itself.
. "$(dirname "$0")/lib.sh"
lib_init rbd-doubt
. "$(dirname "$0")/lib-ceph.sh"
trap _ceph_cleanup EXIT

ceph_up 16M
start_foliod --control "$tmp/ctl" --export \
  "disk0=$(rbd_backing),cache-size=4M,request-timeout=2000,dirty-expire=3600000"
U=$(uri disk0)

# flush: "ok", or the error.
flush () {
  timeout $((60 * TSCALE)) nbdsh -u "$U" -c '
try:
    h.flush()
    print("ok")
except nbd.Error as e:
    print("error:", e.errno)
' || echo "no answer"
}

timeout $((60 * TSCALE)) nbdsh -u "$U" -c 'h.pwrite(b"A" * 65536, 0); h.flush()' ||
  fail "write before the outage"

echo "== OSD stopped (SIGSTOP): a write and a FLUSH"
"$CLUSTER" osd-stop "$CEPH_DIR"
timeout $((60 * TSCALE)) nbdsh -u "$U" -c 'h.pwrite(b"B" * 65536, 0)' ||
  fail "the write was not answered (the cache holds it)"
r=$(flush)
echo "FLUSH: $r"
[ "$r" != ok ] || fail "FLUSH succeeded with the only OSD stopped"
n=$(foliod_stat "$tmp/ctl" foliod_backing_writes_in_doubt)
echo "writes in doubt: $n"
[ -n "$n" ] && [ "$n" -ge 1 ] ||
  fail "foliod stats shows no write in doubt ($n) after a write was abandoned"
r=$(flush)
[ "$r" != ok ] || fail "a second FLUSH succeeded with a write in doubt"

echo "== clear-doubt"
out=$("$FOLIOD" clear-doubt disk0 --control "$tmp/ctl") || fail "clear-doubt: $out"
echo "$out"
# At least the n counted above: the down state's probe (one request every
# 2 s) may have been a write that was abandoned too since.
k=$(echo "$out" | sed -n 's/^OK disk0: \([0-9]*\) write.*/\1/p')
[ -n "$k" ] && [ "$k" -ge "$n" ] || fail "clear-doubt did not count $n: $out"
[ "$(foliod_stat "$tmp/ctl" foliod_backing_writes_in_doubt)" = 0 ] ||
  fail "still in doubt after clear-doubt"

echo "== OSD continued (SIGCONT)"
"$CLUSTER" osd-cont "$CEPH_DIR"
end=$(( SECONDS + 90 * TSCALE ))
until [ "$(flush)" = ok ]; do
  [ $SECONDS -lt $end ] || fail "FLUSH still failing after the OSD continued"
  sleep 1
done
timeout $((60 * TSCALE)) nbdsh -u "$U" -c '
assert h.pread(65536, 0) == b"B" * 65536, "foliod reads other data"' ||
  fail "the data does not read back through foliod"
stop_foliod
rbd_cmd export --no-progress rbd/img "$tmp/out" || fail "rbd export"
head -c 65536 "$tmp/out" | cmp -s - <(head -c 65536 /dev/zero | tr '\0' B) ||
  fail "the image does not hold the data FLUSH acknowledged"
echo OK
