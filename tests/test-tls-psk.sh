#!/usr/bin/env bash
# TLS with pre-shared keys (--tls-psk FILE, username:hexkey lines) against
# GnuTLS clients: libnbd (tls-psk-file) and qemu (tls-creds-psk) read and
# write; an unknown user or a wrong key is refused; a malformed key file,
# one readable by others or a key shorter than 16 bytes stops the start
# naming the file (and line); SIGHUP re-reads the keys.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tls.sh"
lib_init tls-psk
requires openssl nbdsh qemu-img

truncate -s 32M "$tmp/img"
mkdir "$tmp/psk" "$tmp/qemu"
key=$(openssl rand -hex 32)
printf '# test keys\nalice:%s\nbob:%s\n' "$key" "$(openssl rand -hex 16)" \
  >"$tmp/psk/keys.psk"
echo "alice:$key" >"$tmp/qemu/keys.psk"        # qemu reads DIR/keys.psk
cp "$tmp/qemu/keys.psk" "$tmp/psk/keys.psk.old"
chmod 600 "$tmp/psk/keys.psk" "$tmp/qemu/keys.psk" "$tmp/psk/keys.psk.old"

# refused FILE WHAT REGEX: foliod with --tls-psk FILE does not start, and
# its message matches REGEX.
refused () {
  local rc=0
  timeout 30 "$FOLIOD" --foreground --unix "$tmp/bad.sock" --tls require \
    --tls-psk "$1" --export "disk0=file:$tmp/img" >"$tmp/bad.log" 2>&1 ||
    rc=$?
  [ "$rc" -ne 0 ] || fail "started with $2"
  check_sanitizer_log "$tmp/bad.log"
  grep -q -- "$3" "$tmp/bad.log" || fail "$2: unclear message: $(cat "$tmp/bad.log")"
}

# Malformed files.
echo "alice:xyz" >"$tmp/bad.psk"
chmod 600 "$tmp/bad.psk"
refused "$tmp/bad.psk" "a malformed PSK file" "$tmp/bad.psk:1:"
# A key readable by anyone on the host (ssh refuses such a private key).
echo "alice:$key" >"$tmp/open.psk"
chmod 644 "$tmp/open.psk"
refused "$tmp/open.psk" "a PSK file readable by others" \
  "$tmp/open.psk: readable by others"
# A key too short to be a secret: 8 bytes.
echo "alice:$(openssl rand -hex 8)" >"$tmp/short.psk"
chmod 600 "$tmp/short.psk"
refused "$tmp/short.psk" "an 8-byte PSK" "$tmp/short.psk:1: .*at least 16 bytes"

start_foliod_tls --tls require --tls-psk "$tmp/psk/keys.psk" \
  --export "disk0=file:$tmp/img"

psk_nbdsh () {
  timeout 60 nbdsh -c "
h.set_uri_allow_local_file(True)
h.connect_uri('nbds+unix://$1@/disk0?socket=$SOCK&tls-psk-file=$2')
$3"
}
psk_nbdsh alice "$tmp/psk/keys.psk" "
assert h.get_tls_negotiated()
buf = bytes(range(256)) * 300
h.pwrite(buf, 7777)
assert h.pread(len(buf), 7777) == buf
" || fail "libnbd with PSK"
grep -q "TLS PSK user 'alice'" "$FOLIOD_LOG" || fail "PSK user not logged"

creds="tls-creds-psk,id=tls0,dir=$tmp/qemu,username=alice,endpoint=client"
head -c $(( 4 << 20 )) /dev/urandom >"$tmp/src"
timeout 60 qemu-img convert -n --object "$creds" -f raw "$tmp/src" \
  --target-image-opts "driver=nbd,path=$SOCK,export=disk0,tls-creds=tls0" ||
  fail "qemu-img convert with PSK"
timeout 60 qemu-img compare --object "$creds" \
  --image-opts "driver=file,filename=$tmp/src" \
  "driver=raw,file.driver=nbd,file.path=$SOCK,file.export=disk0,file.tls-creds=tls0" \
  >"$tmp/cmp" 2>&1 || fail "qemu-img compare with PSK: $(cat "$tmp/cmp")"

# Unknown user, wrong key, plaintext: refused.
echo "mallory:$(openssl rand -hex 32)" >"$tmp/mallory.psk"
if psk_nbdsh mallory "$tmp/mallory.psk" "h.get_size()" >/dev/null 2>&1; then
  fail "unknown PSK user served"
fi
grep -q "unknown TLS PSK user 'mallory'" "$FOLIOD_LOG" || fail "unknown user not logged"
echo "alice:$(openssl rand -hex 32)" >"$tmp/wrong.psk"
if psk_nbdsh alice "$tmp/wrong.psk" "h.get_size()" >/dev/null 2>&1; then
  fail "wrong PSK served"
fi
if timeout 30 nbdinfo "$(uri disk0)" >/dev/null 2>&1; then
  fail "plaintext served with tls=require and PSK"
fi

# SIGHUP re-reads the key file (foliod itself: FOLIOD_PID is timeout(1)).
key2=$(openssl rand -hex 32)
echo "carol:$key2" >"$tmp/psk/keys.psk"
echo "carol:$key2" >"$tmp/carol.psk"
chmod 600 "$tmp/carol.psk"
kill -HUP "$(ps -o pid= --ppid "$FOLIOD_PID")"
for i in $(seq 50); do
  [ "$(grep -c "TLS pre-shared keys loaded" "$FOLIOD_LOG")" -ge 2 ] && break
  sleep 0.1
done
psk_nbdsh carol "$tmp/carol.psk" "assert h.get_size() == 32 << 20" ||
  fail "new key after SIGHUP"
if psk_nbdsh alice "$tmp/psk/keys.psk.old" "h.get_size()" >/dev/null 2>&1; then
  fail "removed user still served after SIGHUP"
fi
foliod_alive
stop_foliod
