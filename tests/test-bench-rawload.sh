#!/bin/bash
# bench/rawload is a real NBD client (the scaling bench trusts its
# figures):
#  - against foliod, its writes land where it says: a --pattern written
#    over a range is read back by nbdsh (and the bytes around the range
#    are untouched), and rawload's own reads of the range check the
#    pattern; reads over a range that holds other data fail;
#  - an export the server does not have is refused with the server's
#    reason; a server's error reply fails the run: against nbdkit's
#    error filter it exits 1 naming EIO.
. "$(dirname "$0")/lib.sh"
lib_init bench-rawload
requires nbdsh nbdkit
RAWLOAD=$BUILD/bench/rawload
[ -x "$RAWLOAD" ] || fail "rawload not built: $RAWLOAD"

img=$tmp/img
truncate -s 64M "$img"
start_foliod --export "disk0=file:$img,cache-size=16M"
u=$(uri disk0)

# 1. Two connections write 0xa5 over 1 MiB + 64 KiB at 3 MiB, each 4 KiB
#    block once (seqwrite, --ops = the blocks, each connection its half).
"$RAWLOAD" --mode seqwrite --pattern 0xa5 --conns 2 --qd 8 --ops 272 \
  --offset 3M --size 1088k "$u" > "$tmp/w.out" 2> "$tmp/w.err" ||
  fail "rawload seqwrite: $(cat "$tmp/w.err")"
grep -q "^ops=272 reads=0 writes=272 errors=0 .*client_cpu_us_per_op=" "$tmp/w.out" ||
  fail "rawload output: $(cat "$tmp/w.out")"
nbdsh -u "$u" -c '
start, n = 3 << 20, 1088 << 10
assert h.pread(n, start) == b"\xa5" * n, "pattern not read back"
assert h.pread(65536, start - 65536) == bytes(65536), "before the range changed"
assert h.pread(65536, start + n) == bytes(65536), "after the range changed"
' || fail "nbdsh does not read back what rawload wrote"

# 2. rawload's reads check the data: the range it wrote passes, one
#    block more (zeros) fails with the offset of the first wrong byte.
"$RAWLOAD" --mode randread --pattern 0xa5 --conns 2 --ops 2000 \
  --offset 3M --size 1088k "$u" > "$tmp/r.out" 2> "$tmp/r.err" ||
  fail "rawload randread of the written range: $(cat "$tmp/r.err")"
"$RAWLOAD" --mode seqread --pattern 0xa5 --ops 273 --offset 3M \
  --size 1092k "$u" > /dev/null 2> "$tmp/r2.err" &&
  fail "rawload read zeros as the pattern"
grep -q "offset $(( (3 << 20) + (1088 << 10) )) reads 0x00, not the pattern 0xa5" "$tmp/r2.err" ||
  fail "no clear message for wrong data: $(cat "$tmp/r2.err")"
# 3. An export the server refuses: its reply and reason are printed.
rc=0
"$RAWLOAD" --mode randread --ops 1 "nbd+unix:///nosuch?socket=$SOCK" \
  > /dev/null 2> "$tmp/x.err" || rc=$?
[ "$rc" = 1 ] || fail "rawload exited $rc for a refused export (want 1)"
grep -q 'refused export "nosuch": NBD_REP_ERR_' "$tmp/x.err" ||
  fail "no clear message for a refused export: $(cat "$tmp/x.err")"
stop_foliod

# 4. An error reply fails the run and is named.
nbdkit -f -U "$tmp/err.sock" --filter=error memory 16M \
  error-pwrite=EIO error-pwrite-rate=100% 2> "$tmp/nbdkit.log" &
track $!
for _ in $(seq $((300 * TSCALE))); do [ -S "$tmp/err.sock" ] && break; sleep 0.1; done
[ -S "$tmp/err.sock" ] || fail "nbdkit did not start"
eu="nbd+unix:///?socket=$tmp/err.sock"
rc=0
"$RAWLOAD" --mode randwrite --ops 100 "$eu" > /dev/null 2> "$tmp/e.err" || rc=$?
[ "$rc" = 1 ] || fail "rawload exited $rc on a write error (want 1)"
grep -q "write at offset [0-9]* failed: error 5 (EIO)" "$tmp/e.err" ||
  fail "no clear message for the error reply: $(cat "$tmp/e.err")"
# Reads of the same server succeed (the error is not made up).
"$RAWLOAD" --mode randread --ops 100 "$eu" > /dev/null ||
  fail "rawload reads of the error-filtered server failed"

echo "rawload: pattern written and read back, errors reported"
