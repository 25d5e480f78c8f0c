#!/bin/bash
# The fault model over the REAL foliod's rbd backing (issue 33): foliod in
# front of rbd/img of a one-node Ceph cluster, its librbd calls through
# tests/faultfs/fault-rbd.c (LD_PRELOAD), which fails writes (EIO), fails
# a flush and undoes every write since the last good flush (the next
# flush succeeds), holds some writes past request-timeout and sends them
# later (foliod abandons them: writes in doubt, which land over what was
# written meanwhile: item 7), and cuts the power at a random call: each
# unflushed sector keeps its new data or gets its old back, the held
# writes are never sent, and foliod is killed.  After a kill the image's
# lock is broken as an operator would (tests/ceph/cluster break-locks:
# the dead client is blocklisted, so nothing it sent can land later).
# The client (tests/tools/fault-real.py) writes versioned 4 KiB blocks,
# zeroes, FUA writes and FLUSHes, models what each FLUSH and FUA that
# succeeded acknowledged, and ends with FLUSHes, half a second apart,
# until one succeeds (a doubt ends by itself when the held write lands).
# It plays the operator for a passthrough write lost (a zero sent before
# a flush that failed): clear-doubt --lost-only, which leaves a doubt in
# place, and the zeroed blocks are excused (fault-real.py --operator
# ...,losses).
# Then foliod is stopped (SIGTERM; a pmem store, on odd seeds, kill -9)
# unless the power cut killed it, and starts again on the same store
# without faults (a persistent store's inherited doubt is cleared: the
# dead client is fenced); every block must read back as its acknowledged
# version or a newer one, per 512-byte sector, never data no client
# wrote; after a clean stop `rbd export` of the image holds what foliod
# served.
# store=ram and store=pmem (flush=store), FAULT_RBD_SEEDS seeds each (2;
# make check-crash: ROUNDS/10) from FAULT_RBD_SEED (0);
# FAULT_RBD_STORES="ram pmem" picks the stores, FAULT_RBD_LATE=M and
# FAULT_RBD_LATE_MS=N the writes held, FAULT_RBD_TRACE=1 traces every
# librbd write and flush into the faults log, FAULT_RBD_LOGS=PREFIX keeps
# each faulted foliod's log and faults, FAULT_RBD_KEEP=DIR a failed run's
# files.
# Seen failing on a foliod whose rbd backing takes a failed flush for a
# good one (3 of 3 seeds), and on one whose abandoned write that ends
# after it was sent is no loss fact (odd seeds).
. "$(dirname "$0")/lib.sh"
lib_init fault-rbd-real
. "$(dirname "$0")/lib-ceph.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"
shim=$BUILD/tests/faultfs/fault-rbd.so
[ -f "$shim" ] || fail "not built: $shim"

seeds=${FAULT_RBD_SEEDS:-2}
base=${FAULT_RBD_SEED:-0}
blocks=1024                    # 4 MiB export, 1 MiB cache: writeback runs
img=$tmp/img
tool=(/usr/bin/python3 "$TOP/tests/tools/fault-real.py")
keys=cache-size=1M,folio-size=16K,dirty-expire=200,writeback-interval=100
preload=$shim${LD_PRELOAD:+ $LD_PRELOAD}
asan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
# A stop with a request librbd never answered (a held write) leaves the
# image and its requests to the process's exit, by design (rbd.c,
# rbdb_close): LeakSanitizer would report librbd's objects.  foliod's own
# leaks are still reported.
printf 'leak:librbd.so\nleak:librados.so\n' > "$tmp/lsan.supp"
lsan=${LSAN_OPTIONS:+$LSAN_OPTIONS:}suppressions=$tmp/lsan.supp
echo "seeds $base..$((base + seeds - 1)) (FAULT_RBD_SEED=N FAULT_RBD_SEEDS=1 replays one)"

ceph_up 16M

runs=0 lossruns=0 kills=0 cuts=0 clears=0
touch "$tmp/all-faults"
one () {
  local store=$1 seed=$2 spec pa rc=0
  case $store in
  ram)  spec= ;;
  pmem) spec=",store=pmem:$tmp/store" ;;
  esac
  rm -f "$tmp/store" "$tmp/faults" "$tmp/foliod.log" "$tmp/ctl.sock"
  "${tool[@]}" init --img "$img" --blocks $blocks
  rbd_cmd rm rbd/img >/dev/null 2>&1 || fail "rbd rm"
  rbd_cmd import --no-progress "$img" rbd/img || fail "rbd import"
  RANDOM=$seed
  # Even seeds: a power cut at a random call of the first ~300 (a pmem
  # store, with flush=store, makes fewer), or none, and a few writes held
  # 2.5 s.  Odd seeds: no power cut, and more writes held 7 s, long
  # enough for the client to write their blocks again and foliod to
  # write those back before the old copy lands.
  case $store in
  ram)  pa=$(( RANDOM % 3 ? 20 + RANDOM % 280 : 0 )) ;;
  pmem) pa=$(( RANDOM % 3 ? 20 + RANDOM % 130 : 0 )) ;;
  esac
  late=15 late_ms=2500
  [ $((seed % 2)) = 1 ] && pa=0 late=40 late_ms=7000
  late=${FAULT_RBD_LATE:-$late} late_ms=${FAULT_RBD_LATE_MS:-$late_ms}
  echo "--- store=$store seed $seed${spec:+ ($spec)}, power cut at call ${pa/#0/never}, $late per mille of writes held $late_ms ms"
  FAULT_RBD=1 FAULT_SEED=$seed FAULT_SYNC_FAIL=150 FAULT_WRITE_ERR=10 \
    FAULT_LATE=$late FAULT_LATE_MS=$late_ms FAULT_POWER_AT=$pa \
    FAULT_LOG=$tmp/faults FAULT_LOG_ALL=${FAULT_RBD_TRACE:-0} \
    LD_PRELOAD=$preload ASAN_OPTIONS=$asan LSAN_OPTIONS=$lsan \
    start_foliod --control "$tmp/ctl.sock" \
    --export "disk0=$(rbd_backing),$keys,request-timeout=1500$spec"
  timeout $((180 * TSCALE)) "${tool[@]}" run --uri "$(uri disk0)" \
    --model "$tmp/model" --blocks $blocks --seed "$seed" --ops 300 \
    --operator "$FOLIOD,$tmp/ctl.sock,disk0,losses" \
    --final-flushes 40 --flush-pause 0.5 ||
    fail "store=$store seed $seed: the client failed during the run"
  if ! pgrep -P "$FOLIOD_PID" >/dev/null; then
    cuts=$((cuts + 1))          # the power cut killed it
  elif [ "$store" = pmem ] && [ $((seed % 2)) = 1 ]; then
    pkill -KILL -P "$FOLIOD_PID"    # foliod, under start_foliod's timeout
    kills=$((kills + 1))
  else
    kill -TERM "$FOLIOD_PID" 2>/dev/null || true
  fi
  wait_gone "$FOLIOD_PID" 600 || fail "foliod still running after the stop"
  wait "$FOLIOD_PID" || rc=$?
  FOLIOD_PID=
  check_sanitizer_log "$tmp/foliod.log"
  touch "$tmp/faults"
  cat "$tmp/faults" >> "$tmp/all-faults"
  [ -z "${FAULT_RBD_LOGS:-}" ] || cp "$tmp/faults" "$FAULT_RBD_LOGS.$store.$seed.faults"
  echo "  faults: $(awk '{ n[$3]++ } END { for (k in n) printf "%s %d, ", k, n[k] }' \
                   "$tmp/faults")$(grep -h -o 'power-cut.*' "$tmp/faults")"
  echo "  foliod exited $rc$(grep -o 'DIRTY DATA LOST.*' "$tmp/foliod.log" |
                            sed 's/^/: /' | head -1)"
  grep -q 'DIRTY DATA LOST' "$tmp/foliod.log" && lossruns=$((lossruns + 1))
  # The operator's --lost-only clears never end a doubt: an abandoned
  # write may still land.
  ! grep -q 'no longer in doubt (the operator' "$tmp/foliod.log" ||
    fail "store=$store seed $seed: clear-doubt --lost-only cleared a write in doubt"
  cp "$tmp/foliod.log" "$tmp/foliod-faulted.log"
  [ -z "${FAULT_RBD_LOGS:-}" ] || cp "$tmp/foliod.log" "$FAULT_RBD_LOGS.$store.$seed.log"
  # A killed foliod left its exclusive lock: broken, its client blocklisted.
  "$CLUSTER" break-locks "$CEPH_DIR" || fail "break-locks"
  # The restart: the same store and image, no faults.
  rm -f "$tmp/ctl.sock"
  start_foliod --control "$tmp/ctl.sock" \
    --export "disk0=$(rbd_backing),$keys$spec"
  if [ "$(foliod_stat "$tmp/ctl.sock" foliod_backing_writes_in_doubt)" != 0 ] ||
     [ "$(foliod_stat "$tmp/ctl.sock" foliod_passthrough_lost_writes)" != 0 ]; then
    [ "$store" != ram ] || fail "store=$store seed $seed: a ram store's restart inherited a doubt or a loss"
    "$FOLIOD" clear-doubt disk0 --control "$tmp/ctl.sock" > /dev/null ||
      fail "foliod clear-doubt"
    clears=$((clears + 1))
  fi
  "${tool[@]}" check --uri "$(uri disk0)" --model "$tmp/model" \
    --blocks $blocks --save "$tmp/read" || {
    "$FOLIOD" stats --control "$tmp/ctl.sock" || true
    [ -z "${FAULT_RBD_KEEP:-}" ] || cp -r "$tmp" "$FAULT_RBD_KEEP"
    fail "store=$store seed $seed: acknowledged data lost or wrong after the restart (FAULT_RBD_SEED=$seed FAULT_RBD_SEEDS=1 FAULT_RBD_STORES=$store)"
  }
  stop_foliod
  rm -f "$tmp/out"
  rbd_cmd export --no-progress rbd/img "$tmp/out" || fail "rbd export"
  "${tool[@]}" same --model "$tmp/model" --img "$tmp/out" --save "$tmp/read" ||
    fail "store=$store seed $seed: the image after the clean stop"
  runs=$((runs + 1))
}

for ((i = 0; i < seeds; i++)); do
  for store in ${FAULT_RBD_STORES:-ram pmem}; do
    one "$store" $((base + i))
  done
done
echo "ok: $runs runs; faults injected: $(awk '{ n[$3]++ } END {
  for (k in n) printf "%s %d, ", k, n[k] }' "$tmp/all-faults")$cuts power cuts, $kills foliod kill -9, $lossruns saying DIRTY DATA LOST, $clears restarts inheriting a doubt"
