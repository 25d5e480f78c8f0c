#!/bin/bash
# nbdkit-folio-filter in front of the file plugin and of the nbd plugin
# (a remote nbdkit memory server on a Unix socket), each with a small
# cache and four client connections (multi-conn):
#  - four handles write disjoint unaligned ranges in parallel threads, a
#    FLUSH on one handle: the image below holds it all (the file, or the
#    remote read directly), and every handle reads it all back;
#  - a write on one handle not yet flushed is read by another (one cache);
#  - after nbdkit exits the image below holds every byte.
. "$(dirname "$0")/lib.sh"
filter_init filter-file-nbd
requires nbdsh python3

size=$((16 * 1024 * 1024))

cat > "$tmp/mc.py" <<'EOF2'
import os, random, sys, threading
import nbd
below_uri, below_file, model_out = sys.argv[1:4]

def connect(uri):
    h = nbd.NBD()
    h.connect_uri(uri)
    return h

def below():
    if below_file != "-":
        return open(below_file, "rb").read()
    h = connect(below_uri)
    d = h.pread(h.get_size(), 0)
    h.shutdown()
    return d

hs = [connect(os.environ["uri"]) for _ in range(4)]
if not all(h.can_multi_conn() and h.can_fua() for h in hs):
    sys.exit("FAIL: multi-conn or FUA not advertised")
size = hs[0].get_size()
model = bytearray(below())
errors = []
def writer(k, h):
    try:
        r = random.Random(k)
        base = k * (4 << 20) + 77
        for j in range(48):
            o = base + j * 80000 + r.randrange(1000)
            d = r.randbytes(r.randrange(1, 70000))
            h.pwrite(d, o, nbd.CMD_FLAG_FUA if j % 8 == 0 else 0)
            model[o:o + len(d)] = d        # disjoint slices
    except Exception as e:
        errors.append(e)
ts = [threading.Thread(target=writer, args=(k, h)) for k, h in enumerate(hs)]
for t in ts: t.start()
for t in ts: t.join()
if errors:
    sys.exit("FAIL: writer: %r" % errors[0])
hs[3].flush()
if below() != model:
    sys.exit("FAIL: the image below differs after parallel writes + FLUSH")
for h in hs:
    if h.pread(size, 0) != model:
        sys.exit("FAIL: a connection reads different data")
d = random.Random(9).randbytes(5000)
hs[1].pwrite(d, 999)
model[999:999 + 5000] = d
if hs[0].pread(5000, 999) != d:
    sys.exit("FAIL: an unflushed write is not seen by another connection")
open(model_out, "wb").write(model)
for h in hs:
    h.shutdown()
print("ok")
EOF2

# 1. The file plugin.
img=$tmp/disk.img
head -c $size /dev/urandom > "$img"
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
  --filter="$FILTER" file "$img" cache-size=2M \
  --run "env -u LD_PRELOAD uri=\$uri python3 $tmp/mc.py - $img $tmp/model" \
  >"$tmp/out" 2>"$tmp/log" ||
  { cat "$tmp/out" "$tmp/log"; fail "file plugin"; }
check_sanitizer_log "$tmp/log"
cmp "$img" "$tmp/model" || fail "file: the image lacks data after exit"
echo "file plugin: ok"

# 2. The nbd plugin in front of a remote (nbdkit memory).
remote=$tmp/remote.sock
nbdkit -f -U "$remote" memory $size 2>"$tmp/remote.log" &
track $!
for _ in $(seq 50); do [ -S "$remote" ] && break; sleep 0.1; done
[ -S "$remote" ] || fail "the remote did not start"
ruri="nbd+unix:///?socket=$remote"
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
  --filter="$FILTER" nbd socket="$remote" cache-size=2M \
  --run "env -u LD_PRELOAD uri=\$uri python3 $tmp/mc.py $ruri - $tmp/model" \
  >"$tmp/out" 2>"$tmp/log" ||
  { cat "$tmp/out" "$tmp/log"; fail "nbd plugin"; }
check_sanitizer_log "$tmp/log"
nbdsh -u "$ruri" -c "import sys; sys.exit(h.pread($size, 0) != open('$tmp/model', 'rb').read())" ||
  fail "nbd: the remote lacks data after exit"
echo "nbd plugin in front of a remote: ok"
