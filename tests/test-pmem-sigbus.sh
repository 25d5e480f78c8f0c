#!/bin/bash
# A store file truncated under a running foliod (issue 23 item 2b; flock
# does not stop truncate): the next access to the store past its new end
# raises SIGBUS.  foliod cannot go on with that export (see foliod(8)),
# but it must say which store and why before it exits, not die silently;
# the other export's acknowledged writes are in its own store and come
# back at the next start.
. "$(dirname "$0")/lib.sh"
lib_init pmem-sigbus
requires nbdsh

keys=cache-size=4M,dirty-expire=3600000,writeback-interval=3600000
truncate -s 8M "$tmp/a.img" "$tmp/b.img"
ea="a=file:$tmp/a.img,store=pmem:$tmp/a.store,$keys"
eb="b=file:$tmp/b.img,store=pmem:$tmp/b.store,$keys"

start_foliod --export "$ea" --export "$eb"
timeout 30 nbdsh -u "$(uri b)" -c 'h.pwrite(b"b" * 65536, 0); h.flush()' ||
  fail "write b"
timeout 30 nbdsh -u "$(uri a)" -c 'h.pwrite(b"a" * 65536, 0); h.flush()' ||
  fail "write a"

# Cut a's store to its metadata: every data page is gone.
truncate -s 2M "$tmp/a.store"
timeout 30 nbdsh -u "$(uri a)" -c '
for i in range(64):
    h.pwrite(b"A" * 65536, i * 65536)
    h.pread(65536, i * 65536)
' >/dev/null 2>&1 || true

for ((i = 0; i < 100 * TSCALE; i++)); do
  kill -0 "$FOLIOD_PID" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$FOLIOD_PID" 2>/dev/null && fail "foliod served a truncated store"
rc=0
wait "$FOLIOD_PID" || rc=$?
FOLIOD_PID=
echo "foliod exit status $rc"
grep -E "store $tmp/a.store: SIGBUS at byte [0-9]+ of the store \(the file was truncated, or a media error\)" \
  "$FOLIOD_LOG" || fail "no log line naming the store and the cause"

# The other export's store holds its acknowledged data.
mv "$FOLIOD_LOG" "$tmp/first.log"   # an ASan build reports the SIGBUS too
start_foliod --export "$eb"
timeout 30 nbdsh -u "$(uri b)" -c 'assert h.pread(65536, 0) == b"b" * 65536' ||
  fail "b lost acknowledged data"
stop_foliod
echo ok
