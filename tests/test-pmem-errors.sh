#!/bin/bash
# A pmem store foliod must not use is refused at start-up, with an error
# naming the file and the reason and a non-zero exit: another geometry,
# another backing, both headers corrupt, a truncated file, a read-only
# file, a store another foliod holds.  A refusal changes nothing: the
# dirty data stays in the store, and the right export recovers it.
. "$(dirname "$0")/lib.sh"
lib_init pmem-errors
requires nbdsh

st=$tmp/store
slow=dirty-expire=3600000,writeback-interval=3600000
keys=cache-size=4M,$slow
truncate -s 8M "$tmp/img"
truncate -s 8M "$tmp/other"

# refused WHAT PATTERN EXPORT-SPEC: foliod exits non-zero saying PATTERN.
refused () {
  local rc=0
  timeout $((20 * TSCALE)) "$FOLIOD" --foreground --unix "$tmp/sock2" \
    --export "$3" >"$tmp/out" 2>&1 || rc=$?
  [ "$rc" -ne 124 ] || fail "$1: hung"
  [ "$rc" -ne 0 ] || fail "$1: started"
  grep -qE -- "$2" "$tmp/out" || fail "$1: no '$2' in: $(cat "$tmp/out")"
  check_sanitizer_log "$tmp/out"
}
dirty_of () {
  "$FOLIOD" store inspect "$1" | sed -n 's/^dirty: \([0-9]*\) bytes$/\1/p'
}

# A store with dirty data in it, left by a foliod that was killed.
start_foliod --pidfile "$tmp/pid" --export "d=file:$tmp/img,store=pmem:$st,$keys"
timeout 30 nbdsh -u "$(uri d)" -c 'h.pwrite(b"x" * 20000, 3000); h.flush()' ||
  fail "write"
kill9_foliod "$tmp/pid"
dirty=$(dirty_of "$st")
[ "$dirty" -gt 0 ] || fail "no dirty data in the store"

refused "other folio-size" "$st: store has another geometry: folio-size 65536" \
  "d=file:$tmp/img,store=pmem:$st,$keys,folio-size=32K"
refused "other cache-size" "$st: store has another geometry: .* 64 slots.*the export wants .* 128" \
  "d=file:$tmp/img,store=pmem:$st,cache-size=8M,$slow"
refused "other backing" "$st: store belongs to another backing: 'file:$tmp/img'" \
  "d=file:$tmp/other,store=pmem:$st,$keys"
refused "flush=store without a pmem store" "flush=store needs a persistent store" \
  "d=file:$tmp/img,flush=store"
refused "unknown store" "unknown store 'nvram:/x'" "d=file:$tmp/img,store=nvram:/x"

cp "$st" "$tmp/torn"
printf 'X' | dd of="$tmp/torn" bs=1 seek=40 conv=notrunc status=none
printf 'X' | dd of="$tmp/torn" bs=1 seek=$((4096 + 40)) conv=notrunc status=none
refused "both headers corrupt" "$tmp/torn: both store headers are corrupt" \
  "d=file:$tmp/img,store=pmem:$tmp/torn,$keys"

cp "$st" "$tmp/short"
truncate -s 3M "$tmp/short"
refused "truncated" "$tmp/short: store truncated" \
  "d=file:$tmp/img,store=pmem:$tmp/short,$keys"

cp "$st" "$tmp/ro"
chmod 0444 "$tmp/ro"
refused "read-only" "$tmp/ro: store is read-only" \
  "d=file:$tmp/img,store=pmem:$tmp/ro,$keys"

mkdir "$tmp/dir"
refused "a directory" "$tmp/dir: " "d=file:$tmp/img,store=pmem:$tmp/dir,$keys"

[ "$(dirty_of "$st")" = "$dirty" ] || fail "a refusal changed the store"

# The right export recovers it; a second foliod on the same store is
# refused while the first holds it (by the image's lock, and with
# locking=off by the store's own).
start_foliod --export "d=file:$tmp/img,store=pmem:$st,$keys"
refused "image in use" "$tmp/img: in use" \
  "d=file:$tmp/img,store=pmem:$st,$keys"
refused "in use" "$st: store is in use by another foliod \(locked\)" \
  "d=file:$tmp/img,locking=off,store=pmem:$st,$keys"
timeout 30 nbdsh -u "$(uri d)" -c 'assert h.pread(20000, 3000) == b"x" * 20000' ||
  fail "dirty data lost after the refusals"
stop_foliod
cmp -s <(head -c 20000 /dev/zero | tr '\0' x) <(tail -c +3001 "$tmp/img" | head -c 20000) ||
  fail "backing lacks the data after SIGTERM"
echo ok
