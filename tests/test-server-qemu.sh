#!/bin/bash
# qemu against foliod: qemu-img convert a qcow2 image to the export and
# back (qemu-img compare equal), qemu-img map --output=json matches the
# written ranges, and qemu-io write -P / read -P / write -z / discard /
# write -f (FUA) read back correctly.
. "$(dirname "$0")/lib.sh"
lib_init server-qemu
requires qemu-img qemu-io nbdsh

MiB=$((1024 * 1024))
truncate -s 64M "$tmp/img"
# Leftover data in the target, which the convert must overwrite or zero.
head -c $((4 * MiB)) /dev/urandom | dd of="$tmp/img" bs=1M seek=20 conv=notrunc status=none
start_foliod --export "disk0=file:$tmp/img,cache-size=16M"
U=$(uri disk0)
q () { timeout $((120 * TSCALE)) "$@"; }

q qemu-img create -q -f qcow2 "$tmp/src.qcow2" 64M
q qemu-io -f qcow2 "$tmp/src.qcow2" \
  -c 'write -P 0xab 1M 2M' -c 'write -P 0xcd 10M 64k' -c 'write -P 0x5a 40M 4k' >/dev/null

q qemu-img convert -n -f qcow2 -O raw "$tmp/src.qcow2" "$U"
q qemu-img compare -f qcow2 -F raw "$tmp/src.qcow2" "$U" || fail "compare after convert in"

q qemu-img convert -f raw -O qcow2 "$U" "$tmp/back.qcow2"
q qemu-img compare -f qcow2 -F qcow2 "$tmp/src.qcow2" "$tmp/back.qcow2" ||
  fail "compare after convert out"

# Map: data exactly where qemu wrote, zeroes elsewhere.
q qemu-img map -f raw --output=json "$U" > "$tmp/map.json"
cat "$tmp/map.json"
python3 - "$tmp/map.json" <<'PY' || fail "qemu-img map does not match"
import json, sys
MiB = 1 << 20
m = json.load(open(sys.argv[1]))
data = [(e["start"], e["start"] + e["length"]) for e in m if not e["zero"]]
want = [(1 * MiB, 3 * MiB), (10 * MiB, 10 * MiB + 65536), (40 * MiB, 40 * MiB + 4096)]
assert data == want, (data, want)
assert m[-1]["start"] + m[-1]["length"] == 64 * MiB
PY

# qemu-io: pattern writes and reads, zero, discard, FUA.
out=$(q qemu-io -f raw "$U" \
  -c 'write -P 0x11 0 64k' -c 'read -P 0x11 0 64k' \
  -c 'write -P 0x33 65537 100000' -c 'read -P 0x33 65537 100000' \
  -c 'write -z 4096 8192' -c 'read -P 0 4096 8192' -c 'read -P 0x11 12288 4096' \
  -c 'write -z -u 1M 1M' -c 'read -P 0 1M 1M' \
  -c 'discard 40M 4k' \
  -c 'write -f -P 0x22 200k 4k' -c 'read -P 0x22 200k 4k' \
  -c 'flush' 2>&1)
echo "$out"
echo "$out" | grep -qiE 'fail|error' && fail "qemu-io reported an error"
[ "$(echo "$out" | grep -c '^wrote')" -eq 5 ] || fail "qemu-io writes missing"
[ "$(echo "$out" | grep -c '^read')" -eq 6 ] || fail "qemu-io reads missing"
# A pattern that is NOT there must be caught (the checks above can fail).
bad=$(q qemu-io -f raw "$U" -c 'read -P 0x99 0 4k' 2>&1 || true)
echo "$bad" | grep -q 'Pattern verification failed' ||
  fail "qemu-io pattern check is not effective"

stop_foliod
# The backing file has what qemu-io wrote.
python3 - "$tmp/img" <<'PY' || fail "backing file content"
import sys
MiB = 1 << 20
d = open(sys.argv[1], "rb").read()
assert d[0:4096] == b"\x11" * 4096
assert d[4096:12288] == bytes(8192)
assert d[12288:65536] == b"\x11" * (65536 - 12288)
assert d[65537:165537] == b"\x33" * 100000
assert d[200 * 1024:204 * 1024] == b"\x22" * 4096
assert d[MiB:2 * MiB] == bytes(MiB)
assert d[2 * MiB:3 * MiB] == b"\xab" * MiB
assert d[10 * MiB:10 * MiB + 65536] == b"\xcd" * 65536
assert d[20 * MiB:24 * MiB] == bytes(4 * MiB), "stale data not zeroed by convert"
PY
echo OK
