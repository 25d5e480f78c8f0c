# Shared helpers for the integration scripts (tests/test-*.sh).  Source it:
#
#   . "$(dirname "$0")/lib.sh"
#   lib_init server-nbdinfo            # temp dir $tmp, cleanup trap
#   requires nbdinfo nbdsh             # exit 77 if a tool is missing
#   truncate -s 64M "$tmp/img"
#   start_foliod --export disk0=file:$tmp/img,cache-size=64M
#   nbdinfo "$(uri disk0)"
#   stop_foliod                        # SIGTERM, wait, fail unless exit 0
#
# Environment from make check: TOP, BUILD, FOLIOD, PLUGIN, SAN.
# Others may ADD functions at the end of this file.

set -euo pipefail
export PATH=/usr/bin:$PATH

: "${TOP:=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}"
: "${BUILD:=$TOP/build}"
: "${FOLIOD:=$BUILD/foliod}"

# Sanitizer builds are slower: scale timeouts.
if [ "${SAN:-}" = 1 ]; then TSCALE=3; else TSCALE=1; fi
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_leaks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# The Python clients import tests/py (modelclient: seed and model).
export PYTHONPATH=$TOP/tests/py${PYTHONPATH:+:$PYTHONPATH}

_lib_pids=()          # every background process a test started
FOLIOD_PID=           # the foliod started last
FOLIOD_LOG=           # its log file
SOCK=                 # its Unix socket

fail () {
  echo "FAIL: $*" >&2
  if [ -n "$FOLIOD_LOG" ] && [ -f "$FOLIOD_LOG" ]; then
    echo "--- last lines of $FOLIOD_LOG:" >&2
    tail -n 20 "$FOLIOD_LOG" >&2
  fi
  exit 1
}

skip () {
  echo "SKIP: $*"
  exit 77
}

# requires CMD...: skip the test when a tool is not installed.
requires () {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || skip "$c not installed"
  done
}

# _lib_ours PID: is PID still a process of this test?  A tracked process
# may have exited long ago and its pid gone to another process (another
# test's foliod, a make check beside this one): only a child of this
# shell (not reaped yet, so its pid is not reused) or a process whose
# command line names this test's $tmp is.  (Cleanup used to SIGKILL every
# pid a test had tracked: test-daemon-upgrade's 2000 past foliods killed
# whatever ran under those pids by then, seen as another test's foliod or
# nbdkit dying of SIGKILL.)  Builtins only: no fork per pid.
_lib_ours () {
  local st args
  [ -r "/proc/$1/stat" ] || return 1
  read -r -a st 2>/dev/null < "/proc/$1/stat" || return 1
  [ "${st[3]:-}" = "$$" ] && return 0
  mapfile -d '' -t args 2>/dev/null < "/proc/$1/cmdline" || return 1
  [ -n "${tmp:-}" ] && [[ " ${args[*]} " == *"$tmp"* ]]
}

_lib_cleanup () {
  local p d args
  for p in "${_lib_pids[@]}"; do
    _lib_ours "$p" || continue
    # A tracked "timeout CMD" would not pass SIGKILL on: kill its children.
    pkill -KILL -P "$p" 2>/dev/null || true
    kill -KILL "$p" 2>/dev/null || true
  done
  # And any process left that names $tmp (a foliod whose timeout wrapper
  # alone was killed, say): $tmp is this test's own.
  if [ -n "${tmp:-}" ]; then
    for d in /proc/[0-9]*; do
      p=${d#/proc/}
      [ "$p" != "$$" ] && [ "$p" != "$BASHPID" ] || continue
      mapfile -d '' -t args 2>/dev/null < "$d/cmdline" || continue
      [[ " ${args[*]} " == *"$tmp"* ]] && kill -KILL "$p" 2>/dev/null || true
    done
  fi
  wait 2>/dev/null || true
  if [ -n "${tmp:-}" ] && [ -d "$tmp" ]; then
    rm -rf "$tmp"
  fi
}

# lib_init NAME [NEED_MIB]: make $tmp and arrange cleanup on exit.  With
# NEED_MIB, $tmp goes to /dev/shm when it has that much room (big data
# tests would otherwise spend their time waiting for the disk).
lib_init () {
  local base=/tmp
  [ -x "$FOLIOD" ] || fail "foliod not built: $FOLIOD"
  if [ -n "${2:-}" ] && [ -d /dev/shm ] && [ -w /dev/shm ] &&
     [ "$(df -Pm /dev/shm | awk 'NR == 2 { print $4 }')" -gt "$2" ]; then
    base=/dev/shm
  fi
  tmp=$(mktemp -d "$base/foliod-$1-XXXXXX")
  trap _lib_cleanup EXIT
  trap 'exit 130' INT TERM
}

# track PID: have cleanup kill a process the test started itself.
track () {
  _lib_pids+=("$1")
}

# uri EXPORT [SOCKET]: the NBD URI of an export on the test socket.
uri () {
  echo "nbd+unix:///$1?socket=${2:-$SOCK}"
}

# wait_for_socket SOCKET SECONDS: until something accepts NBD there.
wait_for_socket () {
  local sock=$1 i n=$(( $2 * 10 ))
  for ((i = 0; i < n; i++)); do
    # READY_ON_SOCKET=1: the socket existing is enough (a TLS-only
    # server refuses the plaintext probe).
    if [ -S "$sock" ] && { [ "${READY_ON_SOCKET:-0}" = 1 ] ||
       nbdinfo --list "nbd+unix:///?socket=$sock" >/dev/null 2>&1; }; then
      return 0
    fi
    if [ -n "$FOLIOD_PID" ] && ! kill -0 "$FOLIOD_PID" 2>/dev/null; then
      fail "foliod exited during start-up"
    fi
    sleep 0.1
  done
  fail "nothing answers on $sock after $2 s"
}

# start_foliod ARGS...: foliod --foreground --unix $tmp/sock ARGS, in the
# background, logging to $tmp/foliod.log; returns once it answers.
# Sets FOLIOD_PID, FOLIOD_LOG, SOCK.  Extra sockets/listeners may be given
# in ARGS.  START_TIMEOUT (s) bounds the run (default 600).
start_foliod () {
  SOCK=${SOCK_PATH:-$tmp/sock}
  FOLIOD_LOG=$tmp/foliod.log
  rm -f "$SOCK"
  timeout --signal=KILL $(( ${START_TIMEOUT:-600} * TSCALE )) \
    "$FOLIOD" --foreground --unix "$SOCK" "$@" >>"$FOLIOD_LOG" 2>&1 &
  FOLIOD_PID=$!
  track "$FOLIOD_PID"
  wait_for_socket "$SOCK" $(( 20 * TSCALE ))
}

# start_detached ARGS...: foliod --unix $tmp/sock --pidfile $tmp/pid ARGS,
# detaching (no -f); returns once the parent has exited (the daemon is
# ready).  What it wrote to its terminal is in $tmp/term.  Sets
# DETACHED_PID (tracked) and SOCK.
start_detached () {
  SOCK=$tmp/sock
  rm -f "$SOCK" "$tmp/pid"
  timeout $(( 120 * TSCALE )) "$FOLIOD" --unix "$SOCK" --pidfile "$tmp/pid" \
    "$@" </dev/null >"$tmp/term" 2>&1 ||
    fail "foliod (detaching) failed: $(cat "$tmp/term")"
  DETACHED_PID=$(cat "$tmp/pid")
  track "$DETACHED_PID"
  tr '\0' ' ' < "/proc/$DETACHED_PID/cmdline" |
    grep -q -- "--pidfile $tmp/pid" || fail "the pid file does not name our foliod"
}

# wait_gone PID TENTHS: wait up to TENTHS tenths of a second (scaled) for
# PID to exit; 1 if it still runs then.  PID must be one the test
# started (pids are reused quickly on a busy machine).
wait_gone () {
  local pid=$1 tenths=$2 i
  for ((i = 0; i < tenths * TSCALE; i++)); do
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.1
  done
  ! kill -0 "$pid" 2>/dev/null
}

# stop_foliod [SIGNAL]: signal foliod (default TERM) and wait for it; fails
# the test unless it exits 0 within 60 s (scaled) and its log holds no
# sanitizer report.
stop_foliod () {
  local sig=${1:-TERM} rc=0
  [ -n "$FOLIOD_PID" ] || return 0
  kill -"$sig" "$FOLIOD_PID" 2>/dev/null || true
  wait_gone "$FOLIOD_PID" 600 || fail "foliod still running after SIG$sig"
  wait "$FOLIOD_PID" || rc=$?
  FOLIOD_PID=
  check_sanitizer_log "$FOLIOD_LOG"
  [ "$rc" -eq 0 ] || fail "foliod exited with status $rc"
}

# kill9_foliod PIDFILE: SIGKILL the foliod whose pid file that is (it may
# have daemonised: FOLIOD_PID is then its parent) and reap the one we
# started.
kill9_foliod () {
  kill -KILL "$(cat "$1")" || fail "no foliod to kill"
  wait "$FOLIOD_PID" 2>/dev/null || true
  FOLIOD_PID=
}

# foliod_stat CONTROL NAME [EXPORT]: a value of foliod stats --prometheus,
# the export's (default disk0) or one without a label; the whole output
# stays in $tmp/stats.prom.
foliod_stat () {
  "$FOLIOD" stats --control "$1" --prometheus > "$tmp/stats.prom" ||
    fail "foliod stats"
  awk -v n="$2" -v e="${3:-disk0}" \
    '$1 == n "{export=\"" e "\"}" || $1 == n {print $2}' "$tmp/stats.prom"
}

# wait_for_text FILE REGEX WHAT [TENTHS]: wait up to TENTHS tenths of a
# second (100; scaled) until a line of FILE matches REGEX (a log line, a
# background client saying it is up); else fail with WHAT and FILE's end.
wait_for_text () {
  local i
  for ((i = 0; i < ${4:-100} * TSCALE; i++)); do
    grep -q "$2" "$1" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "$3: $(tail -n 20 "$1")"
}

# flush_must_fail URI WHY: a client FLUSH on URI must fail (within 60 s,
# scaled); else the test fails with WHY.
flush_must_fail () {
  timeout $((60 * TSCALE)) nbdsh -u "$1" -c '
try:
    h.flush()
    raise SystemExit("FLUSH succeeded")
except nbd.Error as e:
    print("FLUSH failed as it must:", e)
' || fail "$2"
}

# foliod_alive: fail unless the foliod started last still runs.
foliod_alive () {
  kill -0 "$FOLIOD_PID" 2>/dev/null || fail "foliod died"
}

# check_sanitizer_log FILE: fail if ASan/UBSan/LSan reported anything.
check_sanitizer_log () {
  if grep -qE 'AddressSanitizer|LeakSanitizer|runtime error:' "$1" 2>/dev/null
  then
    grep -E -A 20 'AddressSanitizer|LeakSanitizer|runtime error:' "$1" >&2
    fail "sanitizer report in $1"
  fi
}

# sum_file FILE: sha256 of a whole file.
sum_file () {
  sha256sum < "$1" | cut -d' ' -f1
}

# sum_range FILE OFFSET LENGTH: sha256 of a byte range.
sum_range () {
  tail -c +$(( $2 + 1 )) "$1" | head -c "$3" | sha256sum | cut -d' ' -f1
}

# random_file FILE SIZE_MIB: SIZE_MIB MiB of random data (fast: openssl
# keystream when available, else /dev/urandom).
random_file () {
  local n=$(( $2 * 1024 * 1024 ))
  # The producer dies of SIGPIPE when head has enough: check the size.
  if command -v openssl >/dev/null 2>&1; then
    { openssl enc -aes-128-ctr -pass pass:"$RANDOM$RANDOM" -nosalt -pbkdf2 \
        < /dev/zero 2>/dev/null || true; } | head -c "$n" > "$1"
  else
    head -c "$n" /dev/urandom > "$1"
  fi
  [ "$(stat -c %s "$1")" -eq "$n" ] || fail "random_file $1: short"
}

# ---- nbdkit-folio-plugin tests (tests/test-plugin-*.sh) ----

# plugin_init NAME: like lib_init for the plugin tests: needs $PLUGIN and
# nbdkit (not foliod), makes $tmp, arranges cleanup, and fills the array
# NBDKIT_ENV: run nbdkit as  env "${NBDKIT_ENV[@]}" nbdkit ...
# In the sanitizer build (SAN=1) the plugin is instrumented but nbdkit is
# not, so NBDKIT_ENV preloads the ASan runtime (clients started by --run
# must drop it again: env -u LD_PRELOAD).  It also preloads a one-line shim
# making freelocale() a no-op: with libasan preloaded, glibc's
# __libc_setlocale_lock ends up with a reader count of -1 after any
# strerror()/%m, and p11-kit's destructor (nbdkit links gnutls) then
# deadlocks in freelocale() during exit().  Reproducible without foliod:
# a 5-line program that calls gnutls_global_init(), strerror(), exit().
plugin_init () {
  : "${PLUGIN:?PLUGIN not set (run through make check)}"
  [ -f "$PLUGIN" ] || fail "plugin not built: $PLUGIN"
  requires nbdkit
  tmp=$(mktemp -d "/tmp/foliod-$1-XXXXXX")
  trap _lib_cleanup EXIT
  trap 'exit 130' INT TERM
  NBDKIT_ENV=()
  if [ "${SAN:-}" = 1 ]; then
    printf '%s\n' '#include <locale.h>' 'void freelocale (locale_t l) { (void) l; }' |
      cc -shared -fPIC -x c -o "$tmp/san-shim.so" - || fail "cannot build the shim"
    NBDKIT_ENV=(LD_PRELOAD="$(gcc -print-file-name=libasan.so) $tmp/san-shim.so"
                ASAN_OPTIONS=detect_leaks=1
                UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1)
  fi
}

# ---- foliod that must refuse to start (tests/test-file-*.sh) ----

# start_refused WHAT TEXT ARGS...: foliod --foreground --unix $tmp/sock.refused
# ARGS must exit non-zero within 10 s (scaled) with TEXT (a fixed string)
# in its output, which stays in $tmp/refused.out.
start_refused () {
  local what=$1 text=$2 rc=0 out=$tmp/refused.out
  shift 2
  timeout $(( 10 * TSCALE )) "$FOLIOD" --foreground \
    --unix "$tmp/sock.refused" "$@" >"$out" 2>&1 || rc=$?
  [ $rc -ne 0 ] || fail "$what: accepted: foliod $*"
  [ $rc -ne 124 ] ||
    fail "$what: not refused: still running after 10 s: foliod $*"
  check_sanitizer_log "$out"
  grep -qF -- "$text" "$out" || fail "$what: no '$text' in: $(cat "$out")"
}

# ---- the nbdkit filter (tests/test-filter-*.sh) ----

# filter_init NAME: as plugin_init (temp dir, the sanitizer shim in
# NBDKIT_ENV) for a test of $FILTER, nbdkit-folio-filter.so.
# In the sanitizer build, leak reports are off for these nbdkit processes:
# nbdkit 1.32 itself leaks (24 bytes in its memory plugin, seen with no
# filter and with --filter=cache; 280 bytes from /usr/sbin/nbdkit now and
# then), and a suppression by module would hide the filter's own leaks as
# well (nbdkit is in every stack).  ASan's other checks stay on; the code
# below the filter's adapter is leak-checked by the plugin's and foliod's
# tests.
filter_init () {
  : "${FILTER:=$BUILD/nbdkit-folio-filter.so}"
  [ -f "$FILTER" ] || fail "filter not built: $FILTER"
  PLUGIN=${PLUGIN:-$BUILD/nbdkit-folio-plugin.so} plugin_init "$1"
  if [ "${SAN:-}" = 1 ]; then
    NBDKIT_ENV=("${NBDKIT_ENV[@]/#ASAN_OPTIONS=detect_leaks=1/ASAN_OPTIONS=detect_leaks=0}")
  fi
}

# filter_flush_error_files: the pieces of the tiny-cache, failing-flush
# test of the filter, shared by test-filter-flush-error.sh (Debian 12's
# nbdkit) and test-filter-nbdkit142.sh (Debian 13's): $img (16 MiB,
# empty), the sh plugin $tmp/plugin.sh over it whose flush fails while
# $fail_file exists, and the client $tmp/fe.py (its URI in $uri; its
# arguments $fail_file, the log filter's file $plog, and where to write
# what the image must then hold).  fe.py fails unless every byte reads
# back through failed FLUSHes and what was written back before a failed
# flush reaches the plugin again.  The script's dd runs without the
# sanitizer build's LD_PRELOAD (ASan rejects dd's aligned_alloc).
# nbdkit runs them as
#   nbdkit --filter=FOLIO --filter=log sh $tmp/plugin.sh cache-size=1M \
#     dirty-expire=600000 logfile=$plog --run "python3 $tmp/fe.py ..."
filter_flush_error_files () {
  img=$tmp/disk.img
  truncate -s 16M "$img"
  fail_file=$tmp/flush-fails
  plog=$tmp/plugin.log
  cat > "$tmp/plugin.sh" <<EOF2
#!/bin/bash
case "\$1" in
  get_size) echo 16777216 ;;
  can_write|can_flush) exit 0 ;;
  pread) env -u LD_PRELOAD dd if=$img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
  pwrite) env -u LD_PRELOAD dd of=$img seek=\$4 conv=notrunc oflag=seek_bytes status=none ;;
  flush) if [ -e $fail_file ]; then echo 'EIO flush fails' >&2; exit 1; fi ;;
  *) exit 2 ;;
esac
EOF2
  chmod +x "$tmp/plugin.sh"

  cat > "$tmp/fe.py" <<'EOF2'
import os, random, sys
import nbd
fail_file, plog, model_out = sys.argv[1:4]
h = nbd.NBD()
h.connect_uri(os.environ["uri"])
rng = random.Random(7)
model = bytearray(16 << 20)
for k in range(32):                    # 4 MiB in 128 KiB writes, cache 1 MiB
    off = (1 << 20) + k * (128 << 10)
    d = rng.randbytes(128 << 10)
    h.pwrite(d, off)
    model[off:off + len(d)] = d
h.flush()
open(fail_file, "w").close()           # the plugin's flush fails from now
for k in range(4):                     # 256 KiB: room in the cache
    off = (8 << 20) + k * (64 << 10) + 512
    d = rng.randbytes(64 << 10)
    h.pwrite(d, off)
    model[off:off + len(d)] = d
try:
    h.flush()
    sys.exit("FAIL: FLUSH succeeded while the plugin's flush fails")
except nbd.Error as e:
    print("FLUSH failed as it must:", e.string)
try:
    h.flush()
    sys.exit("FAIL: a second FLUSH succeeded while the plugin's flush fails")
except nbd.Error:
    pass
if h.pread(16 << 20, 0) != model:
    sys.exit("FAIL: data read back differs after the failed FLUSH")
os.unlink(fail_file)                   # the plugin's flush works again
h.flush()
# What was written back before a failed plugin flush may be lost: it must
# reach the plugin again after the LAST failed flush (the background
# writeback may do it before the client's good FLUSH, or that FLUSH).
lines = open(plog).read().splitlines()
last_fail = max(i for i, line in enumerate(lines)
                if "...Flush" in line and "return=-1" in line)
rewrites = sum(1 for line in lines[last_fail + 1:] if " Write " in line)
print("writes the plugin got after its last failed flush:", rewrites)
if rewrites == 0:
    sys.exit("FAIL: nothing written again after a failed flush")
if h.pread(16 << 20, 0) != model:
    sys.exit("FAIL: data read back differs after FLUSH")
open(model_out, "wb").write(model)
h.shutdown()
EOF2
}

# stop_pidfile_foliod PIDFILE: SIGTERM the foliod whose pid PIDFILE holds
# (an upgraded one: not $FOLIOD_PID), wait until it is gone, and check
# $FOLIOD_LOG for sanitizer reports.
stop_pidfile_foliod () {
  local pid
  pid=$(cat "$1")
  kill -TERM "$pid"
  wait_gone "$pid" 600 || fail "foliod $pid still running after SIGTERM"
  check_sanitizer_log "$FOLIOD_LOG"
}
