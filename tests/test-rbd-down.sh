#!/bin/bash
# The rbd backing through an outage has a down state (issue 33 item 7,
# review F7): once a request was abandoned at its request-timeout (the
# only OSD hangs: SIGSTOP), later requests fail at once but for one probe
# every 2 s, instead of each waiting the full timeout and leaving librbd
# one more request (and its buffer) it keeps until the cluster returns.
# Counted, not timed: a client reads 12 uncached 64 KiB ranges during the
# outage, and foliod's own counter of abandoned requests
# (foliod_backing_requests_abandoned_total) must stay well below one per
# read.  The log says the backing is down, and that it answers again
# once the OSD continues (SIGCONT); then the same ranges read back the
# image's data.
. "$(dirname "$0")/lib.sh"
lib_init rbd-down
. "$(dirname "$0")/lib-ceph.sh"
trap _ceph_cleanup EXIT

ceph_up 64M
rbd_import_model 64 16 32
start_foliod --control "$tmp/ctl" --export \
  "disk0=$(rbd_backing),cache-size=8M,request-timeout=1500"
U=$(uri disk0)

# read_range I: read 64 KiB at 16M + I MiB; prints ok, the data
# differing, or the error.
read_range () {
  timeout $((60 * TSCALE)) nbdsh -u "$U" -c "
off = (16 << 20) + $1 * (1 << 20)
want = open('$tmp/model', 'rb').read()[off:off + 65536]
try:
    print('ok' if h.pread(65536, off) == want else 'WRONG DATA')
except nbd.Error as e:
    print('error:', e.errno)
" || echo "no answer"
}

echo "== OSD stopped (SIGSTOP): 12 reads that miss, one connection"
"$CLUSTER" osd-stop "$CEPH_DIR"
timeout $((300 * TSCALE)) nbdsh -u "$U" -c "
for i in range(12):
    off = (16 << 20) + i * (1 << 20)
    try:
        h.pread(65536, off)
        print('read', i, 'answered')
    except nbd.Error as e:
        print('read', i, 'error:', e.errno)
" || fail "the reads did not all answer"
abandoned=$(foliod_stat "$tmp/ctl" foliod_backing_requests_abandoned_total)
echo "requests abandoned: $abandoned"
[ -n "$abandoned" ] || fail "no foliod_backing_requests_abandoned_total"
[ "$abandoned" -ge 1 ] || fail "no request abandoned while the OSD was stopped"
[ "$abandoned" -le 6 ] ||
  fail "$abandoned requests abandoned for 12 reads: each waited its timeout"
grep -q "rbd rbd/img: no answer within request-timeout" "$FOLIOD_LOG" ||
  fail "the log does not say the backing is down"
foliod_alive

echo "== OSD continued (SIGCONT)"
"$CLUSTER" osd-cont "$CEPH_DIR"
end=$(( SECONDS + 120 * TSCALE ))
until [ "$(read_range 0)" = ok ]; do
  [ $SECONDS -lt $end ] || fail "reads do not succeed after the OSD continued"
  sleep 1
done
for i in $(seq 1 11); do
  r=$(read_range "$i")
  [ "$r" = ok ] || fail "read $i after the outage: $r"
done
grep -q "rbd rbd/img: the cluster answers again" "$FOLIOD_LOG" ||
  fail "the log does not say the backing answers again"
stop_foliod
echo OK
