#!/bin/bash
# rbd split-brain (issue 33 item 5).  foliod A serves rbd/img with a
# persistent store (flush=store: FLUSH is answered by the store) and holds
# 1 MiB FLUSHed into the store, not yet written back.  A stalls (SIGSTOP,
# as a host that loses the cluster network); the operator (or librbd on
# the next client's behalf) breaks A's lock, which blocklists A; foliod B
# opens the image, writes B-data and FLUSHes; B stops.  A resumes:
#  - it must no longer acknowledge: a write and a FLUSH through A fail,
#    reads too, and `foliod stats` says why; the log says so;
#  - killed and restarted on the same store (a new process, not
#    blocklisted), it must not write A's old data over B's: its FLUSH
#    fails, it writes nothing back, and after it stops the image still
#    holds B's data;
#  - then the operator decides.  pmem round: the store is thrown away
#    (rm), and a foliod on the image reads B's data.  ssd round:
#    `foliod clear-doubt` says A's data wins: FLUSH succeeds and the image
#    holds A's data.
# (Before: A answered the FLUSH from its store after the resume, and the
# restart wrote A's data over B's.)
. "$(dirname "$0")/lib.sh"
lib_init rbd-fence
. "$(dirname "$0")/lib-ceph.sh"
requires nbdsh

ceph_up 16M
keep_dirty="cache-size=4M,dirty-expire=3600000,dirty-background=100,dirty-limit=100,request-timeout=10000"

# image_holds BYTE WHAT: the image's first MiB is all BYTE.
image_holds () {
  rm -f "$tmp/image"
  rbd_cmd export --no-progress rbd/img "$tmp/image" || fail "rbd export"
  [ "$(head -c 1048576 "$tmp/image" | tr -d "$1" | wc -c)" = 0 ] || fail "$2"
}

# round KIND: the story with store=KIND, up to A's restart on its store.
round () {
  echo "--- store=$1"
  rm -f "$tmp/storeA"
  argsA=(--pidfile "$tmp/pidA" --control "$tmp/ctlA"
    --export "disk0=$(rbd_backing),store=$1:$tmp/storeA,$keep_dirty")
  SOCK_PATH=$tmp/sockA start_foliod "${argsA[@]}"
  A_PID=$FOLIOD_PID
  nbdsh -u "$(uri disk0 "$tmp/sockA")" \
    -c 'h.pwrite(b"A" * 1048576, 0)' -c 'h.flush()' || fail "write through A"
  [ "$(foliod_stat "$tmp/ctlA" foliod_dirty_bytes)" = 1048576 ] ||
    fail "A's write is not dirty in its store"

  # A stalls; its lock is broken (A is blocklisted); B writes and stops.
  kill -STOP "$A_PID"
  stopped=$SECONDS
  "$CLUSTER" break-locks "$CEPH_DIR" || fail "rbd lock rm"
  FOLIOD_PID=
  SOCK_PATH=$tmp/sockB start_foliod --export "disk0=$(rbd_backing),cache-size=4M"
  nbdsh -u "$(uri disk0 "$tmp/sockB")" \
    -c 'h.pwrite(b"B" * 1048576, 0)' -c 'h.flush()' || fail "write through B"
  stop_foliod
  image_holds B "B's data is not on the image"

  # A resumes: nothing it acknowledges now can reach the image.  librbd
  # breaks a live client's lock only once its watch expired (30 s): the
  # stall outlasts A's 5 s lease on ownership (RBD_FENCE_LEASE_MS), which
  # rbd lock rm by hand at once does not (it took 1.3 s on an idle host,
  # and A answered a FLUSH from its store within its lease).
  while (( SECONDS - stopped < 7 )); do sleep 0.5; done
  kill -CONT "$A_PID"
  FOLIOD_PID=$A_PID
  if nbdsh -u "$(uri disk0 "$tmp/sockA")" \
       -c 'h.pwrite(b"C" * 4096, 0)' -c 'h.flush()' 2>"$tmp/a-flush.err"; then
    fail "A acknowledged a write and a FLUSH after its lock was broken"
  fi
  cat "$tmp/a-flush.err"
  nbdsh -u "$(uri disk0 "$tmp/sockA")" -c 'h.flush()' 2>/dev/null &&
    fail "A acknowledged a FLUSH after its lock was broken"
  nbdsh -u "$(uri disk0 "$tmp/sockA")" -c 'h.pread(4096, 0)' >/dev/null 2>&1 &&
    fail "A served a read of its stale cache after its lock was broken"
  [ "$(foliod_stat "$tmp/ctlA" foliod_fenced)" = 1 ] || fail "A's stats: not fenced"
  "$FOLIOD" stats --control "$tmp/ctlA" > "$tmp/table" || fail "foliod stats"
  grep "disk0: fenced: " "$tmp/table" || { cat "$tmp/table"; fail "foliod stats does not say why"; }
  grep -q "no longer owns the image" "$FOLIOD_LOG" || fail "A logged no lost lock"
  kill9_foliod "$tmp/pidA"

  # A restarts on its store: it must not write A's data over B's.
  : > "$FOLIOD_LOG"
  SOCK_PATH=$tmp/sockA start_foliod "${argsA[@]}"
  grep -q "store .* was written under an image lock that was lost" "$FOLIOD_LOG" ||
    fail "the restart did not log the fenced store"
  "$FOLIOD" flush disk0 --control "$tmp/ctlA" &&
    fail "the restart reported its fenced store durable on the image"
  [ "$(foliod_stat "$tmp/ctlA" foliod_fenced)" = 1 ] || fail "the restart forgot the fence"
}

# stop_fenced: SIGTERM the fenced foliod (its stop cannot write back).
stop_fenced () {
  kill -TERM "$FOLIOD_PID"
  wait_gone "$FOLIOD_PID" 600 || fail "foliod still running after SIGTERM"
  wait "$FOLIOD_PID" || true
  FOLIOD_PID=
}

round pmem
stop_fenced
image_holds B "the restarted A wrote its old data over B's"
# The operator throws A's store away: a new one, B's data is served.
rm -f "$tmp/storeA"
SOCK_PATH=$tmp/sockA start_foliod "${argsA[@]}"
nbdsh -u "$(uri disk0 "$tmp/sockA")" \
  -c 'assert h.pread(4096, 0) == b"B" * 4096' || fail "B's data is not read"
stop_foliod

round ssd
stop_fenced
image_holds B "the restarted A wrote its old data over B's"
"$FOLIOD" store inspect "$tmp/storeA" > "$tmp/inspect" ||
  { cat "$tmp/inspect"; fail "foliod store inspect"; }
grep "^fenced: " "$tmp/inspect" || { cat "$tmp/inspect"; fail "store inspect does not show the fence"; }
# The operator's word: A's data wins.
SOCK_PATH=$tmp/sockA start_foliod "${argsA[@]}"
"$FOLIOD" clear-doubt disk0 --control "$tmp/ctlA" || fail "foliod clear-doubt"
"$FOLIOD" flush disk0 --control "$tmp/ctlA" || fail "foliod flush after the clear"
[ "$(foliod_stat "$tmp/ctlA" foliod_fenced)" = 0 ] || fail "still fenced after the clear"
nbdsh -u "$(uri disk0 "$tmp/sockA")" \
  -c 'assert h.pread(4096, 0) == b"A" * 4096' || fail "A's data is not read after the clear"
stop_foliod
image_holds A "the clear did not write A's data back"
echo "--- what the log said (the last run)"
grep -E " (warn|error): " "$FOLIOD_LOG" | cut -c1-300
echo OK
