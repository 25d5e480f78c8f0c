#!/usr/bin/env bash
# TLS with libnbd clients (nbdsh, nbdinfo, nbdcopy) against tls=require:
# reads and writes over nbds+unix, 256 MiB both ways with nbdcopy, the
# plaintext client refused with NBD_REP_ERR_TLS_REQD on the wire, a
# client that trusts another CA refused, and a client already connected
# keeps being served through all of it.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tls.sh"
lib_init tls-libnbd 700
requires openssl nbdsh nbdinfo nbdcopy python3

tls_make_certs "$tmp/c"
truncate -s 256M "$tmp/img"
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
start_foliod_tls --tls require --tls-certificates "$tmp/c/srv" \
  --listen "127.0.0.1:$port" --export "disk0=file:$tmp/img,cache-size=32M"
wait_for_text "$FOLIOD_LOG" "TLS credentials loaded" "no TLS load line"

# A long-lived TLS client: it writes a pattern now and checks it at the
# end, after the failed clients below.
mkfifo "$tmp/ctl"
timeout $(( 300 * TSCALE )) nbdsh -c "
import sys
h.set_uri_allow_local_file(True)
h.set_tls_verify_peer(True)
h.connect_uri('$(tls_uri disk0 "$tmp/c/cli")')
assert h.get_tls_negotiated()
h.pwrite(b'\\xa5' * 65536, 200 << 20)
print('up', flush=True)
open('$tmp/ctl').read()       # wait until the others are done
assert h.pread(65536, 200 << 20) == b'\\xa5' * 65536
h.pwrite(b'\\x5a' * 4096, 201 << 20)
assert h.pread(4096, 201 << 20) == b'\\x5a' * 4096
print('still served', flush=True)
" >"$tmp/long.out" 2>&1 &
long=$!
track $long
wait_for_text "$tmp/long.out" up "long client"

# nbdsh: unaligned write and read back over TLS, structured replies.
tls_nbdsh "$tmp/c/cli" disk0 "
assert h.get_tls_negotiated()
assert h.get_structured_replies_negotiated()
assert h.get_size() == 256 << 20
buf = bytes(range(256)) * 40 + b'tail'
h.pwrite(buf, 12345)
assert h.pread(len(buf), 12345) == buf
h.flush()
" || fail "nbdsh over TLS"

# nbdinfo over TLS.
timeout 60 nbdinfo "$(tls_uri disk0 "$tmp/c/cli")" >"$tmp/info" 2>&1 ||
  fail "nbdinfo over TLS: $(cat "$tmp/info")"
grep -q "with TLS" "$tmp/info" || fail "nbdinfo: no TLS: $(cat "$tmp/info")"

# nbdcopy 256 MiB up and back down, checksums equal.  (Leaves the region
# of the long client alone: its bytes are put back in the copy.)
head -c $(( 256 << 20 )) /dev/urandom >"$tmp/src"
python3 - "$tmp/src" <<'EOF'
import sys
with open(sys.argv[1], 'r+b') as f:
    f.seek(200 << 20); f.write(b'\xa5' * 65536)
EOF
timeout $(( 300 * TSCALE )) nbdcopy "$tmp/src" "$(tls_uri disk0 "$tmp/c/cli")" ||
  fail "nbdcopy upload over TLS"
timeout $(( 300 * TSCALE )) nbdcopy "$(tls_uri disk0 "$tmp/c/cli")" "$tmp/back" ||
  fail "nbdcopy download over TLS"
a=$(md5sum <"$tmp/src"); b=$(md5sum <"$tmp/back")
[ "$a" = "$b" ] || fail "checksums differ after nbdcopy over TLS"
rm -f "$tmp/src" "$tmp/back"

# Plaintext: refused.  libnbd clients just fail ...
if timeout 30 nbdinfo "$(uri disk0)" >"$tmp/plain" 2>&1; then
  fail "plaintext nbdinfo served under tls=require"
fi
# ... and on the wire every option but STARTTLS/ABORT is answered
# NBD_REP_ERR_TLS_REQD; NBD_OPT_EXPORT_NAME (no error possible) closes.
timeout 30 python3 - "$SOCK" <<'EOF' || fail "plaintext protocol check"
import socket, struct, sys
MAGIC, REPLY = 0x49484156454F5054, 0x3e889045565a9
TLS_REQD = (1 << 31) + 5

def conn():
    s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
    f = s.makefile('rwb')
    f.read(18); f.write(struct.pack('>I', 3)); f.flush()
    return s, f

def opt(f, o, data=b''):
    f.write(struct.pack('>QII', MAGIC, o, len(data)) + data); f.flush()
    m, ro, t, n = struct.unpack('>QIII', f.read(20)); f.read(n)
    assert m == REPLY and ro == o, (m, ro)
    return t

s, f = conn()
go = struct.pack('>I', 5) + b'disk0' + struct.pack('>H', 0)
for o, d in ((7, go), (6, go), (3, b''), (8, b''), (10, b'')):
    t = opt(f, o, d)
    assert t == TLS_REQD, 'option %d: reply %#x' % (o, t)
s.close()
s, f = conn()
f.write(struct.pack('>QII', MAGIC, 1, 5) + b'disk0'); f.flush()
assert f.read(1) == b'', 'EXPORT_NAME served in plaintext'
EOF

# A client trusting another CA refuses our certificate (over TCP: libnbd
# checks the server only there); the server logs the failed handshake
# with the peer's address.  The same client with our CA gets in.
other () {
  timeout 60 nbdsh -c "
h.set_uri_allow_local_file(True)
h.connect_uri('nbds://localhost:$port/disk0?tls-certificates=$1')
print(h.get_size())"
}
other "$tmp/c/cli" >"$tmp/ours" 2>&1 || fail "TCP TLS client: $(cat "$tmp/ours")"
if other "$tmp/c/cli-other" >"$tmp/other" 2>&1; then
  fail "client trusting another CA connected"
fi
grep -q "TLS handshake failed" "$FOLIOD_LOG" ||
  fail "no handshake failure logged"
grep "TLS handshake failed" "$FOLIOD_LOG" | grep -q "127.0.0.1" ||
  fail "handshake failure logged without the peer address"

# The long client got through all that.
echo go >"$tmp/ctl"
wait $long || fail "long client: $(cat "$tmp/long.out")"
grep -q "still served" "$tmp/long.out" || fail "long client not served"
foliod_alive
stop_foliod
