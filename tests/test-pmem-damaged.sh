#!/bin/bash
# A slot entry damaged on the media (issue 23 item 3): one bit flipped in
# the folio index of a slot holding dirty data after a kill -9.  Recovery
# must see the entry's checksum fail, log the loss, and write the slot's
# data nowhere: before, it went to the folio the flipped index named
# (64 KiB away here), over data it does not belong to.
. "$(dirname "$0")/lib.sh"
lib_init pmem-damaged
requires nbdsh

img=$tmp/img
st=$tmp/store
keys=store=pmem:$st,cache-size=4M,dirty-expire=3600000,writeback-interval=3600000
truncate -s 8M "$img"

start_foliod --pidfile "$tmp/pid" --export "d=file:$img,$keys"
timeout 30 nbdsh -u "$(uri d)" -c 'h.pwrite(b"D" * 4096, 8192); h.flush()' ||
  fail "write"
kill9_foliod "$tmp/pid"

# Slot 0 holds folio 0 (the first slot handed out); its entry is the
# first of the slot table, 8 KiB into the store: flip bit 0 of its folio
# index, so that it names folio 1.
"$FOLIOD" store inspect "$st" | grep -q "^dirty: 4096 bytes" ||
  fail "no dirty block in the store"
python3 - "$st" <<'PY'
import struct, sys
with open(sys.argv[1], "r+b") as f:
    f.seek(8192)
    fi = struct.unpack("<Q", f.read(8))[0]
    assert fi == 0, "slot 0 holds folio %d" % fi
    f.seek(8192)
    f.write(struct.pack("<Q", fi ^ 1))
PY
"$FOLIOD" store inspect "$st" | grep -q "^damaged slot entries: 1" ||
  fail "inspect does not show the damaged entry"

start_foliod --export "d=file:$img,$keys"
grep -q "1 damaged slot entries (checksum): their 4096 dirty bytes belong to no known offset and are written nowhere (DATA LOST)" \
  "$FOLIOD_LOG" || fail "no log line for the damaged entry"
timeout 30 nbdsh -u "$(uri d)" -c '
assert h.pread(4096, 65536 + 8192) == bytes(4096), "folio 0 data landed in folio 1"
assert h.pread(4096, 8192) == bytes(4096)
' || fail "the damaged entry's data was used"
stop_foliod
cmp -s "$img" <(head -c $((8 << 20)) /dev/zero) ||
  fail "the damaged entry's data reached the backing"
echo ok
