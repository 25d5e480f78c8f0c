#!/bin/bash
# The headline set-up, a remote with store=ssd (issue 32, review F5):
# read misses wait parked, without a worker, as with the ram store.  16
# concurrent 4 KiB misses at a remote with a read delay are answered with
# the remote's data and foliod_requests_parked_total counts them; read
# again, they are hits.  A 1 MiB write (whole folios, received straight
# into folio memory) then a FLUSH survives kill -9: the restart recovers
# it from the log (writeback is an hour away) and reads it back.
. "$(dirname "$0")/lib.sh"
lib_init ssd-remote-parked
. "$(dirname "$0")/lib-remote.sh"
requires python3 nbdcopy

ctl=$tmp/ctl.sock
start_remote "$tmp/remote.sock" -t 1 --filter=delay memory 16M rdelay=20ms
head -c 16M /dev/urandom > "$tmp/data"
nbdcopy "$tmp/data" "$(remote_uri)" || fail "cannot fill the remote"
args=(--control "$ctl" --pidfile "$tmp/pid" --workers 2 --export "disk0=$(remote_uri),store=ssd:$tmp/st,cache-size=32M,folio-size=64K,block-size=4K,dirty-expire=3600000,writeback-interval=3600000")
start_foliod "${args[@]}"

cat > "$tmp/io.py" <<'PY'
import os, sys
import nbd
data = open(os.environ["DATA"], "rb").read()
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
if sys.argv[1] == "reads":
    offs = [i * 65536 + (i * 5 % 16) * 4096 for i in range(16)]
    bufs = [nbd.Buffer(4096) for _ in offs]
    cookies = [h.aio_pread(b, o) for b, o in zip(bufs, offs)]
    while h.aio_in_flight() > 0:
        h.poll(1000)
    for c, b, o in zip(cookies, bufs, offs):
        assert h.aio_command_completed(c), "read at %d" % o
        assert b.to_bytearray() == data[o:o + 4096], "wrong data at %d" % o
elif sys.argv[1] == "write":
    h.pwrite(b"\x5a" * (1 << 20), 8 << 20)
    h.flush()
else:
    assert h.pread(1 << 20, 8 << 20) == b"\x5a" * (1 << 20), "1 MiB write lost"
    assert h.pread(65536, 9 << 20) == data[9 << 20:(9 << 20) + 65536]
h.shutdown()
PY
io () {
  DATA=$tmp/data URI=$(uri disk0) timeout $((60 * TSCALE)) python3 "$tmp/io.py" "$1"
}

parked0=$(foliod_stat "$ctl" foliod_requests_parked_total)
[ -n "$parked0" ] || fail "no foliod_requests_parked_total counter"
io reads || fail "concurrent misses"
parked=$(( $(foliod_stat "$ctl" foliod_requests_parked_total) - parked0 ))
echo "$parked of 16 misses parked"
[ "$parked" -gt 0 ] || fail "no miss was parked with store=ssd"
hits0=$(foliod_stat "$ctl" foliod_read_hits_total)
io reads || fail "the same reads again"
hits=$(( $(foliod_stat "$ctl" foliod_read_hits_total) - hits0 ))
[ "$hits" = 16 ] || fail "$hits of 16 second reads were hits"

io write || fail "1 MiB write and FLUSH"
kill9_foliod "$tmp/pid"
start_foliod "${args[@]}"
io check || fail "after kill -9"
foliod_alive
stop_foliod
echo OK
