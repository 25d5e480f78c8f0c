#!/bin/bash
# The fault model over the REAL foliod's nbd backing (issue 33): the
# remote is a real nbdkit (file plugin) whose system calls on its image go
# through tests/faultfs/fault-preload.c, so the remote fails writes
# (EIO, ENOSPC), fails an fdatasync and drops every write it had not
# synced (its next flush succeeds, as Linux reports the error once: item
# 1), and dies in a power cut at a random call, each unsynced sector of
# its image new or old at random, with foliod's requests in flight (a
# connection ended by the remote's death: item 2's writes in doubt, and
# the writes it had acknowledged and not flushed).  A loop restarts it on
# the same socket and image, with the layer again (up to CUTS power cuts
# a run), and foliod reconnects.
# foliod reaches the remote through a "network", tests/tools/reset-proxy.py,
# that now and then ends foliod's connection and delivers what it held of
# it later, to the live remote (item 2: writes in doubt that land late,
# over newer ones), unless the operator has quieted it.
# The client (tests/tools/fault-real.py, one connection) writes versioned
# 4 KiB blocks, zeroes, FUA writes and FLUSHes, models what each FLUSH
# and FUA that succeeded acknowledged, and plays the operator foliod(8)
# describes: when a FLUSH fails with writes in doubt or a passthrough
# write lost, it quiets the network, waits until no connection it ended
# is left at the remote (the remote that had them is dead, or finished
# them), and says clear-doubt
# (a lost zero is then known lost: its block is excused until a newer
# version of it is acknowledged).  The run ends with FLUSHes until one
# succeeds.  Then the remote is stopped, started without faults, and
# foliod stopped (SIGTERM; a pmem store, on odd seeds, is killed -9
# instead); foliod starts again on the same store and remote, and every
# block must read back as its acknowledged version or a newer one, per
# 512-byte sector, never data no client wrote; after a clean stop the
# image holds what foliod served.
# store=ram and store=pmem (flush=store), FAULT_NBD_SEEDS seeds each (2;
# make check-crash: ROUNDS/10) from FAULT_NBD_SEED (0);
# FAULT_NBD_STORES="ram pmem" picks the stores; FAULT_NBD_NET_CUTS=N the
# network's cuts per mille of foliod's writes (20; 0: none);
# FAULT_NBD_KEEP=DIR keeps a failed run's files (logs, faults, model) in DIR.
. "$(dirname "$0")/lib.sh"
lib_init fault-nbd-real
. "$(dirname "$0")/lib-remote.sh"
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"
shim=$BUILD/tests/faultfs/fault-preload.so
[ -f "$shim" ] || fail "not built: $shim"

seeds=${FAULT_NBD_SEEDS:-2}
base=${FAULT_NBD_SEED:-0}
cuts=${CUTS:-3}
blocks=1024                    # 4 MiB export, 1 MiB cache: writeback runs
img=$tmp/img
sock=$tmp/remote.sock
net=$tmp/net                   # the network's state (reset-proxy.py)
netsock=$tmp/net.sock
tool=(/usr/bin/python3 "$TOP/tests/tools/fault-real.py")
keys=cache-size=1M,folio-size=16K,dirty-expire=200,writeback-interval=100
echo "seeds $base..$((base + seeds - 1)) (FAULT_NBD_SEED=N FAULT_NBD_SEEDS=1 replays one)"

# remote_loop SEED CALLS: nbdkit on $img under the fault layer, started
# again each time it dies, until $tmp/remote-stop exists; the first $cuts
# incarnations each get a power cut at a random call, from 20 to CALLS
# (a pmem store with flush=store makes fewer remote calls).  Each start's pid
# goes to $tmp/remote-cur, each exit to $tmp/remote-exits.
remote_loop () {
  local seed=$1 calls=$2 n=0 pa pid rc
  while [ ! -e "$tmp/remote-stop" ]; do
    n=$((n + 1))
    RANDOM=$((seed * 64 + n))
    pa=0
    [ "$n" -le "$cuts" ] && pa=$((20 + RANDOM % (calls - 20)))
    rm -f "$sock"
    FAULT_FILE=$img FAULT_SEED=$((seed * 64 + n)) FAULT_SYNC_FAIL=150 \
      FAULT_WRITE_ERR=10 FAULT_POWER_AT=$pa FAULT_LOG=$tmp/faults \
      FAULT_LOG_ALL=${FAULT_NBD_TRACE:-0} \
      LD_PRELOAD=$shim \
      nbdkit -f --exit-with-parent -U "$sock" file "$img" \
      >>"$tmp/remote.log" 2>&1 &
    pid=$!
    echo "$pid" > "$tmp/remote-cur"
    rc=0
    wait "$pid" 2>/dev/null || rc=$?   # (no "Killed" line per power cut)
    echo "$n $rc" >> "$tmp/remote-exits"
    sleep 0.$((RANDOM % 5))       # a remote away for a moment
  done
}

# until_socket PATH: until the socket exists (its server listens first).
until_socket () {
  local i
  for ((i = 0; i < 100 * TSCALE; i++)); do
    [ -S "$1" ] && return 0
    sleep 0.1
  done
  fail "no socket at $1 after 10 s"
}

runs=0 lossruns=0 kills=0 clears=0
touch "$tmp/all-faults" "$tmp/all-cuts"
one () {
  local store=$1 seed=$2 spec calls loop rc=0 i pid
  case $store in
  ram)  spec= calls=420 ;;
  pmem) spec=",store=pmem:$tmp/store" calls=150 ;;
  esac
  rm -f "$tmp/store" "$tmp/faults" "$tmp/foliod.log" "$tmp/remote-stop" \
    "$tmp/remote-exits" "$tmp/remote-cur" "$tmp/ctl.sock"
  "${tool[@]}" init --img "$img" --blocks $blocks
  echo "--- store=$store seed $seed${spec:+ ($spec)}"
  remote_loop "$seed" "$calls" &
  loop=$!
  track "$loop"
  until_socket "$sock"
  rm -rf "$net" "$netsock" && mkdir "$net"
  /usr/bin/python3 "$TOP/tests/tools/reset-proxy.py" --listen "$netsock" \
    --remote "$sock" --state "$net" --seed "$seed" \
    --cut-permille "${FAULT_NBD_NET_CUTS:-20}" 2>>"$tmp/net.log" &
  netpid=$!
  track "$netpid"
  until_socket "$netsock"
  start_foliod --control "$tmp/ctl.sock" \
    --export "disk0=$(remote_uri "$netsock"),$keys,request-timeout=30000,retry-timeout=30000$spec"
  timeout $((180 * TSCALE)) "${tool[@]}" run --uri "$(uri disk0)" \
    --model "$tmp/model" --blocks $blocks --seed "$seed" --ops 300 \
    --operator "$FOLIOD,$tmp/ctl.sock,disk0,network=$net" --final-flushes 10 ||
    fail "store=$store seed $seed: the client failed during the run"
  # The network quiet (it keeps carrying foliod's connections) once what
  # it held has landed or met a dead remote: late writes land after the
  # run, as they would.  Then the remote without faults: the loop stops,
  # its nbdkit killed (no power cut: the file keeps what it wrote; SIGTERM
  # would wait for foliod's connections to end).
  touch "$net/calm"
  for ((i = 0; i < 600 * TSCALE; i++)); do
    [ "$(cat "$net/pending")" = 0 ] && break
    sleep 0.1
  done
  [ "$(cat "$net/pending")" = 0 ] || {
    [ -z "${FAULT_NBD_KEEP:-}" ] || cp -r "$tmp" "$FAULT_NBD_KEEP"
    fail "store=$store seed $seed: the network still holds writes after 60 s (connections $(awk '$1 == "orphan" { o[$2] = 1 } $1 == "done" { delete o[$2] } END { for (k in o) printf "%s ", k }' "$net/log")open at the remote)"
  }
  touch "$tmp/remote-stop"
  pid=$(cat "$tmp/remote-cur")
  if grep -qa nbdkit "/proc/$pid/cmdline" 2>/dev/null; then
    kill -KILL "$pid" 2>/dev/null || true
  fi
  wait "$loop" || true
  start_remote "$sock" file "$img"
  if [ "$store" = pmem ] && [ $((seed % 2)) = 1 ]; then
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
  echo "  remote: $(wc -l < "$tmp/remote-exits") incarnations; faults: $(awk '{ n[$3]++ } END { for (k in n) printf "%s %d, ", k, n[k] }' "$tmp/faults")"
  touch "$net/log"
  grep '^cut ' "$net/log" >> "$tmp/all-cuts" || true
  echo "  network: $(awk '/^cut / { n++; w += $6; s += $10 } END {
    printf "%d connections cut, %d writes they held sent %.1f s late on average",
      n, w, s / (n ? n : 1) / 1000 }' "$net/log")"
  echo "  foliod exited $rc; $(grep -c 'reconnected' "$tmp/foliod.log" || true) reconnects"
  grep -q 'DIRTY DATA LOST' "$tmp/foliod.log" && lossruns=$((lossruns + 1))
  clears=$((clears + $(grep -c 'clear-doubt' "$tmp/foliod.log" || true)))
  cp "$tmp/foliod.log" "$tmp/foliod-faulted.log"
  # The restart: the same store and remote, no faults.
  rm -f "$tmp/ctl.sock"
  start_foliod --control "$tmp/ctl.sock" \
    --export "disk0=$(remote_uri "$netsock"),$keys$spec"
  if [ "$(foliod_stat "$tmp/ctl.sock" foliod_backing_writes_in_doubt)" != 0 ] ||
     [ "$(foliod_stat "$tmp/ctl.sock" foliod_passthrough_lost_writes)" != 0 ]; then
    [ "$store" != ram ] || fail "store=$store seed $seed: a ram store's restart inherited a doubt or a loss"
    "$FOLIOD" clear-doubt disk0 --control "$tmp/ctl.sock" > /dev/null ||
      fail "foliod clear-doubt"
  fi
  "${tool[@]}" check --uri "$(uri disk0)" --model "$tmp/model" \
    --blocks $blocks --save "$tmp/read" || {
    [ -z "${FAULT_NBD_KEEP:-}" ] || cp -r "$tmp" "$FAULT_NBD_KEEP"
    fail "store=$store seed $seed: acknowledged data lost or wrong after the restart (FAULT_NBD_SEED=$seed FAULT_NBD_SEEDS=1 FAULT_NBD_STORES=$store)"
  }
  stop_foliod
  stop_remote
  kill "$netpid" 2>/dev/null || true
  wait "$netpid" 2>/dev/null || true
  "${tool[@]}" same --model "$tmp/model" --img "$img" --save "$tmp/read" ||
    fail "store=$store seed $seed: the image after the clean stop"
  runs=$((runs + 1))
}

for ((i = 0; i < seeds; i++)); do
  for store in ${FAULT_NBD_STORES:-ram pmem}; do
    one "$store" $((base + i))
  done
done
echo "ok: $runs runs; faults injected: $(awk '{ n[$3]++ } END {
  for (k in n) printf "%s %d, ", k, n[k] }' "$tmp/all-faults")$(awk '{ w += $6 } END { printf "%d connections cut by the network holding %d writes sent late", NR, w }' "$tmp/all-cuts"), $kills foliod kill -9, $lossruns saying DIRTY DATA LOST, $clears clear-doubt log lines"
