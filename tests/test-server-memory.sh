#!/bin/bash
# Request and reply memory is budgeted (max-conn-buffer, max-buffer-total):
# foliod's peak RSS (VmHWM) stays within cache-size + the budget + a fixed
# allowance under the two memory attacks of issue 12, and other clients
# are served meanwhile and after:
#  a. one client pipelines 32 READs of 32 MiB (1 GiB) and never reads a
#     reply: foliod stops reading from it at max-conn-buffer;
#  b. four clients each send 8 WRITEs of 32 MiB (1 GiB in all) to a slow
#     remote: foliod stops reading payloads at max-buffer-total;
#  c. eight clients each send one READ of 64 MiB and never read the reply:
#     the replies count against max-buffer-total too (issue 34: each
#     connection held its 64 MiB reply whatever the total said).
# (Before the budget, foliod held each whole GiB.)
. "$(dirname "$0")/lib.sh"
lib_init server-memory
. "$(dirname "$0")/lib-remote.sh"
requires python3 nbdsh

CONN_BUF=$((64 << 20))
TOTAL=$((128 << 20))
CACHE=$((64 << 20))

# FOLIOD_PID is the timeout wrapper's; foliod writes its own to pidfile.
vm () { awk -v k="$1:" '$1 == k {print $2 * 1024}' "/proc/$(cat "$tmp/pid")/status"; }

# wait_stalled FILE PID: wait (at most 60 s) until neither the attack PID
# (bytes sent, last line of FILE) nor foliod's resident memory moved for
# 2 s: what foliod would take from the attack, it has taken.
wait_stalled () {
  local last=-1 same=0 i n
  for ((i = 0; i < 600 * TSCALE; i++)); do
    kill -0 "$2" 2>/dev/null || { cat "${1%.prog}.log"; fail "attack failed"; }
    n="$(tail -n 1 "$1" 2>/dev/null || true) $(($(vm VmRSS) >> 20))"
    if [ "$n" = "$last" ]; then
      same=$((same + 1))
      [ "$same" -ge 20 ] && return 0
    else
      same=0 last=$n
    fi
    sleep 0.1
  done
  fail "attack neither finished nor stalled in 60 s"
}

# The good client: writes, reads back and checks 1 MiB at OFF.
good_client () {
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" -c "
import os
d = os.urandom(1 << 20)
h.pwrite(d, $1)
assert h.pread(1 << 20, $1) == d
" || fail "the good client was not served ($2)"
}

# check_hwm WHAT BUDGET: VmHWM within idle + BUDGET + allowance; idle
# holds the cache already (foliod faults its memory in at start: about
# 74 MiB with a 64M cache, 10 MiB of it the rest), and at least the cache.
# The allowance (48 MiB) covers what the budget does not count: folio
# metadata, the worker threads' stacks and per-thread cache state once all
# 16 run, malloc arenas of those threads, and the connections' fixed
# buffers (about 200 KiB each).
check_hwm () {
  local hwm limit idle=$IDLE_HWM
  hwm=$(vm VmHWM)
  [ "$idle" -ge $((CACHE + (10 << 20))) ] || idle=$((CACHE + (10 << 20)))
  limit=$((idle + $2 + (48 << 20)))
  echo "$1: VmHWM $((hwm >> 20)) MiB (limit $((limit >> 20)) MiB)"
  if [ "${SAN:-}" = 1 ]; then
    return 0 # ASan's shadow memory and quarantine are not foliod's
  fi
  [ "$hwm" -le "$limit" ] ||
    fail "$1: VmHWM $((hwm >> 20)) MiB over $((limit >> 20)) MiB"
}

cat > "$tmp/attack.py" <<'PY'
import os, sys, threading
sys.path.insert(0, os.environ["TOP"] + "/tests/tools")
import nbdraw
mode, nconn, nreq, prog = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
size = int(os.environ.get("SIZE", 32 << 20))
sent = [0] * nconn
socks = [nbdraw.connect(os.environ["SOCK"], "disk0", timeout=120)
         for _ in range(nconn)]
payload = b"\xa5" * size
def attack(i):
    s = socks[i]
    for k in range(nreq):
        off = ((i * nreq + k) * size) % (192 << 20)
        if mode == "read":
            nbdraw.send_req(s, nbdraw.CMD_READ, k, off, size)
        else:
            nbdraw.send_req(s, nbdraw.CMD_WRITE, k, off, size, payload)
        sent[i] += size
ts = [threading.Thread(target=attack, args=(i,), daemon=True) for i in range(nconn)]
for t in ts:
    t.start()
with open(prog, "a") as f:
    while any(t.is_alive() for t in ts):
        f.write("%d\n" % sum(sent)); f.flush()
        for t in ts:
            t.join(0.2)
    f.write("%d\n" % sum(sent))
# Hold the connections (never reading a reply) until killed.
threading.Event().wait(300)
PY

# attack NAME BACKING BUDGET MODE NCONN NREQ: serve BACKING, measure idle
# VmHWM, run the attack, check VmHWM against BUDGET while a good client is
# served, end the attack, check the good client again.
attack () {
  local name=$1 backing=$2 budget=$3 pid
  shift 3
  start_foliod --pidfile "$tmp/pid" --max-connections 16 \
    --max-conn-buffer $CONN_BUF --max-buffer-total $TOTAL \
    --export "disk0=$backing,cache-size=64M"
  good_client 0 "before $name"
  IDLE_HWM=$(vm VmHWM)
  echo "idle: VmHWM $((IDLE_HWM >> 20)) MiB"
  TOP=$TOP SOCK=$SOCK SIZE=${SIZE:-$((32 << 20))} python3 "$tmp/attack.py" "$@" "$tmp/$1.prog" \
    > "$tmp/$1.log" 2>&1 &
  pid=$!
  track $pid
  wait_stalled "$tmp/$1.prog" $pid
  check_hwm "$name" "$budget"
  good_client $((200 << 20)) "during $name"
  kill $pid; wait $pid 2>/dev/null || true
  good_client $((210 << 20)) "after $name"
  foliod_alive
  stop_foliod
}

# a. One connection: max-conn-buffer.
truncate -s 256M "$tmp/img"
attack "pipelined reads" "file:$tmp/img" $CONN_BUF read 1 32

# b. The total, however many connections (foliod.conf(5), MEMORY).
start_remote "$tmp/remote.sock" --filter=delay memory 256M wdelay=50ms
attack "writes to a slow remote" "$(remote_uri)" $TOTAL write 4 8
stop_remote

# c. Replies never read, one per connection: the total, not 8 x 64 MiB.
SIZE=$((64 << 20)) attack "unread 64 MiB replies" "file:$tmp/img" $TOTAL \
  read 8 1
echo OK
