#!/bin/bash
# Issue 33 item 8: a remote that comes back must serve the export foliod
# opened.  The remote (nbdkit over a file, with a description) is killed
# and restarted: foliod reconnects and says so at info level.  Then it
# comes back with the same size but another description, and then as
# read-only: foliod refuses it (requests fail, nothing is read from it
# or written to it) and logs why at warning level; back as before, it is
# used again.
. "$(dirname "$0")/lib.sh"
lib_init remote-changed
. "$(dirname "$0")/lib-remote.sh"
requires nbdsh

ctl=$tmp/ctl.sock
truncate -s 16M "$tmp/a.img" "$tmp/b.img"
printf 'A%.0s' $(seq 4096) | dd of="$tmp/a.img" conv=notrunc status=none
printf 'B%.0s' $(seq 4096) | dd of="$tmp/b.img" conv=notrunc status=none
start_remote "$tmp/remote.sock" --filter=exportname file "$tmp/a.img" exportdesc=fixed:vol-a
# cache=none: every read asks the remote; retry-timeout: a refused remote
# counts as away, requests fail after this.
start_foliod --control "$ctl" \
  --export "disk0=$(remote_uri),cache=none,retry-timeout=3000"

# read0: the first byte the client reads at 0, or "error".
read0 () {
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c 'import sys' \
    -c 'try: print(h.pread(1, 0).decode())
except nbd.Error as e: print("error")' 2>/dev/null
}
[ "$(read0)" = A ] || fail "first read"

# back_as_opened: restart the remote as foliod opened it; reads work
# again (the backing may wait for its next probe).
back_as_opened () {
  local i
  stop_remote KILL
  start_remote "$tmp/remote.sock" --filter=exportname file "$tmp/a.img" \
    exportdesc=fixed:vol-a
  for ((i = 0; i < 10 * TSCALE; i++)); do
    [ "$(read0)" = A ] && return 0
    sleep 1
  done
  fail "no read after the remote came back as opened"
}

# The same export again: a reconnect, logged.
back_as_opened
grep -q "info: nbd .*: reconnected (1 reconnect)" "$FOLIOD_LOG" ||
  fail "the reconnect was not logged at info level"

# Another image of the same size, described otherwise: refused, logged.
stop_remote KILL
start_remote "$tmp/remote.sock" --filter=exportname file "$tmp/b.img" exportdesc=fixed:vol-b
for ((i = 0; i < 3; i++)); do
  [ "$(read0)" != B ] || fail "foliod served the other image"
done
wait_for_text "$FOLIOD_LOG" \
  "warn.*came back as another export (description \"vol-b\", was \"vol-a\")" \
  "the refusal was not logged"

# The same image, read-only now: refused too.
stop_remote KILL
start_remote "$tmp/remote.sock" -r --filter=exportname file "$tmp/a.img" exportdesc=fixed:vol-a
sleep 2.5                       # the next probe
for ((i = 0; i < 3; i++)); do
  [ "$(read0)" = error ] || fail "foliod used a remote that turned read-only"
done
wait_for_text "$FOLIOD_LOG" "warn.*came back as another export (handshake flags" \
  "the read-only refusal was not logged"

# As opened: used again.
back_as_opened
stop_foliod
stop_remote
echo OK
