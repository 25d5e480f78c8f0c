#!/bin/bash
# A release under writers (issue 35 item 3): two clients write 4 KiB
# blocks one after the other (each round its own half of the export, each
# block tagged with its write's number) until `foliod release disk0`,
# started once both have written 100, refuses them.  Each
# writer stops at its first refused write, which must fail with EPERM.
# Then the file, read directly:
#  - holds, in each block, the last write acknowledged to it (written back
#    by the release: none lost);
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
N = HALF // 4096          # blocks per writer; a writer goes round them
def block(w, i):
    return (b"%d:%08d|" % (w, i)).ljust(4096, b".")
progress = {0: 0, 1: 0}
result = {}
def writer(w):
    h = nbd.NBD()
    h.connect_uri(uri)
    i = 0
    try:
        while True:                    # until the release refuses one
            h.pwrite(block(w, i), w * HALF + (i % N) * 4096)
            i += 1
            progress[w] = i
    except nbd.Error as e:
        result[w] = (i, e.errno)
ts = [threading.Thread(target=writer, args=(w,), daemon=True) for w in (0, 1)]
for t in ts:
    t.start()
while min(progress.values()) < 100:
    time.sleep(0.01)
r = subprocess.run([foliod, "release", "disk0", "--control", ctl],
                   capture_output=True, text=True)
print("release:", r.returncode, r.stdout.strip(), r.stderr.strip())
if r.returncode != 0:
    sys.exit("release failed")
for t in ts:
    t.join(60)
    if t.is_alive():
        sys.exit("a writer is still writing after the release")
data = open(img, "rb").read()
for w in (0, 1):
    n, err = result[w]
    print("writer %d: %d blocks acknowledged, then %s" % (w, n, err))
    if err not in (errno.EPERM, "EPERM"):
        sys.exit("writer %d: refused with %s, not EPERM" % (w, err))
    # Each block holds the last write acknowledged to it; the refused
    # write n (and none after) never landed.
    for pos in range(N):
        last = pos + ((n - 1 - pos) // N) * N if n > pos else None
        off = w * HALF + pos * 4096
        want = block(w, last) if last is not None else bytes(4096)
        if data[off:off + 4096] != want:
            sys.exit("writer %d: block %d holds %r, not write %s"
                     % (w, pos, data[off:off + 12], last))
EOF
timeout $(( 300 * TSCALE )) python3 "$tmp/writers.py" "$(uri disk0)" "$tmp/ctl" \
  "$FOLIOD" "$img" || fail "writers around the release"
stop_foliod
