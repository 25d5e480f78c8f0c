#!/bin/bash
# A failed fsync is not forgotten (issue 12, "fsyncgate"): the backing is a
# real device whose writeback fails, a loop device over a sparse 8 MiB file
# on a 1 MiB tmpfs.  foliod's writes land in the device's page cache, the
# kernel fails to write them back and fdatasync says EIO once, then 0.  The
# first FLUSH must fail; once the tmpfs has room, the next FLUSH must write
# the data again before it succeeds, and afterwards the data is really in
# the file under the loop device (read from the tmpfs after foliod has
# exited and the loop device is gone, not through the device's cache).
. "$(dirname "$0")/lib.sh"
lib_init durability-fsync
requires python3 nbdsh losetup

[ "$(id -u)" = 0 ] || skip "needs root for loop devices and mounts"
mnt=$(mktemp -d /tmp/foliod-durability-mnt-XXXXXX)
loop=
cleanup () {
  _lib_cleanup                    # foliod first: it holds the device open
  if [ -n "$loop" ]; then losetup -d "$loop" 2>/dev/null || true; fi
  local i
  for ((i = 0; i < 50; i++)); do  # the detach finishes asynchronously
    mountpoint -q "$mnt" || break
    umount "$mnt" 2>/dev/null && break
    sleep 0.1
  done
  rmdir "$mnt" 2>/dev/null || true
}
trap cleanup EXIT

mount -t tmpfs -o size=1M foliod-durability "$mnt" ||
  skip "cannot mount a tmpfs"
truncate -s 8M "$mnt/img"
loop=$(losetup -f --show "$mnt/img" 2>/dev/null) || {
  loop=
  skip "no loop device"
}
echo "backing $loop over $mnt/img (tmpfs of 1 MiB)"

head -c $((4 << 20)) /dev/urandom > "$tmp/data"
ctl=$tmp/ctl
start_foliod --control "$ctl" \
  --export "disk0=file:$loop,cache-size=64M,dirty-expire=600000"

cat > "$tmp/fsync.py" <<'PY'
import errno, os, subprocess
import nbd

env = os.environ
data = open(env["DATA"], "rb").read()

def dirty():
    out = subprocess.check_output([env["FOLIOD"], "stats", "--control",
                                   env["CTL"], "--prometheus"], text=True)
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        if k in ("foliod_dirty_bytes", 'foliod_dirty_bytes{export="disk0"}'):
            return int(float(v))
    raise KeyError("foliod_dirty_bytes")

h = nbd.NBD()
h.connect_uri(env["URI"])
for off in range(0, len(data), 1 << 20):
    h.pwrite(data[off:off + (1 << 20)], off)
try:
    h.flush()
    raise SystemExit("FLUSH succeeded with the device full")
except nbd.Error as e:
    assert e.errnum == errno.EIO, "first FLUSH: errno %r" % e.errnum
lost = dirty()
print("first FLUSH: EIO; dirty again: %d bytes" % lost)
open(env["LOST"], "w").write("%d\n" % lost)

subprocess.check_call(["mount", "-o", "remount,size=64M", env["MNT"]])
h.flush()                         # must rewrite, then succeed
print("second FLUSH: ok, dirty %d bytes" % dirty())
assert dirty() == 0
h.shutdown()
PY

DATA=$tmp/data LOST=$tmp/lost CTL=$ctl MNT=$mnt URI=$(uri disk0) FOLIOD=$FOLIOD \
  timeout $((60 * TSCALE)) nbdsh -c "exec(open('$tmp/fsync.py').read())" ||
  fail "FLUSH after a failed fsync"
stop_foliod
losetup -d "$loop"
loop=
cmp -n $((4 << 20)) "$tmp/data" "$mnt/img" ||
  fail "a successful FLUSH left the data missing from the device"
echo "data is on the device"
[ "$(cat "$tmp/lost")" = $((4 << 20)) ] ||
  fail "after the failed FLUSH, $(cat "$tmp/lost") bytes dirty, not 4 MiB"
