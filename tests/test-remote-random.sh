#!/bin/bash
# Randomized: a client runs random writes, zeroes, reads and flushes
# against a reference while a thread switches the remote's errors on and
# off (nbdkit --filter=error error-rate=100% error-file=F) at random
# moments.  A failed write is repeated until it succeeds (then its range is
# defined again); a read that succeeds must match the reference.  At the
# end, errors off, a FLUSH succeeds, the export reads as the reference, and
# after SIGTERM so does the remote's file.
# Two rounds: error=EIO (the remote answers an error: requests fail, and
# some must have failed) and error=ESHUTDOWN (the remote is going away:
# foliod reconnects and retries, so no request may fail and the reconnect
# counter moves).  SEED=N replays a run; REMOTE_ERRORS="EIO" picks rounds.
. "$(dirname "$0")/lib.sh"
lib_init remote-random
. "$(dirname "$0")/lib-remote.sh"

cat > "$tmp/random.py" <<'PY'
import errno, os, random, threading, time
import nbd
from modelclient import seeded_rng, load_model

env = os.environ
seed, rng = seeded_rng()
errfile = env["ERRFILE"]
model = load_model()
duration = float(env.get("DURATION", "5"))
stop = threading.Event()
toggles = 0

def toggler():
    global toggles
    trng = random.Random(seed + 1)
    while not stop.wait(trng.uniform(0.05, 0.4)):
        if os.path.exists(errfile):
            os.unlink(errfile)
        else:
            open(errfile, "w").close()
        toggles += 1
    if os.path.exists(errfile):
        os.unlink(errfile)

h = nbd.NBD()
h.connect_uri(env["URI"])
size = h.get_size()
t = threading.Thread(target=toggler)
t.start()
fails = {"write": 0, "zero": 0, "read": 0, "flush": 0}
errnos = set()
good = {"write": 0, "zero": 0, "read": 0, "flush": 0}

def until_ok(kind, fn, *args):
    while True:
        try:
            fn(*args)
            good[kind] += 1
            return
        except nbd.Error as e:
            fails[kind] += 1
            errnos.add(e.errnum)
            time.sleep(0.02)

end = time.monotonic() + duration
try:
    while time.monotonic() < end:
        op = rng.choice("wwwwzrrrf")
        n = rng.choice([1, 512, 4096, 4097, 65536, 131072 + 3, rng.randrange(1, 200000)])
        off = rng.randrange(0, size - n)
        if op == "w":
            d = rng.randbytes(n)
            until_ok("write", h.pwrite, d, off)
            model[off:off + n] = d
        elif op == "z":
            until_ok("zero", h.zero, n, off)
            model[off:off + n] = bytes(n)
        elif op == "r":
            try:
                got = h.pread(n, off)
            except nbd.Error as e:
                fails["read"] += 1
                errnos.add(e.errnum)
                continue
            good["read"] += 1
            assert got == model[off:off + n], "read at %d+%d (seed %d)" % (off, n, seed)
        else:
            try:
                h.flush()
                good["flush"] += 1
            except nbd.Error as e:
                fails["flush"] += 1
                errnos.add(e.errnum)
finally:
    stop.set()
    t.join()

assert not os.path.exists(errfile)
h.flush()           # errors off: must succeed
assert h.pread(size, 0) == model, "export differs from the reference (seed %d)" % seed
h.shutdown()
open(env["MODEL"], "wb").write(model)
print("toggles %d, succeeded %r, failed %r, errors %s" % (toggles, good, fails,
      " ".join(sorted(errno.errorcode.get(e, str(e)) for e in errnos))))
assert toggles >= 4, "too few error switches"
if env["REMOTE_ERROR"] == "ESHUTDOWN":
    assert sum(fails.values()) == 0, "a request failed although the remote only went away"
else:
    assert sum(fails.values()) > 0, "no request ever failed: errors not injected?"
PY
ctl=$tmp/ctl.sock
img=$tmp/remote.img
for err in ${REMOTE_ERRORS:-EIO ESHUTDOWN}; do
  echo "== error=$err"
  rm -f "$img"
  truncate -s 32M "$img"
  head -c 4M /dev/urandom | dd of="$img" bs=1M seek=8 conv=notrunc status=none
  cp "$img" "$tmp/model"
  start_remote "$tmp/remote.sock" --filter=error file "$img" \
    error="$err" error-rate=100% error-file="$tmp/errfile"
  # A small cache so that reads miss and writeback runs while errors come
  # and go; short expiry so background writeback meets them too.
  start_foliod --control "$ctl" \
    --export "disk0=$(remote_uri),cache-size=4M,dirty-expire=200,writeback-interval=100"
  MODEL=$tmp/model ERRFILE=$tmp/errfile REMOTE_ERROR=$err URI=$(uri disk0) \
    timeout $((120 * TSCALE)) nbdsh -c "exec(open('$tmp/random.py').read())" ||
    fail "randomized run, error=$err"
  reconnects=$(foliod_stat "$ctl" foliod_backing_reconnects_total)
  echo "reconnects $reconnects"
  if [ "$err" = ESHUTDOWN ]; then
    [ "$reconnects" -gt 0 ] || fail "ESHUTDOWN made no reconnects"
  fi
  foliod_alive
  stop_foliod
  stop_remote
  same_file "$img" "$tmp/model" "remote differs from the reference (error=$err)"
done
echo OK
