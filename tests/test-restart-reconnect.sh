#!/bin/bash
# Restart under a reconnecting client (issue 35 item 2): foliod with a pmem
# store (page-granular on /tmp: every write durable against kill -9 from
# its reply on) is killed with SIGKILL twice and started again while
# qemu-io writes a pattern through qemu's NBD client with reconnect-delay.
#  - the client sees no I/O error: every write and flush succeeds, qemu-io
#    exits 0;
#  - no acknowledged write is lost: afterwards every 256 KiB chunk reads
#    back with its pattern through foliod, and the file holds them all
#    after SIGTERM;
#  - it prints the restart (kill to the new foliod's "ready" line) and the
#    stall the client saw (its slowest write).
# RESTART_STORE=ssd (or ram) runs the same with another store: see what
# foliod(8) says of them (acknowledged but unflushed writes are lost).
# RESTART_SIGNAL=TERM stops foliod cleanly instead (systemctl restart):
# then the ram store loses nothing either.
. "$(dirname "$0")/lib.sh"
lib_init restart-reconnect
requires qemu-io nbdinfo stdbuf

img=$tmp/disk.img
truncate -s 64M "$img"
case ${RESTART_STORE:-pmem} in
  pmem) store=pmem:$tmp/disk0.pmem ;;
  ssd) store=ssd:$tmp/disk0.log ;;
  *) store=ram ;;
esac
spec="disk0=file:$img,store=$store,cache-size=32M"
run_foliod () {
  start_foliod --pidfile "$tmp/pid" --control "$tmp/ctl" --export "$spec"
}
run_foliod

# Debian 12's qemu 7.2 has reconnect-delay on the nbd driver.
nbd_opts="driver=nbd,server.type=unix,server.path=$SOCK,export=disk0"
qemu-io --image-opts "$nbd_opts,reconnect-delay=30" -c "read 0 4096" \
  >"$tmp/probe" 2>&1 || fail "qemu-io has no reconnect-delay: $(cat "$tmp/probe")"

# 120 writes of 256 KiB (30 MiB), chunk i filled with byte i % 250 + 1,
# 20 ms apart (so that the kills below land in the stream), a FLUSH after
# every 16th.
chunks=120
cmds=()
for ((i = 0; i < chunks; i++)); do
  cmds+=(-c "write -P $(( i % 250 + 1 )) $(( i * 262144 )) 256k" -c "sleep 20")
  (( i % 16 == 15 )) && cmds+=(-c flush)
done
written () {
  grep -c '^[0-9]* wrote' "$tmp/qio.out" || true
}
# Each line of its output stamped with the time it came (ns): the longest
# gap between two answered writes is the stall the client saw (a FLUSH
# prints nothing, so qemu-io's own per-write times miss a stall in one).
{ stdbuf -oL qemu-io -t writeback --image-opts "$nbd_opts,reconnect-delay=30" "${cmds[@]}" 2>&1
  echo "qemu-io exit $?"; } |
  python3 -c '
import sys, time
for line in iter(sys.stdin.readline, ""):
    sys.stdout.write("%d %s" % (time.time_ns(), line))
    sys.stdout.flush()' >"$tmp/qio.out" &
qpid=$!
track "$qpid"

base=0
for round in 1 2; do
  # Kill in the middle of the stream: 20 writes after the last restart
  # was answered.
  for ((i = 0; i < 600 * TSCALE; i++)); do
    [ "$(written)" -ge $(( base + 20 )) ] && break
    kill -0 "$qpid" 2>/dev/null || fail "qemu-io ended early: $(tail "$tmp/qio.out")"
    sleep 0.1
  done
  at_kill=$(written)
  [ "$at_kill" -lt "$chunks" ] || fail "round $round: the writes were over before the kill"
  t0=$(date +%s%N)
  if [ "${RESTART_SIGNAL:-KILL}" = KILL ]; then
    kill9_foliod "$tmp/pid"
  else                       # a clean stop: writes back, then exits
    kill -TERM "$(cat "$tmp/pid")"
    wait "$FOLIOD_PID" || fail "foliod exited $? at SIGTERM"
    FOLIOD_PID=
  fi
  mv "$FOLIOD_LOG" "$tmp/foliod-$round.log"
  run_foliod
  ready=$(grep -m1 'info: ready:' "$FOLIOD_LOG" | cut -d' ' -f1)
  t1=$(date -d "$ready" +%s%N)
  echo "round $round: SIG${RESTART_SIGNAL:-KILL} after $at_kill writes;" \
    "restart (signal to ready) $(( (t1 - t0) / 1000000 )) ms"
  grep -E "recover|dirty" "$FOLIOD_LOG" | head -3 || true
  # The client is back: its next write is answered.
  for ((i = 0; i < 600 * TSCALE; i++)); do
    [ "$(written)" -gt "$at_kill" ] && break
    kill -0 "$qpid" 2>/dev/null || fail "qemu-io ended: $(tail "$tmp/qio.out")"
    sleep 0.1
  done
  base=$(written)
done

wait "$qpid"
grep -q " qemu-io exit 0$" "$tmp/qio.out" ||
  fail "qemu-io failed: $(grep -iE 'error|fail|exit' "$tmp/qio.out" | head)"
if grep -iE "error|fail" "$tmp/qio.out"; then
  fail "the client saw an I/O error"
fi
[ "$(written)" -eq "$chunks" ] || fail "not every write was answered: $(written)"
python3 - "$tmp/qio.out" <<'EOF'
import sys
t = [int(l.split()[0]) for l in open(sys.argv[1]) if l.split()[1:2] == ["wrote"]]
gaps = sorted(b - a for a, b in zip(t, t[1:]))
print("client stall (longest gaps between two answered writes): %s ms"
      % ", ".join("%d" % (g // 1000000) for g in gaps[-2:][::-1]))
EOF

# Every chunk reads back with its pattern through the restarted foliod.
cmds=()
for ((i = 0; i < chunks; i++)); do
  cmds+=(-c "read -P $(( i % 250 + 1 )) $(( i * 262144 )) 256k")
done
qemu-io --image-opts "$nbd_opts" "${cmds[@]}" >"$tmp/verify.out" 2>&1 || true
lost=$(grep -c "Pattern verification failed" "$tmp/verify.out" || true)
[ "$lost" -eq 0 ] || fail "acknowledged writes lost: $lost of $chunks chunks read back wrong"
[ "$(grep -c '^read ' "$tmp/verify.out")" -eq "$chunks" ] ||
  fail "verify: $(grep -iE 'error|fail' "$tmp/verify.out" | head -3)"
stop_foliod
python3 - "$img" "$chunks" <<'EOF' || fail "the backing file lacks acknowledged writes"
import sys
d = open(sys.argv[1], "rb").read()
bad = [i for i in range(int(sys.argv[2]))
       if d[i * 262144:(i + 1) * 262144] != bytes([i % 250 + 1]) * 262144]
if bad:
    sys.exit("chunks differ: %r" % bad[:8])
EOF
echo "restart-reconnect: $chunks writes, 2 SIG${RESTART_SIGNAL:-KILL}, no error, nothing lost"
