#!/bin/bash
# A crash says where: foliod killed by a fault signal logs one line
# naming the signal, the thread and its stack (object+offset, for
# addr2line), then dies of that signal as before (exit status 128+N, a
# core dump where allowed).  A crash seen once on a loaded machine is
# then found from its log.  (Before: nothing in the log; the shell said
# "Segmentation fault".)
. "$(dirname "$0")/lib.sh"
lib_init daemon-crash-report
[ "${SAN:-}" = 1 ] && skip "the sanitizer build reports crashes itself"

truncate -s 16M "$tmp/disk.img"
for sig in SEGV ABRT; do
  : > "$tmp/foliod.log"
  start_foliod --pidfile "$tmp/pid" --export "disk0=$tmp/disk.img"
  pid=$(cat "$tmp/pid")
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "--pidfile $tmp/pid" ||
    fail "the pid file does not name our foliod"
  kill -"$sig" "$pid"
  wait_gone "$pid" 100 || fail "foliod still runs after SIG$sig"
  rc=0; wait "$FOLIOD_PID" || rc=$?
  FOLIOD_PID=
  # timeout(1) dies of its child's signal: the shell says 128+N.
  [ "$rc" = $((128 + $(kill -l "$sig"))) ] ||
    fail "foliod did not die of SIG$sig (status $rc)"
  line=$(grep "crashed: SIG$sig" "$tmp/foliod.log") ||
    fail "no crash line for SIG$sig: $(tail -n 3 "$tmp/foliod.log")"
  echo "$line"
  echo "$line" | grep -q "sent by pid $$\| sent by pid [0-9]* in thread foliod" ||
    fail "the line does not say who sent it, in which thread"
  off=$(echo "$line" | grep -o 'foliod+0x[0-9a-f]*' | head -n 1)
  [ -n "$off" ] || fail "no frame of foliod in the stack"
  # The outermost foliod frame resolves to a function of foliod's.
  fn=$(addr2line -f -e "$FOLIOD" "${off#foliod+}" | head -n 1)
  [ -n "$fn" ] && [ "$fn" != "??" ] || fail "$off does not resolve"
done
echo OK
