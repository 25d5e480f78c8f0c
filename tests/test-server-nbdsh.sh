#!/bin/bash
# nbdsh against foliod: read, write (FUA), flush, trim, zero (NO_HOLE,
# FAST_ZERO), cache and block status at unaligned offsets and awkward sizes,
# checked against a model of the disk; structured reads with hole chunks and
# DF; simple replies; and, with libnbd's client-side checks off, the errors
# the server gives for bad requests.  After SIGTERM the backing file must
# hold every written byte.
. "$(dirname "$0")/lib.sh"
lib_init server-nbdsh
requires nbdsh

MiB=$((1024 * 1024))
SIZE=$((8 * MiB + 4321))
truncate -s $SIZE "$tmp/img"
head -c $((3 * MiB)) /dev/urandom | dd of="$tmp/img" bs=1M seek=1 conv=notrunc status=none
cp "$tmp/img" "$tmp/model"
truncate -s 1M "$tmp/ro"
start_foliod --export "disk0=file:$tmp/img,cache-size=4M,folio-size=64K,block-size=4K" \
             --export "ro=file:$tmp/ro,read-only=true"

cat > "$tmp/t.py" <<'PY'
import errno, os
import nbd
from modelclient import seeded_rng, load_model

uri, ro_uri, mpath = os.environ["URI"], os.environ["RO_URI"], os.environ["MODEL"]
seed, rng = seeded_rng()
model = load_model(mpath)
known = bytearray(b"\1" * len(model))  # 0 where a trim made contents undefined

h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(uri)
size = h.get_size()
assert size == len(model)

def check(off, n):
    got = h.pread(n, off)
    for i in range(n):
        if known[off + i] and got[i] != model[off + i]:
            raise AssertionError("mismatch at %d (seed %d)" % (off + i, seed))

def write(off, data, flags=0):
    h.pwrite(data, off, flags)
    model[off:off + len(data)] = data
    known[off:off + len(data)] = b"\1" * len(data)

def zero(off, n, flags=0):
    h.zero(n, off, flags)
    model[off:off + n] = bytes(n)
    known[off:off + n] = b"\1" * n

# The awkward case from the issue: 130000 bytes at 777.
data = os.urandom(130000)
write(777, data)
assert h.pread(130000, 777) == data
check(0, 200000)
# FUA write across a folio boundary, unaligned both ends.
write(65536 - 3333, os.urandom(9999), nbd.CMD_FLAG_FUA)
check(60000, 20000)
h.flush()

# Zero without and with NO_HOLE, then a fast zero (may be refused with
# ENOTSUP, which must leave the data alone).
zero(1 * 2**20 + 123, 70000)
zero(2 * 2**20 + 5, 4096 * 3, nbd.CMD_FLAG_NO_HOLE)
check(2**20, 2**20 + 20000)
before = h.pread(8192, 3 * 2**20)
try:
    zero(3 * 2**20, 8192, nbd.CMD_FLAG_FAST_ZERO)
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
    assert h.pread(8192, 3 * 2**20) == before
check(3 * 2**20 - 100, 8392)

# Trim: afterwards contents are undefined, but a whole-block trim of data
# never written back must not resurrect anything beyond the range.
h.trim(200000, 5 * 2**20 + 1)
known[5 * 2**20 + 1:5 * 2**20 + 200001] = bytes(200000)
check(5 * 2**20 - 4096, 210000)

# Cache (prefetch) then read the same range.
h.cache(300000, 1234567)
check(1234567, 300000)

# Block status: what we wrote is data; the zeroed 12 KiB reads as zero.
def extents(off, n, flags=0):
    out = []
    def cb(meta, o, ents, err):
        assert meta == nbd.CONTEXT_BASE_ALLOCATION
        pos = o
        for i in range(0, len(ents), 2):
            out.append((pos, ents[i], ents[i + 1]))
            pos += ents[i]
    h.block_status(n, off, cb, flags)
    return out
e = extents(777, 130000)
assert e[0][0] == 777 and all(t & 1 == 0 for (_, _, t) in e), e
e = extents(2 * 2**20 + 8192, 4096)
assert all(t & 2 for (_, _, t) in e), e
one = extents(0, size, nbd.CMD_FLAG_REQ_ONE)
assert len(one) == 1 and one[0][1] <= size, one
# The end of the export is a hole (never written): reported as such.
e = extents(size - 100000, 100000)
assert e[-1][2] & 1 and e[0][0] == size - 100000, e
assert sum(x[1] for x in e) >= 100000 or len(e) >= 1

# Structured read of a sparse MiB: hole chunks, data equal to zeroes.
chunks = []
def chunk(sub, off, status, err):
    chunks.append((off, len(sub), status))
    return 0
buf = h.pread_structured(2**20, 6 * 2**20, chunk)
assert buf == bytes(2**20)
assert any(s == nbd.READ_HOLE for (_, _, s) in chunks), chunks
# DF: one content chunk, data explicit.
chunks.clear()
buf = h.pread_structured(65536, 6 * 2**20, chunk, nbd.CMD_FLAG_DF)
assert len(chunks) == 1 and chunks[0][2] == nbd.READ_DATA, chunks
# A mixed read: data, then hole.
chunks.clear()
buf = h.pread_structured(2**20, 4 * 2**20 - 2**19, chunk)
assert buf == bytes(model[4 * 2**20 - 2**19:4 * 2**20 + 2**19])
assert sum(n for (_, n, _) in chunks) == 2**20, chunks

# Random operations against the model.
for i in range(300):
    op = rng.choice("rrwwzf")
    n = rng.choice([1, 511, 512, 4095, 4096, 4097, 65536, 130000, rng.randrange(1, 300000)])
    off = rng.randrange(0, size - n + 1)
    if op == "r":
        check(off, n)
    elif op == "w":
        write(off, rng.randbytes(n), rng.choice([0, nbd.CMD_FLAG_FUA]))
    elif op == "z":
        zero(off, n, rng.choice([0, nbd.CMD_FLAG_NO_HOLE]))
    else:
        h.flush()
h.flush()
check(0, size)

# Bad requests: turn libnbd's own checks off so they reach the server.
h.set_strict_mode(0)
def expect(err, fn, *args):
    try:
        fn(*args)
    except nbd.Error as e:
        assert e.errnum == err, (fn.__name__, args, e)
        return
    raise AssertionError("%s%r succeeded" % (fn.__name__, args))
expect(errno.EINVAL, h.pread, 4096, size - 100)          # read past end
expect(errno.EINVAL, h.pread, 1, size)
expect(errno.ENOSPC, h.pwrite, b"x" * 4096, size - 100)  # write past end
expect(errno.ENOSPC, h.zero, 4096, size)
expect(errno.EINVAL, h.trim, 4096, size - 1)
expect(errno.EINVAL, h.cache, 4096, 2**63)
expect(errno.EINVAL, h.pread, 4096, 0, nbd.CMD_FLAG_NO_HOLE)  # bad flag
expect(errno.EINVAL, h.pwrite, b"y" * 512, 0, nbd.CMD_FLAG_DF)
expect(errno.EINVAL, h.pread, 33 * 2**20, 0)             # over the maximum
expect(errno.EINVAL, h.block_status, 4096, size, lambda *a: 0)
# The connection is still usable and nothing changed.
check(0, size)

# A read-only export: writes refused with EPERM, reads fine.
r = nbd.NBD()
r.connect_uri(ro_uri)
assert r.is_read_only()
r.set_strict_mode(0)
try:
    r.pwrite(b"z" * 512, 0)
    raise AssertionError("write to read-only export succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EPERM, e
for fn in (lambda: r.trim(512, 0), lambda: r.zero(512, 0)):
    try:
        fn()
        raise AssertionError("trim/zero on read-only export succeeded")
    except nbd.Error as e:
        assert e.errnum == errno.EPERM, e
assert r.pread(4096, 0) == bytes(4096)
r.shutdown()

# Simple replies (no structured reply negotiated).
s = nbd.NBD()
s.set_request_structured_replies(False)
s.connect_uri(uri)
assert not s.get_structured_replies_negotiated()
assert s.pread(130000, 777) == bytes(model[777:130777])
s.pwrite(b"simple" * 1000, 4000)
model[4000:10000] = b"simple" * 1000
s.set_strict_mode(0)
try:
    s.pread(100, size - 1)
    raise AssertionError("read past end succeeded")
except nbd.Error as e:
    assert e.errnum == errno.EINVAL, e
s.flush()
s.shutdown()
check(0, size)

h.shutdown()
# Cells a trim made undefined are taken from the backing afterwards.
open(mpath + ".known", "wb").write(known)
open(mpath, "wb").write(model)
PY

URI=$(uri disk0) RO_URI=$(uri ro) MODEL=$tmp/model timeout $((120 * TSCALE)) \
  nbdsh -c "exec(open('$tmp/t.py').read())" || fail "nbdsh script"

foliod_alive
stop_foliod

# Every byte written is in the backing file (except trimmed ranges, whose
# content is undefined).
python3 - "$tmp/img" "$tmp/model" <<'PY' || fail "backing file differs from the model"
import sys
img = open(sys.argv[1], "rb").read()
model = open(sys.argv[2], "rb").read()
known = open(sys.argv[2] + ".known", "rb").read()
assert len(img) == len(model)
bad = [i for i in range(0, len(img), 4096)
       if any(k and a != b for a, b, k in zip(img[i:i+4096], model[i:i+4096], known[i:i+4096]))]
assert not bad, "differs in blocks at %r" % bad[:10]
PY
echo OK
