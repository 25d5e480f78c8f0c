#!/bin/bash
# SIGTERM while a client has many writes in flight: foliod stops reading,
# answers what it already received, writes everything back and exits 0.
# Every write the client saw succeed must be in the backing file.
. "$(dirname "$0")/lib.sh"
lib_init server-shutdown
requires nbdsh

truncate -s 256M "$tmp/img"
start_foliod --export "disk0=file:$tmp/img,cache-size=64M,dirty-expire=600000"

cat > "$tmp/writer.py" <<'PY'
import os, sys
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
log = open(os.environ["LOG"], "w")
blk, nblk = 65536, (256 << 20) // 65536
inflight, i, done = {}, 0, 0
started = False
try:
    while True:
        while len(inflight) < 32:
            off = (i * 7919 % nblk) * blk     # each block written once
            data = (b"%08d" % i) * (blk // 8)
            inflight[h.aio_pwrite(data, off)] = (i, off)
            i += 1
        h.poll(-1)
        for c in list(inflight):
            if h.aio_command_completed(c):
                n, off = inflight.pop(c)
                log.write("%d %d\n" % (n, off))
                done += 1
        if done >= 200 and not started:
            open(os.environ["GO"], "w").close()   # tell the shell: signal now
            started = True
        if i >= nblk:
            break
except nbd.Error as e:
    print("client stopped by the server:", e)
log.close()
print("writes acknowledged:", done)
PY
URI=$(uri disk0) LOG=$tmp/acked GO=$tmp/go timeout $((120 * TSCALE)) \
  nbdsh -c "exec(open('$tmp/writer.py').read())" > "$tmp/writer.log" 2>&1 &
writer=$!
track $writer
for ((i = 0; i < 300 * TSCALE; i++)); do
  [ -e "$tmp/go" ] && break
  kill -0 $writer 2>/dev/null || break
  sleep 0.1
done
[ -e "$tmp/go" ] || { cat "$tmp/writer.log"; fail "writer did not get going"; }
stop_foliod TERM
wait $writer || true
cat "$tmp/writer.log"
grep -q "shutdown" "$FOLIOD_LOG" || fail "no shutdown logged"
n=$(wc -l < "$tmp/acked")
[ "$n" -ge 200 ] || fail "only $n writes acknowledged"

python3 - "$tmp/img" "$tmp/acked" <<'PY' || fail "an acknowledged write is missing from the backing file"
import sys
blk = 65536
with open(sys.argv[1], "rb") as f:
    for line in open(sys.argv[2]):
        n, off = map(int, line.split())
        f.seek(off)
        assert f.read(blk) == (b"%08d" % n) * (blk // 8), "write %d at %d lost" % (n, off)
print("all acknowledged writes are in the backing file")
PY
echo OK
