#!/bin/bash
# Issue 33 (the ledger: "which passthrough writes cannot be restored",
# persisted): a passthrough loss outlives the process.  foliod with a
# pmem store, then with an ssd store, in front of a remote whose flush
# fails once and drops what it had not flushed (as Linux does when
# fdatasync fails: test-remote-flush-fails.sh).  B is written past the
# cache (direct-threshold) over a FLUSHed A; the remote's flush of B
# fails and drops B: the cache has no copy, B is lost, and every FLUSH
# fails.  kill -9, restart on the same store: FLUSH must still fail
# (stats and the log say why), and after a stop and another start too.
# Then the operator's word (foliod clear-doubt; with the ssd store
# clear-doubt --lost-only, the word for a loss alone) ends it: FLUSH
# succeeds, and a restart finds it gone.  (Before: the restart forgot the loss and
# its first FLUSH succeeded, the remote holding A where the client had
# written B.)  Last, the ram cache across foliod upgrade: the same.
. "$(dirname "$0")/lib.sh"
lib_init passthrough-lost-restart
. "$(dirname "$0")/lib-remote.sh"
requires nbdsh

ctl=$tmp/ctl.sock
pidf=$tmp/pid
cur=$tmp/cur.img
durable=$tmp/durable.img
flush_fails_plugin "$tmp/plugin.sh" "$cur" "$durable"

lost_count () {
  foliod_stat "$ctl" foliod_passthrough_lost_writes
}

keys=cache-size=4M,direct-threshold=64K,dirty-expire=3600000,writeback-interval=3600000

# lose_b [STORE_OPTS]: a fresh remote and a foliod on it (its arguments
# in args); A written past the cache and FLUSHed (on the remote's durable
# copy), then B over it, past the cache, whose flush on the remote fails
# and drops it.
lose_b () {
  rm -f "$tmp/fail-flush" "$cur" "$durable"
  truncate -s 4M "$cur"
  cp "$cur" "$durable"
  start_remote "$tmp/remote.sock" sh "$tmp/plugin.sh"
  args=(--control "$ctl" --pidfile "$pidf"
    --export "disk0=$(remote_uri),$keys${1:-}")
  start_foliod "${args[@]}"
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c 'h.pwrite(b"A" * 262144, 0)' -c 'h.flush()' || fail "write and FLUSH A"
  touch "$tmp/fail-flush"
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c 'h.pwrite(b"B" * 262144, 0)' || fail "write B"
  flush_must_fail "$(uri disk0)" "the FLUSH of B succeeded though the remote dropped B"
  [ ! -e "$tmp/fail-flush" ] || fail "the remote was never asked to flush"
  [ "$(lost_count)" -gt 0 ] || fail "B is not counted lost"
}

# round STORE [CLEAR-OPTION]: the ssd store's round clears with
# --lost-only, the word for the loss alone.
round () {
  echo "--- store=$1${2:+, clear-doubt $2}"
  rm -f "$tmp/store"
  lose_b ",store=$1:$tmp/store"
  flush_must_fail "$(uri disk0)" "a FLUSH after the loss succeeded"

  kill9_foliod "$pidf"
  "$FOLIOD" store inspect "$tmp/store" > "$tmp/inspect" ||
    fail "foliod store inspect"
  grep -q "passthrough writes lost: every FLUSH fails until 'foliod clear-doubt'" \
    "$tmp/inspect" || { cat "$tmp/inspect"; fail "store inspect does not say so"; }
  start_foliod "${args[@]}"
  flush_must_fail "$(uri disk0)" "the restart forgot the passthrough loss: FLUSH succeeded with the remote holding A where the client wrote B"
  [ "$(lost_count)" -gt 0 ] ||
    fail "the restart's foliod_passthrough_lost_writes is 0"
  "$FOLIOD" stats --control "$ctl" > "$tmp/table" || fail "foliod stats"
  grep -q "disk0: .* lost: FLUSH fails until 'foliod clear-doubt disk0'" \
    "$tmp/table" || { cat "$tmp/table"; fail "foliod stats does not say why"; }
  grep -q "a previous run lost writes that bypassed the cache.*'foliod clear-doubt disk0'" \
    "$FOLIOD_LOG" || fail "the restart did not log the inherited loss"

  # A stop (it cannot report everything written back: exit 1) does not
  # erase it either.
  kill -TERM "$FOLIOD_PID"
  wait_gone "$FOLIOD_PID" 600 || fail "foliod still running after SIGTERM"
  rc=0; wait "$FOLIOD_PID" || rc=$?
  FOLIOD_PID=
  [ "$rc" = 1 ] || fail "the stop with a passthrough loss exited $rc, not 1"
  # It says what was lost, and that nothing dirty was.
  grep -q "disk0: 1 passthrough write was lost .*the store keeps the loss" \
    "$FOLIOD_LOG" || fail "the stop does not say the passthrough write was lost"
  grep -q "DIRTY DATA LOST\|up to 0 bytes" "$FOLIOD_LOG" &&
    fail "the stop's lines speak of dirty data lost or kept: there was none"
  start_foliod "${args[@]}"
  flush_must_fail "$(uri disk0)" "a stop erased the passthrough loss"
  flush_must_fail "$(uri disk0)" "the second FLUSH after the restart succeeded"
  [ "$(lost_count)" -gt 0 ] || fail "a stop erased the passthrough loss (stats)"

  # The operator's word.
  "$FOLIOD" clear-doubt disk0 --control "$ctl" ${2:+"$2"} ||
    fail "foliod clear-doubt ${2:-}"
  grep -q "clear-doubt disk0: .*bypassed the cache" "$FOLIOD_LOG" ||
    fail "clear-doubt did not log the loss it ended"
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c 'h.flush()' ||
    fail "FLUSH after clear-doubt"
  [ "$(lost_count)" = 0 ] || fail "foliod_passthrough_lost_writes after the clear"
  # The log said why FLUSH failed, once per process, and that it ended.
  grep -q "export disk0: FLUSH failed (Input/output error): 1 passthrough write lost: every FLUSH fails until 'foliod clear-doubt disk0'" \
    "$FOLIOD_LOG" || fail "the log does not say why FLUSH failed"
  grep -q "export disk0: FLUSH succeeds again" "$FOLIOD_LOG" ||
    fail "the log does not say FLUSH succeeds again"
  pid=$(cat "$pidf")
  [ "$(grep -c "foliod\[$pid\] warn: export disk0: FLUSH failed" "$FOLIOD_LOG")" = 1 ] ||
    fail "one process said 'FLUSH failed' more than once"
  stop_foliod
  grep -q "DIRTY DATA LOST" "$FOLIOD_LOG" && fail "the stop reported lost data"

  # The clear is durable too.
  start_foliod "${args[@]}"
  [ "$(lost_count)" = 0 ] || fail "the clear did not reach the store"
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c 'h.flush()' ||
    fail "FLUSH after a restart that followed the clear"
  stop_foliod
  stop_remote
  rm -f "$FOLIOD_LOG"
}

# The ram cache keeps nothing across a restart, but an upgrade in place
# hands it over whole: the loss goes with it.  (Before: the new process
# answered FLUSH with success.)
upgrade_round () {
  local old new out
  echo "--- ram cache, foliod upgrade"
  lose_b
  old=$(cat "$pidf")
  out=$(timeout $((60 * TSCALE)) "$FOLIOD" upgrade --control "$ctl" 2>&1) ||
    fail "foliod upgrade: $out"
  echo "  $out"
  case $out in *"ram cache kept"*) ;; *) fail "the upgrade did not hand the ram cache over";; esac
  new=$(cat "$pidf")
  [ "$new" != "$old" ] || fail "upgrade: still pid $old"
  track "$new"
  wait_gone "$old" 100 || fail "the old foliod $old still runs"
  flush_must_fail "$(uri disk0)" "the upgrade forgot the passthrough loss: FLUSH succeeded with the remote holding A where the client wrote B"
  [ "$(lost_count)" -gt 0 ] ||
    fail "after the upgrade foliod_passthrough_lost_writes is 0"
  grep -q "foliod\[$new\] error: export disk0: the ram cache handed over: a previous run lost writes that bypassed the cache.*'foliod clear-doubt disk0'" \
    "$FOLIOD_LOG" || fail "the new process did not log the loss it took over"
  "$FOLIOD" clear-doubt disk0 --control "$ctl" || fail "foliod clear-doubt"
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c 'h.flush()' ||
    fail "FLUSH after clear-doubt"
  kill -TERM "$new"
  wait_gone "$new" 600 || fail "foliod still running after SIGTERM"
  FOLIOD_PID=
  check_sanitizer_log "$FOLIOD_LOG"
  grep -q "DIRTY DATA LOST" "$FOLIOD_LOG" && fail "the stop reported lost data"
  stop_remote
}

round pmem
round ssd --lost-only
upgrade_round
echo OK
