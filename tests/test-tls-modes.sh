#!/usr/bin/env bash
# The TLS modes: tls=on serves plaintext and TLS clients side by side,
# and an export with tls=require is hidden from and refused to plaintext
# clients while the plaintext export next to it is served (the spec's
# SELECTIVETLS).  STARTTLS with data is invalid, data behind it before
# our ACK ends the connection.  tls=off refuses STARTTLS.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tls.sh"
lib_init tls-modes
requires openssl nbdsh nbdinfo

tls_make_certs "$tmp/c"
truncate -s 16M "$tmp/plain.img" "$tmp/secure.img"
start_foliod_tls --tls on --tls-certificates "$tmp/c/srv" \
  --export "plain=file:$tmp/plain.img" \
  --export "secure=file:$tmp/secure.img,tls=require"

# Plaintext: the plain export works, the secure one is not listed and its
# NBD_OPT_GO is answered NBD_REP_ERR_TLS_REQD.
timeout 30 nbdsh -c "
h.connect_uri('$(uri plain)')
assert not h.get_tls_negotiated()
h.pwrite(b'plain' * 100, 0)
assert h.pread(500, 0) == b'plain' * 100
" || fail "plaintext client on the plain export"
timeout 30 nbdinfo --list "$(uri '')" >"$tmp/list" 2>&1 ||
  fail "plaintext list: $(cat "$tmp/list")"
grep -q 'export="plain"' "$tmp/list" || fail "plain not listed: $(cat "$tmp/list")"
grep -q 'export="secure"' "$tmp/list" && fail "TLS-only export listed in plaintext"
timeout 30 python3 - "$SOCK" <<'EOF' || fail "TLS_REQD for the secure export"
import socket, struct, sys
s = socket.socket(socket.AF_UNIX); s.connect(sys.argv[1])
f = s.makefile('rwb')
f.read(18); f.write(struct.pack('>I', 3)); f.flush()
def opt(o, data):
    f.write(struct.pack('>QII', 0x49484156454F5054, o, len(data)) + data)
    f.flush()
    m, ro, t, n = struct.unpack('>QIII', f.read(20)); f.read(n)
    return t
go = lambda name: struct.pack('>I', len(name)) + name + struct.pack('>H', 0)
assert opt(6, go(b'secure')) == (1 << 31) + 5   # INFO: TLS_REQD
assert opt(6, go(b'plain')) == 3                 # INFO: NBD_REP_INFO first
while True:                                      # ... up to the ACK
    m, ro, t, n = struct.unpack('>QIII', f.read(20)); f.read(n)
    if t == 1:
        break
assert opt(5, b'x') == (1 << 31) + 3             # STARTTLS with data: INVALID
# Bytes sent behind STARTTLS, before the ACK, would pass as TLS-protected
# (the STARTTLS injection attack): the server hangs up instead.
f.write(struct.pack('>QII', 0x49484156454F5054, 5, 0)
        + struct.pack('>QII', 0x49484156454F5054, 7, 0)); f.flush()
assert f.read(20) == b'', 'data after STARTTLS accepted'
EOF
grep -q "data after NBD_OPT_STARTTLS" "$FOLIOD_LOG" || fail "injection not logged"

# TLS: both exports, the secure one listed too.
tls_nbdsh "$tmp/c/cli" secure "
assert h.get_tls_negotiated()
h.pwrite(b'secret' * 100, 4096)
assert h.pread(600, 4096) == b'secret' * 100
" || fail "TLS client on the secure export"
tls_nbdsh "$tmp/c/cli" plain "
assert h.get_tls_negotiated()
assert h.pread(500, 0) == b'plain' * 100
" || fail "TLS client on the plain export"
timeout 30 nbdsh -c "
h.set_uri_allow_local_file(True)
h.set_opt_mode(True)
h.connect_uri('$(tls_uri '' "$tmp/c/cli")')
names = []
h.opt_list(lambda name, desc: names.append(name))
assert sorted(names) == ['plain', 'secure'], names
h.opt_abort()
" || fail "TLS list"
stop_foliod

# tls=off: STARTTLS refused, so a client that insists on TLS fails.
start_foliod --export "plain=file:$tmp/plain.img"
if tls_nbdsh "$tmp/c/cli" plain "h.get_size()" >"$tmp/off" 2>&1; then
  fail "TLS client served with tls=off"
fi
timeout 30 nbdinfo "$(uri plain)" >/dev/null || fail "plaintext with tls=off"
stop_foliod
