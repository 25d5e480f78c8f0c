#!/bin/bash
# The fault model over the nbdkit filter (issue 33): nbdkit --filter=folio
# over the file plugin, one process, whose calls on the image go through
# tests/faultfs/fault-preload.c: writes that fail (EIO, ENOSPC), an
# fdatasync that fails and drops every write not yet synced (the next
# one succeeds: Linux reports the error once, to one of the plugin's
# threads), and a power cut at a random call: each unsynced sector new or
# old, then nbdkit is killed, the filter's cache with it.  The filter
# runs the same cache core as foliod, over a backing that is the plugin
# below it: nbdkit's threads send it FUA writes and flushes at once.
# The client (tests/tools/fault-real.py, one connection) writes versioned
# 4 KiB blocks, zeroes, FUA writes and FLUSHes, and models what each FLUSH
# and FUA that succeeded acknowledged.  After the power cut, or SIGTERM,
# nbdkit starts again with the filter on the same image without faults,
# and every block must read back as its acknowledged version or a newer
# one, per 512-byte sector, never data no client wrote (the exception:
# when the run's last FLUSH failed, a block zeroed since the last good
# FLUSH); after a clean stop the image holds what the filter served.
# FAULT_FILTER_SEEDS seeds (3; make check-crash: ROUNDS/10) from
# FAULT_FILTER_SEED (0).
. "$(dirname "$0")/lib.sh"
filter_init fault-filter-real
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"
shim=$BUILD/tests/faultfs/fault-preload.so
[ -f "$shim" ] || fail "not built: $shim"

seeds=${FAULT_FILTER_SEEDS:-3}
base=${FAULT_FILTER_SEED:-0}
blocks=1024                    # 4 MiB export, 1 MiB cache: writeback runs
img=$tmp/img
sock=$tmp/sock
uri="nbd+unix:///?socket=$sock"
tool=(/usr/bin/python3 "$TOP/tests/tools/fault-real.py")
keys=(cache-size=1M folio-size=16K dirty-expire=200 writeback-interval=100)
preload=$shim                  # after the sanitizer's runtime, if any
for e in "${NBDKIT_ENV[@]}"; do
  case $e in LD_PRELOAD=*) preload="${e#LD_PRELOAD=} $shim" ;; esac
done
echo "seeds $base..$((base + seeds - 1)) (FAULT_FILTER_SEED=N FAULT_FILTER_SEEDS=1 replays one)"

# start_nbdkit [VAR=VALUE...]: nbdkit with the filter over $img, in the
# background with those variables, until it listens; NBDKIT_PID.
start_nbdkit () {
  local i
  rm -f "$sock" "$tmp/nbdkit.pid"
  env "${NBDKIT_ENV[@]}" "$@" nbdkit -f --exit-with-parent -U "$sock" \
    -P "$tmp/nbdkit.pid" --filter="$FILTER" file "$img" "${keys[@]}" \
    >>"$tmp/nbdkit.log" 2>&1 &
  NBDKIT_PID=$!
  track "$NBDKIT_PID"
  for ((i = 0; i < 200 * TSCALE; i++)); do
    [ -s "$tmp/nbdkit.pid" ] && return 0
    kill -0 "$NBDKIT_PID" 2>/dev/null ||
      fail "nbdkit exited at start: $(tail -n 5 "$tmp/nbdkit.log")"
    sleep 0.1
  done
  fail "nbdkit did not start"
}

# stop_nbdkit: SIGTERM (the filter writes back as it is unloaded), wait.
# Returns nbdkit's exit status.
stop_nbdkit () {
  local rc=0
  kill -TERM "$NBDKIT_PID" 2>/dev/null || true
  wait_gone "$NBDKIT_PID" 600 || fail "nbdkit still running after SIGTERM"
  wait "$NBDKIT_PID" || rc=$?
  check_sanitizer_log "$tmp/nbdkit.log"
  return $rc
}

runs=0 cuts=0
touch "$tmp/all-faults"
for ((seed = base; seed < base + seeds; seed++)); do
  rm -f "$tmp/faults" "$tmp/nbdkit.log"
  "${tool[@]}" init --img "$img" --blocks $blocks
  RANDOM=$seed
  pa=$(( RANDOM % 4 ? 20 + RANDOM % 300 : 0 ))   # 0: no power cut
  echo "--- seed $seed, power cut at call ${pa/#0/never}"
  start_nbdkit FAULT_FILE="$img" FAULT_SEED="$seed" FAULT_SYNC_FAIL=150 \
    FAULT_WRITE_ERR=10 FAULT_POWER_AT="$pa" FAULT_LOG="$tmp/faults" \
    LD_PRELOAD="$preload"
  timeout $((60 * TSCALE)) "${tool[@]}" run --uri "$uri" \
    --model "$tmp/model" --blocks $blocks --seed "$seed" --ops 300 ||
    fail "seed $seed: the client failed during the run"
  rc=0
  stop_nbdkit || rc=$?
  touch "$tmp/faults"
  cat "$tmp/faults" >> "$tmp/all-faults"
  grep -q power-cut "$tmp/faults" && cuts=$((cuts + 1))
  echo "  faults: $(awk '{ n[$3]++ } END { for (k in n) printf "%s %d, ", k, n[k] }' \
                   "$tmp/faults")nbdkit exited $rc"
  # The restart: no fault layer.
  start_nbdkit
  "${tool[@]}" check --uri "$uri" --model "$tmp/model" --blocks $blocks \
    --save "$tmp/read" ||
    fail "seed $seed: acknowledged data lost or wrong after the restart (FAULT_FILTER_SEED=$seed FAULT_FILTER_SEEDS=1)"
  stop_nbdkit || fail "seed $seed: nbdkit without faults exited $?"
  "${tool[@]}" same --model "$tmp/model" --img "$img" --save "$tmp/read" ||
    fail "seed $seed: the image after the clean stop"
  runs=$((runs + 1))
done
echo "ok: $runs runs, $cuts with a power cut; faults injected: $(awk '{ n[$3]++ } END {
  for (k in n) printf "%s %d, ", k, n[k] }' "$tmp/all-faults")"
