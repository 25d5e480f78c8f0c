#!/bin/bash
# nbdkit-folio-plugin configuration:
#  - --dump-plugin lists the keys and foliod's version, --help describes
#    them;
#  - bad configurations make nbdkit exit non-zero with a message naming the
#    problem, and never crash;
#  - read-only=1 (and nbdkit -r) give a read-only export that refuses writes;
#  - description= reaches the client.
. "$(dirname "$0")/lib.sh"
plugin_init plugin-cfg
set +e   # expect_error looks at exit statuses itself
nbdkit_folio () {
  timeout $((60 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit "$@"
}
fails=0
bad () { echo "FAIL: $*"; fails=$((fails + 1)); }

img=$tmp/disk.img
head -c $((3 * 1024 * 1024)) /dev/urandom > "$img"

# --dump-plugin: nbdkit's own fields plus the keys.
nbdkit_folio --dump-plugin "$PLUGIN" > "$tmp/dump" 2>&1 || bad "--dump-plugin failed"
cat "$tmp/dump"
grep -qx 'name=folio' "$tmp/dump" || bad "--dump-plugin: no name=folio"
grep -qx 'thread_model=parallel' "$tmp/dump" || bad "--dump-plugin: not parallel"
grep -qx 'magic_config_key=backing' "$tmp/dump" || bad "--dump-plugin: magic key"
# The plugin is the same release as the daemon built with it.
version=$("$FOLIOD" --version | sed -n 's/^foliod //p')
grep -qx "version=$version" "$tmp/dump" ||
  bad "--dump-plugin: not version=$version (foliod --version)"
nbdkit_folio "$PLUGIN" --version 2>&1 | grep -qx "folio $version" ||
  bad "nbdkit folio --version: not 'folio $version'"
keys=$(sed -n 's/^folio_keys=//p' "$tmp/dump")
for k in backing cache cache-size folio-size block-size; do
  [[ ",$keys," == *",$k,"* ]] || bad "--dump-plugin: key $k missing from '$keys'"
  grep -q "^folio_key_$k=." "$tmp/dump" || bad "--dump-plugin: no help for $k"
done

# --help describes every key.
nbdkit_folio "$PLUGIN" --help > "$tmp/help" 2>&1 || bad "--help failed"
for k in ${keys//,/ }; do
  grep -q -- "$k" "$tmp/help" || bad "--help does not mention $k"
done

# expect_error PATTERN nbdkit-args...: nbdkit must fail (not crash, not
# hang) and say something matching PATTERN (case-insensitive).
expect_error () {
  local pat=$1; shift
  local out=$tmp/err rc
  timeout -k 2 $((30 * TSCALE)) env "${NBDKIT_ENV[@]}" \
    nbdkit -U - "$PLUGIN" "$@" --run 'exit 0' > "$out" 2>&1
  rc=$?
  echo "-- $* -> exit $rc: $(grep -m1 -i folio "$out")"
  if [ $rc -eq 0 ]; then bad "accepted: $*"; return; fi
  if [ $rc -ge 124 ]; then bad "crash or hang (exit $rc): $*"; cat "$out"; return; fi
  grep -Eq 'AddressSanitizer|runtime error:' "$out" && { bad "sanitizer: $*"; cat "$out"; }
  grep -Eiq -- "$pat" "$out" || { bad "message for '$*' does not match /$pat/"; cat "$out"; }
}
expect_error 'backing'            cache-size=1M
expect_error 'frobnicate'         "$img" frobnicate=1
expect_error 'folio-size|folio.size|power' "$img" folio-size=3K
expect_error 'block-size|block.size|power' "$img" block-size=1000
expect_error 'block.*folio|folio.*block'   "$img" folio-size=16K block-size=64K
expect_error 'cache-size|size'    "$img" cache-size=lots
expect_error 'cache'              "$img" cache=sometimes
expect_error 'folio-size|folio.size|range|large|small' "$img" folio-size=64M
expect_error 'no-such|No such'    backing=file:"$tmp/no-such.img"
expect_error 'bad value for format' "$img" format=qcow2
expect_error 'bad value for locking' "$img" locking=sometimes

# Backings are raw: a qcow2 file is refused, unless format=raw (issue 26).
if command -v qemu-img >/dev/null; then
  qemu-img create -q -f qcow2 "$tmp/disk.qcow2" 16M || bad "qemu-img create"
  expect_error 'a qcow2 image.*format=raw' backing=file:"$tmp/disk.qcow2"
  nbdkit_folio -U - "$PLUGIN" backing=file:"$tmp/disk.qcow2" format=raw \
    --run 'exit 0' > "$tmp/out" 2>&1 || bad "format=raw refused: $(cat "$tmp/out")"
else
  bad "qemu-img is not installed"
fi

# An image another nbdkit-folio-plugin (or foliod, or qemu) serves is in
# use (issue 23 item 5); locking=off opens it anyway.
env "${NBDKIT_ENV[@]}" nbdkit -f -U "$tmp/hold.sock" "$PLUGIN" "$img" \
  2>"$tmp/hold.log" &
hold=$!
track $hold
for _ in $(seq $((300 * TSCALE))); do [ -S "$tmp/hold.sock" ] && break; sleep 0.1; done
[ -S "$tmp/hold.sock" ] || bad "the holding nbdkit did not start: $(cat "$tmp/hold.log")"
expect_error 'in use.*locking=off' "$img"
nbdkit_folio -U - "$PLUGIN" "$img" locking=off --run 'exit 0' > "$tmp/out" 2>&1 ||
  bad "locking=off refused: $(cat "$tmp/out")"
kill $hold
wait $hold

# Read-only: advertised and enforced, by key and by nbdkit -r; the backing
# file stays untouched.
sum=$(md5sum < "$img")
cat > "$tmp/ro.py" <<'EOF'
import os, sys
import nbd
h = nbd.NBD()
h.set_full_info(True)
h.connect_uri(os.environ["URI"])
if not h.is_read_only():
    sys.exit("FAIL: export not read-only")
if h.get_size() != 3 * 1024 * 1024:
    sys.exit("FAIL: size")
try:
    h.pwrite(b"x" * 4096, 0)
    sys.exit("FAIL: write to a read-only export succeeded")
except nbd.Error as e:
    print("write refused:", e.errno)
h.pread(100000, 12345)
want = os.environ.get("DESC")
if want and h.get_export_description() != want:
    sys.exit("FAIL: description %r" % h.get_export_description())
h.shutdown()
EOF
for args in "read-only=1" "-r"; do
  if [ "$args" = -r ]; then set -- -r "$PLUGIN" "$img"; else set -- "$PLUGIN" "$img" "$args"; fi
  DESC= nbdkit_folio -U - "$@" \
    --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/ro.py" > "$tmp/ro.log" 2>&1 ||
    { cat "$tmp/ro.log"; bad "read-only ($args)"; }
done
[ "$(md5sum < "$img")" = "$sum" ] || bad "read-only export modified the backing file"

# A read-only backing (a remote nbdkit -r) makes the export read-only.
if [ -f "${TOP:-.}/src/backing/nbd.c" ]; then
  nbdkit -r -f -U "$tmp/remote.sock" file "$img" &
  remote_pid=$!
  track $remote_pid
  for _ in $(seq $((300 * TSCALE))); do [ -S "$tmp/remote.sock" ] && break; sleep 0.1; done
  DESC= nbdkit_folio -U - "$PLUGIN" backing="nbd+unix:///?socket=$tmp/remote.sock" \
    --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/ro.py" > "$tmp/ro.log" 2>&1 ||
    { cat "$tmp/ro.log"; bad "read-only nbd backing"; }
  kill $remote_pid
fi

# Description reaches the client.
DESC="folio test disk" nbdkit_folio -U - -r "$PLUGIN" "$img" \
  description="folio test disk" \
  --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/ro.py" > "$tmp/desc.log" 2>&1 ||
  { cat "$tmp/desc.log"; bad "description"; }

[ $fails -eq 0 ] || { echo "$fails failure(s)"; exit 1; }
echo "config ok"
