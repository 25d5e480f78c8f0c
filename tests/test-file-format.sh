#!/bin/bash
# Image format probe (issue 26): a file backing holding an image format
# qemu knows is refused with the format and the ways out named (format=raw;
# qemu-img info to see a backing file first, never qemu-img convert, which
# would follow it: issue 34); format=raw serves its bytes as they are; raw
# images (zeroes, or data that starts like a boot sector) are served.
# The nbdkit plugin's refusal: tests/test-plugin-config.sh; images a
# client wrote a header into: tests/test-file-format-written.sh.
. "$(dirname "$0")/lib.sh"
lib_init file-format
requires qemu-img nbdinfo

for fmt in qcow2 vmdk vdi vhdx vpc qed; do
  img=$tmp/disk.$fmt
  qemu-img create -q -f "$fmt" "$img" 64M || fail "qemu-img create -f $fmt"
  start_refused "$fmt" "$img: holds a $fmt image header, not a raw disk" \
    --export "disk0=file:$img"
  grep -qF "qemu-img info $img' shows a backing file" "$tmp/refused.out" ||
    fail "$fmt: the message does not say what to check: $(cat "$tmp/refused.out")"
  grep -qF "qemu-img convert" "$tmp/refused.out" &&
    fail "$fmt: the message suggests qemu-img convert: $(cat "$tmp/refused.out")"
  grep -qF "format=raw" "$tmp/refused.out" ||
    fail "$fmt: the message does not name format=raw: $(cat "$tmp/refused.out")"
  echo "$fmt: $(grep -F "a $fmt image" "$tmp/refused.out")"
  start_refused "$fmt, read-only" "a $fmt image header" \
    --export "disk0=file:$img,read-only=true"
  # format=raw: the bytes as they are, the file's size.
  start_foliod --export "disk0=file:$img,format=raw"
  size=$(nbdinfo --size "$(uri disk0)")
  [ "$size" = "$(stat -c %s "$img")" ] ||
    fail "$fmt with format=raw: size $size, file $(stat -c %s "$img")"
  stop_foliod
done

# A fixed VHD: raw data, then a footer in the last sector.
img=$tmp/fixed.vpc
qemu-img create -q -f vpc -o subformat=fixed "$img" 16M || fail "qemu-img create fixed vpc"
start_refused "fixed vpc" "a vpc image header" --export "disk0=file:$img"

# Raw images are served: all zeroes, and a boot sector's signature.
truncate -s 16M "$tmp/zero.img"
start_foliod --export "disk0=file:$tmp/zero.img"
stop_foliod
printf '\xeb\x63\x90' | dd of="$tmp/zero.img" conv=notrunc status=none
printf '\x55\xaa' | dd of="$tmp/zero.img" bs=1 seek=510 conv=notrunc status=none
start_foliod --export "disk0=file:$tmp/zero.img,format=auto"
stop_foliod

