#!/bin/bash
# nbdkit-folio-plugin: one cache shared by every connection (multi-conn).
#  - write on one handle, flush on another: the backing file holds the data
#    (the NBD multi-conn promise) and a third handle reads it;
#  - four handles write disjoint ranges in parallel threads (PARALLEL thread
#    model), one flush, every handle reads every range back;
#  - after nbdkit exits the backing file holds everything.
. "$(dirname "$0")/lib.sh"
plugin_init plugin-mc
requires python3

img=$tmp/disk.img
size=$((16 * 1024 * 1024 + 512))
head -c $size /dev/urandom > "$img"

cat > "$tmp/mc.py" <<'EOF'
import os, random, sys, threading
import nbd

uri, img, out = os.environ["URI"], os.environ["IMG"], os.environ["MODEL"]
rng = random.Random()

def connect():
    h = nbd.NBD()
    h.connect_uri(uri)
    return h

def file_range(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)

hs = [connect() for _ in range(4)]
assert all(h.can_multi_conn() for h in hs)
size = hs[0].get_size()
with open(img, "rb") as f:
    model = bytearray(f.read())

# 1. Write on h0 (unaligned), flush on h1, then the file and h2 agree.
off, n = 1234567, 300001
data = rng.randbytes(n)
hs[0].pwrite(data, off)
model[off:off + n] = data
hs[1].flush()
if file_range(off, n) != data:
    sys.exit("FAIL: flush on another connection did not write the data back")
if hs[2].pread(n, off) != data:
    sys.exit("FAIL: another connection reads stale data")

# 2. Parallel writers on disjoint, unaligned slices.
errors = []
def writer(k, h):
    try:
        r = random.Random(k)
        base = 2 * 1024 * 1024 + k * 3 * 1024 * 1024 + 77
        for j in range(64):
            o = base + j * 40000 + r.randrange(1000)
            d = r.randbytes(r.randrange(1, 36000))
            h.pwrite(d, o)
            model[o:o + len(d)] = d   # slices are disjoint: no lock needed
    except Exception as e:
        errors.append(e)
ts = [threading.Thread(target=writer, args=(k, h)) for k, h in enumerate(hs)]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    sys.exit("FAIL: writer: %r" % errors[0])
hs[3].flush()
with open(img, "rb") as f:
    if f.read() != model:
        sys.exit("FAIL: backing file differs after parallel writes + flush")
for h in hs:
    if h.pread(size, 0) != model:
        sys.exit("FAIL: a connection reads different data")

# 3. Unflushed writes from one handle are visible to another (one cache).
d = rng.randbytes(5000)
hs[1].pwrite(d, 999)
model[999:999 + 5000] = d
if hs[0].pread(5000, 999) != d:
    sys.exit("FAIL: shared cache: unflushed write not visible to another handle")

with open(out, "wb") as f:
    f.write(model)
for h in hs:
    h.shutdown()
print("multi-conn ok")
EOF

log=$tmp/nbdkit.log
if ! IMG=$img MODEL=$tmp/model timeout $((300 * TSCALE)) env "${NBDKIT_ENV[@]}" \
     nbdkit -U - "$PLUGIN" backing=file:"$img" cache-size=2M \
     --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/mc.py" 2>"$log"; then
  cat "$log"; exit 1
fi
cat "$log"
check_sanitizer_log "$log"
cmp "$img" "$tmp/model"
echo "backing file holds every write after exit"
