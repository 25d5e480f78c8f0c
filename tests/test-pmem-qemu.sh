#!/bin/bash
# qemu-img against an export with a pmem store (store=pmem:FILE, a plain
# file: page granularity): convert a qcow2 image in, compare, stop foliod
# (SIGTERM: the store is clean, the backing holds the image), start it
# again on the same store (warm restart) and compare again, then convert
# back out.
. "$(dirname "$0")/lib.sh"
lib_init pmem-qemu
requires qemu-img qemu-io

truncate -s 64M "$tmp/img"
spec="disk0=file:$tmp/img,cache-size=16M,store=pmem:$tmp/store"
q () { timeout $((120 * TSCALE)) "$@"; }

q qemu-img create -q -f qcow2 "$tmp/src.qcow2" 64M
q qemu-io -f qcow2 "$tmp/src.qcow2" \
  -c 'write -P 0xab 1M 2M' -c 'write -P 0xcd 10M 64k' \
  -c 'write -P 0x5a 40M 4k' -c 'write -P 0x77 63M 1M' >/dev/null

start_foliod --export "$spec"
grep -q 'granularity=page' "$FOLIOD_LOG" ||
  fail "no granularity=page for a store on a plain file: $(cat "$FOLIOD_LOG")"
U=$(uri disk0)
q qemu-img convert -n -f qcow2 -O raw "$tmp/src.qcow2" "$U"
q qemu-img compare -f qcow2 -F raw "$tmp/src.qcow2" "$U" || fail "compare after convert in"
stop_foliod

"$FOLIOD" store inspect "$tmp/store" > "$tmp/inspect" || fail "store inspect: exit $?"
grep -q '^state: clean' "$tmp/inspect" || fail "store not clean after SIGTERM: $(cat "$tmp/inspect")"
q qemu-img compare -f qcow2 -F raw "$tmp/src.qcow2" "$tmp/img" ||
  fail "the backing file after SIGTERM differs"

start_foliod --export "$spec"
grep -q 'store pmem:.*: last shutdown clean; recovered' "$FOLIOD_LOG" ||
  fail "no warm restart in the log: $(tail -n 5 "$FOLIOD_LOG")"
q qemu-img compare -f qcow2 -F raw "$tmp/src.qcow2" "$U" || fail "compare after restart"
q qemu-img convert -f raw -O qcow2 "$U" "$tmp/back.qcow2"
q qemu-img compare -f qcow2 -F qcow2 "$tmp/src.qcow2" "$tmp/back.qcow2" ||
  fail "compare after convert out"
stop_foliod
echo "ok"
