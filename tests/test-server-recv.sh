#!/bin/bash
# One recv per wake-up on a plain socket: a recv shorter than asked means
# the socket is empty, so the loop waits for the next readable event
# instead of calling recv again for an EAGAIN.  A client with one request
# in flight at a time makes every request its own wake-up: foliod must not
# need two recv calls per request (it did: the second returned EAGAIN).
# The recv calls are counted by strace (no timing involved), and the
# replies checked.
. "$(dirname "$0")/lib.sh"
lib_init server-recv
requires nbdsh strace

N=1000
truncate -s 16M "$tmp/img"
SOCK=$tmp/sock
# LeakSanitizer cannot run under ptrace (it exits 1 at the end): the other
# ASan checks stay on in a SAN build.
ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0 \
strace -f -qq -c -e trace=recvfrom,recvmsg,read -o "$tmp/strace.out" \
  "$FOLIOD" --foreground --unix "$SOCK" \
  --export "disk0=file:$tmp/img,cache-size=32M" >>"$tmp/foliod.log" 2>&1 &
spid=$!
track "$spid"
wait_for_socket "$SOCK" $(( 20 * TSCALE ))

URI=$(uri disk0) N=$N timeout $((120 * TSCALE)) nbdsh -c '
import os
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
h.pwrite(b"\x07" * 4096, 0)
for i in range(int(os.environ["N"])):
    assert h.pread(512, (i % 8) * 512) == b"\x07" * 512
h.shutdown()
' || fail "one request at a time"

fpid=$(ps -o pid= --ppid "$spid" | tr -d ' ')
[ -n "$fpid" ] || fail "foliod (under strace) not found"
kill -TERM "$fpid"
wait "$spid" || fail "foliod under strace exited with $?"
calls=$(awk '$NF == "recvfrom" { print $4 }' "$tmp/strace.out")
[ -n "$calls" ] || fail "no recvfrom calls counted: $(cat "$tmp/strace.out")"
echo "recvfrom calls: $calls for $N requests"
# The handshake and the write add a few; two per request is the old cost.
[ "$calls" -le $(( N * 3 / 2 )) ] ||
  fail "$calls recv calls for $N one-at-a-time requests (one per request expected)"
echo OK
