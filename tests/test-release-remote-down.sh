#!/bin/bash
# A release that cannot finish keeps everything (issue 35 item 3): foliod
# in front of a remote (nbdkit, file plugin) holds 4 MiB dirty; the remote
# stops; `foliod release disk0` must fail and say so, and leave the export
# as it was: the data still dirty in the cache, writes still accepted (on
# the old connection and on a new one, which is not read-only).  Once the
# remote is back the data reaches it, and a release then succeeds.
. "$(dirname "$0")/lib.sh"
lib_init release-remote-down
. "$(dirname "$0")/lib-remote.sh"
requires nbdinfo

truncate -s 64M "$tmp/remote.img"
start_remote "$tmp/remote.sock" file "$tmp/remote.img"
keep_dirty="cache-size=32M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"
start_foliod --control "$tmp/ctl" \
  --export "disk0=$(remote_uri),retry-timeout=1000,$keep_dirty"

head -c $(( 4 << 20 )) /dev/zero | tr '\0' '\132' > "$tmp/data"
nbdsh -u "$(uri disk0)" -c "h.pwrite(open('$tmp/data', 'rb').read(), 0)" ||
  fail "write"
dirty=$(foliod_stat "$tmp/ctl" foliod_dirty_bytes)
[ "$dirty" -eq $(( 4 << 20 )) ] || fail "expected 4 MiB dirty, got $dirty"

stop_remote KILL
if timeout $(( 120 * TSCALE )) "$FOLIOD" release disk0 --control "$tmp/ctl" \
     >"$tmp/release.out" 2>&1; then
  fail "release succeeded with the remote down: $(cat "$tmp/release.out")"
fi
cat "$tmp/release.out"
grep -q "nothing released, still writable" "$tmp/release.out" ||
  fail "the failure does not say what was kept: $(cat "$tmp/release.out")"
grep -q "export disk0: release failed" "$FOLIOD_LOG" || fail "not in the log"
dirty=$(foliod_stat "$tmp/ctl" foliod_dirty_bytes)
[ "$dirty" -eq $(( 4 << 20 )) ] || fail "dirty data not kept: $dirty bytes dirty"

# Still writable, new connections too.
nbdinfo "$(uri disk0)" > "$tmp/info" || fail "nbdinfo"
grep -q "is_read_only: false" "$tmp/info" || fail "read-only after a failed release"
head -c 4096 /dev/zero | tr '\0' '\133' > "$tmp/data2"
nbdsh -u "$(uri disk0)" -c "h.pwrite(open('$tmp/data2', 'rb').read(), 8 << 20)" ||
  fail "a write after the failed release"

# The remote comes back: everything reaches it, and now the release works.
start_remote "$tmp/remote.sock" file "$tmp/remote.img"
flush_until_ok disk0      # foliod probes a remote that was down every 2 s
timeout $(( 120 * TSCALE )) "$FOLIOD" release disk0 --control "$tmp/ctl" \
  > "$tmp/release2.out" 2>&1 || fail "release with the remote back: $(cat "$tmp/release2.out")"
cat "$tmp/release2.out"
cmp <(head -c $(( 4 << 20 )) "$tmp/remote.img") "$tmp/data" ||
  fail "the remote lacks the data written before the failed release"
cmp <(tail -c +$(( (8 << 20) + 1 )) "$tmp/remote.img" | head -c 4096) "$tmp/data2" ||
  fail "the remote lacks the write made after the failed release"
stop_foliod
stop_remote KILL
