#!/bin/bash
# metrics-listen against slowloris (issue 23 item 8): clients that open
# connections and send one header byte every 4 s (the inactivity timeout
# never fires) must not keep a scraper out.
#  1. The issue's attack, 4 connections from each of 127.0.0.2 and
#     127.0.0.3 (all that the per-address cap allows): room is left, so
#     scrapes from 127.0.0.1 succeed at once.
#  2. More addresses (127.0.0.4 to .7), filling every connection: each
#     request has a total deadline, so the slow connections are cut and
#     the scrapes get through within a bounded time.
. "$(dirname "$0")/lib.sh"
lib_init daemon-metrics-slow
requires curl python3

python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.7", 0))' 2>/dev/null ||
  skip "cannot bind 127.0.0.7"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
truncate -s 16M "$tmp/img"
start_foliod --metrics-listen "127.0.0.1:$port" \
  --export "disk0=file:$tmp/img,cache-size=8M"

# slow.py STOPFILE ADDR...: 8 connections per source address (the server
# refuses what is over its caps), one byte every 4 s each, never a whole
# header; a connection the server closes is not reopened.
cat > "$tmp/slow.py" <<'PY'
import os, socket, sys, time
stop, port, addrs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
req = b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 4096
socks = []
for a in addrs:
    for i in range(8):
        s = socket.socket()
        s.bind((a, 0))
        try:
            s.connect(("127.0.0.1", port))
            socks.append([s, 0])
        except OSError:
            s.close()
open(stop + ".up", "w").close()
while not os.path.exists(stop):
    for e in socks:
        if e[0] is None:
            continue
        try:
            e[0].send(req[e[1]:e[1] + 1])
            e[1] += 1
        except OSError:
            e[0].close()
            e[0] = None
    for _ in range(40):
        if os.path.exists(stop):
            break
        time.sleep(0.1)
PY

# scrapes N BOUND: N scrapes, each retried until it succeeds or BOUND s
# have passed since the first attempt; prints how many succeeded (stops
# at the first that does not).
scrapes () {
  local ok=0 k t0
  for ((k = 0; k < $1; k++)); do
    t0=$SECONDS
    while [ $((SECONDS - t0)) -lt "$2" ]; do
      if curl -sf --max-time 3 -o "$tmp/m" "http://127.0.0.1:$port/metrics" &&
         grep -q '^foliod_connections_accepted_total' "$tmp/m"; then
        ok=$((ok + 1))
        break
      fi
      sleep 0.2
    done
    [ "$ok" -gt "$k" ] || break
  done
  echo "$ok"
}

attack () {
  rm -f "$tmp/stop" "$tmp/stop.up"
  python3 "$tmp/slow.py" "$tmp/stop" "$port" "$@" &
  track $!
  attacker=$!
  for ((i = 0; i < 100; i++)); do [ -e "$tmp/stop.up" ] && break; sleep 0.1; done
  [ -e "$tmp/stop.up" ] || fail "attacker did not start"
  sleep 1          # let the server accept them all
}

# --- 1. two addresses: room is left ----------------------------------------
attack 127.0.0.2 127.0.0.3
n=$(scrapes 5 4)
echo "two slow addresses: $n of 5 scrapes succeeded"
[ "$n" -eq 5 ] || fail "only $n of 5 scrapes during a slowloris from two addresses"
touch "$tmp/stop"; wait "$attacker"

# --- 2. six addresses fill every slot: the deadline frees them -------------
attack 127.0.0.2 127.0.0.3 127.0.0.4 127.0.0.5 127.0.0.6 127.0.0.7
n=$(scrapes 5 $((30 * TSCALE)))
echo "six slow addresses: $n of 5 scrapes succeeded"
[ "$n" -eq 5 ] || fail "only $n of 5 scrapes during a slowloris from six addresses"
touch "$tmp/stop"; wait "$attacker"

foliod_alive
stop_foliod
