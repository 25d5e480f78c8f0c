#!/bin/bash
# A write received into folios (cache_write_prepare) whose edges are
# tried on the loop thread (CACHE_NOWAIT) and must go to a worker (issue
# 23 item 10d): the try writes the head, gives up on the tail (a partial
# block in a folio not cached: it must be read first), and the worker
# goes on from there.  The head is neither written nor counted twice: the
# client-write counter says exactly the bytes the client wrote, and the
# data reads back.
. "$(dirname "$0")/lib.sh"
lib_init server-nowait-write
requires nbdsh

random_file "$tmp/img" 16
cp "$tmp/img" "$tmp/want"
ctl=$tmp/ctl.sock
# 64 KiB folios, 4 KiB blocks; no background writeback meanwhile.
start_foliod --control "$ctl" --export \
  "disk0=file:$tmp/img,cache-size=8M,folio-size=64K,block-size=4K,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

counter () {
  "$FOLIOD" stats --control "$ctl" --prometheus > "$tmp/stats" || fail "foliod stats"
  awk -v n="$1" '$1 == n "{export=\"disk0\"}" || $1 == n {print $2}' "$tmp/stats"
}

# [4 KiB, 128 KiB + 512): head 60 KiB (whole blocks of folio 0), folio 1
# whole (prepared), tail 512 bytes of folio 2 (a partial block).
off=4096 len=$((60 * 1024 + 64 * 1024 + 512))
head -c "$len" /dev/urandom > "$tmp/data"
dd if="$tmp/data" of="$tmp/want" bs=1 seek="$off" conv=notrunc status=none
timeout 60 nbdsh -u "$(uri disk0)" -c "
data = open('$tmp/data', 'rb').read()
h.pwrite(data, $off)
" || fail "write"
got=$(counter foliod_client_write_bytes_total)
echo "client_write_bytes after one write of $len bytes: $got"
[ "$got" = "$len" ] || fail "client_write_bytes $got for a write of $len bytes"
timeout 60 nbdsh -u "$(uri disk0)" -c "
want = open('$tmp/want', 'rb').read(1 << 20)
assert h.pread(1 << 20, 0) == want, 'read back differs'
" || fail "read back"
stop_foliod
cmp "$tmp/img" "$tmp/want" || fail "image differs after writeback"
