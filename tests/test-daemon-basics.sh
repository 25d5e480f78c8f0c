#!/bin/bash
# foliod's command line: --help, --version, clear errors for bad input
# (non-zero exit, a message naming the problem), detaching with a pidfile,
# and log line format with and without the journal.
. "$(dirname "$0")/lib.sh"
lib_init daemon-basics
requires nbdinfo

out=$tmp/out
err=$tmp/err

# expect_fail WHAT PATTERN ARGS...: foliod ARGS exits non-zero and says PATTERN.
expect_fail () {
  local what=$1 pattern=$2 rc=0
  shift 2
  timeout 10 "$FOLIOD" "$@" >"$out" 2>"$err" || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: exit 0 for: foliod $*"
  [ "$rc" -ne 124 ] || fail "$what: hung: foliod $*"
  grep -qE -- "$pattern" "$err" ||
    fail "$what: no '$pattern' in: $(cat "$err")"
}

"$FOLIOD" --help >"$out"
grep -q '^Usage: foliod' "$out" || fail "--help has no usage line"
grep -q -- '--export NAME=BACKING' "$out" || fail "--help lacks --export"
grep -q 'cache-size' "$out" || fail "--help lacks the export keys"

# --version and -V: "foliod VERSION" then the libraries it runs with.
for opt in --version -V; do
  "$FOLIOD" $opt >"$out" || fail "$opt: exit $?"
  grep -qE '^foliod [0-9]+\.[0-9]+' "$out" || fail "$opt: $(cat "$out")"
  grep -qE '^libnbd [0-9.]+, OpenSSL [0-9.]+.*, libev [0-9]+\.[0-9]+, libmicrohttpd [0-9.]+$' "$out" ||
    fail "$opt: no library versions: $(cat "$out")"
done

truncate -s 16M "$tmp/img"
expect_fail "unknown option" "unrecognized option '--bogus'" --bogus
expect_fail "missing argument" "requires an argument" --export
expect_fail "export without backing" "expected NAME=BACKING" --export disk0
expect_fail "unknown export key" "unknown export option 'colour'" \
  --export "disk0=$tmp/img,colour=blue"
expect_fail "bad size" "bad value for cache-size" \
  --export "disk0=$tmp/img,cache-size=lots"
expect_fail "bad folio size" "folio-size" \
  --export "disk0=$tmp/img,folio-size=3000"
expect_fail "duplicate export" "duplicate export 'disk0'" \
  --export "disk0=$tmp/img" --export "disk0=$tmp/img"
expect_fail "bad listen address" "bad address '::1:80'" \
  --listen ::1:80 --export "disk0=$tmp/img"
expect_fail "bad workers" "bad value '0' for workers" \
  --workers 0 --export "disk0=$tmp/img"
expect_fail "bad log level" "for log-level" \
  --log-level chatty --export "disk0=$tmp/img"
expect_fail "stray argument" "unexpected argument 'disk0'" disk0
expect_fail "missing backing file" "$tmp/nonexistent" \
  --foreground --unix "$tmp/s" --export "disk0=$tmp/nonexistent"
expect_fail "flush without export" "usage: foliod flush EXPORT" flush
expect_fail "stats without daemon" "cannot connect to the control socket" \
  stats --control "$tmp/no-such.sock"

# TLS asked for without certificates is refused, never served in clear.
expect_fail "tls without certificates" "tls = require needs tls-certificates" \
  --foreground --unix "$tmp/s" --tls require --export "disk0=$tmp/img"
expect_fail "tls with an empty certificate directory" "server-cert.pem" \
  --foreground --unix "$tmp/s" --tls require --tls-certificates "$tmp/nocerts" \
  --export "disk0=$tmp/img"

# IPv6 in brackets.
if python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
  port6=$(python3 -c 'import socket; s=socket.socket(socket.AF_INET6); s.bind(("::1",0)); print(s.getsockname()[1])')
  "$FOLIOD" --foreground --listen "[::1]:$port6" --export "disk0=$tmp/img" \
    2>"$tmp/v6.log" &
  p=$!; track $p
  for i in $(seq 100); do
    nbdinfo --size "nbd://[::1]:$port6/disk0" >"$out" 2>/dev/null && break
    sleep 0.1
  done
  grep -qx 16777216 "$out" || fail "not served on [::1]:$port6: $(cat "$tmp/v6.log")"
  kill -TERM $p; wait $p || fail "exit status $? after SIGTERM"
fi

# A busy address is a start-up error, not a hang.
python3 -c '
import socket, sys, time
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
open(sys.argv[1], "w").write(str(s.getsockname()[1]))
time.sleep(30)' "$tmp/busy-port" &
track $!
for i in $(seq 50); do [ -s "$tmp/busy-port" ] && break; sleep 0.1; done
expect_fail "port in use" "in use" --foreground \
  --listen "127.0.0.1:$(cat "$tmp/busy-port")" --export "disk0=$tmp/img"

# Detaching: the parent returns once the export answers, the pidfile names
# the daemon, SIGTERM stops it and removes the pidfile.
timeout 20 "$FOLIOD" --unix "$tmp/sock" --pidfile "$tmp/pid" \
  --export "disk0=$tmp/img" 2>"$tmp/detached.log" ||
  fail "detached start failed: $(cat "$tmp/detached.log")"
[ -s "$tmp/pid" ] || fail "no pidfile"
pid=$(cat "$tmp/pid")
track "$pid"
nbdinfo "nbd+unix:///disk0?socket=$tmp/sock" >/dev/null ||
  fail "detached daemon does not answer at once"
[ "$(ps -o ppid= -p "$pid" | tr -d ' ')" != "$$" ] ||
  fail "daemon did not detach"
kill -TERM "$pid"
wait_gone "$pid" 100 || fail "detached daemon ignores SIGTERM"
[ ! -e "$tmp/pid" ] || fail "pidfile left behind"

# Log format: timestamps on a terminal/file, syslog priorities and no
# timestamp when stderr is the journal stream (JOURNAL_STREAM=dev:ino).
"$FOLIOD" --foreground --unix "$tmp/sock2" --export "disk0=$tmp/img" \
  2>"$tmp/plain.log" &
p=$!; track $p
SOCK=$tmp/sock2 wait_for_socket "$tmp/sock2" 20
kill -TERM $p; wait $p || fail "exit status $? after SIGTERM"
grep -qE '^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]+ foliod\[[0-9]+\] info: ready' \
  "$tmp/plain.log" || fail "no timestamped ready line: $(cat "$tmp/plain.log")"

touch "$tmp/journal.log"
js=$(stat -c '%d:%i' "$tmp/journal.log")
JOURNAL_STREAM=$js "$FOLIOD" --foreground --unix "$tmp/sock3" \
  --export "disk0=$tmp/img" 2>>"$tmp/journal.log" &
p=$!; track $p
wait_for_socket "$tmp/sock3" 20
kill -TERM $p; wait $p || fail "exit status $? after SIGTERM"
grep -qE '^<6>ready: ' "$tmp/journal.log" ||
  fail "journal format: $(cat "$tmp/journal.log")"
grep -qE '^[0-9]{4}-' "$tmp/journal.log" && fail "timestamps in journal mode"
echo OK
