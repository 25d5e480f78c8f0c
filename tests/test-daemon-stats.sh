#!/bin/bash
# Statistics: after a known workload the counters of `foliod stats` equal
# what was done: bytes clients wrote and read, bytes written back (= bytes
# written for block-aligned writes: amplification 1.000), hits and misses,
# connections; `foliod flush EXPORT` writes back at once; the table of
# `foliod stats` shows hit ratio and write amplification per export;
# SIGUSR1 logs the counters.
. "$(dirname "$0")/lib.sh"
lib_init daemon-stats
requires nbdsh python3

img=$tmp/img
truncate -s 64M "$img"
# Data in the backing at 32 MiB, so that reading it must miss.
python3 -c '
import sys; f = open(sys.argv[1], "r+b"); f.seek(32 << 20); f.write(b"\x5a" * 65536)' "$img"
ctl=$tmp/ctl.sock
# A second export, never used, with a name longer than a table cell.
idle=idle-export-with-a-name-longer-than-32-characters
truncate -s 1M "$tmp/idle.img"
start_foliod --control "$ctl" --pidfile "$tmp/pid" --export \
  "disk0=$img,cache-size=16M,folio-size=64K,block-size=4K,dirty-expire=3600000,dirty-background=100,dirty-limit=100" \
  --export "$idle=$tmp/idle.img"

# stat NAME: one counter of export disk0 (or of the server when no label).
stat () {
  "$FOLIOD" stats --control "$ctl" --prometheus > "$tmp/stats" || fail "foliod stats"
  awk -v n="$1" '$1 == n "{export=\"disk0\"}" || $1 == n {print $2}' "$tmp/stats"
}
expect () {
  local v
  v=$(stat "$1")
  [ "$v" = "$2" ] || fail "$1 = '$v', expected $2 ($3)"
}

conns0=$(stat foliod_connections_accepted_total)
for c in $(stat foliod_client_write_bytes_total) $(stat foliod_writeback_bytes_total) \
         $(stat foliod_read_hits_total) $(stat foliod_read_misses_total); do
  [ "$c" = 0 ] || fail "counters not zero at start: $(cat "$tmp/stats")"
done

# Workload, in two connections:
#   10 aligned 64 KiB writes and 3 aligned 4 KiB writes, no flush;
#   a read of written data (hit), a read of backing data (miss), the same
#   read again (hit).
nbdsh -u "$(uri disk0)" -c '
for i in range(10):
    h.pwrite(bytes([i + 1]) * 65536, i * 131072)
for i in range(3):
    h.pwrite(b"\x77" * 4096, (8 << 20) + i * 8192)
' || fail "write workload"
nbdsh -u "$(uri disk0)" -c '
assert h.pread(65536, 0) == b"\x01" * 65536
assert h.pread(65536, 32 << 20) == b"\x5a" * 65536
assert h.pread(65536, 32 << 20) == b"\x5a" * 65536
' || fail "read workload"

written=$(( 10 * 65536 + 3 * 4096 ))
expect foliod_client_write_bytes_total $written "bytes clients wrote"
expect foliod_client_read_bytes_total $(( 3 * 65536 )) "bytes clients read"
expect foliod_read_hits_total 2 "reads served from the cache"
expect foliod_read_misses_total 1 "reads that went to the backing"
expect foliod_dirty_bytes $written "nothing written back yet"
expect foliod_writeback_bytes_total 0 "nothing written back yet"
expect foliod_connections_accepted_total $(( conns0 + 2 )) "two client connections"
expect foliod_connections 0 "all clients gone"

# Forced writeback.
"$FOLIOD" flush disk0 --control "$ctl" > "$tmp/flush.out" || fail "foliod flush"
grep -q "OK disk0: $written dirty bytes written back" "$tmp/flush.out" ||
  fail "flush said: $(cat "$tmp/flush.out")"
expect foliod_dirty_bytes 0 "after foliod flush"
expect foliod_writeback_bytes_total $written "written back = written (aligned)"
expect foliod_write_amplification 1.000 "aligned writes"
expect foliod_backing_errors_total 0 "no errors"
python3 - "$img" <<'PY' || fail "backing lacks the data after foliod flush"
import sys
f = open(sys.argv[1], "rb")
for i in range(10):
    f.seek(i * 131072)
    assert f.read(65536) == bytes([i + 1]) * 65536
PY
"$FOLIOD" flush nosuch --control "$ctl" 2>"$tmp/err" && fail "flush of a missing export succeeded"
grep -q "no export named 'nosuch'" "$tmp/err" || fail "flush nosuch: $(cat "$tmp/err")"

# The table (the default form): one row per export with its hit ratio
# (2 hits of 3 reads) and write amplification (652K written, 652K
# written back, 12 folios cached); "-" for the export nobody used; the
# server's line; no readahead on a file backing (readahead=auto).
"$FOLIOD" stats --control "$ctl" > "$tmp/table" || fail "foliod stats (table)"
cat "$tmp/table"
head -n 1 "$tmp/table" | grep -qE '^EXPORT +SIZE +CACHED +DIRTY +READS +HIT RATIO +WRITTEN +WRITTEN BACK +WRITE AMP +ERRORS +READAHEAD$' ||
  fail "table head: $(head -n 1 "$tmp/table")"
row () { awk -v e="$1" '$1 == e { $1 = $1; print }' "$tmp/table"; }
[ "$(row disk0)" = "disk0 64M 768K 0 3 66.7% 652K 652K 1.00 0 0" ] ||
  fail "disk0 row: '$(row disk0)'"
[ "$(row "$idle")" = "$idle 1M 0 0 0 - 0 0 - 0 0" ] || fail "idle row: '$(row "$idle")'"
grep -qx "connections: 0 open, $(( conns0 + 2 )) accepted, 0 refused; requests: [0-9]*, 0 with errors" \
  "$tmp/table" || fail "table: no connections line"
grep -q '^#\|_total' "$tmp/table" && fail "Prometheus text in the table"

# SIGUSR1 logs the counters (to foliod itself, not the timeout wrapper).
kill -USR1 "$(cat "$tmp/pid")"
wait_for_text "$FOLIOD_LOG" \
  "export disk0: hits 2 misses 1 client-written $written written-back $written" \
  "SIGUSR1 did not log the counters" 50
stop_foliod
echo OK
