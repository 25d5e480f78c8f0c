#!/bin/bash
# A write lost with a connection the network reset (not one foliod cut)
# may still be carried out by the remote later: nbdkit finishes a dead
# connection's requests.  foliod sends it again on a new connection, but
# it must count it in doubt (foliod(8), "Writes in doubt"): else a FLUSH
# reports newer data durable and the first copy lands over it.
#
# foliod -> socat (the "network") -> nbdkit sh script over a file whose
# FIRST write is held 4 s, then done.  A is written back; while the
# remote holds it, socat is killed (the connection resets under foliod)
# and a new socat takes its place; foliod reconnects and sends A again.
# The client then writes B over A and FLUSHes; the first A lands.
. "$(dirname "$0")/lib.sh"
lib_init remote-reset
. "$(dirname "$0")/lib-remote.sh"
requires socat

ctl=$tmp/ctl.sock
img=$tmp/remote.img
proxy=$tmp/proxy.sock
truncate -s 16M "$img"
sh_remote_script "$tmp/plugin.sh" "$img" parallel <<SH
  pwrite)
    if mkdir "$tmp/first-write" 2>/dev/null; then
      sleep 4
      dd of="$img" seek="\$4" oflag=seek_bytes conv=notrunc status=none
      echo x > "$tmp/first-write/landed"
      exit 0
    fi
    dd of="$img" seek="\$4" oflag=seek_bytes conv=notrunc status=none ;;
  flush) sync "$img" ;;
SH
# -t 1: see test-remote-hang.sh (nbdkit 1.32 and a closed connection).
start_remote "$tmp/remote.sock" -t 1 sh "$tmp/plugin.sh"

SOCAT_PID=
start_socat () {
  rm -f "$proxy"
  socat UNIX-LISTEN:"$proxy" UNIX-CONNECT:"$tmp/remote.sock" \
    2>>"$tmp/socat.log" &
  SOCAT_PID=$!
  track "$SOCAT_PID"
  for ((i = 0; i < 100 * TSCALE; i++)); do
    [ -S "$proxy" ] && return 0
    sleep 0.05
  done
  fail "socat did not listen"
}
start_socat
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri "$proxy"),cache-size=16M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

# A, written back by a FLUSH that waits while the remote holds it.
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"A" * 262144, 0)
try:
    h.flush()
except nbd.Error as e:
    print("FLUSH of A:", e)
' > "$tmp/flush-a.log" 2>&1 &
flush_a=$!
for ((i = 0; i < 100 * TSCALE; i++)); do
  [ -d "$tmp/first-write" ] && break
  sleep 0.1
done
[ -d "$tmp/first-write" ] || fail "A never reached the remote"
# The network resets the connection; the path comes back at once.
kill -KILL "$SOCAT_PID"
wait "$SOCAT_PID" 2>/dev/null || true
start_socat
wait "$flush_a" || fail "nbdsh for A: $(cat "$tmp/flush-a.log")"
[ ! -e "$tmp/first-write/landed" ] || fail "A landed too early for the test"

# B over A, FLUSHed while the first copy of A may still land.
b_flushed=0
if timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"B" * 262144, 0)
h.flush()
' 2>/dev/null; then
  b_flushed=1
fi
for ((i = 0; i < 100 * TSCALE; i++)); do
  [ -e "$tmp/first-write/landed" ] && break
  sleep 0.1
done
[ -e "$tmp/first-write/landed" ] || fail "the first A never landed"
sleep 0.5
has () { head -c 262144 "$img" | tr -d "$1" | wc -c | grep -qx 0; }
if [ "$b_flushed" = 1 ] && ! has B; then
  fail "a FLUSH reported B durable, then the first copy of A (lost with the reset connection) landed over it"
fi
n=$(foliod_stat "$ctl" foliod_backing_writes_in_doubt)
[ "$n" -ge 1 ] || fail "the write lost with the reset connection is not in doubt ($n)"

# The operator knows the remote is done with it: B is written again.
"$FOLIOD" clear-doubt disk0 --control "$ctl" || fail "foliod clear-doubt"
flush_until_ok disk0
stop_foliod
stop_remote
has B || fail "the remote has $(head -c 1 "$img") in block 0, not B"
echo OK
