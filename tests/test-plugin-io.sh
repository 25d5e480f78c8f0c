#!/bin/bash
# nbdkit-folio-plugin: random read/write/zero/fast-zero/trim/flush/cache/
# block-status at unaligned offsets and sizes on an export of awkward size,
# checked against an in-memory model of the disk.  After every flush the
# backing file must equal the model; after nbdkit exits (no final flush) it
# must too: the plugin writes all dirty data back on unload.
# Run under several cache geometries and modes.
. "$(dirname "$0")/lib.sh"
plugin_init plugin-io
requires python3
nbdkit_folio () {
  timeout $((300 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit "$@"
}

# 5 MiB + 1234 bytes: data, hole, data, hole, data (holes are sparse).
make_image () {
  local img=$1 MiB=$((1024 * 1024))
  rm -f "$img"
  truncate -s $((5 * MiB + 1234)) "$img"
  head -c $MiB /dev/urandom | dd of="$img" conv=notrunc status=none
  head -c $MiB /dev/urandom | dd of="$img" bs=$MiB seek=3 conv=notrunc status=none
  head -c $((MiB / 2 + 1234)) /dev/urandom |
    dd of="$img" bs=$((MiB / 2)) seek=9 conv=notrunc status=none
}

cat > "$tmp/io.py" <<'EOF'
import errno, os, sys
import nbd
from modelclient import seeded_rng

uri, img, out = os.environ["URI"], os.environ["IMG"], os.environ["MODEL"]
block = int(os.environ["BLOCK"])
nops = int(os.environ.get("NOPS", "300"))
seed, rng = seeded_rng()
MiB = 1 << 20

h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
size = h.get_size()
with open(img, "rb") as f:
    model = bytearray(f.read())
assert size == len(model), (size, len(model))

# What the plugin advertises.
assert not h.is_read_only()
for cap in ("can_flush", "can_fua", "can_trim", "can_zero", "can_fast_zero",
            "can_cache", "can_multi_conn"):
    assert getattr(h, cap)(), cap
assert h.can_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
assert h.get_block_size(nbd.SIZE_MINIMUM) == 1
assert h.get_block_size(nbd.SIZE_PREFERRED) == block, \
    h.get_block_size(nbd.SIZE_PREFERRED)
assert h.get_block_size(nbd.SIZE_MAXIMUM) == 32 * MiB

def fail(msg):
    print("FAIL:", msg, "seed", seed)
    sys.exit(1)

def extents(off, length):
    """[(off, len, flags)] covering [off, off+length), from block status."""
    res, pos, end = [], off, off + length
    while pos < end:
        got = []
        def cb(meta, o, ents, err):
            if meta == nbd.CONTEXT_BASE_ALLOCATION:
                got.extend(zip(ents[0::2], ents[1::2]))
            return 0
        h.block_status(end - pos, pos, cb)
        if not got:
            fail("block status returned no extent at %d" % pos)
        for ln, fl in got:
            if ln == 0:
                fail("zero-length extent at %d" % pos)
            ln = min(ln, end - pos)
            res.append((pos, ln, fl))
            pos += ln
            if pos >= end:
                break
    return res

def check_extents(off, length):
    for o, ln, fl in extents(off, length):
        if fl & nbd.STATE_ZERO and any(model[o:o + ln]):
            fail("extent %d+%d flagged zero holds data" % (o, ln))

def check_read(off, n):
    got = h.pread(n, off)
    want = bytes(model[off:off + n])
    if got != want:
        i = next(i for i in range(n) if got[i] != want[i])
        fail("read %d+%d differs at %d" % (off, n, off + i))

def check_file(when):
    with open(img, "rb") as f:
        disk = f.read()
    if disk != model:
        i = next(i for i in range(len(disk)) if disk[i] != model[i])
        fail("backing file differs from model at %d after %s" % (i, when))

def rand_range():
    off = rng.randrange(size)
    n = rng.choice([1, rng.randrange(1, 513), rng.randrange(1, 70000),
                    rng.randrange(1, 300000)])
    if rng.random() < 0.3:          # block-aligned now and then
        off -= off % block
        n = max(block, n - n % block)
    return off, max(1, min(n, size - off))

# The sparse file's holes show up as holes before anything is written.
for o, ln, fl in extents(1 * MiB, 2 * MiB):
    if fl != nbd.STATE_HOLE | nbd.STATE_ZERO:
        fail("hole of the backing reported as %d at %d+%d" % (fl, o, ln))
check_extents(0, size)

counts = {}
for i in range(nops):
    op = rng.choices(["read", "write", "zero", "fastzero", "trim", "flush",
                      "cache", "extents"],
                     [30, 30, 8, 4, 5, 3, 5, 5])[0]
    counts[op] = counts.get(op, 0) + 1
    off, n = rand_range()
    if op == "read":
        check_read(off, n)
    elif op == "write":
        data = rng.randbytes(n)
        h.pwrite(data, off, nbd.CMD_FLAG_FUA if rng.random() < 0.2 else 0)
        model[off:off + n] = data
    elif op == "zero":
        fl = rng.choice([0, nbd.CMD_FLAG_NO_HOLE, nbd.CMD_FLAG_FUA])
        h.zero(n, off, fl)
        model[off:off + n] = bytes(n)
        check_read(off, n)
    elif op == "fastzero":
        try:
            h.zero(n, off, nbd.CMD_FLAG_FAST_ZERO)
            model[off:off + n] = bytes(n)
        except nbd.Error as e:
            if e.errnum != errno.ENOTSUP:
                fail("fast zero failed with %s, not ENOTSUP" % e.errno)
        check_read(off, n)
    elif op == "trim":
        # After a trim the range may read as anything, but it must read the
        # same until it is written again: adopt what it reads now.
        h.trim(n, off, nbd.CMD_FLAG_FUA if rng.random() < 0.2 else 0)
        model[off:off + n] = h.pread(n, off)
    elif op == "flush":
        h.flush()
        check_file("flush")
    elif op == "cache":
        h.cache(n, off)
        check_read(off, n)
    elif op == "extents":
        check_extents(off, n)

check_read(0, size)
check_extents(0, size)
print("ops", counts)
with open(out, "wb") as f:
    f.write(model)
h.shutdown()
EOF

# run NAME BLOCK nbdkit-args...: one random run; the backing file must
# equal the model after nbdkit has exited.
run () {
  local name=$1 block=$2; shift 2
  local img=$tmp/$name.img log=$tmp/$name.log
  make_image "$img"
  echo "== $name: $*"
  if ! IMG=$img MODEL=$tmp/$name.model BLOCK=$block \
       nbdkit_folio -U - "$@" \
       --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/io.py" 2>"$log"; then
    cat "$log"; echo "$name: run failed"; exit 1
  fi
  grep -E '^(seed|ops)' "$log" || true
  check_sanitizer_log "$log"
  if ! cmp "$img" "$tmp/$name.model"; then
    echo "$name: backing file differs from the model after nbdkit exited"
    exit 1
  fi
}

run wb-64k-4k 4096 "$PLUGIN" backing=file:"$tmp/wb-64k-4k.img" \
  cache-size=1M folio-size=64K block-size=4K
run wb-default 4096 -v -D folio.verbose=1 "$PLUGIN" "$tmp/wb-default.img"
run wb-16k-512 512 "$PLUGIN" backing="$tmp/wb-16k-512.img" \
  cache-size=256K folio-size=16K block-size=512
run wt-2m-64k 65536 "$PLUGIN" backing=file:"$tmp/wt-2m-64k.img" \
  cache=writethrough cache-size=8M folio-size=2M block-size=64K
run none-4k 4096 "$PLUGIN" backing=file:"$tmp/none-4k.img" \
  cache=none folio-size=4K block-size=4K

# The verbose run really logged requests through nbdkit_debug.
grep -q 'folio: pwrite count=' "$tmp/wb-default.log" ||
  { echo "-D folio.verbose=1 logged no requests"; exit 1; }
echo "all runs match"
