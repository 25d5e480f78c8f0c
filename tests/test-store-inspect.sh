#!/bin/bash
# foliod store inspect PATH: a pmem store's headers, geometry, backing,
# clean flag and dirty bytes, read offline; clear errors for what is not a
# store, a corrupt one, and one a foliod holds.  The stores come from
# tests/tools/pmem-store until the cache makes them.
. "$(dirname "$0")/lib.sh"
lib_init store-inspect

tool=$BUILD/tests/tools/pmem-store
st=$tmp/store
out=$tmp/out
err=$tmp/err

# inspect_fail WHAT PATTERN PATH: foliod store inspect fails saying PATTERN.
inspect_fail () {
  local rc=0
  timeout 10 "$FOLIOD" store inspect "$3" >"$out" 2>"$err" || rc=$?
  [ "$rc" -ne 0 ] || fail "$1: exit 0"
  [ "$rc" -ne 124 ] || fail "$1: hung"
  grep -qE -- "$2" "$err" || fail "$1: no '$2' in: $(cat "$err")"
}

# 20 dirty blocks of 4 KiB, shut down cleanly.
"$tool" make "$st" 20 clean || fail "pmem-store make failed"
timeout 10 "$FOLIOD" store inspect "$st" >"$out" || fail "inspect: exit $?"
cat "$out"
# (format: A=1, B=2; in use, into both: A=3, B=4; clean: A=5.)
for want in "^store: $st\$" "^header A: valid, seq 5 \(current\)\$" \
    "^header B: valid, seq 4\$" \
    "^geometry: folio-size 65536, block-size 4096, slots 8, export-size 1048576\$" \
    "^backing: file:/backing, 1048576 bytes\$" "^state: clean\$" \
    "^granularity: (page|cache-line|byte)\$" "^folios: 2 of 8 slots\$" \
    "^dirty: 81920 bytes\$"; do
  grep -qE -- "$want" "$out" || fail "inspect: no '$want'"
done

# Killed before its clean shutdown: not clean, the dirty data still there.
rm -f "$st"
"$tool" make "$st" 3 unclean || fail "pmem-store make failed"
"$FOLIOD" store inspect "$st" >"$out" || fail "inspect: exit $?"
grep -q '^state: not clean' "$out" || fail "unclean store reads clean"
grep -q '^dirty: 12288 bytes$' "$out" || fail "dirty bytes: $(cat "$out")"

# One header copy torn: the other answers; both: refused.
printf 'X' | dd of="$st" bs=1 seek=40 conv=notrunc status=none
"$FOLIOD" store inspect "$st" >"$out" || fail "inspect with copy A torn"
grep -q '^header A: bad checksum' "$out" || fail "copy A: $(cat "$out")"
grep -q '^header B: valid, seq 4 (current)$' "$out" || fail "copy B: $(cat "$out")"
printf 'X' | dd of="$st" bs=1 seek=$((4096 + 40)) conv=notrunc status=none
inspect_fail "both copies torn" "$st: both store headers are corrupt" "$st"

# Not a store at all, missing, usage.
head -c 1M /dev/urandom >"$tmp/junk"
inspect_fail "junk file" "$tmp/junk: not a foliod store \(bad magic\)" "$tmp/junk"
truncate -s 1M "$tmp/zero"
inspect_fail "zero file" "$tmp/zero: not a foliod store \(never formatted\)" \
  "$tmp/zero"
inspect_fail "missing file" "$tmp/none: No such file" "$tmp/none"
rc=0; "$FOLIOD" store inspect 2>"$err" || rc=$?
[ $rc -ne 0 ] && grep -q 'usage: foliod store inspect PATH' "$err" ||
  fail "no usage error: $(cat "$err")"

# A store in use is refused, naming it, and readable once released.
rm -f "$st"
"$tool" make "$st" 1 clean || fail "pmem-store make failed"
coproc HOLD { exec timeout 30 "$tool" hold "$st"; }
hold_pid=$HOLD_PID   # bash unsets HOLD_PID once it reaps the coprocess
read -r -t 10 line <&"${HOLD[0]}" && [ "$line" = held ] ||
  fail "pmem-store hold did not start"
inspect_fail "store in use" "$st: store is in use by another foliod" "$st"
exec {HOLD[1]}>&-
wait "$hold_pid" || fail "pmem-store hold: exit $?"
"$FOLIOD" store inspect "$st" >/dev/null || fail "inspect after release"
echo "ok"
