#!/bin/bash
# NBD extended headers (NBD_OPT_EXTENDED_HEADERS) with the clients that ask
# for them by default: Debian 13's libnbd 1.22 (nbdsh) and qemu-io/qemu-img
# 10, from the root tests/lib-trixie.sh makes.  Over a sparse 16 GiB export:
# negotiation, read/write/flush past 4 GiB, block status that answers one
# extent longer than 4 GiB as one 64-bit descriptor (base:allocation and
# foliod:cache), the block status payload form (one context asked for), a
# 6 GiB zero and a 5 GiB trim each in one request, errors as extended
# error chunks; the malformed extended headers of
# tests/tools/bad-client; and the clients without extended headers (libnbd
# 1.22 told not to ask, Debian 12's nbdsh and qemu-img) still served as
# before.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-trixie.sh"
lib_init server-extended-headers
requires nbdsh qemu-img unshare
BAD=$BUILD/tests/tools/bad-client
[ -x "$BAD" ] || fail "bad-client not built: $BAD"
trixie_root

truncate -s 16G "$tmp/img"
start_foliod --export "disk0=file:$tmp/img,cache-size=32M"

# 1. libnbd 1.22: everything in one connection, extended headers on.
cat > "$tmp/ext.py" <<'PY'
import os, nbd
G = 1 << 30
h = nbd.NBD()
h.add_meta_context("base:allocation")
h.add_meta_context("foliod:cache")
h.connect_uri(os.environ["URI"])
assert h.get_extended_headers_negotiated(), "extended headers not negotiated"
assert h.get_size() == 16 * G

# Read, write, flush, on both sides of 4 GiB.
h.pwrite(b"a" * 65536, 0)
h.pwrite(b"b" * 65536, 12 * G)
h.flush()
assert h.pread(65536, 0) == b"a" * 65536
assert h.pread(65536, 12 * G) == b"b" * 65536

# Block status of the whole export in one request: the hole between the
# two writes (12 GiB - 64 KiB) is one descriptor in each context.
def status():
    got = {}
    def cb(meta, off, ents, err):
        got.setdefault(meta, []).append(list(ents))
        return 0
    h.block_status_64(h.get_size(), 0, cb)
    for ctx in ("base:allocation", "foliod:cache"):
        assert len(got.get(ctx, [])) == 1, ("one chunk per context", got)
    return got
got = status()
hole = 12 * G - 65536
assert got["base:allocation"][0][:3] == [(65536, 0), (hole, 3), (65536, 0)], got
assert got["foliod:cache"][0][:3] == [(65536, 1), (hole, 0), (65536, 1)], got
print("block status: one %d-byte extent" % hole)

# The payload form (NBD_FLAG_BLOCK_STATUS_PAYLOAD): only the contexts
# asked for are answered.
assert h.can_block_status_payload(), "block status payload form not offered"
got = {}
h.block_status_filter(h.get_size(), 0, ["foliod:cache"],
                      lambda meta, off, ents, err: got.setdefault(meta, []).append(list(ents)) or 0)
assert list(got) == ["foliod:cache"], got
assert got["foliod:cache"][0][:2] == [(65536, 1), (hole, 0)], got

# A 6 GiB zero in one request (libnbd refuses > 4 GiB without extended
# headers) over data on both sides of 4 GiB.
h.pwrite(b"c" * 4096, 2 * G)
h.pwrite(b"d" * 4096, 7 * G - 4096)
h.zero(6 * G, 1 * G)
assert h.pread(4096, 2 * G) == bytes(4096), "zeroed data reads back"
assert h.pread(4096, 7 * G - 4096) == bytes(4096), "zeroed data reads back"

# A 5 GiB trim in one request: the file backing punches it (reads zero).
h.pwrite(b"e" * 4096, 9 * G)
h.flush()
h.trim(5 * G, 7 * G)
assert h.pread(4096, 9 * G) == bytes(4096), "trimmed data reads back"
got = status()
alloc = got["base:allocation"][0]
assert alloc[0] == (65536, 0) and alloc[1] == (hole, 3), alloc
h.flush()

# Errors come back as extended error chunks (a wrong reply header would
# make libnbd drop the connection), and the connection goes on.
h.set_strict_mode(0)
for what, fn, want in (
        ("read past the end", lambda: h.pread(512, 16 * G), "EINVAL"),
        ("zero of 8 GiB past the end", lambda: h.zero(8 * G, 12 * G), "ENOSPC"),
        ("trim of 2^40", lambda: h.trim(1 << 40, 0), "EINVAL")):
    try:
        fn()
        raise AssertionError(what + " succeeded")
    except nbd.Error as e:
        assert want in str(e), (what, str(e))
assert h.pread(65536, 12 * G) == b"b" * 65536
h.shutdown()
print("libnbd 1.22 extended headers: ok")
PY
URI=$(uri disk0) trixie_run env URI="$(uri disk0)" \
  nbdsh -c "exec(open('$tmp/ext.py').read())" || fail "libnbd 1.22 with extended headers"
grep -q "export 'disk0', extended headers, base:allocation, foliod:cache" \
  "$FOLIOD_LOG" || fail "the log does not say extended headers"

# 2. The same client without extended headers: structured replies, then
# simple replies, as before.
cat > "$tmp/compat.py" <<'PY'
import os, nbd
for ext, sr in ((False, True), (False, False)):
    h = nbd.NBD()
    h.set_request_extended_headers(ext)
    h.set_request_structured_replies(sr)
    if sr:
        h.add_meta_context("base:allocation")
    h.connect_uri(os.environ["URI"])
    assert not h.get_extended_headers_negotiated()
    assert h.get_structured_replies_negotiated() == sr
    h.pwrite(b"f" * 4096, 5 * (1 << 30))
    assert h.pread(4096, 5 * (1 << 30)) == b"f" * 4096
    if sr:
        got = []
        h.block_status(1 << 30, 0,
                       lambda meta, off, ents, err: got.append(ents) or 0)
        assert got and got[0][:2] == [65536, 0], got
    h.flush()
    h.shutdown()
print("libnbd 1.22 without extended headers: ok")
PY
trixie_run env URI="$(uri disk0)" \
  nbdsh -c "exec(open('$tmp/compat.py').read())" || fail "libnbd 1.22 without extended headers"

# 3. qemu-io and qemu-img 10 (extended headers; qemu's writes carry no
# NBD_CMD_FLAG_PAYLOAD_LEN).  qemu-io's 6 GiB zero: -n, as qemu-io
# refuses more than 2 GiB without it.
U=$(uri disk0)
trixie_run qemu-io -f raw \
  -c 'write -P 0x55 5G 64k' -c 'read -P 0x55 5G 64k' \
  -c 'write -P 0x66 10G 1M' -c 'flush' \
  -c 'write -z -n 4G 6G' -c 'read -P 0 5G 64k' -c 'read -P 0x66 10G 1M' \
  "$U" > "$tmp/qemu-io.log" 2>&1 || { cat "$tmp/qemu-io.log"; fail "qemu-io 10"; }
cat "$tmp/qemu-io.log"
grep -qi "fail\|error" "$tmp/qemu-io.log" && fail "qemu-io 10 reported an error"
trixie_run qemu-img map --output=json -f raw "$U" > "$tmp/map.json" ||
  fail "qemu-img 10 map"
python3 - "$tmp/map.json" <<'PY' || fail "qemu-img 10 map: wrong extents"
import json, sys
m = json.load(open(sys.argv[1]))
G = 1 << 30
data = [(e["start"], e["length"]) for e in m if e["data"] and not e["zero"]]
assert data == [(0, 65536), (10 * G, 1 << 20), (12 * G, 65536)], data
PY
n_qemu=$(grep -c "export 'disk0', extended headers, base:allocation$" "$FOLIOD_LOG") || true
[ "$n_qemu" -ge 2 ] || fail "qemu 10 did not negotiate extended headers"

# 4. Malformed extended headers: a clear error or a close, never a crash.
for c in ext-negotiate ext-wrong-magic ext-payload ext-lengths ext-bs-payload; do
  echo "case $c"
  timeout $((60 * TSCALE)) "$BAD" "$SOCK" disk0 "$c" || fail "bad-client $c"
  foliod_alive
done

# 5. Debian 12's clients (libnbd 1.14, qemu 7.2: no extended headers).
nbdsh -u "$U" -c '
import nbd
G = 1 << 30
assert h.pread(65536, 12 * G) == b"b" * 65536
h.pwrite(b"g" * 4096, 3 * G)
assert h.pread(4096, 3 * G) == b"g" * 4096
h.flush()
' || fail "Debian 12 nbdsh"
qemu-img map --output=json -f raw "$U" > "$tmp/map12.json" || fail "Debian 12 qemu-img map"
grep -q '"start": 3221225472, "length": 4096' "$tmp/map12.json" ||
  fail "Debian 12 qemu-img map: $(cat "$tmp/map12.json")"
stop_foliod
echo OK
