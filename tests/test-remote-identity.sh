#!/bin/bash
# Issue 33 item 8, content: a remote that comes back with the same size,
# flags and description but serving another image must not be used.
# foliod caches blocks of image A (all 'A'); the remote restarts on A (a
# routine restart: used again), then on image B (all 'B', same size) on
# the same socket.  A read of a block the cache does not hold must not
# return B's data next to A's cached blocks (mixed images): the reconnect
# is refused, logged at warning level, and a FLUSH with dirty data fails.
# Back on A, the remote is used again and B was never written.
. "$(dirname "$0")/lib.sh"
lib_init remote-identity
. "$(dirname "$0")/lib-remote.sh"
requires nbdsh python3

ctl=$tmp/ctl.sock
make_ab_images
start_remote "$tmp/remote.sock" file "$tmp/a.img"
# readahead=0: only what the client reads is cached; retry-timeout: a
# refused remote counts as away, requests fail after this.
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri),cache-size=64M,readahead=0,retry-timeout=3000"

# read_at OFF: the first byte the client reads at OFF, or "error".
read_at () {
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c "try: print(h.pread(4096, $1)[:1].decode())
except nbd.Error as e: print('error')" 2>/dev/null
}

# The first half of the export, 1 MiB apart: cached, clean.
for ((m = 0; m < 8; m++)); do
  [ "$(read_at $((m << 20)))" = A ] || fail "first read at ${m} MiB"
done

# A routine restart of the same image: used again, a block not cached
# yet is read from it.
stop_remote KILL
start_remote "$tmp/remote.sock" file "$tmp/a.img"
[ "$(read_at $((9 << 20)))" = A ] || fail "the restarted remote was not used"
grep -q "info: nbd .*: reconnected" "$FOLIOD_LOG" ||
  fail "the reconnect was not logged"

# Another image of the same size, flags and (no) description.
stop_remote KILL
start_remote "$tmp/remote.sock" file "$tmp/b.img"
for ((i = 0; i < 3; i++)); do
  got=$(read_at $((12 << 20)))
  [ "$got" != B ] ||
    fail "foliod served image B's data next to image A's cached blocks"
done
[ "$(read_at 0)" = A ] || fail "a cached block changed"
wait_for_text "$FOLIOD_LOG" \
  "warn.*came back as another export (the block at offset [0-9]* differs" \
  "the refusal was not logged"

# Dirty data cannot go to the refused remote: FLUSH fails.
flush_rc=$(timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
  -c 'h.pwrite(b"W" * 4096, 0)' \
  -c 'try:
    h.flush()
    print("ok")
except nbd.Error as e:
    print("error")' 2>/dev/null)
[ "$flush_rc" = error ] || fail "FLUSH succeeded with the remote refused ($flush_rc)"

# Back on image A: used again, the write lands there, B was never
# written.
stop_remote KILL
start_remote "$tmp/remote.sock" file "$tmp/a.img"
for ((i = 0; i < 10 * TSCALE; i++)); do
  flush_rc=$(timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c 'try:
    h.flush()
    print("ok")
except nbd.Error as e:
    print("error")' 2>/dev/null)
  [ "$flush_rc" = ok ] && break
  sleep 1
done
[ "$flush_rc" = ok ] || fail "no FLUSH after the remote came back as opened"
[ "$(read_at $((13 << 20)))" = A ] || fail "a read after the remote came back"
stop_foliod
stop_remote
cmp -s "$tmp/b.img" "$tmp/b.orig" || fail "image B was written"
[ "$(head -c 1 "$tmp/a.img")" = W ] || fail "the write did not reach image A"
echo OK
