#!/bin/bash
# A remote whose flush fails once and drops what it had not flushed, as
# Linux does when fdatasync fails (the pages are marked clean, the error
# is reported once, the next fdatasync succeeds).  foliod must not take
# the next good flush as covering the writes the failed one dropped: no
# FLUSH may succeed while the remote's durable copy is older than what
# the client wrote (foliod(8), DURABILITY).
#
# The remote is an nbdkit sh script over two files: $cur (what reads and
# writes see) and $durable (what a crash would leave).  flush copies cur
# to durable; with $tmp/fail-flush present it fails instead (once) and
# cur falls back to durable (the unflushed writes are gone).
. "$(dirname "$0")/lib.sh"
lib_init remote-flush-fails
. "$(dirname "$0")/lib-remote.sh"

ctl=$tmp/ctl.sock
cur=$tmp/cur.img
durable=$tmp/durable.img
truncate -s 4M "$cur"
cp "$cur" "$durable"
flush_fails_plugin "$tmp/plugin.sh" "$cur" "$durable"
start_remote "$tmp/remote.sock" sh "$tmp/plugin.sh"
# No background writeback: only the client's FLUSH writes back.
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri),cache-size=4M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

# 256 KiB: too many blocks for a flush by FUA writes (the cache writes
# them and then flushes the remote).
durable_has () {
  head -c 262144 "$durable" | tr -d "$1" | wc -c | grep -qx 0
}

timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"A" * 262144, 0)
h.flush()
' || fail "write and FLUSH A"
durable_has A || fail "A is not on the remote after a good FLUSH"

# B over A; the remote's flush of B fails and drops B.
touch "$tmp/fail-flush"
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"B" * 262144, 0)
try:
    h.flush()
    raise SystemExit("FLUSH of B succeeded though the remote failed it")
except nbd.Error as e:
    print("FLUSH of B failed as expected:", e)
' || fail "the failing FLUSH"
[ ! -e "$tmp/fail-flush" ] || fail "the remote was never asked to flush"
durable_has A || fail "the remote's durable copy is not A after the failed flush"

# The remote's next flush succeeds.  A client FLUSH may now succeed only
# if B is durable on the remote.
for i in 1 2 3; do
  if timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c 'h.flush()' \
       2>/dev/null; then
    durable_has B ||
      fail "FLUSH $i succeeded but the remote holds A: the writes its failed flush dropped were taken as durable"
  fi
done
durable_has B || fail "B never reached the remote's durable copy"

# And a clean stop says all was written back, truthfully.
stop_foliod
stop_remote
durable_has B || fail "the remote holds A after a clean stop"
echo OK
