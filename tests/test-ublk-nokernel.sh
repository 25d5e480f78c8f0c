#!/bin/bash
# ublk on a kernel without the driver (Debian 12's 6.1, this host): a
# clear error at once, never a hang, and NBD goes on.  `foliod ublk add`
# (and `foliod ublk recover`) says that the kernel has no ublk driver and
# exits 1; `ublk list` answers; `ublk del` of a device foliod does not
# serve says so; the
# export still serves NBD afterwards.  `ublk = yes` in an export's options
# stops the start with the same reason.  (tests/test-vm-ublk.sh runs the
# driver itself, in a guest.)
. "$(dirname "$0")/lib.sh"
lib_init ublk-nokernel
[ -e /dev/ublk-control ] && skip "this kernel has ublk (/dev/ublk-control)"

truncate -s 8M "$tmp/img"
ctl=$tmp/ctl
start_foliod --control "$ctl" --export "disk0=file:$tmp/img,cache-size=8M"

rc=0
timeout $(( 10 * TSCALE )) "$FOLIOD" ublk add disk0 --control "$ctl" \
  > "$tmp/add.out" 2>&1 || rc=$?
[ $rc -ne 124 ] || fail "foliod ublk add still running after 10 s"
[ $rc -eq 1 ] || fail "foliod ublk add exited $rc: $(cat "$tmp/add.out")"
grep -q "ublk add disk0: this kernel has no ublk driver (no /dev/ublk-control" \
  "$tmp/add.out" || fail "ublk add said: $(cat "$tmp/add.out")"

rc=0
timeout $(( 10 * TSCALE )) "$FOLIOD" ublk recover disk0 --control "$ctl" \
  > "$tmp/recover.out" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "foliod ublk recover exited $rc: $(cat "$tmp/recover.out")"
grep -q "ublk recover disk0: this kernel has no ublk driver" \
  "$tmp/recover.out" || fail "ublk recover said: $(cat "$tmp/recover.out")"

out=$("$FOLIOD" ublk list --control "$ctl") || fail "ublk list failed"
[ "$out" = "OK no ublk device" ] || fail "ublk list said '$out'"
"$FOLIOD" ublk del 0 --control "$ctl" > "$tmp/del.out" 2>&1 &&
  fail "ublk del 0 succeeded with no device"
grep -q "foliod serves no /dev/ublkb0" "$tmp/del.out" ||
  fail "ublk del said: $(cat "$tmp/del.out")"
"$FOLIOD" ublk add nosuch --control "$ctl" > "$tmp/nosuch.out" 2>&1 &&
  fail "ublk add of an unknown export succeeded"
grep -q "no export named 'nosuch'" "$tmp/nosuch.out" ||
  fail "ublk add nosuch said: $(cat "$tmp/nosuch.out")"
"$FOLIOD" ublk frob --control "$ctl" > "$tmp/usage.out" 2>&1 &&
  fail "ublk frob accepted"
grep -q "usage: foliod ublk add EXPORT" "$tmp/usage.out" ||
  fail "ublk frob said: $(cat "$tmp/usage.out")"

# NBD is untouched.
printf 'after ublk' > "$tmp/data"
nbdcopy "$tmp/data" "$(uri disk0)" || fail "NBD write after ublk add"
[ "$(nbdcopy "$(uri disk0)" - | head -c 10)" = "after ublk" ] ||
  fail "NBD read after ublk add"
stop_foliod

start_refused "ublk = yes without the driver" \
  "export disk0: ublk = yes: this kernel has no ublk driver" \
  --export "disk0=file:$tmp/img,cache-size=8M,ublk=yes"
echo "PASS"
