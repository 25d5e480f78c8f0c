#!/bin/bash
# Upgrade in place (issue 35 item 1): `foliod upgrade` starts the binary
# again and hands it the sockets and every plain connection.  A libnbd
# client keeps 8 requests in flight on one connection, writes and reads a
# verified pattern without a pause while foliod is upgraded
# UPGRADE_ROUNDS times (15; the ram store UPGRADE_RAM_ROUNDS, 5; both
# ROUNDS in make check-crash): no request fails, the connection is the same
# socket at the end, every byte reads back, each upgrade gives a new pid
# and the old one exits.  With the pmem store, dirty data is not written
# back across the upgrades (the image is untouched until the final
# SIGTERM, the new process recovers it dirty); with the ram store too
# (its memfd goes over whole; tests/test-daemon-upgrade-warm.sh checks
# the warm set).  A new binary that
# fails to start (at once, or after it took the hand-over) leaves the old
# process serving the same connection.  TLS connections, whose session
# cannot move, are closed and a new one is served by the new process.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/lib-tls.sh"
lib_init daemon-upgrade 64
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"
requires openssl     # the TLS part's certificates

rounds=${UPGRADE_ROUNDS:-15}
ram_rounds=${UPGRADE_RAM_ROUNDS:-5}
ctl=$tmp/ctl
SOCK=$tmp/sock
FOLIOD_LOG=$tmp/foliod.log

# The binary foliod upgrade starts again is the path it runs from: a copy
# this test can replace, as a package upgrade does.
install_binary () {
  cp "$1" "$tmp/foliod.new" && mv -f "$tmp/foliod.new" "$tmp/foliod"
}

# upgrade_once: foliod upgrade; a new pid serves, the old one is gone.
upgrade_once () {
  local old new out
  old=$(cat "$tmp/pid")
  out=$(timeout $(( 60 * TSCALE )) "$FOLIOD" upgrade --control "$ctl" 2>&1) ||
    fail "foliod upgrade: $out"
  echo "  $out"
  new=$(cat "$tmp/pid")
  [ "$new" != "$old" ] || fail "upgrade: still pid $old"
  track "$new"
  tr '\0' ' ' < "/proc/$new/cmdline" | grep -q -- "--pidfile $tmp/pid" ||
    fail "pid $new is not our foliod"
  wait_gone "$old" 100 || fail "the old foliod $old still runs"
}

# run STORE_OPTS ROUNDS [CACHE_SIZE]: start foliod, the client, ROUNDS
# upgrades.
run () {
  local store=$1 n=$2 cache=${3:-8M}
  rm -f "$tmp/stop" "$tmp/pid" "$tmp/store"
  random_file "$tmp/img" 16
  cp "$tmp/img" "$tmp/img.orig"
  install_binary "$FOLIOD"
  "$tmp/foliod" --foreground --unix "$SOCK" --control "$ctl" \
    --pidfile "$tmp/pid" --export "disk0=file:$tmp/img,cache-size=$cache$store" \
    >>"$FOLIOD_LOG" 2>&1 &
  track $!
  wait_for_socket "$SOCK" $(( 20 * TSCALE ))
  /usr/bin/python3 "$TOP/tests/tools/upgrade-client.py" "$SOCK" \
    "$tmp/img.orig" $((4 << 20)) "$tmp/stop" "$tmp/expect" \
    > "$tmp/client.out" 2>&1 &
  client=$!
  track $client
  sleep 0.5
  for ((i = 1; i <= n; i++)); do
    # Round 1 runs from a binary replaced since it started ("(deleted)").
    [ "$i" = 1 ] && install_binary "$FOLIOD"
    upgrade_once
    kill -0 $client 2>/dev/null || fail "the client stopped: $(cat "$tmp/client.out")"
    sleep 0.2
  done
}

finish () {
  touch "$tmp/stop"
  wait $client || fail "client: $(cat "$tmp/client.out")"
  grep -q "^ok .* same-socket$" "$tmp/client.out" ||
    fail "client: $(cat "$tmp/client.out")"
  echo "  client: $(cat "$tmp/client.out") (requests, longest pause ms)"
}

echo "pmem store, $rounds upgrades:"
run ",store=pmem:$tmp/store,dirty-background=90,dirty-limit=95,dirty-expire=3600000" "$rounds"
# Nothing was written back across the upgrades: the image is untouched,
# and the last process holds the dirty data (recovered from the store).
cmp -s "$tmp/img" "$tmp/img.orig" ||
  fail "the image changed: dirty data was written back across an upgrade"
dirty=$(foliod_stat "$ctl" foliod_dirty_bytes)
[ "${dirty:-0}" -gt 0 ] || fail "no dirty data after the upgrades ($dirty)"
echo "  image untouched, $dirty bytes dirty in the last process"

# A new binary that cannot start: the old process serves on.  Two ways:
# it exits at once (before anything is handed over), or it loads, takes
# the hand-over and then cannot open the export (the old process takes
# its connection back and opens its store again).
pid=$(cat "$tmp/pid")
cp "$FOLIOD" "$tmp/foliod.real"
printf '#!/bin/sh\necho "broken foliod" >&2\nexit 1\n' > "$tmp/broken1"
# broken2: the same binary, its export's store in a missing directory.
cat > "$tmp/broken2" <<EOS
#!/bin/sh
for a do
  shift
  case \$a in disk0=*) a=\$(echo "\$a" | sed 's|store=pmem:[^,]*|store=pmem:$tmp/no/such/store|') ;; esac
  set -- "\$@" "\$a"
done
exec "$tmp/foliod.real" "\$@"
EOS
chmod +x "$tmp/broken1" "$tmp/broken2"
for b in broken1 broken2; do
  install_binary "$tmp/$b"
  out=$(timeout $(( 60 * TSCALE )) "$FOLIOD" upgrade --control "$ctl" 2>&1) &&
    fail "upgrade to a broken binary ($b) succeeded: $out"
  echo "  $b: $out"
  echo "$out" | grep -q "upgrade failed" || fail "upgrade to $b: $out"
  [ "$(cat "$tmp/pid")" = "$pid" ] && kill -0 "$pid" ||
    fail "foliod $pid is gone"
  sleep 0.5
  kill -0 $client 2>/dev/null ||
    fail "the client stopped: $(cat "$tmp/client.out")"
done
# broken2 failed after the hand-over: the old process took its
# connection back (and said so), and its store again.
echo "$out" | grep -q "before it was ready" ||
  fail "broken2 failed before the hand-over: $out"
sed -n "/foliod\[$pid\] error: upgrade failed: .* before it was ready/,\$p" \
  "$FOLIOD_LOG" |
  grep -q "foliod\[$pid\] info: conn .*: export 'disk0' (handed over by the old" ||
  fail "broken2: the old process never took its connection back"
install_binary "$FOLIOD"
upgrade_once
finish
stop_pidfile_foliod "$tmp/pid"
cmp -s "$tmp/img" "$tmp/expect" || fail "pmem: the image is not what was written"

# The ram store holds the whole image (no eviction, no threshold
# reached): its memfd goes across every upgrade, and so does the dirty
# data, never written back until the final SIGTERM.
echo "ram store, $ram_rounds upgrades:"
run ",dirty-expire=3600000" "$ram_rounds" 32M
cmp -s "$tmp/img" "$tmp/img.orig" ||
  fail "ram: the image changed: dirty data was written back across an upgrade"
dirty=$(foliod_stat "$ctl" foliod_dirty_bytes)
[ "${dirty:-0}" -gt 0 ] || fail "ram: no dirty data after the upgrades ($dirty)"
echo "  image untouched, $dirty bytes dirty in the last process"
finish    # the client's last FLUSH writes it back
stop_pidfile_foliod "$tmp/pid"
cmp -s "$tmp/img" "$tmp/expect" || fail "ram: the image is not what was written"

echo "TLS (tls = on), one TLS and one plain connection:"
tls_make_certs "$tmp/pki" > /dev/null
rm -f "$tmp/pid"
install_binary "$FOLIOD"
"$tmp/foliod" --foreground --unix "$SOCK" --control "$ctl" --pidfile "$tmp/pid" \
  --tls on --tls-certificates "$tmp/pki/srv" \
  --export "disk0=file:$tmp/img,cache-size=8M" >>"$FOLIOD_LOG" 2>&1 &
track $!
wait_for_socket "$SOCK" $(( 20 * TSCALE ))
/usr/bin/python3 - "$SOCK" "$tmp/pki/cli" "$FOLIOD" "$ctl" > "$tmp/tls.out" 2>&1 <<'PY' ||
import subprocess, sys
import nbd
sock, cli, foliod, ctl = sys.argv[1:5]
def conn(tls):
    h = nbd.NBD()
    h.set_export_name("disk0")
    if tls:
        h.set_tls(nbd.TLS_REQUIRE)
        h.set_tls_certificates(cli)
    h.connect_unix(sock)
    return h
t, p = conn(True), conn(False)
want = p.pread(4096, 0)
assert t.get_tls_negotiated() and t.pread(4096, 0) == want
r = subprocess.run([foliod, "upgrade", "--control", ctl],
                   capture_output=True, text=True, timeout=60)
assert r.returncode == 0, r.stderr
assert p.pread(4096, 0) == want, "plain connection after the upgrade"
try:
    t.pread(4096, 0)
    sys.exit("the TLS connection still answers after the upgrade")
except nbd.Error as e:
    print("TLS connection closed:", e)
assert conn(True).pread(4096, 0) == want, "a new TLS connection"
print("ok")
PY
  fail "TLS: $(cat "$tmp/tls.out")"
sed 's/^/  /' "$tmp/tls.out"
stop_pidfile_foliod "$tmp/pid"
echo "ok"
