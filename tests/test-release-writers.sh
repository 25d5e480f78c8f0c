#!/bin/bash
# A release under writers (issue 35 item 3): two clients write 4 KiB
# blocks one after the other (each to its own half of the export, each
# block tagged with its number) while `foliod release disk0` runs.  Each
# writer stops at its first refused write, which must fail with EPERM.
# Then the file, read directly:
#  - holds every block a writer had acknowledged (written back by the
#    release: none lost);
#  - holds nothing of the refused block or any later one (no write got
#    past the gate and landed after the release).
. "$(dirname "$0")/lib.sh"
lib_init release-writers
requires nbdsh

img=$tmp/disk.img
truncate -s 64M "$img"
start_foliod --control "$tmp/ctl" \
  --export "disk0=file:$img,cache-size=64M,dirty-expire=3600000"

cat > "$tmp/writers.py" <<'EOF'
import errno, os, subprocess, sys, threading, time, nbd
uri, ctl, foliod, img = sys.argv[1:5]
HALF = 32 << 20
def block(w, i):
    return (b"%d:%08d|" % (w, i)).ljust(4096, b".")
result = {}
def writer(w):
    h = nbd.NBD()
    h.connect_uri(uri)
    i = 0
    try:
        while i < HALF // 4096:
            h.pwrite(block(w, i), w * HALF + i * 4096)
            i += 1
    except nbd.Error as e:
        result[w] = (i, e.errno)
        return
    result[w] = (i, None)
ts = [threading.Thread(target=writer, args=(w,)) for w in (0, 1)]
for t in ts:
    t.start()
time.sleep(1.0)
r = subprocess.run([foliod, "release", "disk0", "--control", ctl],
                   capture_output=True, text=True)
print("release:", r.returncode, r.stdout.strip(), r.stderr.strip())
for t in ts:
    t.join()
if r.returncode != 0:
    sys.exit("release failed")
data = open(img, "rb").read()
for w in (0, 1):
    n, err = result[w]
    print("writer %d: %d blocks acknowledged, then %s" % (w, n, err))
    if err not in (errno.EPERM, "EPERM"):
        sys.exit("writer %d: refused with %s, not EPERM" % (w, err))
    if n < 10:
        sys.exit("writer %d: too few writes before the release to test it" % w)
    for i in range(n):
        off = w * HALF + i * 4096
        if data[off:off + 4096] != block(w, i):
            sys.exit("writer %d: acknowledged block %d not in the file" % (w, i))
    rest = data[w * HALF + n * 4096:(w + 1) * HALF]
    if rest.strip(b"\0"):
        sys.exit("writer %d: a write after the gate landed (block %d on)" % (w, n))
EOF
timeout $(( 300 * TSCALE )) python3 "$tmp/writers.py" "$(uri disk0)" "$tmp/ctl" \
  "$FOLIOD" "$img" || fail "writers around the release"
stop_foliod
