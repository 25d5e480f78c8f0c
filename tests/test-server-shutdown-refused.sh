#!/bin/bash
# SIGTERM while one client's data is dirty and another holds replies it has
# not read: that client's next request is refused with ESHUTDOWN, it reads
# its replies and disconnects; foliod must then write the dirty data back
# and exit 0.  (The connection closed with the refusal still queued once
# aborted the daemon here, before the writeback: acknowledged writes never
# reached the file.)
. "$(dirname "$0")/lib.sh"
lib_init server-shutdown-refused
requires nbdsh
BAD=$BUILD/tests/tools/bad-client
[ -x "$BAD" ] || fail "bad-client not built: $BAD"

truncate -s 64M "$tmp/img"
ctl=$tmp/ctl
start_foliod --control "$ctl" \
  --export "disk0=file:$tmp/img,cache-size=48M,dirty-expire=600000"

# The writer: 4 MiB of known data at 32 MiB, acknowledged, never flushed.
nbdsh -u "$(uri disk0)" -c '
for i in range(64):
    h.pwrite((b"%08d" % i) * 8192, (32 << 20) + i * 65536)
h.shutdown()
' || fail "writer failed"
dirty=$("$FOLIOD" stats --control "$ctl" --prometheus |
        awk '$1 == "foliod_dirty_bytes{export=\"disk0\"}" { print $2 }')
[ "${dirty:-0}" -gt 0 ] || fail "no dirty data before SIGTERM (dirty=$dirty)"

# bad-client sends the SIGTERM itself, at the moment it needs.
BAD_CLIENT_PID=$FOLIOD_PID timeout $((60 * TSCALE)) \
  "$BAD" "$SOCK" disk0 shutdown-refused || fail "case shutdown-refused"
stop_foliod 0   # signal 0: only wait for the exit (status 0) of the SIGTERM
grep -q "shutdown" "$FOLIOD_LOG" || fail "no shutdown logged"

for i in $(seq 0 63); do
  want=$(printf '%08d' "$i")
  got=$(dd if="$tmp/img" bs=65536 skip=$((512 + i)) count=1 2>/dev/null |
        head -c 8)
  [ "$got" = "$want" ] || fail "acknowledged write $i is not in the backing file"
done
echo OK
