#!/bin/bash
# Two FUA writes at once on a file backing, and the first one's fdatasync
# fails (issue 33).  Linux reports a writeback error once per open file:
# when fdatasync fails it has dropped every page whose writeback failed,
# the other FUA write's page among them, and that write's own fdatasync,
# coming second, succeeds.  The client must not be told that this write
# is durable: after a crash (kill -9) every FUA write the client saw
# succeed is in the file.
# The fault layer (tests/faultfs/fault-preload.c) fails the first sync
# with unsynced writes and makes each sync wait 400 ms first, so that the
# second write lands while the first sync runs.  Seen failing on a
# foliod whose file backing trusts each fdatasync alone (the second
# write answered durable, its block still zeroes in the file).
. "$(dirname "$0")/lib.sh"
lib_init fault-fua-concurrent
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"
shim=$BUILD/tests/faultfs/fault-preload.so
[ -f "$shim" ] || fail "not built: $shim"
img=$tmp/img
preload=$shim${LD_PRELOAD:+ $LD_PRELOAD}
asan=${ASAN_OPTIONS:+$ASAN_OPTIONS:}verify_asan_link_order=0

# The client: two FUA writes of 64 KiB, 4 MiB apart, the second 100 ms
# after the first; one line per write, "OFFSET INDEX ok|failed [ERRNO]"
# (aio_command_completed raises on a failed command).
cat > "$tmp/client.py" <<'EOF'
import nbd, sys, time
h = nbd.NBD()
h.connect_uri(sys.argv[1])
ops = []
for i, off in enumerate((0, 4 << 20)):
    buf = nbd.Buffer.from_bytearray(bytearray([0x41 + i]) * 65536)
    ops.append((off, i, h.aio_pwrite(buf, off, flags=nbd.CMD_FLAG_FUA)))
    time.sleep(0.1)
for off, i, cookie in ops:
    while True:
        try:
            if h.aio_command_completed(cookie):
                print(off, i, "ok")
                break
        except nbd.Error as e:
            print(off, i, "failed", e.errno)
            break
        h.poll(-1)
EOF

# cache=none: each FUA write is a passthrough write and its own sync;
# through the ram cache, FUA writes go to the backing one at a time.
one () {
  local keys=$1
  rm -f "$img" "$tmp/faults" "$tmp/acks"
  truncate -s 8M "$img"
  FAULT_FILE=$img FAULT_SYNC_FAIL=1000 FAULT_SYNC_DELAY_MS=400 \
    FAULT_LOG=$tmp/faults LD_PRELOAD=$preload ASAN_OPTIONS=$asan \
    start_foliod --pidfile "$tmp/pid" --export "disk0=file:$img,$keys"

  /usr/bin/python3 "$tmp/client.py" "$(uri disk0)" > "$tmp/acks" ||
    fail "$keys: the client failed"
  kill9_foliod "$tmp/pid"
  cat "$tmp/acks"
  cat "$tmp/faults" 2>/dev/null
  grep -q "sync-fail" "$tmp/faults" 2>/dev/null ||
    fail "$keys: no fdatasync failed: the test did not test anything"
  grep -q failed "$tmp/acks" || fail "$keys: no FUA write failed though a sync did"
  while read -r off i what _; do
    [ "$what" = ok ] || continue
    want=$(printf '%02x' $((0x41 + i)))
    got=$(od -An -tx1 -v -j "$off" -N 65536 "$img" | tr -s ' \n' '\n' |
          grep -v '^$' | sort -u | tr '\n' ' ')
    [ "$got" = "$want " ] ||
      fail "$keys: the FUA write at $off was acknowledged, but the file holds bytes '$got' there after kill -9"
  done < "$tmp/acks"
  echo "ok ($keys): $(grep -c ok "$tmp/acks") FUA write(s) acknowledged, each in the file; $(grep -c failed "$tmp/acks") failed"
}
for keys in cache=none cache-size=4M; do
  one "$keys"
done
