#!/bin/bash
# metrics-listen: GET /metrics over HTTP answers what `foliod stats
# --prometheus` says.  Scraped with curl while a workload runs (every
# scrape answers, the write counter never goes back), then checked against
# the workload (bytes written and read, requests, connections); other
# paths are 404, other methods 405; a port without a host binds 127.0.0.1
# only; idle scrapers holding connections are closed by the timeout and
# do not stop NBD clients; a bad address is a config error at its line.
. "$(dirname "$0")/lib.sh"
lib_init daemon-metrics
requires curl nbdsh python3

free_port () {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
port=$(free_port)
url=http://127.0.0.1:$port/metrics
img=$tmp/img
truncate -s 64M "$img"
ctl=$tmp/ctl.sock
# No background writeback: the counters stay put once the clients stop.
start_foliod --control "$ctl" --metrics-listen ":$port" --export \
  "disk0=$img,cache-size=32M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"
grep -q "metrics on http://127.0.0.1:$port/metrics" "$FOLIOD_LOG" ||
  fail "no 'metrics on' line for 127.0.0.1:$port"

# Bound to loopback: /proc/net/tcp lists the listener as 0100007F:PORT.
hexport=$(printf '%04X' "$port")
listeners=$(awk -v p=":$hexport" '$4 == "0A" && substr($2, length($2) - 4) == p { print $2 }' \
            /proc/net/tcp /proc/net/tcp6)
[ "$listeners" = "0100007F:$hexport" ] || fail "listeners on port $port: '$listeners'"

# value FILE NAME: one sample of export disk0 (or unlabelled) in FILE.
value () {
  awk -v n="$2" '$1 == n "{export=\"disk0\"}" || $1 == n { print $2 }' "$1"
}
scrape () { timeout 10 curl -sf -o "$1" "$url"; }

scrape "$tmp/m0" || fail "GET /metrics before the workload"
[ "$(value "$tmp/m0" foliod_client_write_bytes_total)" = 0 ] ||
  fail "write counter not 0 at start"
conns0=$(value "$tmp/m0" foliod_connections_accepted_total)
grep -q '^# TYPE foliod_read_hits_total counter$' "$tmp/m0" || fail "no TYPE lines"

# Scrape in a loop while the workload runs.
: >"$tmp/scrapes"
(
  i=0
  while [ ! -e "$tmp/done" ] && [ $i -lt 600 ]; do
    if scrape "$tmp/s"; then value "$tmp/s" foliod_client_write_bytes_total >>"$tmp/scrapes"
    else echo FAILED >>"$tmp/scrapes"; fi
    i=$((i + 1))
  done
) &
track $!
scraper=$!
# 256 writes of 64 KiB (16 MiB) and 64 reads of 64 KiB, one connection.
timeout 120 nbdsh -u "$(uri disk0)" -c '
import time
for i in range(256):
    h.pwrite(bytes([i % 251 + 1]) * 65536, i * 65536)
    if i % 32 == 0:
        time.sleep(0.05)
for i in range(64):
    assert h.pread(65536, i * 65536) == bytes([i % 251 + 1]) * 65536
' || fail "workload"
touch "$tmp/done"
timeout 30 bash -c "while kill -0 $scraper 2>/dev/null; do sleep 0.1; done" ||
  fail "the scraper loop did not end"
grep -q FAILED "$tmp/scrapes" && fail "a scrape failed during the workload"
n=$(wc -l <"$tmp/scrapes")
[ "$n" -ge 2 ] || fail "only $n scrapes during the workload"
sort -n -c "$tmp/scrapes" 2>/dev/null || fail "write counter went back: $(tr '\n' ' ' <"$tmp/scrapes")"
echo "$n scrapes during the workload, write counter $(head -n 1 "$tmp/scrapes") .. $(tail -n 1 "$tmp/scrapes")"

# After it: the counters are the workload's, and the same as foliod stats.
scrape "$tmp/m1" || fail "GET /metrics after the workload"
expect () {
  local v
  v=$(value "$tmp/m1" "$1")
  [ "$v" = "$2" ] || fail "$1 = '$v', expected $2 ($3)"
}
expect foliod_client_write_bytes_total $((256 * 65536)) "bytes written"
expect foliod_client_read_bytes_total $((64 * 65536)) "bytes read"
expect foliod_dirty_bytes $((256 * 65536)) "nothing written back"
expect foliod_read_hits_total 64 "reads of written data"
expect foliod_connections_accepted_total $((conns0 + 1)) "one NBD connection"
expect foliod_connections 0 "the client is gone"
req=$(value "$tmp/m1" foliod_requests_total)
[ "$req" -ge $((256 + 64)) ] || fail "foliod_requests_total = $req, want >= 320"
"$FOLIOD" stats --control "$ctl" --prometheus >"$tmp/p1" || fail "foliod stats --prometheus"
diff "$tmp/p1" "$tmp/m1" >"$tmp/diff" || fail "/metrics and foliod stats differ: $(cat "$tmp/diff")"

# HEAD answers too; other paths and methods do not.
code () { timeout 10 curl -s -o /dev/null -w '%{http_code}' "$@"; }
[ "$(code -I "$url")" = 200 ] || fail "HEAD /metrics"
[ "$(code "http://127.0.0.1:$port/")" = 404 ] || fail "GET / not 404"
[ "$(code "http://127.0.0.1:$port/metricsx")" = 404 ] || fail "GET /metricsx not 404"
[ "$(code -X POST -d x=1 "$url")" = 405 ] || fail "POST /metrics not 405"

# Idle scrapers: 20 connections that send half a request.  The daemon
# closes each within its timeout (10 s) or refuses it (connection
# limits); NBD clients are served meanwhile.
python3 - "$port" >"$tmp/idle.out" 2>&1 <<'PY' &
import socket, sys, time
port = int(sys.argv[1])
socks = []
for _ in range(20):
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    socks.append(s)
start = time.time()
for s in socks:
    try:
        while s.recv(4096):
            pass
    except ConnectionResetError:
        pass
print("all closed after %.1f s" % (time.time() - start))
PY
idle=$!
track $idle
sleep 1
timeout 30 nbdsh -u "$(uri disk0)" -c 'assert h.pread(65536, 0) == b"\x01" * 65536' ||
  fail "NBD read while idle scrapers hold the metrics port"
wait $idle || fail "idle scrapers: $(cat "$tmp/idle.out")"
cat "$tmp/idle.out"
scrape "$tmp/m2" || fail "GET /metrics after the idle scrapers"
foliod_alive || fail "foliod died"
stop_foliod

# Off unless configured.
lines=$(wc -l <"$FOLIOD_LOG")
start_foliod --export "disk0=$img"
tail -n +$((lines + 1)) "$FOLIOD_LOG" | grep -q "metrics on" &&
  fail "metrics served without metrics-listen"
stop_foliod

# A bad address is an error at its line, in the file and on the command line.
printf '[server]\nlisten = 127.0.0.1:%s\nmetrics-listen = 127.0.0.1:notaport\n[export disk0]\nbacking = file:%s\n' \
  "$port" "$img" >"$tmp/bad.conf"
"$FOLIOD" --check-config "$tmp/bad.conf" >/dev/null 2>"$tmp/err" && fail "bad metrics-listen accepted"
grep -q "bad.conf:3: bad address '127.0.0.1:notaport'" "$tmp/err" ||
  fail "error not at line 3: $(cat "$tmp/err")"
sed -i 's/127.0.0.1:notaport/no-such-host.invalid:9100/' "$tmp/bad.conf"
"$FOLIOD" --check-config "$tmp/bad.conf" >/dev/null 2>"$tmp/err" && fail "unresolvable host accepted"
grep -q "bad.conf:3: bad address 'no-such-host.invalid:9100'" "$tmp/err" ||
  fail "unresolvable: $(cat "$tmp/err")"
timeout 10 "$FOLIOD" -f --export "disk0=$img" --metrics-listen 1.2.3.4.5 2>"$tmp/err" &&
  fail "--metrics-listen 1.2.3.4.5 accepted"
grep -q -- "--metrics-listen: bad address" "$tmp/err" || fail "--metrics-listen: $(cat "$tmp/err")"
echo OK
