#!/bin/bash
# The rbd backing against a model (issue 27): a one-node Ceph cluster,
# foliod with a tiny cache (4 MiB over a 64 MiB image, short dirty expiry)
# in front of rbd:rbd/img, four libnbd clients each doing random unaligned
# writes, zeroes, reads (checked against the model) and flushes in a
# region of its own (the regions' borders are unaligned, so clients share
# blocks and folios).  Then every client's data reads back through foliod,
# SIGTERM writes it all back, and the image read with `rbd export` equals
# the model byte for byte.  Before that, block status says where the
# imported image has data and where it has holes.  SEED=N replays a run.
. "$(dirname "$0")/lib.sh"
lib_init rbd-random 200
. "$(dirname "$0")/lib-ceph.sh"
/usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"

cat > "$tmp/rbd_random_driver.py" <<'PY'
import os, random, sys, threading, time
import nbd
from modelclient import seeded_rng, load_model

env = os.environ
seed, _ = seeded_rng()
model = load_model()
size = len(model)
clients = 4
duration = float(env.get("DURATION", "8"))
bounds = [i * (size // clients) + (i * 777 if 0 < i < clients else 0)
          for i in range(clients + 1)]
counts = [dict(w=0, z=0, r=0, f=0) for _ in range(clients)]
errors = []

def client(i):
    rng = random.Random(seed * 31 + i)
    lo, hi = bounds[i], bounds[i + 1]
    h = nbd.NBD()
    h.connect_uri(env["URI"])
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end:
            op = rng.choice("wwwwzrrrf")
            n = rng.choice([1, 511, 4096, 4097, 65536 + 3,
                            rng.randrange(1, 200000)])
            n = min(n, hi - lo)
            off = rng.randrange(lo, hi - n + 1)
            if op == "w":
                d = rng.randbytes(n)
                h.pwrite(d, off)
                model[off:off + n] = d
            elif op == "z":
                h.zero(n, off)
                model[off:off + n] = bytes(n)
            elif op == "r":
                got = h.pread(n, off)
                if got != model[off:off + n]:
                    raise AssertionError("client %d read at %d+%d differs" % (i, off, n))
            else:
                h.flush()
            counts[i][op] += 1
        h.flush()
        step = 4 << 20
        for off in range(lo, hi, step):
            n = min(step, hi - off)
            if h.pread(n, off) != model[off:off + n]:
                raise AssertionError("client %d: final read at %d+%d differs" % (i, off, n))
        h.shutdown()
    except Exception as e:
        errors.append("client %d: %r (seed %d)" % (i, e, seed))

ts = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
for t in ts: t.start()
for t in ts: t.join()
print("ops per client:", counts)
open(env["MODEL"], "wb").write(model)
if errors:
    print("\n".join(errors))
    sys.exit(1)
PY

ceph_up 64M
# The image starts with data in its middle (reads of it miss the cache).
rbd_import_model 64 8 16

start_foliod --control "$tmp/ctl" --export \
  "disk0=$(rbd_backing),cache-size=4M,dirty-expire=200,writeback-interval=100,request-timeout=60000"
grep -q "rbd:rbd/img" "$FOLIOD_LOG" || fail "no rbd export in the log"
# Block status from the image's allocation (whole 4 MiB objects): the
# imported data at 8M..24M is data, the zeroes around it holes.
nbdinfo --map "$(uri disk0)" > "$tmp/map"
cat "$tmp/map"
awk '$1 == 0 && $2 == 8388608 && $3 == 3 { a = 1 }
     $1 == 8388608 && $2 == 16777216 && $3 == 0 { b = 1 }
     $1 == 25165824 && $4 ~ /^hole/ { c = 1 }
     END { exit !(a && b && c) }' "$tmp/map" ||
  fail "block status does not follow the image's allocation"
MODEL=$tmp/model URI=$(uri disk0) \
  timeout $((240 * TSCALE)) /usr/bin/python3 "$tmp/rbd_random_driver.py" ||
  fail "randomized run"
foliod_alive
stop_foliod
rbd_cmd export --no-progress rbd/img "$tmp/exported" || fail "rbd export"
cmp "$tmp/exported" "$tmp/model" ||
  fail "the image differs from the model after SIGTERM"
echo OK
