#!/bin/bash
# A store file with holes on a file system without room for them (issue
# 23 item 2a): a store of full size made with truncate or a sparse copy
# used to be mapped as it was, and the first write into a hole with the
# file system full raised SIGBUS (exit 135, no log line, every export
# gone).  foliod allocates the whole store at every open, so such a store
# is refused at start with ENOSPC naming the file, and a store that fits
# is allocated (no holes left) and serves.
. "$(dirname "$0")/lib.sh"
lib_init pmem-space
requires nbdsh

[ "$(id -u)" = 0 ] || skip "needs root to mount a small tmpfs"
mnt=$(mktemp -d /tmp/foliod-pmem-space-mnt-XXXXXX)
cleanup () {
  _lib_cleanup                    # foliod first: it maps the store
  umount "$mnt" 2>/dev/null || true
  rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT
mount -t tmpfs -o size=8M foliod-pmem-space "$mnt" ||
  skip "cannot mount a tmpfs"

keys=cache-size=16M,dirty-expire=3600000,writeback-interval=3600000
truncate -s 32M "$tmp/img"

# A real store (18 MiB with its metadata), made elsewhere, copied sparse
# onto the 8 MiB tmpfs: the copy has its full size and almost no blocks.
start_foliod --export "d=file:$tmp/img,store=pmem:$tmp/store,$keys"
stop_foliod
cp --sparse=always "$tmp/store" "$mnt/store"
[ "$(stat -c %s "$mnt/store")" -gt $((8 << 20)) ] || fail "store too small"

rc=0
timeout $((60 * TSCALE)) "$FOLIOD" --foreground --unix "$tmp/sock" \
  --export "d=file:$tmp/img,store=pmem:$mnt/store,$keys" \
  >"$tmp/out" 2>&1 &
pid=$!
track "$pid"
for ((i = 0; i < 200 * TSCALE; i++)); do
  [ -S "$tmp/sock" ] && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
if [ -S "$tmp/sock" ]; then
  # It started on the sparse store: fill the cache; a SIGBUS kills it.
  timeout $((30 * TSCALE)) nbdsh -u "nbd+unix:///d?socket=$tmp/sock" \
    -c 'h.pwrite(b"y" * (16 << 20), 0)' >/dev/null 2>&1 || true
  kill -TERM "$pid" 2>/dev/null || true
fi
wait "$pid" || rc=$?
cat "$tmp/out"
[ "$rc" -ne 135 ] && [ "$rc" -ne 138 ] || fail "foliod died of SIGBUS"
[ "$rc" -ne 0 ] || fail "foliod served a store the file system cannot hold"
grep -qE "$mnt/store: cannot allocate the store .*No space left on device" \
  "$tmp/out" || fail "no ENOSPC refusal naming the store"

# With room (the tmpfs grown), the same sparse store is allocated and serves.
mount -o remount,size=64M "$mnt"
start_foliod --export "d=file:$tmp/img,store=pmem:$mnt/store,$keys"
[ "$(( $(stat -c %b "$mnt/store") * $(stat -c %B "$mnt/store") ))" -ge \
  "$(stat -c %s "$mnt/store")" ] || fail "the store still has holes"
timeout 30 nbdsh -u "$(uri d)" \
  -c 'h.pwrite(b"y" * (16 << 20), 0); h.flush()' || fail "write"
stop_foliod
cmp -s <(head -c $((16 << 20)) /dev/zero | tr '\0' y) \
  <(head -c $((16 << 20)) "$tmp/img") || fail "backing lacks the data"
echo ok
