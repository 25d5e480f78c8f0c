#!/bin/bash
# Randomized, server level: several clients on several loops at once,
# while writeback to a slow remote runs under them (issue 24: "drive
# several loops and the writeback/reader overlap").
#
# foliod --loops 2 over a remote that takes 2 ms a write (nbdkit
# --filter=delay), with a cache of 2 MiB (32 folios) over a 16 MiB export
# and a low dirty limit, so that eviction, background writeback, the
# throttle and flushes run all the time.  Four client threads, each with
# two connections (the loops take new connections in turn, so each
# thread's two are on different loops), each thread owning a region of
# the export: random writes, zeroes, trims (read back as zeroes: the
# remote file trims to zero), FUA writes and flushes through one
# connection, reads through either, every read checked against the
# thread's model.  So a write is read back on the other loop while its
# folio may be under writeback, evicted, or refilled from the remote.
# At the end every thread's region reads as its model through a new
# connection, and after a FLUSH and SIGTERM the remote's file equals the
# whole model.  SEED=N replays the clients' choices (the schedule still
# varies).
. "$(dirname "$0")/lib.sh"
lib_init loops-model
. "$(dirname "$0")/lib-remote.sh"
requires python3

size=$((16 << 20))
head -c "$size" /dev/urandom > "$tmp/remote.img"
cp "$tmp/remote.img" "$tmp/model"
start_remote "$tmp/remote.sock" --filter=delay file "$tmp/remote.img" \
  delay-write=2ms delay-zero=2ms delay-trim=2ms
start_foliod --loops 2 --control "$tmp/ctl" --export \
  "disk0=$(remote_uri),cache-size=2M,folio-size=64K,block-size=4K,dirty-background=10,dirty-limit=30"

URI=$(uri disk0) MODEL=$tmp/model DURATION=${DURATION:-6} \
python3 - <<'PY' || fail "the clients saw something else than they wrote"
import os, random, sys, threading, time
import nbd
from modelclient import seeded_rng, load_model

env = os.environ
seed, _ = seeded_rng()
model = load_model()
size = len(model)
NT = 4
region = size // NT
duration = float(env["DURATION"])
errors = []
counts = [0] * NT

def client(t):
    rng = random.Random(seed * 31 + t)
    lo, hi = t * region, (t + 1) * region
    hs = [nbd.NBD(), nbd.NBD()]
    for h in hs:
        h.connect_uri(env["URI"])
    w = hs[0]
    end = time.monotonic() + duration
    try:
        while time.monotonic() < end and not errors:
            op = rng.choice("wwwzturrrrf")
            n = rng.choice([512, 4096, 4096, 8192, 65536, 65536 + 4096,
                            rng.randrange(1, 200000)])
            n = min(n, hi - lo)
            off = rng.randrange(lo, hi - n + 1)
            if op == "w" or op == "u":
                d = rng.randbytes(n)
                w.pwrite(d, off, nbd.CMD_FLAG_FUA if op == "u" else 0)
                model[off:off + n] = d
            elif op == "z":
                w.zero(n, off)
                model[off:off + n] = bytes(n)
            elif op == "t":
                # A trim may leave the data or zeroes, per 512-byte sector:
                # read it back at once through the other loop and take
                # what it says, if it is one of the two; then it sticks.
                old = bytes(model[off:off + n])
                w.trim(n, off)
                got = hs[1].pread(n, off)
                for s in range(off - off % 512, off + n, 512):
                    a, b = max(s, off) - off, min(s + 512, off + n) - off
                    g, o = got[a:b], old[a:b]
                    if g != o and g != bytes(b - a):
                        errors.append("thread %d: trim of [%d, %d) left neither "
                                      "the data nor zeroes at %d (seed %d)"
                                      % (t, off, off + n, off + a, seed))
                        return
                model[off:off + n] = got
            elif op == "r":
                h = hs[rng.randrange(2)]
                got = h.pread(n, off)
                if got != model[off:off + n]:
                    bad = next(i for i in range(n) if got[i] != model[off + i])
                    errors.append("thread %d: read [%d, %d) on connection %d "
                                  "differs first at %d (seed %d)"
                                  % (t, off, off + n, hs.index(h), off + bad, seed))
                    return
            else:
                w.flush()
            counts[t] += 1
    except nbd.Error as e:
        errors.append("thread %d: %s" % (t, e))
    finally:
        for h in hs:
            h.shutdown()

threads = [threading.Thread(target=client, args=(t,)) for t in range(NT)]
for x in threads:
    x.start()
for x in threads:
    x.join()
if errors:
    print("\n".join(errors))
    sys.exit(1)
print("ops per thread:", counts)
if min(counts) < 20:
    print("a thread did too little to count:", counts)
    sys.exit(1)
h = nbd.NBD()
h.connect_uri(env["URI"])
for off in range(0, size, 1 << 20):
    if h.pread(1 << 20, off) != model[off:off + (1 << 20)]:
        print("the export differs from the model in [%d, +1M)" % off)
        sys.exit(1)
h.flush()
h.shutdown()
with open(env["MODEL"], "wb") as f:
    f.write(model)
PY

# The run did overlap: more was written back than the final flush could
# write (at most the dirty limit, 30 % of the 2 MiB cache), and folios
# were evicted, which only clean ones are.
wb=$(foliod_stat "$tmp/ctl" foliod_writeback_bytes_total)
ev=$(foliod_stat "$tmp/ctl" foliod_evictions_total)
[ "${wb:-0}" -gt $((2 << 20)) ] || fail "only ${wb:-0} bytes written back: no writeback under the clients"
[ "${ev:-0}" -gt 0 ] || fail "no folio was evicted during the run"
"$FOLIOD" stats --control "$tmp/ctl" | grep '^loop' > "$tmp/loops"
for l in 0 1; do
  grep -qE "^loop $l: [0-9]+ open, [1-9][0-9]* accepted, [1-9][0-9]* requests$" "$tmp/loops" ||
    fail "loop $l served nothing: $(tr '\n' ' ' < "$tmp/loops")"
done
stop_foliod
stop_remote
same_file "$tmp/remote.img" "$tmp/model"
echo "ok: $(tr '\n' ' ' < "$tmp/loops"), $wb bytes written back, $ev evictions"
