#!/bin/bash
# The config file: every bad case is refused at start with FILE:LINE and
# a reason (non-zero exit, nothing served); --check-config; the command
# line overrides the file; the shipped example is valid.
. "$(dirname "$0")/lib.sh"
lib_init daemon-config
requires nbdinfo

truncate -s 16M "$tmp/img"
conf=$tmp/foliod.conf

# bad_case NAME LINE PATTERN: $conf (written by the caller) must be refused
# by --check-config and by a real start, naming $conf:LINE and PATTERN.
bad_case () {
  local name=$1 line=$2 pattern=$3 rc
  for mode in check start; do
    rc=0
    if [ $mode = check ]; then
      timeout 10 "$FOLIOD" --check-config "$conf" >"$tmp/out" 2>"$tmp/err" || rc=$?
    else
      timeout 10 "$FOLIOD" --foreground --config "$conf" >"$tmp/out" 2>"$tmp/err" || rc=$?
    fi
    [ $rc -ne 0 ] || fail "$name ($mode): accepted"
    [ $rc -ne 124 ] || fail "$name ($mode): hung instead of refusing"
    grep -qF "$conf:$line: " "$tmp/err" ||
      fail "$name ($mode): no '$conf:$line:' in: $(cat "$tmp/err")"
    grep -qE -- "$pattern" "$tmp/err" ||
      fail "$name ($mode): no '$pattern' in: $(cat "$tmp/err")"
  done
}

good_head="[server]
unix = $tmp/sock"
good_export="[export disk0]
backing = file:$tmp/img"

printf '%s\nworkerz = 4\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "unknown server key" 3 "unknown key 'workerz'"

printf '%s\nworkers = many\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "bad number" 3 "bad value 'many' for workers"

printf '%s\nworkers = 2\nworkers = 3\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "duplicate key" 4 "duplicate key 'workers' \(first set at line 3\)"

printf '%s\n%s\ncache-size = 12X\n' "$good_head" "$good_export" > "$conf"
bad_case "bad size" 5 "bad value for cache-size: '12X'"

printf '%s\n%s\nread-only = perhaps\n' "$good_head" "$good_export" > "$conf"
bad_case "bad boolean" 5 "bad value for read-only"

# A whole-export check names the line of the key at fault, not of its
# [export] header (issue 16: folio-size = 3K on line 3 was line 1).
printf '%s\n%s\nfolio_size = 3K\n' "$good_head" "$good_export" > "$conf"
bad_case "folio size not a power of two" 5 "export 'disk0': folio-size must be a power of two"
printf '[export disk0]\nbacking = file:%s\nfolio-size = 3K\n' "$tmp/img" > "$conf"
bad_case "folio-size = 3K on line 3" 3 "^foliod: $conf:3: export 'disk0': folio-size must be a power of two"
printf '%s\n%s\nblock-size = 128K\ncache = writethrough\n' "$good_head" "$good_export" > "$conf"
bad_case "block size over folio size" 5 "block-size \(131072\) must not exceed folio-size"
printf '%s\n%s\nfolio-size = 2M\nread-only = yes\ncache-size = 4M\n' \
  "$good_head" "$good_export" > "$conf"
bad_case "cache of under 4 folios" 7 "cache-size must hold at least 4 folios"
printf '%s\n%s\ndirty-limit = 5\n' "$good_head" "$good_export" > "$conf"
bad_case "dirty-limit under dirty-background" 5 "dirty limits must satisfy"
printf '%s\n%s\nwriteback-interval = 0\n' "$good_head" "$good_export" > "$conf"
bad_case "writeback-interval 0" 5 "writeback interval must be > 0"
printf '%s\n%s\nstore = nvram:/x\n' "$good_head" "$good_export" > "$conf"
bad_case "unknown store" 5 "unknown store 'nvram:/x'"
printf '%s\n%s\nflush = store\n' "$good_head" "$good_export" > "$conf"
bad_case "flush=store with the ram store" 5 "flush=store needs a persistent store"
printf '%s\n%s\nflush = never\n' "$good_head" "$good_export" > "$conf"
bad_case "bad flush value" 5 "bad value for flush: 'never'"

printf '%s\n%s\nflavour = vanilla\n' "$good_head" "$good_export" > "$conf"
bad_case "unknown export key" 5 "unknown export option 'flavour'"

printf '%s\n%s\n\n%s\n' "$good_head" "$good_export" "$good_export" > "$conf"
bad_case "duplicate export" 6 "duplicate export 'disk0' \(first defined at $conf:3\)"

printf '%s\n[export disk1]\ncache = writeback\n' "$good_head" > "$conf"
bad_case "export without backing" 3 "export 'disk1': no backing"

printf 'workers = 2\n%s\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "key outside a section" 1 "outside a section"

printf '%s\n[exports]\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "unknown section" 3 "unknown section \[exports\]"

printf '%s\njust some words\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "not key = value" 3 "expected 'key = value'"

printf '%s\nlisten = localhost\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "listen without port" 3 "bad address 'localhost'"

printf '%s\ntls = maybe\n%s\n' "$good_head" "$good_export" > "$conf"
bad_case "bad tls mode" 3 "bad value 'maybe' for tls"

# Several errors are all reported, each with its line.
printf '%s\nworkerz = 1\nlog-level = loud\n%s\nblock-size = 0\n' \
  "$good_head" "$good_export" > "$conf"
"$FOLIOD" --check-config "$conf" 2>"$tmp/err" && fail "three errors accepted"
[ "$(grep -c "^foliod: $conf:[0-9]*: " "$tmp/err")" -eq 3 ] ||
  fail "expected 3 errors: $(cat "$tmp/err")"

# A missing file.
"$FOLIOD" --check-config "$tmp/absent.conf" 2>"$tmp/err" && fail "absent file accepted"
grep -q "absent.conf: No such file" "$tmp/err" || fail "absent file: $(cat "$tmp/err")"

# The shipped example (also the built-in default) is valid.
"$FOLIOD" --check-config "$TOP/conf/foliod.conf" > "$tmp/out" ||
  fail "conf/foliod.conf refused"
grep -q "OK (1 export)" "$tmp/out" || fail "check-config said: $(cat "$tmp/out")"

# A good file with comments, quotes, suffixes, '_' keys and booleans runs.
cat > "$conf" <<CONF
# comment
; another comment
[server]
unix = $tmp/file.sock
control = ctl.sock
state-dir = $tmp
log_level = debug
handshake-timeout = 5s

[export disk0]
backing = img
cache-size = 8M
folio_size = 16K
read-only = yes
description = "  spaced  "

[export ""]
backing = file:$tmp/img3
CONF
truncate -s 16M "$tmp/img3"   # its own image: two exports on one are refused
"$FOLIOD" --check-config "$conf" >/dev/null || fail "good file refused"

# Command line over file: --unix replaces the file's unix list, --export
# replaces the section of the same name (here: not read-only).
truncate -s 8M "$tmp/img2"
start_foliod --config "$conf" --export "disk0=$tmp/img2"
[ ! -S "$tmp/file.sock" ] || fail "--unix did not replace the file's unix"
nbdinfo "$(uri disk0)" > "$tmp/info"
grep -q "export-size: 8388608" "$tmp/info" || fail "--export did not replace [export disk0]"
grep -q "is_read_only: false" "$tmp/info" || fail "file options leaked into --export"
# The empty-named export from the file is served too; relative control
# path resolved in state-dir.
nbdinfo "nbd+unix:///?socket=$SOCK" | grep -q "export-size: 16777216" ||
  fail "export \"\" missing"
[ -S "$tmp/ctl.sock" ] || fail "control socket not created in state-dir"
stop_foliod

# Without overrides the file's own values apply.
SOCK_PATH=$tmp/file.sock
FOLIOD_LOG=$tmp/foliod2.log
timeout 60 "$FOLIOD" --foreground --config "$conf" 2>"$FOLIOD_LOG" &
FOLIOD_PID=$!; track $FOLIOD_PID
SOCK=$tmp/file.sock
wait_for_socket "$SOCK" 20
nbdinfo "$(uri disk0)" > "$tmp/info"
grep -q "is_read_only: true" "$tmp/info" || fail "read-only from the file ignored"
grep -q "description:   spaced  " "$tmp/info" || fail "quoted description: $(grep description "$tmp/info")"
grep -q "debug:" "$FOLIOD_LOG" || fail "log_level = debug ignored"
stop_foliod
echo OK
