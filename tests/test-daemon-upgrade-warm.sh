#!/bin/bash
# Upgrade in place keeps the ram cache (issue 35 item 1): the ram store's
# memfd goes to the new process with the sockets.  A 16 MiB image behind
# a 32 MiB ram cache is read whole (the warm set), 1 MiB of it is
# written and not flushed (dirty), then foliod is upgraded:
#  - the image file is untouched (the dirty data was not written back),
#  - the new process answers a second read of every block from the cache
#    (foliod stats: every read a hit, none a miss, as before the upgrade),
#    with the written data, and holds the 1 MiB dirty,
#  - a FLUSH then writes it to the image.
# A new binary that fails (at once, or after it took the cache) leaves
# the old process serving the same cache, still warm and dirty.  A new
# binary that reads another ram layout (FOLIOD_TEST_RAM_LAYOUT) starts
# cold: the old process wrote the dirty data back first.
. "$(dirname "$0")/lib.sh"
lib_init daemon-upgrade-warm 64
requires nbdsh

ctl=$tmp/ctl
SOCK=$tmp/sock
FOLIOD_LOG=$tmp/foliod.log
url="nbd+unix:///disk0?socket=$SOCK"
MIB=$((1 << 20))

install_binary () {
  cp "$1" "$tmp/foliod.new" && mv -f "$tmp/foliod.new" "$tmp/foliod"
}

start () {
  rm -f "$tmp/pid"
  random_file "$tmp/img" 16
  cp "$tmp/img" "$tmp/img.orig"
  install_binary "$FOLIOD"
  "$tmp/foliod" --foreground --unix "$SOCK" --control "$ctl" \
    --pidfile "$tmp/pid" \
    --export "disk0=file:$tmp/img,cache-size=32M,dirty-expire=3600000" \
    >>"$FOLIOD_LOG" 2>&1 &
  track $!
  wait_for_socket "$SOCK" $(( 20 * TSCALE ))
  # The expected image: the original with 1 MiB of 0xa5 at 5 MiB.
  cp "$tmp/img.orig" "$tmp/expect"
  head -c $MIB /dev/zero | tr '\0' '\245' |
    dd of="$tmp/expect" bs=$MIB seek=5 conv=notrunc status=none
}

# read_all [FILE]: read the whole export in 64 KiB requests; it must
# equal FILE ($tmp/expect).
read_all () {
  nbdsh -u "$url" -c "
want = open('${1:-$tmp/expect}', 'rb').read()
for off in range(0, h.get_size(), 65536):
    assert h.pread(65536, off) == want[off:off + 65536], off
"
}

write_dirty () {
  nbdsh -u "$url" -c "h.pwrite(b'\xa5' * $MIB, 5 * $MIB)"
}

stat_of () { foliod_stat "$ctl" "$1"; }

upgrade () {
  local old out
  old=$(cat "$tmp/pid")
  out=$(timeout $(( 60 * TSCALE )) "$FOLIOD" upgrade --control "$ctl" 2>&1) ||
    fail "foliod upgrade: $out"
  echo "  $out"
  [ "$(cat "$tmp/pid")" != "$old" ] || fail "upgrade: still pid $old"
  track "$(cat "$tmp/pid")"
  wait_gone "$old" 100 || fail "the old foliod $old still runs"
}

# hits_only WHAT: a read of the whole image was answered from the cache.
hits_only () {
  local h0 m0 h1 m1
  h0=$(stat_of foliod_read_hits_total); m0=$(stat_of foliod_read_misses_total)
  read_all || fail "$1: the data read back is not what was written"
  h1=$(stat_of foliod_read_hits_total); m1=$(stat_of foliod_read_misses_total)
  echo "  $1: hits $h0 -> $h1, misses $m0 -> $m1"
  [ "$m1" = "$m0" ] || fail "$1: $((m1 - m0)) read misses (the cache is cold)"
  [ $((h1 - h0)) -ge 256 ] || fail "$1: only $((h1 - h0)) hits for 256 reads"
}

dirty_kept () {
  local d
  cmp -s "$tmp/img" "$tmp/img.orig" ||
    fail "$1: the image changed: dirty data was written back"
  d=$(stat_of foliod_dirty_bytes)
  [ "$d" -ge $MIB ] || fail "$1: $d bytes dirty, not the 1 MiB written"
}

echo "ram store, warm upgrade:"
start
read_all "$tmp/img.orig" || fail "first read"
write_dirty
hits_only "before the upgrade"
dirty_kept "before the upgrade"
upgrade
hits_only "after the upgrade"
dirty_kept "after the upgrade"
grep -q "ram cache handed over" "$FOLIOD_LOG" ||
  fail "the new process did not say it took the ram cache"

echo "a new binary that fails:"
cp "$FOLIOD" "$tmp/foliod.real"
printf '#!/bin/sh\necho "broken foliod" >&2\nexit 1\n' > "$tmp/broken1"
# broken2 loads, takes the hand-over (the cache too), opens its export,
# then cannot write its pid file.
cat > "$tmp/broken2" <<EOS
#!/bin/sh
for a do
  shift
  case \$a in $tmp/pid) a=$tmp/no/such/dir/pid ;; esac
  set -- "\$@" "\$a"
done
exec "$tmp/foliod.real" "\$@"
EOS
chmod +x "$tmp/broken1" "$tmp/broken2"
pid=$(cat "$tmp/pid")
for b in broken1 broken2; do
  install_binary "$tmp/$b"
  out=$(timeout $(( 60 * TSCALE )) "$FOLIOD" upgrade --control "$ctl" 2>&1) &&
    fail "upgrade to a broken binary ($b) succeeded: $out"
  echo "  $b: $out"
  kill -0 "$pid" || fail "foliod $pid is gone"
  hits_only "after $b"
  dirty_kept "after $b"
done
echo "$out" | grep -q "before it was ready" ||
  fail "broken2 failed before the hand-over: $out"
grep -q "foliod\[[0-9]*\] info: export disk0: ram cache handed over" \
  "$FOLIOD_LOG" || fail "broken2 never took the ram cache"

echo "a FLUSH writes the dirty data back:"
install_binary "$FOLIOD"
upgrade
nbdsh -u "$url" -c 'h.flush()'
cmp -s "$tmp/img" "$tmp/expect" || fail "the image after FLUSH is not what was written"
stop_pidfile_foliod "$tmp/pid"

echo "a new binary of another ram layout starts cold:"
FOLIOD_TEST_RAM_LAYOUT=0 start
read_all "$tmp/img.orig" || fail "first read"
write_dirty
upgrade
cmp -s "$tmp/img" "$tmp/expect" ||
  fail "the old process did not write back before a cold upgrade"
m0=$(stat_of foliod_read_misses_total)
read_all || fail "cold: the data read back is not what was written"
m1=$(stat_of foliod_read_misses_total)
[ "$m1" -gt "$m0" ] || fail "cold: no miss ($m0 -> $m1): the cache was kept"
echo "  cold: misses $m0 -> $m1, image written back before the upgrade"
stop_pidfile_foliod "$tmp/pid"
echo "ok"
