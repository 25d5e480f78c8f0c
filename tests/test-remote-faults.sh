#!/bin/bash
# Faults of the remote, injected with nbdkit's own filters under it.
#  1. --filter=error error-rate=100% error-file=F (errors while F exists):
#     whole-block writes still land in the cache, FLUSH fails and the data
#     stays dirty (foliod stats), a read that misses fails, one that hits
#     does not; once F is gone a FLUSH succeeds and nothing is dirty; after
#     SIGTERM the remote's file equals what the client wrote.
#  2. --filter=delay (slow remote, small cache: misses and evictions): two
#     clients' random workloads read back right and end up in the remote.
. "$(dirname "$0")/lib.sh"
lib_init remote-faults
. "$(dirname "$0")/lib-remote.sh"

img=$tmp/remote.img
ctl=$tmp/ctl.sock
truncate -s 64M "$img"
cp "$img" "$tmp/model"

# ---- 1. errors on, then off ----
start_remote "$tmp/remote.sock" --filter=error file "$img" \
  error=EIO error-rate=100% error-file="$tmp/errfile"
start_foliod --control "$ctl" --export "disk0=$(remote_uri),cache-size=32M,block-size=4K,dirty-expire=600000,dirty-background=90,dirty-limit=95"

cat > "$tmp/errors.py" <<'PY'
import errno, os, subprocess
import nbd
from modelclient import seeded_rng, load_model

env = os.environ
seed, rng = seeded_rng()
model = load_model()
errfile = env["ERRFILE"]

def stat(name):
    out = subprocess.check_output([env["FOLIOD"], "stats", "--control",
                                   env["CTL"], "--prometheus"], text=True)
    for line in out.splitlines():
        k, _, v = line.partition(" ")
        if k in (name, name + '{export="disk0"}'):
            return float(v)
    raise KeyError(name)

h = nbd.NBD()
h.connect_uri(env["URI"])

def write(off, data):
    h.pwrite(data, off)
    model[off:off + len(data)] = data

def fails(fn, *args):
    try:
        fn(*args)
    except nbd.Error as e:
        return e.errnum
    return 0

# Errors off: 1 MiB at 0, flushed.
write(0, rng.randbytes(1 << 20))
h.flush()
assert stat("foliod_dirty_bytes") == 0

# Errors on.
open(errfile, "w").close()
dirty = set()
for i in range(200):
    blk = rng.randrange(1 << 20 >> 12, 48 << 20 >> 12)   # beyond the 1st MiB
    write(blk << 12, rng.randbytes(4096))
    dirty.add(blk)
write(40 << 20, rng.randbytes(256 << 10))
dirty.update(range(40 << 20 >> 12, (40 << 20 >> 12) + 64))
# Unaligned, but in blocks already in the cache: no remote read needed.
write(12345, rng.randbytes(10000))
dirty.update(range(12345 >> 12, (12345 + 10000 - 1 >> 12) + 1))
e = fails(h.flush)
assert e == errno.EIO, "flush with the remote failing: errno %r" % e
want = len(dirty) * 4096
got = stat("foliod_dirty_bytes")
assert got == want, "dirty bytes after failed flush: %d, expected %d" % (got, want)
# A read that must go to the remote fails; one served by the cache does not.
e = fails(h.pread, 4096, 60 << 20)
assert e != 0, "read of uncached data succeeded while the remote fails"
assert h.pread(256 << 10, 40 << 20) == model[40 << 20:(40 << 20) + (256 << 10)]
assert h.pread(1 << 20, 0) == model[:1 << 20]
e = fails(h.flush)
assert e == errno.EIO, "second flush: errno %r" % e
errors = stat("foliod_backing_errors_total")
assert errors > 0, "no backing errors counted"
print("errors on: flush failed (EIO), %d bytes dirty, %d backing errors" % (got, errors))

# Errors off: the next flush writes everything.
os.unlink(errfile)
h.flush()
assert stat("foliod_dirty_bytes") == 0, "dirty data left after a good flush"
assert h.pread(4096, 60 << 20) == model[60 << 20:(60 << 20) + 4096]
# Unflushed tail: SIGTERM must write it back.
for i in range(50):
    n = rng.choice([1, 512, 4096, 5000, 70000])
    write(rng.randrange(0, len(model) - n), rng.randbytes(n))
h.shutdown()
open(env["MODEL"], "wb").write(model)
PY
MODEL=$tmp/model ERRFILE=$tmp/errfile CTL=$ctl URI=$(uri disk0) \
  timeout $((120 * TSCALE)) nbdsh -c "exec(open('$tmp/errors.py').read())" ||
  fail "error injection workload"
foliod_alive
stop_foliod
stop_remote
same_file "$img" "$tmp/model" "remote differs from what the client wrote (errors)"
echo "error filter: remote == client data"

# ---- 2. slow remote ----
# Two clients at once, each in its own half of the disk (misses and
# writeback of both overlap on foliod's connections to the remote).
start_remote "$tmp/remote.sock" --filter=delay file "$img" rdelay=2ms wdelay=2ms
start_foliod --export "disk0=$(remote_uri),cache-size=2M,folio-size=64K,block-size=4K"
cat > "$tmp/slow.py" <<'PY'
import os
import nbd
from modelclient import seeded_rng, load_model

env = os.environ
lo, hi = int(env["LO"]), int(env["HI"])
seed, rng = seeded_rng(salt=lo)
model = load_model()
h = nbd.NBD()
h.connect_uri(env["URI"])
for i in range(200):
    op = rng.choice("rrww f")
    n = rng.choice([512, 4096, 4097, 65536, 200000, rng.randrange(1, 100000)])
    off = rng.randrange(lo, hi - n)
    if op == "r":
        assert h.pread(n, off) == model[off:off + n], "read at %d+%d (seed %d)" % (off, n, seed)
    elif op == "w":
        d = rng.randbytes(n)
        h.pwrite(d, off)
        model[off:off + n] = d
    elif op == "f":
        h.flush()
    else:
        h.zero(n, off)
        model[off:off + n] = bytes(n)
h.flush()
assert h.pread(hi - lo, lo) == model[lo:hi], "final read-back (seed %d)" % seed
h.shutdown()
open(env["OUT"], "wb").write(model[lo:hi])
PY
t0=$(date +%s%N)
half=$((32 << 20))
pids=()
for lo in 0 $half; do
  MODEL=$tmp/model LO=$lo HI=$((lo + half)) OUT=$tmp/part$lo URI=$(uri disk0) \
    timeout $((120 * TSCALE)) nbdsh -c "exec(open('$tmp/slow.py').read())" &
  pids+=($!)
  track $!
done
for p in "${pids[@]}"; do
  wait "$p" || fail "slow remote workload"
done
echo "slow remote: 2 x 200 ops in $(( ($(date +%s%N) - t0) / 1000000 )) ms"
cat "$tmp/part0" "$tmp/part$half" > "$tmp/model"
foliod_alive
stop_foliod
stop_remote
same_file "$img" "$tmp/model" "remote differs from what the clients wrote (delay)"
echo OK
