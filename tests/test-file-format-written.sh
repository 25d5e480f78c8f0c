#!/bin/bash
# A client writes an image signature into its own raw disk (issue 34,
# items 2 and 3; qemu's CVE-2008-2004): qemu-img create -f qcow2 through
# nbd://, a LUKS header at byte 0, "conectix" in the last sector.  After a
# restart those exports still serve their bytes raw (foliod created them
# and served them writable: it never probes them again).  A foreign qcow2
# file foliod never served is still refused, alone: the other exports
# serve, the empty name does not fall to another export, and the advice
# names qemu-img info and format=raw, never qemu-img convert (which
# would follow a backing file the image names).  --check-config says the
# same as the start.  An image replaced by another file is looked at again.
. "$(dirname "$0")/lib.sh"
lib_init file-format-written
requires qemu-img nbdsh nbdinfo

state=$tmp/state
mkdir "$state"
conf=$tmp/foliod.conf
# As the shipped foliod.conf: images foliod creates in its state directory.
exports="[export disk0]
backing = file:disk0.img
create-size = 64M
cache-size = 4M

[export disk1]
backing = file:disk1.img
create-size = 16M
cache-size = 4M

[export disk2]
backing = file:disk2.img
create-size = 16M
cache-size = 4M"
printf '[server]\nstate-dir = %s\n\n%s\n' "$state" "$exports" > "$conf"

# read_at EXPORT OFFSET HEX: the export serves these bytes there.
read_at () {
  nbdsh -u "$(uri "$1")" -c "
got = h.pread(len(bytes.fromhex('$3')), $2)
assert got == bytes.fromhex('$3'), got" ||
    fail "export $1: not the bytes $3 at $2"
}

start_foliod --config "$conf"
timeout $((60 * TSCALE)) qemu-img create -q -f qcow2 "$(uri disk0)" 64M ||
  fail "qemu-img create -f qcow2 into export disk0"
nbdsh -u "$(uri disk1)" -c 'h.pwrite(b"LUKS\xba\xbe\x00\x02", 0)' ||
  fail "writing a LUKS header into disk1"
nbdsh -u "$(uri disk2)" -c 'h.pwrite(b"conectix", h.get_size() - 512)' ||
  fail "writing a VHD footer into disk2"
stop_foliod
[ "$(head -c 4 "$state/disk0.img" | od -An -tx1 | tr -d ' ')" = 514649fb ] ||
  fail "qemu-img create did not write the qcow2 magic into disk0.img"

# (a) the restart serves all three, their bytes raw.
start_foliod --config "$conf"
read_at disk0 0 514649fb
read_at disk1 0 4c554b53babe
read_at disk2 $((16 * 1024 * 1024 - 512)) 636f6e6563746978
grep 'served writable before' "$FOLIOD_LOG"
grep -q 'refus\|not served' "$FOLIOD_LOG" &&
  fail "an export written by its client was refused: $(grep 'refus\|not served' "$FOLIOD_LOG")"
stop_foliod

# (b) a foreign qcow2 file never served, listed first (the default
# export): refused alone, with advice that copies nothing.
qemu-img create -q -f qcow2 "$tmp/foreign.qcow2" 16M ||
  fail "qemu-img create foreign.qcow2"
printf '[server]\nstate-dir = %s\n\n[export foreign]\nbacking = file:%s\ncache-size = 4M\n\n%s\n' \
  "$state" "$tmp/foreign.qcow2" "$exports" > "$conf"
line=$(grep -n "foreign.qcow2" "$conf" | cut -d: -f1)

# check_advice FILE WHAT: FILE holds the refusal of foreign with its advice.
check_advice () {
  grep -q "foreign.*qcow2" "$1" || fail "$2: foreign not refused: $(cat "$1")"
  grep -qF "format=raw" "$1" || fail "$2: no format=raw in: $(cat "$1")"
  grep -qF "qemu-img info" "$1" || fail "$2: no qemu-img info in: $(cat "$1")"
  grep -qF "backing file" "$1" || fail "$2: no backing file in: $(cat "$1")"
  grep -qF "qemu-img convert" "$1" &&
    fail "$2: the advice suggests qemu-img convert: $(cat "$1")"
  grep -E "disk[0-9]" "$1" | grep -qi "refus\|not served\|image, not" &&
    fail "$2: an export written by its client is refused: $(cat "$1")"
  return 0
}

# (c) --check-config: the foreign export will not be served, at its line;
# nothing about the three others.
rc=0
"$FOLIOD" --check-config "$conf" >"$tmp/check.out" 2>"$tmp/check.err" || rc=$?
cat "$tmp/check.out" "$tmp/check.err"
[ $rc -ne 0 ] || fail "--check-config says OK with a refused export"
grep -qF "$conf:$line: export 'foreign'" "$tmp/check.err" ||
  fail "--check-config does not name $conf:$line and export 'foreign'"
check_advice "$tmp/check.err" "--check-config"

start_foliod --config "$conf"
foliod_alive
grep -E 'not served|NOT served' "$FOLIOD_LOG"
check_advice "$FOLIOD_LOG" "start"
read_at disk0 0 514649fb
read_at disk1 0 4c554b53babe
read_at disk2 $((16 * 1024 * 1024 - 512)) 636f6e6563746978
nbdinfo --list "nbd+unix:///?socket=$SOCK" > "$tmp/list" || fail "nbdinfo --list"
grep -q 'export="foreign"' "$tmp/list" && fail "the refused export is listed"
nbdinfo --size "$(uri foreign)" >/dev/null 2>&1 && fail "export foreign served"
# The empty name meant foreign: it must not become another client's disk.
nbdinfo --size "$(uri "")" > "$tmp/default" 2>&1 &&
  fail "the empty export name serves another export ($(cat "$tmp/default") bytes)"
stop_foliod

# (d) the record is of that file: another one renamed into its place (a
# copy, here a qcow2) is looked at again.
qemu-img create -q -f qcow2 "$state/new.qcow2" 16M || fail "qemu-img create new.qcow2"
mv "$state/new.qcow2" "$state/disk2.img"
start_foliod --config "$conf"
grep -q "export disk2 .*not served.*disk2.img: holds a qcow2 image header" "$FOLIOD_LOG" ||
  fail "disk2.img replaced by a qcow2 file is served: $(grep disk2 "$FOLIOD_LOG")"
read_at disk1 0 4c554b53babe
stop_foliod
echo ok
