# TLS helpers for tests/test-tls-*.sh (source after lib.sh).
#
#   tls_make_certs DIR      make, with the openssl command, under DIR:
#     srv/         ca-cert.pem server-cert.pem server-key.pem  (for foliod)
#     cli/         ca-cert.pem client-cert.pem client-key.pem  (libnbd, qemu)
#     cli-nocert/  ca-cert.pem                                 (no client cert)
#     cli-other/   a second, unrelated CA's ca-cert.pem and a client
#                  certificate it signed
#     ca/, ca2/    the two CAs' keys (to sign more)
#   tls_uri EXPORT CLIDIR   nbds+unix URI of EXPORT on $SOCK using CLIDIR
#   tls_nbdsh CLIDIR EXPORT CODE   nbdsh connected over TLS, runs CODE
#   start_foliod_tls ARGS   like start_foliod, but waits with a TLS client
#                           (a plaintext probe fails under tls=require)

# _tls_conf FILE EXT...: an openssl extension section "ext".
_tls_ext () {
  local f=$1; shift
  printf '[ext]\n' >"$f"
  printf '%s\n' "$@" >>"$f"
}

# _tls_ca DIR CN: a self-signed CA (key and certificate) in DIR.
_tls_ca () {
  mkdir -p "$1"
  openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=$2" \
    -keyout "$1/ca-key.pem" -out "$1/ca-cert.pem" \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null ||
    fail "openssl: cannot make CA $2"
}

# _tls_sign CADIR CN PURPOSE OUTKEY OUTCERT [DAYS]: a key and a certificate
# for CN signed by the CA in CADIR (PURPOSE serverAuth or clientAuth).
_tls_sign () {
  local ca=$1 cn=$2 purpose=$3 key=$4 cert=$5 days=${6:-30}
  local ext=$cert.ext
  _tls_ext "$ext" "basicConstraints=CA:FALSE" \
    "keyUsage=digitalSignature,keyEncipherment" \
    "extendedKeyUsage=$purpose" \
    "subjectAltName=DNS:localhost,IP:127.0.0.1,IP:::1"
  openssl req -new -newkey rsa:2048 -nodes -subj "/CN=$cn" \
    -keyout "$key" -out "$cert.csr" 2>/dev/null &&
  openssl x509 -req -in "$cert.csr" -CA "$ca/ca-cert.pem" \
    -CAkey "$ca/ca-key.pem" -CAcreateserial -days "$days" \
    -extfile "$ext" -extensions ext -out "$cert" 2>/dev/null ||
    fail "openssl: cannot sign $cn"
  rm -f "$cert.csr" "$ext"
}

tls_make_certs () {
  local d=$1
  _tls_ca "$d/ca" "foliod test CA"
  _tls_ca "$d/ca2" "unrelated CA"
  mkdir -p "$d/srv" "$d/cli" "$d/cli-nocert" "$d/cli-other"
  cp "$d/ca/ca-cert.pem" "$d/srv/"
  cp "$d/ca/ca-cert.pem" "$d/cli/"
  cp "$d/ca/ca-cert.pem" "$d/cli-nocert/"
  cp "$d/ca2/ca-cert.pem" "$d/cli-other/"
  _tls_sign "$d/ca" localhost serverAuth "$d/srv/server-key.pem" \
    "$d/srv/server-cert.pem"
  _tls_sign "$d/ca" client clientAuth "$d/cli/client-key.pem" \
    "$d/cli/client-cert.pem"
  _tls_sign "$d/ca2" client clientAuth "$d/cli-other/client-key.pem" \
    "$d/cli-other/client-cert.pem"
}

tls_uri () {
  echo "nbds+unix:///$1?socket=$SOCK&tls-certificates=$2"
}

# tls_nbdsh CLIDIR EXPORT PYTHON: run PYTHON with h connected to EXPORT
# over TLS with the credentials in CLIDIR.  The server's certificate is
# verified against CLIDIR/ca-cert.pem (libnbd only does so by default
# over TCP).
tls_nbdsh () {
  local cli=$1 exp=$2 code=$3
  timeout $(( 120 * TSCALE )) nbdsh -c "
h.set_uri_allow_local_file(True)
h.set_tls_verify_peer(True)
h.connect_uri('$(tls_uri "$exp" "$cli")')
$code"
}

start_foliod_tls () {
  READY_ON_SOCKET=1 start_foliod "$@"
}

# tls_sign_expired CADIR OUTKEY OUTCERT: a server key and a certificate
# that expired in 2020, signed by the CA in CADIR (openssl ca sets dates).
tls_sign_expired () {
  local ca=$1 key=$2 cert=$3 w
  w=$(mktemp -d "$tmp/ca-XXXXXX")
  touch "$w/index.txt"
  echo 1000 >"$w/serial"
  cat >"$w/ca.cnf" <<EOC
[ca]
default_ca = c
[c]
database = $w/index.txt
new_certs_dir = $w
serial = $w/serial
default_md = sha256
policy = p
[p]
commonName = supplied
[ext]
basicConstraints = CA:FALSE
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost
EOC
  openssl req -new -newkey rsa:2048 -nodes -subj /CN=localhost \
    -keyout "$key" -out "$w/csr" 2>/dev/null &&
  openssl ca -batch -config "$w/ca.cnf" -cert "$ca/ca-cert.pem" \
    -keyfile "$ca/ca-key.pem" -in "$w/csr" -out "$cert" -notext \
    -extensions ext -startdate 20200101000000Z -enddate 20200201000000Z \
    2>/dev/null || fail "openssl ca: cannot make an expired certificate"
  rm -rf "$w"
}
