#!/bin/bash
# Issue 33 item 3: doubt outlives the process.  foliod with a pmem store,
# then with an ssd store, in front of a remote (a file behind an nbdkit sh script whose FIRST
# write is held until the test lets it land).  A is written back, held
# past request-timeout and abandoned: in doubt.  The client writes B over
# it (FLUSH: in the store).  kill -9, restart on the same store: the
# restarted foliod must still count the write in doubt (stats, log) and
# refuse the backing's flush, so that nothing reports B durable on the
# remote while A can land over it.  A lands; the operator clears the
# doubt; B is written again; after a clean stop the remote holds B.
# (Before: the restart forgot the doubt, wrote B back and flushed it at
# once, and A then landed over it.)
. "$(dirname "$0")/lib.sh"
lib_init remote-doubt-restart
. "$(dirname "$0")/lib-remote.sh"
requires nbdsh

ctl=$tmp/ctl.sock
pidf=$tmp/pid
img=$tmp/remote.img
sh_remote_script "$tmp/plugin.sh" "$img" parallel <<SH
  pwrite)
    if mkdir "$tmp/first-write" 2>/dev/null; then
      while [ ! -e "$tmp/release" ]; do sleep 0.1; done
      echo x > "$tmp/first-write/landed"
    fi
    dd of="$img" seek="\$4" oflag=seek_bytes conv=notrunc status=none ;;
  flush) sync "$img" ;;
SH

# pwrite_flush BYTE: 4 KiB of BYTE at 0, then FLUSH (the store's).
pwrite_flush () {
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c "h.pwrite(b'$1' * 4096, 0)" -c 'h.flush()' || fail "write $1"
}

# round KIND: the whole story with store=KIND.
round () {
  echo "--- store=$1"
  rm -rf "$tmp/first-write" "$tmp/release" "$tmp/store"
  rm -f "$img"
  truncate -s 16M "$img"
  # -t 1: see test-remote-hang.sh (nbdkit 1.32 and a cut connection).
  start_remote "$tmp/remote.sock" -t 1 sh "$tmp/plugin.sh"
  args=(--control "$ctl" --pidfile "$pidf"
    --export "disk0=$(remote_uri),store=$1:$tmp/store,cache-size=8M,request-timeout=4000,dirty-expire=3600000,writeback-interval=3600000")
  start_foliod "${args[@]}"

  pwrite_flush A
  "$FOLIOD" flush disk0 --control "$ctl" &&
    fail "foliod flush succeeded though the remote held A"
  [ -d "$tmp/first-write" ] || fail "A never reached the remote"
  [ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 1 ] ||
    fail "A is not in doubt"
  pwrite_flush B
  kill9_foliod "$pidf"

  start_foliod "${args[@]}"
  [ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 1 ] ||
    fail "the restart forgot the write in doubt"
  "$FOLIOD" stats --control "$ctl" > "$tmp/table" || fail "foliod stats"
  grep -q "disk0: 1 write in doubt: FLUSH fails until 'foliod clear-doubt disk0'" \
    "$tmp/table" || { cat "$tmp/table"; fail "foliod stats does not say why"; }
  grep -q "previous run left writes to the backing in doubt" "$FOLIOD_LOG" ||
    fail "the restart did not log the inherited doubt"
  "$FOLIOD" flush disk0 --control "$ctl" &&
    fail "foliod flush reported B durable on the remote while A could land"
  [ ! -e "$tmp/first-write/landed" ] || fail "A landed too early for the test"

  # A lands over whatever the remote has; then the operator's word.
  touch "$tmp/release"
  wait_for_text "$tmp/first-write/landed" x "A never landed"
  sleep 0.5
  "$FOLIOD" clear-doubt disk0 --control "$ctl" || fail "foliod clear-doubt"
  "$FOLIOD" flush disk0 --control "$ctl" || fail "foliod flush after the clear"
  [ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 0 ] ||
    fail "still in doubt after the clear"
  stop_foliod
  grep -q "DIRTY DATA LOST" "$FOLIOD_LOG" && fail "the stop reported lost data"
  [ "$(head -c 4096 "$img" | tr -d B | wc -c)" = 0 ] ||
    fail "the remote does not hold B: the abandoned write A landed over it"

  # The clear is durable too: a restart finds no doubt.
  start_foliod "${args[@]}"
  [ "$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)" = 0 ] ||
    fail "the clear did not reach the store"
  stop_foliod
  stop_remote
}

round pmem
round ssd
echo OK
