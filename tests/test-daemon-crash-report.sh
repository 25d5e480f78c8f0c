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

# A real fault on an address whose mapping went away under the thread
# (a preloaded thread maps three pages and, once foliod serves, unmaps
# the middle one and reads it): the line says the address is not mapped and which mappings lie
# either side, the one before ending where the hole begins.
requires cc
cat > "$tmp/hole.c" <<'C'
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>
static void *
hole (void *arg)
{
  long pg = sysconf (_SC_PAGESIZE);
  char *p = mmap (NULL, 3 * pg, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  (void) arg;
  while (access (getenv ("HOLE_GO"), F_OK) != 0)   /* foliod is ready */
    usleep (10000);
  munmap (p + pg, pg);
  fprintf (stderr, "hole at %p\n", (void *) (p + pg));
  return (void *) (uintptr_t) *(volatile char *) (p + pg);
}
__attribute__ ((constructor)) static void
start (void)
{
  pthread_t t;
  pthread_create (&t, NULL, hole, NULL);
  pthread_detach (t);
}
C
cc -shared -fPIC -o "$tmp/hole.so" "$tmp/hole.c" -lpthread || fail "cc hole.so"
: > "$tmp/foliod.log"
HOLE_GO=$tmp/go LD_PRELOAD=$tmp/hole.so start_foliod --pidfile "$tmp/pid" \
  --export "disk0=$tmp/disk.img"
pid=$(cat "$tmp/pid")
touch "$tmp/go"
wait_gone "$pid" 100 || fail "foliod still runs after its fault"
rc=0; wait "$FOLIOD_PID" || rc=$?
FOLIOD_PID=
[ "$rc" = $((128 + $(kill -l SEGV))) ] || fail "foliod did not die of SIGSEGV (status $rc)"
hole=$(sed -n 's/^hole at 0x//p' "$tmp/foliod.log")
[ -n "$hole" ] || fail "the preloaded thread did not run"
grep "crashed: " "$tmp/foliod.log"
grep -q "crashed: SIGSEGV at 0x$hole (not mapped) in thread foliod" "$tmp/foliod.log" ||
  fail "the crash line does not say 0x$hole was not mapped"
grep -q "crashed: 0x$hole is in no mapping; before it: [0-9a-f]*-$hole r--p .*; after it: [0-9a-f]*-[0-9a-f]* r--p " \
  "$tmp/foliod.log" || fail "the crash does not name the mappings either side of the hole"
echo OK
