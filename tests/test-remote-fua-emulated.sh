#!/bin/bash
# Issue 33 item 2, "a connection's end loses what the remote acknowledged
# on it": a remote without native FUA gets a client's FUA write as a
# write and then a flush.  The remote (nbdkit's sh plugin, below) keeps
# writes in a volatile copy until a flush and is killed while that flush
# waits: the write it acknowledged is gone.  (The cache's own writes
# never ask such a backing for FUA: they are counted unflushed and
# written again after a reconnect.  A passthrough write, here
# cache=none, and a FUA zero or trim are sent with FUA.)  foliod reconnects to the
# restarted remote and sends the flush again; that flush covers nothing
# of the dead process.  The FUA write must not be reported durable unless
# the image has it: after the client's FUA write succeeded and foliod
# stopped cleanly, the image holds the new data.
. "$(dirname "$0")/lib.sh"
lib_init remote-fua-emulated
. "$(dirname "$0")/lib-remote.sh"
requires nbdsh python3

ctl=$tmp/ctl.sock
python3 -c "open('$tmp/img', 'wb').write(b'A' * (1 << 20))"
# The remote: no FUA; writes go to vol.img, a copy made at start (what
# the process holds in memory), and reach img at a flush.  While the
# file "hold" exists a flush says so (file "flushing") and waits for its
# nbdkit to die, never flushing.
printf '#!/bin/bash\nd=%s\n' "$tmp" >"$tmp/remote.sh"
cat >>"$tmp/remote.sh" <<'EOF'
case "$1" in
  get_ready) cp "$d/img" "$d/vol.img" ;;
  open) echo h ;;
  get_size) stat -c %s "$d/img" ;;
  can_write|can_flush) exit 0 ;;
  can_multi_conn|can_trim|can_zero|can_extents|is_rotational) exit 3 ;;
  can_fua) echo none ;;
  pread)
    dd if="$d/vol.img" skip="$4" count="$3" iflag=skip_bytes,count_bytes \
      status=none ;;
  pwrite)
    echo "pwrite $3 $4 $5" >>"$d/remote-req.log"
    dd of="$d/vol.img" seek="$4" conv=notrunc oflag=seek_bytes status=none ;;
  flush)
    echo flush >>"$d/remote-req.log"
    if [ -e "$d/hold" ]; then
      touch "$d/flushing"
      while kill -0 "$PPID" 2>/dev/null; do sleep 0.1; done
      exit 1
    fi
    cp "$d/vol.img" "$d/img.new" && sync "$d/img.new" &&
      mv "$d/img.new" "$d/img" ;;
  *) exit 2 ;;
esac
EOF
chmod +x "$tmp/remote.sh"
touch "$tmp/hold"
start_remote "$tmp/remote.sock" sh "$tmp/remote.sh"
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri),cache=none,retry-timeout=10000"

# The client's FUA write, in the background.
timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
  -c 'h.pwrite(b"W" * 4096, 0, nbd.CMD_FLAG_FUA)' -c 'print("written")' \
  >"$tmp/client.out" 2>&1 &
client=$!
# The remote has the write and waits on the flush after it: kill it.
for ((i = 0; i < 300 * TSCALE; i++)); do
  [ -e "$tmp/flushing" ] && break
  sleep 0.1
done
[ -e "$tmp/flushing" ] || fail "no flush reached the remote"
grep -q "pwrite 4096 0" "$tmp/remote-req.log" ||
  fail "the write did not reach the remote"
rm -f "$tmp/hold"
stop_remote KILL
start_remote "$tmp/remote.sock" sh "$tmp/remote.sh"
wait "$client" || true
grep -q written "$tmp/client.out" ||
  fail "the FUA write failed: $(cat "$tmp/client.out")"
# Reported durable: the image must hold it once foliod is gone.
stop_foliod
stop_remote
[ "$(head -c 1 "$tmp/img")" = W ] ||
  fail "the FUA write was acknowledged, and the image does not hold it"
echo OK
