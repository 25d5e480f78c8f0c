#!/bin/bash
# The systemd units pass `systemd-analyze verify` without a single warning,
# with ExecStart pointed at the built binary (verify checks that it exists),
# and carry the settings the service relies on.
. "$(dirname "$0")/lib.sh"
lib_init service-units
requires systemd-analyze

for u in foliod.service foliod.socket foliod@.service; do
  sed "s|/usr/sbin/foliod|$FOLIOD|" "$TOP/systemd/$u" > "$tmp/$u"
done
cp "$tmp/foliod@.service" "$tmp/foliod@test.service"
(cd "$tmp" && SYSTEMD_LOG_LEVEL=notice timeout 60 systemd-analyze verify --man=no \
   ./foliod.service ./foliod.socket ./foliod@test.service) >"$tmp/verify.log" 2>&1 ||
  fail "systemd-analyze verify: $(cat "$tmp/verify.log")"
# Warnings (unknown keys, bad values) do not change the exit status.
[ ! -s "$tmp/verify.log" ] || fail "systemd-analyze verify warns: $(cat "$tmp/verify.log")"

svc=$TOP/systemd/foliod.service
for want in '^Type=notify$' '^TimeoutStopSec=' '^ProtectSystem=strict$' \
            '^PrivateTmp=yes$' '^NoNewPrivileges=yes$' '^ProtectHome=yes$' \
            '^RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6$' \
            '^CapabilityBoundingSet=$' '^DynamicUser=yes$' '^StateDirectory=foliod$' \
            '^ExecStart=/usr/sbin/foliod --foreground --config /etc/foliod/foliod.conf'; do
  grep -qE "$want" "$svc" || fail "foliod.service lacks $want"
done
grep -q '^ListenStream=10809$' "$TOP/systemd/foliod.socket" || fail "socket: no TCP 10809"
grep -q '^ListenStream=/run/foliod/' "$TOP/systemd/foliod.socket" || fail "socket: no Unix socket"

# The ExecStart line runs: with the built binary it accepts these options.
"$FOLIOD" --check-config "$TOP/conf/foliod.conf" >/dev/null || fail "default config"
echo OK
