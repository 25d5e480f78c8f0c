#!/bin/bash
# Two daemons on one image (issue 23 item 5): foliod locks a file backing
# as qemu does (OFD locks on bytes 100+ and 200+ of the image), so
#  - a second foliod on an image a foliod serves is refused, with the file
#    and the holder named;
#  - qemu-io and qemu-nbd cannot write it, qemu-img convert cannot read it
#    ('Failed to get shared "write" lock') unless forced with -U, and
#    qemu-img info still works, as with an image a qemu VM runs on;
#  - a read-only export lets readers in (a second read-only foliod, qemu-img
#    convert) and keeps writers out;
#  - foliod is refused an image qemu-nbd serves;
#  - locking=off starts anyway, next to a foliod and next to qemu-nbd.
. "$(dirname "$0")/lib.sh"
lib_init file-lock
requires qemu-img qemu-io qemu-nbd nbdinfo

img=$tmp/disk.img
truncate -s 64M "$img"

# qemu_says WHAT TEXT CMD...: CMD fails and says TEXT.
qemu_says () {
  local what=$1 text=$2
  shift 2
  if timeout $(( 60 * TSCALE )) "$@" >"$tmp/qemu.out" 2>&1; then
    fail "$what: $1 succeeded on an image foliod holds"
  fi
  grep -qF -- "$text" "$tmp/qemu.out" || fail "$what: no '$text' in: $(cat "$tmp/qemu.out")"
}

# A second foliod, and qemu's tools, against a writable export.
start_foliod --export "disk0=file:$img,cache-size=16M"
first=$FOLIOD_PID
start_refused "second foliod" "$img: in use" --export "disk0=file:$img"
cat "$tmp/refused.out"
grep -qE "pid [0-9]+ \(foliod\)" "$tmp/refused.out" ||
  fail "the holder is not named: $(cat "$tmp/refused.out")"
start_refused "second foliod, read-only" "$img: in use" \
  --export "disk0=file:$img,read-only=true"
qemu_says "qemu-io write" 'Failed to get "write" lock' \
  qemu-io -f raw -c "write 0 512" "$img"
qemu_says "qemu-nbd" 'Failed to get "write" lock' \
  qemu-nbd -k "$tmp/q.sock" -f raw "$img"
qemu_says "qemu-img convert" 'Failed to get shared "write" lock' \
  qemu-img convert -f raw -O raw "$img" "$tmp/copy.img"
qemu-img convert -U -f raw -O raw "$img" "$tmp/copy.img" ||
  fail "qemu-img convert -U refused"
qemu-img info "$img" >/dev/null || fail "qemu-img info refused"

# locking=off: a second foliod runs (at the operator's risk).
SOCK_PATH=$tmp/sock2 start_foliod --export "disk0=file:$img,locking=off"
nbdinfo "$(uri disk0)" >/dev/null || fail "the locking=off foliod does not serve"
stop_foliod
FOLIOD_PID=$first SOCK=$tmp/sock
stop_foliod
qemu-io -f raw -c "write 0 512" "$img" >/dev/null ||
  fail "foliod's locks outlived it"

# A read-only export: readers welcome, writers not.
start_foliod --export "disk0=file:$img,read-only=true"
first=$FOLIOD_PID
SOCK_PATH=$tmp/sock2 start_foliod --export "disk0=file:$img,read-only=true"
stop_foliod
FOLIOD_PID=$first SOCK=$tmp/sock
qemu-img convert -f raw -O raw "$img" "$tmp/copy.img" ||
  fail "qemu-img convert refused an image foliod serves read-only"
start_refused "writable foliod next to a read-only one" "$img: in use" \
  --export "disk0=file:$img"
qemu_says "qemu-io write, read-only export" 'Failed to get "write" lock' \
  qemu-io -f raw -c "write 0 512" "$img"
stop_foliod

# An image qemu-nbd serves: foliod is refused, unless locking=off.
qemu-nbd -k "$tmp/q.sock" -f raw --pid-file "$tmp/q.pid" --fork "$img" ||
  fail "qemu-nbd did not start"
qpid=$(cat "$tmp/q.pid")
track "$qpid"
start_refused "foliod on qemu-nbd's image" "$img: in use" --export "disk0=file:$img"
cat "$tmp/refused.out"
grep -qF "(qemu-nbd)" "$tmp/refused.out" ||
  fail "qemu-nbd is not named: $(cat "$tmp/refused.out")"
SOCK_PATH=$tmp/sock2 start_foliod --export "disk0=file:$img,locking=off"
stop_foliod
kill "$qpid"
for ((i = 0; i < 100 * TSCALE; i++)); do
  kill -0 "$qpid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$qpid" 2>/dev/null && fail "qemu-nbd still runs"
# Its locks went with it.
start_foliod --export "disk0=file:$img"
stop_foliod
