#!/bin/bash
# The kill -9 loop of test-pmem-kill.sh (tests/tools/pmem-kill.py) with an
# rbd backing (issue 27): foliod with a pmem store in front of rbd:rbd/img
# of a one-node Ceph cluster, 2-4 clients writing random unaligned ranges
# with and without FLUSH and FUA, SIGKILL at a random moment, a restart on
# the same store, and every acknowledged write reads back.  A killed
# foliod leaves the image's exclusive lock behind (until its watch
# expires): before each start the lock is broken, as an operator would
# (tests/ceph/cluster break-locks: rbd lock rm, which blocklists the dead
# client).  After the last round, SIGTERM, and `rbd export` of the image
# equals the model.  RBD_KILL_ROUNDS (8), PMEM_KILL_SEED=N replays a seed,
# STORE=ram runs the loop on the ram store (it loses acknowledged writes:
# a demonstration that the test sees it).
. "$(dirname "$0")/lib.sh"
lib_init rbd-pmem-kill 64
. "$(dirname "$0")/lib-ceph.sh"
/usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"

rounds=${RBD_KILL_ROUNDS:-8}
seed=${PMEM_KILL_SEED:-$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')}
echo "seed $seed (PMEM_KILL_SEED=$seed replays it), $rounds rounds"

ceph_up 16M
random_file "$tmp/img" 16
rbd_cmd rm rbd/img >/dev/null 2>&1 || fail "rbd rm"
rbd_cmd import --no-progress "$tmp/img" rbd/img || fail "rbd import"

case ${STORE:-pmem} in
pmem) store=",store=pmem:$tmp/store" ;;
ram)  store="" ;;
*)    fail "STORE=${STORE}: pmem or ram" ;;
esac
SOCK=$tmp/sock
FOLIOD_LOG=$tmp/foliod.log
timeout --signal=KILL $(( (rounds * 20 + 120) * TSCALE )) \
  /usr/bin/python3 "$TOP/tests/tools/pmem-kill.py" --socket "$SOCK" \
  --backing "$tmp/img" --seed "$seed" --tscale "$TSCALE" \
  --backing-cmd "rm -f '$tmp/img' && rbd -c '$CEPH_CONF' export --no-progress rbd/img '$tmp/img'" \
  --before-start "'$CLUSTER' break-locks '$CEPH_DIR'" \
  --foliod "$FOLIOD" \
  --export "disk0=$(rbd_backing),cache-size=4M$store" \
  --vary ",dirty-background=50,dirty-limit=90" \
  --rounds "$rounds" --log "$FOLIOD_LOG" ||
  fail "kill -9 loop on rbd failed (seed $seed; see above)"
check_sanitizer_log "$FOLIOD_LOG"
echo OK
