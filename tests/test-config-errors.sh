#!/bin/bash
# Configuration errors: one run reports every error of every export, each
# with FILE:LINE (or its --export) and a reason, and a real start refuses
# what --check-config refuses.  Duplicate keys in --export; cache-size
# beyond this host's memory; a file backing that is a directory, a device
# node or missing; export names no NBD client can ask for; a bad
# handshake-timeout with an "s"; file://RELATIVE with create-size.
. "$(dirname "$0")/lib.sh"
lib_init config-errors
requires nbdinfo

truncate -s 16M "$tmp/img"
mkdir "$tmp/dir"
conf=$tmp/foliod.conf
out=$tmp/out
err=$tmp/err

# refused WHAT ARGS...: foliod ARGS exits non-zero, neither hung nor with
# a sanitizer report.
refused () {
  local what=$1 rc=0
  shift
  timeout $(( 10 * TSCALE )) "$FOLIOD" "$@" >"$out" 2>"$err" || rc=$?
  [ $rc -ne 0 ] || fail "$what: accepted: foliod $*"
  [ $rc -ne 124 ] || fail "$what: hung: foliod $*"
  check_sanitizer_log "$err"
}

# says WHAT TEXT...: the last run's stderr holds each TEXT (fixed strings).
says () {
  local what=$1 t
  shift
  for t in "$@"; do
    grep -qF -- "$t" "$err" || fail "$what: no '$t' in: $(cat "$err")"
  done
}

# conf_refused WHAT TEXT...: $conf is refused by --check-config and by a
# real start, and both say each TEXT.
conf_refused () {
  local what=$1
  shift
  refused "$what (check)" --check-config "$conf"
  says "$what (check)" "$@"
  refused "$what (start)" --foreground --config "$conf"
  says "$what (start)" "$@"
}

head="[server]
unix = $tmp/s"

# A duplicate key inside one --export, in either spelling, is refused as
# the config file refuses it; every error of the --export is named.
refused "duplicate --export key" --foreground --unix "$tmp/s" \
  --export "disk0=$tmp/img,cache-size=1M,cache_size=2M"
says "duplicate --export key" "duplicate key 'cache-size'"
refused "backing given twice" --foreground --unix "$tmp/s" \
  --export "disk0=$tmp/img,backing=$tmp/img"
says "backing given twice" "duplicate key 'backing'"
refused "two --export errors" --foreground --unix "$tmp/s" \
  --export "disk0=$tmp/img,colour=blue,folio-size=3000"
says "two --export errors" "unknown export option 'colour'" \
  "folio-size must be a power of two"

# Every error of every export at once, each at the line of the key at
# fault (the [export] line when no key is: no backing).
cat > "$conf" <<CONF
$head
handshake-timeout = 99999s
[export a]
backing = file:$tmp/img
flavour = vanilla
folio-size = 3K
cache-size = 1M
cache-size = 2M
[export b]
backing = $tmp/dir
[export c]
backing = file:$tmp/absent
[export d]
backing = /dev/null
[export e]
cache = none
CONF
conf_refused "every error" \
  "$conf:3: bad value '99999s' for handshake-timeout" \
  "$conf:6: export 'a': unknown export option 'flavour'" \
  "$conf:9: duplicate key 'cache-size' (first set at line 8)" \
  "$conf:7: export 'a': folio-size must be a power of two" \
  "$conf:11: export 'b': file backing $tmp/dir is a directory: expected a regular file or a block device" \
  "$conf:13: export 'c': file backing $tmp/absent: No such file or directory" \
  "$conf:15: export 'd': file backing /dev/null is a special file" \
  "$conf:16: export 'e': no backing given"
[ "$(grep -c "^foliod: $conf:[0-9]*: " "$err")" -eq 8 ] ||
  fail "expected 8 errors: $(cat "$err")"

# The directory alone: the only error, at start too.
printf '%s\n[export b]\nbacking = file:%s\n' "$head" "$tmp/dir" > "$conf"
conf_refused "directory" "$conf:4: export 'b': file backing $tmp/dir is a directory"
refused "directory (--export)" --foreground --unix "$tmp/s" \
  --export "disk0=$tmp/dir"
says "directory (--export)" "--export disk0: file backing $tmp/dir is a directory"

# handshake-timeout with an "s" out of range, alone (ASan: the message
# once read a dead stack buffer).
printf '%s\nhandshake-timeout = 99999s\n[export a]\nbacking = %s\n' \
  "$head" "$tmp/img" > "$conf"
conf_refused "handshake-timeout" \
  "$conf:3: bad value '99999s' for handshake-timeout (expected SECONDS)"

# Export names: the NBD protocol caps strings at 4096 bytes.
long=$(head -c 5000 /dev/zero | tr '\0' n)
printf '%s\n[export %s]\nbacking = %s\n' "$head" "$long" "$tmp/img" > "$conf"
conf_refused "5000-byte name" \
  "$conf:3: export name of 5000 bytes" "at most 4096 bytes"
refused "4097-byte name (--export)" --foreground --unix "$tmp/s" \
  --export "${long:0:4097}=$tmp/img"
says "4097-byte name (--export)" "export name of 4097 bytes"
printf '%s\n[export %s]\nbacking = %s\n' "$head" "${long:0:4096}" "$tmp/img" \
  > "$conf"
"$FOLIOD" --check-config "$conf" >"$out" 2>"$err" ||
  fail "4096-byte name refused: $(cat "$err")"

# cache-size over all exports beyond RAM + swap: refused, naming the sum,
# every export and the host's memory.
mem_kib=$(awk '$1 == "MemTotal:" { print $2 }' /proc/meminfo)
swap_kib=$(awk '$1 == "SwapTotal:" { print $2 }' /proc/meminfo)
each=$(( (mem_kib + swap_kib) / 2 + 1048576 ))K
refused "cache-size beyond memory" --foreground --unix "$tmp/s" \
  --export "big0=$tmp/img,cache-size=$each" \
  --export "big1=$tmp/img,cache-size=$each"
says "cache-size beyond memory" "cache-size of all exports adds up to" \
  "big0 " "big1 " "RAM + " "swap"
printf '%s\n[export a]\nbacking = %s\ncache-size = %s\n[export b]\nbacking = %s\ncache-size = %s\n' \
  "$head" "$tmp/img" "$each" "$tmp/img" "$each" > "$conf"
conf_refused "cache-size beyond memory (file)" "cache-size of all exports adds up to"
# Beyond RAM but within swap: a warning, and it serves.
if [ "$swap_kib" -gt 2097152 ]; then
  each=$(( mem_kib / 2 + 524288 ))K
  start_foliod --export "big0=$tmp/img,cache-size=$each" \
    --export "big1=$tmp/img,cache-size=$each"
  grep -q "warning: cache-size of all exports adds up to" "$FOLIOD_LOG" ||
    fail "no warning for cache-size beyond RAM"
  stop_foliod
else
  echo "no swap over 2 GiB: the warning case (beyond RAM, within swap) is not run"
fi

# A good configuration says nothing but OK: a missing file is fine when
# create-size makes it, in state-dir, also spelled file://RELATIVE.
rel=foliod-config-errors-$$.img
cat > "$conf" <<CONF
[server]
unix = $tmp/sock
state-dir = $tmp
[export plain]
backing = new.img
create-size = 4M
[export url]
backing = file://$rel
create-size = 8M
CONF
"$FOLIOD" --check-config "$conf" >"$out" 2>"$err" ||
  fail "create-size config refused: $(cat "$err")"
[ ! -s "$err" ] || fail "good config: stderr: $(cat "$err")"
SOCK_PATH=$tmp/sock start_foliod --config "$conf"
rm -f "/$rel"        # where file://RELATIVE once created it
[ "$(stat -c %s "$tmp/$rel" 2>/dev/null)" = 8388608 ] ||
  fail "file://$rel with create-size not created in state-dir"
nbdinfo "$(uri url)" | grep -q "export-size: 8388608" || fail "export url"
nbdinfo "$(uri plain)" | grep -q "export-size: 4194304" || fail "export plain"
stop_foliod
echo OK
