#!/bin/bash
# Bad input: tests/tools/bad-client sends each malformed case (bad magic,
# truncated header, unknown command/flag/option, beyond the end, over the
# maximum, writes to a read-only export, byte-by-byte handshake, pipelining,
# disconnect mid-request, handshake timeout, connection limit, a refused
# request then NBD_CMD_DISC or a bad magic in the same write...) and checks
# the reply or the close.  Meanwhile a well-behaved client keeps writing and
# verifying: it must never notice, and foliod must survive everything.
. "$(dirname "$0")/lib.sh"
lib_init server-bad-client
requires nbdsh nbdinfo
BAD=$BUILD/tests/tools/bad-client
[ -x "$BAD" ] || fail "bad-client not built: $BAD"

truncate -s 64M "$tmp/img"
truncate -s 1M "$tmp/ro"
start_foliod --handshake-timeout 2 \
  --export "disk0=file:$tmp/img,cache-size=32M" \
  --export "ro=file:$tmp/ro,read-only=true"

# The good client: writes and reads back its own 8 MiB region until told
# to stop, then checks everything once more.
cat > "$tmp/good.py" <<'PY'
import os
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
base, n, i, mine = 48 << 20, 0, 0, {}
while not os.path.exists(os.environ["STOP"]) and i < 100000:
    off = base + (i * 65536 + 123) % (8 << 20) // 512 * 512
    data = os.urandom(65536)
    h.pwrite(data, off)
    mine[off] = data
    assert h.pread(65536, off) == data, "good client read back wrong data"
    i += 1
h.flush()
for off, data in mine.items():
    assert h.pread(65536, off) == data
print("good client: %d writes verified" % i)
h.shutdown()
PY
URI=$(uri disk0) STOP=$tmp/stop timeout $((300 * TSCALE)) \
  nbdsh -c "exec(open('$tmp/good.py').read())" > "$tmp/good.log" 2>&1 &
good=$!
track $good

for c in $("$BAD" "$SOCK" disk0 list); do
  case $c in
    read-only|read-only-disc) exp=ro ;;
    connection-limit) continue ;;   # needs its own server, below
    shutdown-refused) continue ;;   # test-server-shutdown-refused.sh
    *) exp=disk0 ;;
  esac
  echo "case $c"
  timeout $((60 * TSCALE)) "$BAD" "$SOCK" "$exp" "$c" || fail "case $c"
  foliod_alive
  timeout 30 nbdinfo --size "$(uri disk0)" >/dev/null || fail "server unusable after $c"
done

touch "$tmp/stop"
wait $good || { cat "$tmp/good.log"; fail "the good client failed"; }
cat "$tmp/good.log"
grep -q "writes verified" "$tmp/good.log" || fail "good client did not finish"
stop_foliod
grep -q "bad request magic" "$FOLIOD_LOG" || fail "bad magic not logged"
grep -q "handshake timed out" "$FOLIOD_LOG" || fail "handshake timeout not logged"

# Connection limit: a second server allowing 3 clients.
SOCK_PATH=$tmp/sock2 start_foliod --max-connections 3 \
  --export "disk0=file:$tmp/img,cache-size=8M"
BAD_CLIENT_LIMIT=3 timeout $((60 * TSCALE)) "$BAD" "$SOCK" disk0 connection-limit ||
  fail "case connection-limit"
timeout 30 nbdinfo --size "$(uri disk0)" >/dev/null || fail "server unusable after the limit"
stop_foliod
grep -q "connection limit" "$FOLIOD_LOG" || fail "refusal not logged"
echo OK
