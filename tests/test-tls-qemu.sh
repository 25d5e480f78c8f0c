#!/usr/bin/env bash
# TLS with qemu (GnuTLS, tls-creds-x509) against tls=require with client
# certificates required (--tls-verify-peer): qemu-img convert and compare
# both ways; clients without a certificate, or with one from another CA,
# are refused while qemu's connection carries on.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tls.sh"
lib_init tls-qemu 300
requires openssl qemu-img nbdsh

tls_make_certs "$tmp/c"
truncate -s 96M "$tmp/img"
start_foliod_tls --tls require --tls-certificates "$tmp/c/srv" \
  --tls-verify-peer yes --export "disk0=file:$tmp/img,cache-size=16M"
# Ready on its socket, which it binds before it loads the credentials.
wait_for_text "$FOLIOD_LOG" "client certificates required" \
  "verify-peer not in effect"

creds () {
  echo "tls-creds-x509,id=tls0,dir=$1,endpoint=client"
}
nbdopts () {
  echo "driver=nbd,path=$SOCK,export=disk0,tls-creds=tls0,tls-hostname=localhost"
}

# 80 MiB + 12345 bytes of random data with a hole in the middle.
head -c $(( 40 << 20 )) /dev/urandom >"$tmp/src"
truncate -s $(( 60 << 20 )) "$tmp/src"
head -c $(( (20 << 20) + 12345 )) /dev/urandom >>"$tmp/src"

timeout $(( 120 * TSCALE )) qemu-img convert -n --object "$(creds "$tmp/c/cli")" \
  -f raw "$tmp/src" --target-image-opts "$(nbdopts)" ||
  fail "qemu-img convert to foliod over TLS"
grep -q "TLS established.*client /CN=client" "$FOLIOD_LOG" ||
  fail "qemu's client certificate not seen"

# compare: the export is bigger than src; the rest must read as zero,
# which qemu-img compare checks (without -s).
timeout $(( 120 * TSCALE )) qemu-img compare --object "$(creds "$tmp/c/cli")" \
  --image-opts "driver=file,filename=$tmp/src" \
  "driver=raw,file.$(nbdopts | sed 's/,/,file./g')" >"$tmp/cmp" 2>&1 ||
  fail "qemu-img compare over TLS: $(cat "$tmp/cmp")"

# And back down with qemu-img convert.
timeout $(( 120 * TSCALE )) qemu-img convert --object "$(creds "$tmp/c/cli")" \
  --image-opts "driver=raw,file.$(nbdopts | sed 's/,/,file./g')" \
  -O raw "$tmp/back" || fail "qemu-img convert from foliod over TLS"
cmp -n "$(stat -c %s "$tmp/src")" "$tmp/src" "$tmp/back" ||
  fail "data read back over TLS differs"

# No client certificate: refused by the server (qemu and libnbd).
if timeout 60 qemu-img info --object "$(creds "$tmp/c/cli-nocert")" \
   --image-opts "$(nbdopts)" >"$tmp/nocert" 2>&1; then
  fail "qemu without a client certificate was served"
fi
if tls_nbdsh "$tmp/c/cli-nocert" disk0 "h.pread(512, 0)" >"$tmp/nocert2" 2>&1
then
  fail "libnbd without a client certificate was served"
fi
grep -q "TLS handshake failed.*did not return a certificate" "$FOLIOD_LOG" ||
  fail "missing client certificate not logged"

# A certificate from another CA: refused (qemu rejects our server cert
# first; with the server's CA it still fails, on the client cert).
cp "$tmp/c/ca/ca-cert.pem" "$tmp/c/cli-other/ca-cert.pem"
if timeout 60 qemu-img info --object "$(creds "$tmp/c/cli-other")" \
   --image-opts "$(nbdopts)" >"$tmp/other" 2>&1; then
  fail "qemu with a client certificate from another CA was served"
fi

# The good client still gets in.
timeout 60 qemu-img info --object "$(creds "$tmp/c/cli")" \
  --image-opts "$(nbdopts)" >"$tmp/info" 2>&1 ||
  fail "qemu-img info after refusals: $(cat "$tmp/info")"
grep -q "virtual size: 96 MiB" "$tmp/info" || fail "$(cat "$tmp/info")"
foliod_alive
stop_foliod
