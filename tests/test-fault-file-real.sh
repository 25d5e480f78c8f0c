#!/bin/bash
# The fault model over the REAL foliod (issue 33): its file backing's
# system calls go through tests/faultfs/fault-preload.c (LD_PRELOAD), which
# fails writes and fallocates (EIO, ENOSPC), fails fdatasync with EIO and
# drops every write since the last good sync as Linux does (the next
# sync succeeds), and cuts the power at a random call: each unsynced
# sector keeps its new data or gets its old back, then foliod is killed.
# A client (tests/tools/fault-real.py) writes versioned 4 KiB blocks,
# zeroes, FUA writes and FLUSHes and models what each FLUSH and FUA that
# succeeded acknowledged.  After the run (power cut, or SIGTERM), foliod
# starts again on the same store without faults and every block must
# read back as its acknowledged version or a newer one, per 512-byte
# sector, and never data no client wrote (the one exception: when the
# run's last FLUSH failed, a block zeroed since the last good FLUSH, as
# a lost passthrough zero makes every FLUSH fail until the export is
# reopened); after a clean stop the file holds what foliod served.
# Seen failing on a foliod whose file_sync ignores fdatasync errors.
# store=ram (flush=backing) and store=pmem (flush=store, then flush=backing
# on odd seeds), FAULT_REAL_SEEDS seeds each (3; make check-crash: ROUNDS)
# from FAULT_REAL_SEED (0); FAULT_REAL_STORES="ram pmem" picks the stores,
# FAULT_REAL_KEEP=PREFIX keeps each faulted foliod's log as PREFIX.STORE.SEED.log.
. "$(dirname "$0")/lib.sh"
lib_init fault-file-real
requires nbdinfo
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"
shim=$BUILD/tests/faultfs/fault-preload.so
[ -f "$shim" ] || fail "not built: $shim"

seeds=${FAULT_REAL_SEEDS:-3}
base=${FAULT_REAL_SEED:-0}
blocks=1024                    # 4 MiB export, 1 MiB cache: writeback runs
img=$tmp/img
tool=(/usr/bin/python3 "$TOP/tests/tools/fault-real.py")
keys=cache-size=1M,folio-size=16K,dirty-expire=200,writeback-interval=100
preload=$shim${LD_PRELOAD:+ $LD_PRELOAD}
asan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0
echo "seeds $base..$((base + seeds - 1)) (FAULT_REAL_SEED=N FAULT_REAL_SEEDS=1 replays one)"

runs=0 lossruns=0 badstops=0 inherited=0
touch "$tmp/all-faults"
one () {
  local store=$1 seed=$2 spec pa rc=0
  case $store in
  ram)  spec= ;;
  pmem) spec=",store=pmem:$tmp/store"
        [ $((seed % 2)) = 1 ] && spec+=",flush=backing" ;;
  esac
  rm -f "$tmp/store" "$tmp/faults" "$tmp/foliod.log"
  "${tool[@]}" init --img "$img" --blocks $blocks
  RANDOM=$seed
  pa=$(( RANDOM % 4 ? 20 + RANDOM % 300 : 0 ))   # 0: no power cut
  echo "--- store=$store seed $seed${spec:+ ($spec)}, power cut at call ${pa/#0/never}"
  FAULT_FILE=$img FAULT_SEED=$seed FAULT_SYNC_FAIL=150 FAULT_WRITE_ERR=10 \
    FAULT_POWER_AT=$pa FAULT_LOG=$tmp/faults LD_PRELOAD=$preload \
    ASAN_OPTIONS=$asan \
    start_foliod --export "disk0=file:$img,$keys$spec"
  timeout $((60 * TSCALE)) "${tool[@]}" run --uri "$(uri disk0)" \
    --model "$tmp/model" --blocks $blocks --seed "$seed" --ops 300 ||
    fail "store=$store seed $seed: the client failed during the run"
  kill -TERM "$FOLIOD_PID" 2>/dev/null || true
  wait_gone "$FOLIOD_PID" 600 || fail "foliod still running after SIGTERM"
  wait "$FOLIOD_PID" || rc=$?
  FOLIOD_PID=
  check_sanitizer_log "$tmp/foliod.log"
  touch "$tmp/faults"
  cat "$tmp/faults" >> "$tmp/all-faults"
  echo "  faults: $(awk '{ n[$3]++ } END { for (k in n) printf "%s %d, ", k, n[k] }' \
                   "$tmp/faults")$(grep -h -o 'power-cut.*' "$tmp/faults")"
  grep -q 'DIRTY DATA LOST' "$tmp/foliod.log" && lossruns=$((lossruns + 1))
  [ "$rc" = 1 ] && badstops=$((badstops + 1))
  echo "  foliod exited $rc$(grep -o 'DIRTY DATA LOST.*' "$tmp/foliod.log" |
                            sed 's/^/: /' | head -1)"
  cp "$tmp/foliod.log" "$tmp/foliod-faulted.log"
  [ -z "${FAULT_REAL_KEEP:-}" ] || cp "$tmp/foliod.log" "$FAULT_REAL_KEEP.$store.$seed.log"
  # The restart: no fault layer.
  rm -f "$tmp/ctl.sock"
  start_foliod --control "$tmp/ctl.sock" --export "disk0=file:$img,$keys$spec"
  "${tool[@]}" check --uri "$(uri disk0)" --model "$tmp/model" \
    --blocks $blocks --save "$tmp/read" ||
    fail "store=$store seed $seed: acknowledged data lost or wrong after the restart (FAULT_REAL_SEED=$seed FAULT_REAL_SEEDS=1)"
  # A persistent store keeps a passthrough loss across the restart: FLUSH
  # still fails until the operator accepts it (clear-doubt).
  if [ "$(foliod_stat "$tmp/ctl.sock" foliod_passthrough_lost_writes)" != 0 ]; then
    [ "$store" != ram ] || fail "store=$store seed $seed: a ram store's restart inherited a loss"
    inherited=$((inherited + 1))
    timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c 'h.flush()' 2>/dev/null &&
      fail "store=$store seed $seed: FLUSH succeeded after a restart that inherited a passthrough loss"
    "$FOLIOD" clear-doubt disk0 --control "$tmp/ctl.sock" > /dev/null ||
      fail "foliod clear-doubt"
  fi
  stop_foliod
  "${tool[@]}" same --model "$tmp/model" --img "$img" --save "$tmp/read" ||
    fail "store=$store seed $seed: the file after the clean stop"
  runs=$((runs + 1))
}

for ((i = 0; i < seeds; i++)); do
  for store in ${FAULT_REAL_STORES:-ram pmem}; do
    one "$store" $((base + i))
  done
done
echo "ok: $runs runs; faults injected: $(awk '{ n[$3]++ } END {
  for (k in n) printf "%s %d, ", k, n[k] }' "$tmp/all-faults")$badstops stops exited 1, $lossruns saying DIRTY DATA LOST, $inherited restarts inheriting a passthrough loss"
