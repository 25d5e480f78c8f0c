# Helpers for the remote-backing tests (tests/test-remote-*.sh): nbdkit is
# the remote NBD server behind foliod's nbd: backing.  Source after lib.sh:
#
#   . "$(dirname "$0")/lib.sh"
#   lib_init remote-x
#   . "$(dirname "$0")/lib-remote.sh"
#   start_remote "$tmp/remote.sock" file "$tmp/img"
#   start_foliod --control "$tmp/ctl" --export "disk0=$(remote_uri),cache-size=64M"
#   foliod_stat foliod_backing_reconnects_total
#   stop_foliod; stop_remote

requires nbdkit nbdsh

REMOTE_PID=     # the nbdkit started last
REMOTE_SOCK=    # its Unix socket

# A killed foliod is not left running: lib.sh's cleanup KILLs the timeout
# wrapper started by start_foliod, which cannot pass SIGKILL on to foliod.
_remote_cleanup () {
  if [ -n "${FOLIOD_PID:-}" ]; then
    pkill -KILL -P "$FOLIOD_PID" 2>/dev/null || true
  fi
  _lib_cleanup
}
trap _remote_cleanup EXIT

# start_remote SOCKET NBDKIT-ARGS...: run  nbdkit -f -U SOCKET ARGS  in the
# background (it also exits when the test's shell does); returns once it
# listens.  Sets REMOTE_PID and REMOTE_SOCK; output goes to $tmp/remote.log.
start_remote () {
  local i
  REMOTE_SOCK=$1
  shift
  # nbdkit 1.32 leaves its socket behind on exit.
  rm -f "$REMOTE_SOCK" "$tmp/remote.pid"
  nbdkit -f --exit-with-parent -U "$REMOTE_SOCK" -P "$tmp/remote.pid" "$@" \
    >>"$tmp/remote.log" 2>&1 &
  REMOTE_PID=$!
  track "$REMOTE_PID"
  # nbdkit writes the pid file once the socket is bound.
  for ((i = 0; i < 200 * TSCALE; i++)); do
    [ -s "$tmp/remote.pid" ] && return 0
    kill -0 "$REMOTE_PID" 2>/dev/null ||
      fail "nbdkit exited at start: $(tail -n 5 "$tmp/remote.log")"
    sleep 0.1
  done
  fail "nbdkit did not start"
}

# stop_remote [SIGNAL]: signal the remote (default TERM), wait for it to
# exit (its stats/log filters write their files then) and remove its socket.
stop_remote () {
  local sig=${1:-TERM}
  [ -n "$REMOTE_PID" ] || return 0
  kill -"$sig" "$REMOTE_PID" 2>/dev/null || true
  wait_gone "$REMOTE_PID" 300 || fail "nbdkit still running after SIG$sig"
  wait "$REMOTE_PID" 2>/dev/null || true
  REMOTE_PID=
  rm -f "$REMOTE_SOCK"
}

# remote_uri [SOCKET]: the backing spec of the remote.
remote_uri () {
  echo "nbd+unix:///?socket=${1:-$REMOTE_SOCK}"
}

# same_file A B: fail unless the files are equal; names the first
# differing 4 KiB blocks.
same_file () {
  cmp -s "$1" "$2" && return 0
  python3 - "$1" "$2" <<'PY' >&2 || true
import sys
a, b = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
print("sizes", len(a), len(b))
bad = [i for i in range(0, min(len(a), len(b)), 4096) if a[i:i+4096] != b[i:i+4096]]
print("%d blocks differ, first at offsets %r" % (len(bad), bad[:8]))
PY
  fail "${3:-$1 and $2 differ}"
}

# flush_until_ok EXPORT: a FLUSH of EXPORT (on foliod's $SOCK) until one
# succeeds, once a second for 30 s (scaled): reconnect probes of a backing
# that was down run every 2 s.  Fails the test after that.
flush_until_ok () {
  local i
  for ((i = 0; i < 30 * TSCALE; i++)); do
    timeout $((60 * TSCALE)) nbdsh -u "$(uri "$1")" -c 'h.flush()' \
      2>/dev/null && return 0
    sleep 1
  done
  fail "FLUSH of $1 still failing after 30 s"
}

# sh_remote_script SCRIPT IMG THREAD-MODEL < CASE-ARMS: write an nbdkit sh
# plugin over the file IMG (its size, reads, can_write, can_flush); the
# test's own case arms (pwrite, flush, ...) come on stdin.
sh_remote_script () {
  {
    printf '#!/bin/bash\ncase "$1" in\n'
    printf '  thread_model) echo %s ;;\n' "$3"
    printf '  get_size) stat -L -c %%s "%s" ;;\n' "$2"
    printf '  can_write|can_flush) exit 0 ;;\n'
    printf '  pread) dd if="%s" skip="$4" count="$3" iflag=skip_bytes,count_bytes status=none ;;\n' "$2"
    cat
    printf '  *) exit 2 ;;\nesac\n'
  } > "$1"
  chmod +x "$1"
}

# held_write_plugin IMG SCRIPT: write SCRIPT, an nbdkit sh plugin serving
# the file IMG whose FIRST write is held 6 s (past a request-timeout of
# 2 s) before it is done: $tmp/first-write exists once it arrived,
# $tmp/first-write/landed once it landed (writes in doubt).
held_write_plugin () {
  sh_remote_script "$2" "$1" parallel <<SH
  pwrite)
    if mkdir "$tmp/first-write" 2>/dev/null; then
      sleep 6
      echo x > "$tmp/first-write/landed"
    fi
    dd of="$1" seek="\$4" oflag=seek_bytes conv=notrunc status=none ;;
  flush) sync "$1" ;;
SH
}

# flush_fails_plugin SCRIPT CUR DURABLE: write SCRIPT, an nbdkit sh plugin
# over two files: CUR (what reads and writes see) and DURABLE (what a
# crash would leave).  flush copies CUR to DURABLE; with $tmp/fail-flush
# present it fails instead (once, removing it) and CUR falls back to
# DURABLE: the unflushed writes are gone, as when Linux fails fdatasync.
flush_fails_plugin () {
  sh_remote_script "$1" "$2" serialize_all_requests <<SH
  pwrite) dd of="$2" seek="\$4" oflag=seek_bytes conv=notrunc status=none ;;
  flush)
    if rm "$tmp/fail-flush" 2>/dev/null; then
      cp "$3" "$2"
      echo "EIO injected: fdatasync failed, unflushed writes dropped" >&2
      exit 1
    fi
    cp "$2" "$3.new" && mv "$3.new" "$3" ;;
SH
}

# make_ab_images [MIB]: two images of the same size (default 16 MiB) in
# $tmp, a.img all 'A' and b.img all 'B', and b.orig a copy of b.img (the
# identity tests: another image behind the same remote).
make_ab_images () {
  python3 - "$tmp" "${1:-16}" <<'PY'
import sys
for name, ch in (("a.img", b"A"), ("b.img", b"B")):
    with open(sys.argv[1] + "/" + name, "wb") as f:
        f.write(ch * (int(sys.argv[2]) << 20))
PY
  cp "$tmp/b.img" "$tmp/b.orig"
}
