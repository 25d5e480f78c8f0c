#!/usr/bin/env bash
# TLS start-up errors name the file (missing key, key of another
# certificate, expired certificate, no CA for --tls-verify-peer, garbage)
# and foliod exits non-zero; SIGHUP reloads the certificates for new
# connections while open ones carry on, and a bad set is refused on
# reload without stopping the server.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tls.sh"
lib_init tls-errors
requires openssl nbdsh qemu-img

tls_make_certs "$tmp/c"
truncate -s 16M "$tmp/img" "$tmp/img2"   # two exports: one image each (image locks)

# bad_dir NAME: a copy of the good server directory to break.
bad_dir () {
  rm -rf "$tmp/$1"
  cp -r "$tmp/c/srv" "$tmp/$1"
  echo "$tmp/$1"
}

# expect_start_fail WHAT PATTERN ARGS...: foliod must exit non-zero at
# start with PATTERN in its output.
expect_start_fail () {
  local what=$1 pat=$2 rc=0
  shift 2
  timeout $(( 30 * TSCALE )) "$FOLIOD" --foreground --unix "$tmp/bad.sock" \
    --export "disk0=file:$tmp/img" "$@" >"$tmp/bad.log" 2>&1 || rc=$?
  [ "$rc" -ne 0 ] || fail "$what: foliod started"
  [ "$rc" -ne 124 ] && [ "$rc" -ne 137 ] || fail "$what: foliod hung"
  check_sanitizer_log "$tmp/bad.log"
  grep -qE -- "$pat" "$tmp/bad.log" ||
    fail "$what: no '$pat' in: $(cat "$tmp/bad.log")"
}

d=$(bad_dir nokey); rm "$d/server-key.pem"
expect_start_fail "missing key" "$d/server-key.pem: No such file" \
  --tls require --tls-certificates "$d"

d=$(bad_dir nocert); rm "$d/server-cert.pem"
expect_start_fail "missing certificate" "$d/server-cert.pem: No such file" \
  --tls on --tls-certificates "$d"

d=$(bad_dir mismatch); cp "$tmp/c/cli/client-key.pem" "$d/server-key.pem"
expect_start_fail "key of another certificate" \
  "$d/server-key.pem: the private key does not match" \
  --tls require --tls-certificates "$d"

d=$(bad_dir garbage); echo "not a key" >"$d/server-key.pem"
expect_start_fail "garbage key" "$d/server-key.pem: cannot load the private key" \
  --tls require --tls-certificates "$d"

d=$(bad_dir expired)
tls_sign_expired "$tmp/c/ca" "$d/server-key.pem" "$d/server-cert.pem"
expect_start_fail "expired certificate" "$d/server-cert.pem: certificate expired" \
  --tls require --tls-certificates "$d"

d=$(bad_dir noca); rm "$d/ca-cert.pem"
expect_start_fail "verify-peer without CA" "$d/ca-cert.pem: No such file" \
  --tls require --tls-certificates "$d" --tls-verify-peer yes

# A per-export tls=require needs the certificates too.
expect_start_fail "export tls without certificates" "tls-certificates" \
  --export "secure=file:$tmp/img2,tls=require"

# ---- reload on SIGHUP --------------------------------------------------
srv=$(bad_dir live)
start_foliod_tls --tls require --tls-certificates "$srv" \
  --export "disk0=file:$tmp/img"
# FOLIOD_PID is timeout(1), which passes on only the first SIGHUP: signal
# foliod itself.
hup () {
  kill -HUP "$(ps -o pid= --ppid "$FOLIOD_PID")"
}
creds () { echo "tls-creds-x509,id=tls0,dir=$1,endpoint=client"; }
info () {
  timeout 60 qemu-img info --object "$(creds "$1")" --image-opts \
    "driver=nbd,path=$SOCK,export=disk0,tls-creds=tls0,tls-hostname=localhost"
}
info "$tmp/c/cli" >"$tmp/info" 2>&1 || fail "before reload: $(cat "$tmp/info")"

# A connection opened with the old certificate.
mkfifo "$tmp/ctl"
tls_nbdsh "$tmp/c/cli" disk0 "
h.pwrite(b'old' * 1000, 0)
print('up', flush=True)
open('$tmp/ctl').read()
assert h.pread(3000, 0) == b'old' * 1000
print('still served', flush=True)
" >"$tmp/long.out" 2>&1 &
long=$!
track $long
wait_for_text "$tmp/long.out" up "long client"

# New credentials from the other CA; SIGHUP.
_tls_sign "$tmp/c/ca2" localhost serverAuth "$srv/server-key.pem.new" \
  "$srv/server-cert.pem.new"
mv "$srv/server-key.pem.new" "$srv/server-key.pem"
mv "$srv/server-cert.pem.new" "$srv/server-cert.pem"
n=$(grep -c "TLS credentials loaded" "$FOLIOD_LOG")
hup
for i in $(seq 50); do
  [ "$(grep -c "TLS credentials loaded" "$FOLIOD_LOG")" -gt "$n" ] && break
  sleep 0.1
done
[ "$(grep -c "TLS credentials loaded" "$FOLIOD_LOG")" -gt "$n" ] ||
  fail "no reload after SIGHUP"
info "$tmp/c/cli-other" >"$tmp/info" 2>&1 ||
  fail "new CA after reload: $(cat "$tmp/info")"
if info "$tmp/c/cli" >"$tmp/info" 2>&1; then
  fail "old CA still accepted for new connections after reload"
fi

# A broken set is refused on reload; the server keeps the last good one.
echo "not a key" >"$srv/server-key.pem"
hup
wait_for_text "$FOLIOD_LOG" "TLS reload failed.*server-key.pem" \
  "bad reload not reported" 50
info "$tmp/c/cli-other" >"$tmp/info" 2>&1 ||
  fail "after a failed reload: $(cat "$tmp/info")"

echo go >"$tmp/ctl"
wait $long || fail "connection from before the reload: $(cat "$tmp/long.out")"
grep -q "still served" "$tmp/long.out" || fail "long client not served"
stop_foliod
