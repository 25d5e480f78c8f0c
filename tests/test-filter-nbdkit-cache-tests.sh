#!/bin/bash
# nbdkit's own tests of its cache filter (nbdkit's tests/, the same in
# Debian 12's 1.32 source), their steps rewritten here with
# --filter=folio for --filter=cache (the source package is not fetched
# at check time).  Which apply:
#   test-cache.sh            yes: write through the cache, read, FLUSH, file
#   test-cache-unaligned.sh  yes: an export size not a multiple of a block
#   test-cache-on-read.sh    yes, without cache-on-read=true (not a key of
#                            ours: the folio cache always keeps what it read)
#   test-cache-max-size.sh   no: it measures nbdkit's cache temp file in
#                            /proc/PID/fd; ours is memory (cache-size)
#   test-cache-block-size.sh no: it tests cache-min-block-size, a key of
#                            nbdkit's cache filter only
#   test-cacheextents.sh     no: another filter (cacheextents)
. "$(dirname "$0")/lib.sh"
filter_init filter-nbdkit-cache-tests
requires nbdsh

run () {   # run NAME NBDSH-SCRIPT NBDKIT-ARGS...
  local name=$1 script=$2
  shift 2
  cd "$tmp"
  timeout $((60 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
    --filter="$FILTER" "$@" \
    --run "env -u LD_PRELOAD nbdsh -u \"\$uri\" -c '$script'" \
    >"$tmp/$name.out" 2>&1 || { cat "$tmp/$name.out"; fail "$name"; }
  check_sanitizer_log "$tmp/$name.out"
  cd - >/dev/null
  echo "$name: ok"
}

# test-cache.sh
truncate -s 128K "$tmp/cache.img"
run test-cache.sh '
buf = b"abcd" * 16384
h.pwrite(buf, 32768)
zero = h.pread(32768, 0)
assert zero == bytearray(32768)
buf2 = h.pread(65536, 32768)
assert buf == buf2
h.flush()
with open("cache.img", "rb") as file:
    zero = file.read(32768)
    assert zero == bytearray(32768)
    buf2 = file.read(65536)
    assert buf == buf2
' file cache.img

# test-cache-unaligned.sh
truncate -s 130000 "$tmp/cache-unaligned.img"
run test-cache-unaligned.sh '
buf = b"abcdefghijklm" * 10000
h.pwrite(buf, 0)
buf2 = h.pread(130000, 0)
assert buf == buf2
h.flush()
with open("cache-unaligned.img", "rb") as file:
    buf2 = file.read(130000)
    assert buf == buf2
' file cache-unaligned.img

# test-cache-on-read.sh
run test-cache-on-read.sh '
buf = b"abcd" * 16384
h.pwrite(buf, 32768)
zero = h.pread(32768, 0)
assert zero == bytearray(32768)
buf2 = h.pread(65536, 32768)
assert buf == buf2
' memory 128K
