#!/bin/bash
# nbdkit-folio-plugin when nbdkit forks into the background (no -f):
#  - the writeback thread runs after the fork (after_fork restarts it):
#    unflushed writes reach the backing file on their own once they expire;
#  - SIGTERM writes back all dirty data before nbdkit exits;
#  - the same with an nbd backing (its connections and poller threads
#    must work in the forked server).
. "$(dirname "$0")/lib.sh"
plugin_init plugin-daemon
requires nbdsh

img=$tmp/disk.img
head -c $((8 * 1024 * 1024)) /dev/urandom > "$img"
head -c $((1024 * 1024 + 333)) /dev/urandom > "$tmp/data"

# start ARGS...: nbdkit forks into the background; sets pid.
start () {
  rm -f "$tmp/sock" "$tmp/pid"
  env "${NBDKIT_ENV[@]}" nbdkit -U "$tmp/sock" -P "$tmp/pid" \
    --log=stderr "$PLUGIN" backing="${BACKING:-file:$img}" "$@" \
    2>>"$tmp/nbdkit.log"
  for _ in $(seq $((300 * TSCALE))); do [ -s "$tmp/pid" ] && break; sleep 0.1; done
  pid=$(cat "$tmp/pid")
  track "$pid"
  [ -S "$tmp/sock" ] || { echo "nbdkit did not start"; exit 1; }
}
# write_unflushed OFF: write $tmp/data at OFF and disconnect without flush.
write_unflushed () {
  nbdsh -u "nbd+unix:///?socket=$tmp/sock" \
    -c "h.pwrite(open('$tmp/data', 'rb').read(), $1)"
}
# on_disk OFF: does the backing file hold $tmp/data at OFF?
on_disk () {
  cmp -s -n $(stat -c %s "$tmp/data") -i 0:"$1" "$tmp/data" "$img"
}
stop () {
  kill -TERM "$pid"
  wait_gone "$pid" 600 || { echo "nbdkit did not exit on SIGTERM"; exit 1; }
  pid=
}

# 1. Background writeback after the fork.
start dirty-expire=200 writeback-interval=100
write_unflushed 12345
ok=0
for _ in $(seq $((300 * TSCALE))); do on_disk 12345 && { ok=1; break; }; sleep 0.1; done
[ $ok = 1 ] || { cat "$tmp/nbdkit.log"; echo "FAIL: no background writeback after fork"; exit 1; }
echo "background writeback ran in the forked server"
stop

# 2. SIGTERM writes back what is still dirty.
start dirty-expire=600000 writeback-interval=60000 dirty-background=90 dirty-limit=95
write_unflushed 3000001
on_disk 3000001 && echo "(data already written before SIGTERM)"
stop
on_disk 3000001 || { cat "$tmp/nbdkit.log"; echo "FAIL: dirty data lost on SIGTERM"; exit 1; }
echo "SIGTERM wrote back all dirty data"

# 3. nbd backing: a remote nbdkit serves the same file.
if [ -f "$TOP/src/backing/nbd.c" ]; then
  nbdkit -f -U "$tmp/remote.sock" file "$img" 2>>"$tmp/remote.log" &
  track $!
  for _ in $(seq $((300 * TSCALE))); do [ -S "$tmp/remote.sock" ] && break; sleep 0.1; done
  BACKING="nbd+unix:///?socket=$tmp/remote.sock"
  BACKING=$BACKING start dirty-expire=200 writeback-interval=100
  write_unflushed 4000003
  ok=0
  for _ in $(seq $((300 * TSCALE))); do on_disk 4000003 && { ok=1; break; }; sleep 0.1; done
  [ $ok = 1 ] || { cat "$tmp/nbdkit.log"; echo "FAIL: nbd backing: no background writeback after fork"; exit 1; }
  head -c 77777 /dev/urandom > "$tmp/data"
  write_unflushed 6000001
  stop
  on_disk 6000001 || { cat "$tmp/nbdkit.log"; echo "FAIL: nbd backing: dirty data lost on SIGTERM"; exit 1; }
  echo "nbd backing: writeback works in the forked server (background and at SIGTERM)"
fi
if grep -E 'AddressSanitizer|runtime error:|error' "$tmp/nbdkit.log"; then
  echo "FAIL: errors in the nbdkit log"; exit 1
fi
