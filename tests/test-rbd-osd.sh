#!/bin/bash
# The rbd backing while the cluster's only OSD is stopped and restarted
# under load (issue 27).  foliod (request-timeout=3000) holds data that
# was written and flushed; then the OSD hangs (SIGSTOP): new writes land
# in the cache and stay dirty, FLUSH fails within the bound (the
# writeback's requests time out; librbd cannot cancel them, so FLUSH
# keeps failing while one is out), a read that misses fails or answers
# within the bound, nothing hangs.  The OSD continues (SIGCONT): FLUSH
# succeeds again and the dirty data is written.  Then the OSD is killed
# (SIGKILL) and started again while a client writes: the same.  At the
# end, after SIGTERM, `rbd export` reads the model: nothing acknowledged
# and flushed was lost, nor anything written while the OSD was away.
# Last, a foliod with nothing dirty exits 0 in time on SIGTERM after the
# whole cluster went away.  A foliod started while the OSD is stopped, and
# one started while the whole cluster is down, each exit with a clear
# error within their request-timeout (1 s: the test waits 20 s) instead of
# hanging in rbd_open or waiting 30 s for the monitors.
. "$(dirname "$0")/lib.sh"
lib_init rbd-osd
. "$(dirname "$0")/lib-ceph.sh"
. "$(dirname "$0")/lib-remote.sh" 2>/dev/null || true
trap _ceph_cleanup EXIT

ceph_up 64M
# Data at 16M..20M that foliod has not read: a miss goes to the OSD.
rbd_import_model 64 16 4
rbd_cmd create --size 8M rbd/img2 || fail "rbd create img2"
start_foliod --control "$tmp/ctl" --export \
  "disk0=$(rbd_backing),cache-size=32M,request-timeout=3000,dirty-expire=200,writeback-interval=100"
U=$(uri disk0)

# put FILE OFFSET [SECONDS]: write FILE at OFFSET through foliod and into
# the model; a write that fails (the dirty limit reached while writeback
# cannot go on) is repeated for up to SECONDS (default: not).
put () {
  local end=$(( SECONDS + ${3:-0} ))
  until timeout 60 nbdsh -u "$U" -c "h.pwrite(open('$1', 'rb').read(), $2)"; do
    [ $SECONDS -lt $end ] || fail "write of $1 at $2"
    sleep 0.5
  done
  dd if="$1" of="$tmp/model" bs=1M seek=$(( $2 >> 20 )) conv=notrunc \
    status=none
}

# start_unreachable WHAT: a second foliod, on rbd/img2 with
# request-timeout=1000, must give up opening it within 20 s (scaled), exit
# non-zero and say why.
start_unreachable () {
  local rc=0 out=$tmp/unreachable.out
  # An open given up on leaves librbd objects allocated at exit (as at
  # the end): LeakSanitizer off for it.
  ASAN_OPTIONS=${ASAN_OPTIONS:-}:detect_leaks=0 \
  timeout -s KILL $(( 20 * TSCALE )) "$FOLIOD" --foreground \
    --unix "$tmp/sock.unreachable" --export \
    "disk1=$(rbd_backing img2),cache-size=4M,request-timeout=1000" \
    >"$out" 2>&1 || rc=$?
  cat "$out"
  [ $rc -ne 0 ] || fail "$1: foliod started"
  [ $rc -ne 137 ] || fail "$1: foliod still opening rbd/img2 after 20 s"
  check_sanitizer_log "$out"
  grep -E -q "rbd:rbd/img2: .*request-timeout" "$out" ||
    fail "$1: no clear error"
}

# flush_until_ok SECONDS: FLUSH until one succeeds.
flush_until_ok () {
  local end=$(( SECONDS + $1 ))
  until timeout 60 nbdsh -u "$U" -c 'h.flush()' 2>/dev/null; do
    if [ $SECONDS -ge $end ]; then
      # Why, for the log (a flake once in ~7 runs, never reproduced by
      # hand): the last FLUSH's error, foliod's counters (writes in
      # doubt: librbd never ended an abandoned request; writeback errors:
      # every write fails, e.g. the image's lock lost) and its log, who
      # holds the lock and watches the image, the cluster's state,
      # librbd's own log, and what foliod's threads wait for.
      timeout 60 nbdsh -u "$U" -c 'h.flush()' 2>&1 | tail -n 2 || true
      "$FOLIOD" stats --control "$tmp/ctl" --prometheus 2>&1 |
        grep -E "doubt|error|dirty|flush|retries|reconnect" | grep -v "^#" || true
      tail -n 40 "$FOLIOD_LOG" || true
      rbd_cmd lock ls rbd/img || true
      rbd_cmd status rbd/img || true
      timeout 60 ceph -c "$CEPH_CONF" -s || true
      timeout 60 ceph -c "$CEPH_CONF" osd blocklist ls || true
      # What foliod waits for: its threads, for the log.
      gdb -p "$(pgrep -P "$FOLIOD_PID" foliod)" -batch \
        -ex "thread apply all bt 10" 2>/dev/null | grep -E "^#|^Thread" | head -300 || true
      tail -n 30 "$CEPH_DIR"/log/client.admin.*.log 2>/dev/null || true
      fail "FLUSH still fails $1 s after the OSD came back"
    fi
    sleep 0.5
  done
}

random_file "$tmp/a" 4
put "$tmp/a" 0
nbdsh -u "$U" -c 'h.flush()' || fail "first flush"

echo "== OSD stopped (SIGSTOP)"
"$CLUSTER" osd-stop "$CEPH_DIR"
stopped=$SECONDS
random_file "$tmp/b" 4
put "$tmp/b" $(( 4 << 20 ))
start=$SECONDS
flush_must_fail "$U" "FLUSH while the OSD is stopped did not fail in time"
echo "flush answered after $(( SECONDS - start )) s"
dirty=$(foliod_stat "$tmp/ctl" foliod_dirty_bytes)
echo "dirty $dirty"
[ "$dirty" -gt 0 ] || fail "no dirty data while the OSD is stopped"
# Cached data still reads; a miss answers (data or an error) in time.
timeout $((60 * TSCALE)) nbdsh -u "$U" -c "
assert h.pread(4096, 4 << 20) == open('$tmp/b', 'rb').read(4096)
try:
    assert h.pread(65536, 16 << 20) == open('$tmp/model', 'rb').read()[16 << 20:(16 << 20) + 65536]
    print('miss answered')
except nbd.Error as e:
    print('miss failed:', e)
" || fail "a read while the OSD is stopped did not answer in time"
foliod_alive
start_unreachable "the OSD stopped"
# Stopped for longer than a PG's read lease (16 s by default), as an OSD
# that hangs for a while under load: every run, not only a slow one.  With
# requests waiting, Ceph 16.2's OSD could then keep a PG "laggy" for good
# after SIGCONT (its requests "waiting for readable" forever; the flake of
# this test): tests/ceph/cluster gives its PGs a longer lease.
while [ $(( SECONDS - stopped )) -lt 20 ]; do sleep 1; done

echo "== OSD continued (SIGCONT)"
"$CLUSTER" osd-cont "$CEPH_DIR"
flush_until_ok 120
dirty=$(foliod_stat "$tmp/ctl" foliod_dirty_bytes)
[ "$dirty" -eq 0 ] || fail "dirty $dirty after a successful FLUSH"

echo "== OSD killed (SIGKILL) and started again"
"$CLUSTER" osd-kill "$CEPH_DIR"
random_file "$tmp/c" 4
put "$tmp/c" $(( 8 << 20 ))
flush_must_fail "$U" "FLUSH while the OSD is dead did not fail in time"
"$CLUSTER" osd-start "$CEPH_DIR" || fail "the OSD did not come back"
random_file "$tmp/d" 4
put "$tmp/d" $(( 12 << 20 )) 120
flush_until_ok 120
foliod_alive
stop_foliod
rbd_cmd export --no-progress rbd/img "$tmp/exported" || fail "rbd export"
same_file "$tmp/exported" "$tmp/model" ||
  fail "the image differs from the model"

echo "== the whole cluster gone, then SIGTERM"
# Nothing dirty: foliod must still exit 0 in time (releasing the lock and
# closing the image wait for a cluster that is not there: given up).  The
# image given up is never closed, so librbd's objects for it stay
# allocated at exit: LeakSanitizer off for this foliod alone (under
# make check-asan it reported exactly those, allocated inside librbd).
ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 start_foliod --export "disk0=$(rbd_backing),cache-size=8M,request-timeout=3000"
"$CLUSTER" down "$CEPH_DIR"
stop_foliod
start_unreachable "the cluster down"
echo OK
