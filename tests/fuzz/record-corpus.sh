#!/bin/bash
# Record the fuzzer's seed corpus from real clients.
#
#   tests/fuzz/record-corpus.sh [OUTDIR]     (default tests/fuzz/corpus)
#
# Starts a foliod ($FOLIOD, default build/foliod) serving the exports the
# harness serves (same names and sizes, see tests/fuzz/fuzz-server.c), puts
# the recording proxy tests/fuzz/nbd-record.py in front of it, and runs
# nbdinfo, nbdsh (libnbd), nbdcopy, qemu-img, qemu-io, nbdkit's nbd plugin,
# nbd-client, the test suite's bad-client and (extended headers) Debian
# 13's nbdsh and qemu-io through the proxy.  Each connection's client-to-server
# bytes become OUTDIR/CLIENT-WHAT.bin (under 64 KiB each), which the
# harness replays as one client.  Sessions are plain text (a TLS session
# would record ciphertext); two STARTTLS attempts (certificate, PSK) keep
# their options and ClientHello.  Existing files in OUTDIR are replaced.
. "$(dirname "$0")/../lib.sh"
. "$(dirname "$0")/../lib-tls.sh"
. "$(dirname "$0")/../lib-trixie.sh"
lib_init fuzz-record
requires nbdinfo nbdsh nbdcopy qemu-img qemu-io nbdkit

OUT=${1:-$TOP/tests/fuzz/corpus}
mkdir -p "$OUT" "$tmp/rec"
KiB=1024

# The harness's exports; "disk" gets a little data so that copies and
# maps see both data and holes.
truncate -s $((1024 * KiB)) "$tmp/disk.img"
truncate -s $((192 * KiB + 512)) "$tmp/ro.img"
truncate -s $((256 * KiB + 4096)) "$tmp/wt.img"
truncate -s $((64 * KiB)) "$tmp/tls.img"
printf 'foliod fuzz seed' | dd of="$tmp/disk.img" bs=1 seek=70000 conv=notrunc status=none
head -c 12288 /dev/urandom | dd of="$tmp/disk.img" bs=4096 seek=100 conv=notrunc status=none
head -c 8192 /dev/urandom | dd of="$tmp/ro.img" bs=4096 seek=3 conv=notrunc status=none
tls_make_certs "$tmp/c"
start_foliod_tls --tls on --tls-certificates "$tmp/c/srv" \
  --export "disk=file:$tmp/disk.img,cache-size=256K,folio-size=64K,block-size=4K,description=fuzz disk" \
  --export "ro=file:$tmp/ro.img,read-only=true,cache-size=64K,folio-size=16K" \
  --export "wt=file:$tmp/wt.img,cache=writethrough,cache-size=128K,folio-size=16K,block-size=512" \
  --export "tls=file:$tmp/tls.img,tls=require,cache-size=64K,folio-size=16K"

# The proxy, on a Unix socket and on a loopback TCP port (nbd-client).
PORT=$(( 20000 + RANDOM % 20000 ))
REC=$tmp/rec.sock
"$TOP/tests/fuzz/nbd-record.py" "$REC" "$SOCK" "$tmp/rec" &
proxies=($!)
"$TOP/tests/fuzz/nbd-record.py" "127.0.0.1:$PORT" "$SOCK" "$tmp/rec" &
proxies+=($!)
track "${proxies[0]}"
track "${proxies[1]}"
for ((i = 0; i < 50; i++)); do [ -S "$REC" ] && break; sleep 0.1; done
[ -S "$REC" ] || fail "recording proxy did not start"

u () { echo "nbd+unix:///$1?socket=$REC"; }

# record NAME CMD...: run CMD (bounded), then move the sessions it made
# to OUT/NAME.bin (NAME-2.bin ... if it made several).
record () {
  local name=$1 i f n=0
  shift
  timeout 60 "$@" >"$tmp/out.log" 2>&1 ||
    echo "record-corpus: $name: exit $? (kept): $(tail -n 1 "$tmp/out.log")" >&2
  for ((i = 0; i < 100; i++)); do
    compgen -G "$tmp/rec/*.part" >/dev/null || break
    sleep 0.1
  done
  for f in "$tmp"/rec/*.bin; do
    [ -e "$f" ] || continue
    n=$((n + 1))
    if [ -s "$f" ]; then
      if [ $n = 1 ]; then mv "$f" "$OUT/$name.bin"; else mv "$f" "$OUT/$name-$n.bin"; fi
    else
      rm -f "$f"
    fi
  done
  [ $n -gt 0 ] || echo "record-corpus: $name: no connection" >&2
}

# nbdsh_rec NAME PYTHON: nbdsh running PYTHON, with URI and RO in scope.
nbdsh_rec () {
  record "$1" env URI="$(u disk)" RO="$(u ro)" WT="$(u wt)" /usr/bin/python3 -c "
import os, nbd
URI, RO, WT = os.environ['URI'], os.environ['RO'], os.environ['WT']
$2"
}

rm -f "$OUT"/*.bin

# nbdinfo: the option phase in its variants.
record nbdinfo-list nbdinfo --list "$(u "")"
record nbdinfo-disk nbdinfo "$(u disk)"
record nbdinfo-json nbdinfo --json "$(u wt)"
record nbdinfo-map nbdinfo --map "$(u disk)"
record nbdinfo-map-totals nbdinfo --map --totals "$(u ro)"
record nbdinfo-can nbdinfo --can trim "$(u ro)"
record nbdinfo-tls-refused nbdinfo "$(u tls)"
record nbdinfo-unknown nbdinfo "$(u nosuch)"
record nbdinfo-starttls nbdinfo "nbds+unix:///disk?socket=$REC&tls-certificates=$tmp/c/cli"
# The harness's pre-shared key (FUZZ_PSK in fuzz-server.c): its server
# takes this ClientHello further than ours, which has certificates.
echo "fuzz:0123456789abcdef0123456789abcdef" > "$tmp/fuzz.psk"
record nbdinfo-starttls-psk nbdinfo \
  "nbds+unix://fuzz@/disk?socket=$REC&tls-psk-file=$tmp/fuzz.psk"

# nbdsh (libnbd): structured replies, meta contexts, every command.
nbdsh_rec nbdsh-io '
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(URI)
h.pwrite(b"\xab" * 5000, 777)
h.pwrite(b"\x01" * 4096, 65536 - 2048, nbd.CMD_FLAG_FUA)
h.pread(9000, 500)
h.pread_structured(65536, 0, lambda *a: 0, nbd.CMD_FLAG_DF)
h.zero(12288, 8192)
h.zero(4096, 200000, nbd.CMD_FLAG_NO_HOLE)
h.trim(65536, 131072)
h.cache(65536, 0)
h.block_status(1048576, 0, lambda *a: 0)
h.block_status(300000, 1000, lambda *a: 0, nbd.CMD_FLAG_REQ_ONE)
h.flush()
h.shutdown()'
nbdsh_rec nbdsh-fast-zero '
h = nbd.NBD()
h.connect_uri(URI)
try:
    h.zero(65536, 65536, nbd.CMD_FLAG_FAST_ZERO)
except nbd.Error:
    pass
h.zero(1000, 3, nbd.CMD_FLAG_FUA)
h.trim(4096, 4096, nbd.CMD_FLAG_FUA)
h.shutdown()'
nbdsh_rec nbdsh-simple-replies '
h = nbd.NBD()
h.set_request_structured_replies(False)
h.connect_uri(URI)
h.pwrite(b"x" * 1000, 1048576 - 1000)
h.pread(4096, 1048576 - 4096)
h.zero(4096, 0)
h.flush()
h.shutdown()'
nbdsh_rec nbdsh-opt-mode '
h = nbd.NBD()
h.set_opt_mode(True)
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.add_meta_context("base:")
h.add_meta_context("qemu:dirty-bitmap:nosuch")
h.connect_uri(URI)
h.opt_list(lambda n, d: 0)
h.opt_list_meta_context(lambda n: 0)
h.set_export_name("ro")
h.opt_info()
h.set_export_name("nosuch")
try:
    h.opt_info()
except nbd.Error:
    pass
h.set_export_name("disk")
h.set_full_info(True)
h.opt_go()
h.block_status(65536, 65536, lambda *a: 0)
h.shutdown()'
nbdsh_rec nbdsh-opt-abort '
h = nbd.NBD()
h.set_opt_mode(True)
h.connect_uri(URI)
h.opt_list(lambda n, d: 0)
h.opt_abort()'
nbdsh_rec nbdsh-export-name '
h = nbd.NBD()
h.set_handshake_flags(nbd.HANDSHAKE_FLAG_FIXED_NEWSTYLE)
h.set_request_structured_replies(False)
h.set_opt_mode(False)
h.connect_uri(URI)
print(h.get_protocol())
h.pread(512, 0)
h.pwrite(b"y" * 512, 512)
h.shutdown()'
nbdsh_rec nbdsh-oldstyle-flags '
h = nbd.NBD()
h.set_handshake_flags(0)
h.connect_uri(URI)
h.pread(512, 4096)
h.shutdown()'
nbdsh_rec nbdsh-pipelined '
h = nbd.NBD()
h.connect_uri(URI)
bufs = [nbd.Buffer(4096) for i in range(32)]
for i in range(32):
    if i % 2:
        h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray([i]) * 3000), i * 9000)
    else:
        h.aio_pread(bufs[i], i * 7000)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.aio_flush()
while h.aio_in_flight() > 0:
    h.poll(-1)
h.shutdown()'
nbdsh_rec nbdsh-pipelined-small '
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(URI)
for i in range(200):
    if i % 3 == 0:
        h.aio_pread(nbd.Buffer(512), i * 4096)
    elif i % 3 == 1:
        h.aio_pwrite(nbd.Buffer.from_bytearray(bytearray(b"p" * 100)), i * 4096 + 7)
    else:
        h.aio_block_status(8192, i * 4096, lambda *a: 0)
while h.aio_in_flight() > 0:
    h.poll(-1)
h.shutdown()'
nbdsh_rec nbdsh-errors '
h = nbd.NBD()
h.set_strict_mode(0)
h.connect_uri(URI)
for f in (lambda: h.pread(4096, 1048576 - 100),
          lambda: h.pwrite(b"z" * 4096, 1048576 - 100),
          lambda: h.zero(8192, 1048576),
          lambda: h.trim(1, 1048577),
          lambda: h.pread(512, 0, nbd.CMD_FLAG_REQ_ONE),
          lambda: h.block_status(4096, 0, lambda *a: 0),
          lambda: h.cache(0, 2 ** 63),
          lambda: h.pread(0, 0)):
    try:
        f()
    except nbd.Error:
        pass
h.pread(10, 10)
h.shutdown()'
nbdsh_rec nbdsh-readonly '
h = nbd.NBD()
h.set_strict_mode(0)
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(RO)
for f in (lambda: h.pwrite(b"w" * 512, 0),
          lambda: h.zero(512, 0),
          lambda: h.trim(512, 0),
          lambda: h.pwrite(b"w" * 512, 0, nbd.CMD_FLAG_FUA)):
    try:
        f()
    except nbd.Error:
        pass
h.pread(2048, 192 * 1024 - 1536)
h.block_status(192 * 1024 + 512, 0, lambda *a: 0)
h.flush()
h.shutdown()'
nbdsh_rec nbdsh-writethrough '
h = nbd.NBD()
h.connect_uri(WT)
h.pwrite(b"\x5a" * 700, 300)
h.pwrite(b"\x5b" * 512, 1024, nbd.CMD_FLAG_FUA)
h.pread(2048, 0)
h.zero(1536, 100)
h.trim(16384, 16384)
h.pread(4096, 256 * 1024)
h.flush()
h.shutdown()'
nbdsh_rec nbdsh-cmd-disc '
h = nbd.NBD()
h.connect_uri(URI)
h.aio_pread(nbd.Buffer(512), 0)
h.aio_disconnect()
while h.aio_in_flight() > 0:
    h.poll(-1)'

# nbdcopy and qemu-img / qemu-io: reads, writes, zero detection, map.
head -c 20000 /dev/urandom > "$tmp/src.raw"
truncate -s $((256 * KiB)) "$tmp/src.raw"
head -c 4096 /dev/urandom | dd of="$tmp/src.raw" bs=4096 seek=40 conv=notrunc status=none
record nbdcopy-to-disk nbdcopy "$tmp/src.raw" "$(u disk)"
record nbdcopy-from-disk nbdcopy --requests=4 "$(u disk)" "$tmp/out.raw"
record nbdcopy-ro-null nbdcopy "$(u ro)" null:
record nbdcopy-flush nbdcopy --flush "$tmp/src.raw" "$(u wt)"
record qemu-img-info qemu-img info "$(u disk)"
record qemu-img-map qemu-img map --output=json "$(u disk)"
record qemu-img-convert-from qemu-img convert -f raw -O raw "$(u ro)" "$tmp/out2.raw"
record qemu-img-convert-to qemu-img convert -n -f raw -O raw "$tmp/src.raw" "$(u wt)"
record qemu-img-compare qemu-img compare -f raw -F raw "$tmp/ro.img" "$(u ro)"
record qemu-io-rw qemu-io -f raw \
  -c 'write -P 0x55 4096 8k' -c 'write -z 65536 64k' -c 'discard 131072 64k' \
  -c 'read -P 0x55 4096 8k' -c 'write -f 0 512' -c 'flush' \
  -c 'aio_write -P 0x66 200000 4k' -c 'aio_flush' -c 'read -v 70000 16' \
  "$(u disk)"
record qemu-io-unaligned qemu-io -f raw \
  -c 'write -P 0x11 1 511' -c 'read 3 1000' -c 'write -z -u 8192 8192' \
  "$(u wt)"
record qemu-io-ro qemu-io -r -f raw -c 'read 0 64k' -c 'map' "$(u ro)"

# Extended headers: libnbd 1.22 (nbdsh) and qemu-io 10 from Debian 13's
# root (tests/lib-trixie.sh), when it can be made; both ask for them.
if (trixie_root) >/dev/null 2>&1; then
  trixie_root >/dev/null
  cat > "$tmp/trixie" <<SH
#!/bin/bash
TOP=$TOP TRIXIE=$TRIXIE
. "$TOP/tests/lib-trixie.sh"
trixie_run "\$@"
SH
  chmod +x "$tmp/trixie"
  record nbdsh-ext-io "$tmp/trixie" env URI="$(u disk)" python3 -c '
import os, nbd
h = nbd.NBD()
h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)
h.connect_uri(os.environ["URI"])
assert h.get_extended_headers_negotiated()
h.pwrite(b"\xab" * 5000, 777)
h.pread(9000, 500)
h.pread_structured(65536, 0, lambda *a: 0, nbd.CMD_FLAG_DF)
h.zero(786432, 8192)
h.trim(65536, 131072)
h.cache(1048576, 0)
h.block_status_64(1048576, 0, lambda *a: 0)
h.block_status_64(300000, 1000, lambda *a: 0, nbd.CMD_FLAG_REQ_ONE)
h.block_status_filter(1048576 - 4096, 4096, ["base:allocation"], lambda *a: 0)
h.set_strict_mode(0)
for f in (lambda: h.pread(512, 1 << 40),
          lambda: h.zero(1 << 40, 4096),
          lambda: h.trim(1 << 63, 1 << 63),
          lambda: h.pread((64 << 20) + 1, 0)):
    try:
        f()
    except nbd.Error:
        pass
h.flush()
h.shutdown()'
  record qemu-io-ext "$tmp/trixie" qemu-io -f raw \
    -c 'write -P 0x55 4096 8k' -c 'write -z 65536 640k' -c 'discard 131072 64k' \
    -c 'read -P 0x55 4096 8k' -c 'flush' -c 'map' "$(u disk)"
fi

# nbdkit's nbd plugin as the client, with a client of its own in front.
record nbdkit-nbd-plugin nbdkit -U - nbd socket="$REC" export=disk \
  --run 'nbdinfo --map "$uri" && nbdcopy "$uri" null: &&
         nbdsh -u "$uri" -c "h.pwrite(b\"k\" * 4096, 8192)" -c "h.flush()"'
record nbdkit-nbd-plugin-ro nbdkit -r -U - nbd socket="$REC" export=ro \
  --run 'qemu-img info "$uri"'

# tests/tools/bad-client: malformed input on purpose (bad magics, unknown
# commands and options, oversized options and requests, byte by byte...).
BAD=$BUILD/tests/tools/bad-client
if [ -x "$BAD" ]; then
  for c in $("$BAD" "$REC" disk list); do
    case $c in
      read-only) exp=ro ;;
      handshake-timeout|connection-limit) continue ;; # slow, no new bytes
      *) exp=disk ;;
    esac
    record "bad-client-$c" "$BAD" "$REC" "$exp" "$c"
  done
fi

# nbd-client (the Linux client's userspace half) can list without a device.
if command -v nbd-client >/dev/null; then
  record nbd-client-list nbd-client -l 127.0.0.1 "$PORT"
fi

# The harness's "fake" export (failing reads and maps, short extents) has
# the size of "disk" and a name as long: the same sessions replay there.
for f in nbdsh-io nbdsh-pipelined-small nbdsh-errors nbdinfo-map qemu-io-rw \
         qemu-img-map nbdcopy-from-disk-2; do
  [ -e "$OUT/$f.bin" ] || continue
  /usr/bin/python3 -c 'import sys; d = open(sys.argv[1], "rb").read()
open(sys.argv[2], "wb").write(d.replace(b"disk", b"fake"))' \
    "$OUT/$f.bin" "$OUT/fake-$f.bin"
done

kill "${proxies[@]}"
wait "${proxies[@]}" 2>/dev/null || true
stop_foliod
ls -l "$OUT"
echo "record-corpus: $(ls "$OUT" | wc -l) sessions in $OUT"
