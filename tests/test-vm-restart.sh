#!/bin/bash
# The Linux kernel's NBD client across foliod upgrades and restarts (issue
# 35): one qemu guest (TCG, Debian's kernel, tests/vm/init-restart) runs
# foliod with a pmem store and attaches it with Debian's nbd-client, ext4
# mounted, a writer fsyncing files under it.
#   - foliod upgrade, twice: the writer sees no error, dmesg no I/O error,
#     e2fsck clean, every file reads back;
#   - kill -9 and a restart on the same store, once per client setting in
#     VM_KILL (netlink, persist, persist-not: tests/vm/init-restart; the
#     default is netlink, Debian's default): what the client saw is
#     logged; re-attached, every fsynced file reads back and e2fsck is
#     clean.  Debian 12's nbd-client reconnects in no setting (foliod(8),
#     "Restarts clients do not see"); VM_INVISIBLE=ROUND,... makes those
#     rounds fail unless the kill was invisible (to try a client that
#     should reconnect).
# Environment: FOLIOD, BUILD (the kept initramfs), VM_KVER, VM_KEEP=1,
# VM_TIMEOUT (seconds, default 240).
set -u
TOP=${TOP:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${BUILD:-$TOP/build}
. "$TOP/tests/vm/lib.sh"
vm_requires /usr/sbin/mke2fs /usr/sbin/e2fsck /usr/sbin/nbd-client
[ -x "${FOLIOD:-}" ] || fail "FOLIOD not set or not executable"
pids=()         # qemu (vm_boot): killed when the test exits
vm_on_exit() { local p; for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; }
vm_setup

foliod=$(realpath "$FOLIOD")
vm_initrd initrd "$TOP/tests/vm/init-restart" "nbd ext4" \
  "$foliod /usr/sbin/nbd-client /usr/sbin/mke2fs /usr/sbin/e2fsck"
vm_boot "${VM_TIMEOUT:-240}" "$initrd" \
  "loglevel=4 rdinit=/init vmtest.foliod=$foliod vmtest.kill=${VM_KILL:-netlink} vmtest.invisible=${VM_INVISIBLE:-}" \
  -m 1024
tr -d '\r' < "$T/console.log" > "$T/boot.log"
grep -a '^vmtest:\|^VMTEST:' "$T/boot.log"
if ! grep -q '^VMTEST: PASS' "$T/boot.log"; then
  grep -av '^vmtest:\|^VMTEST:' "$T/boot.log" | tail -n 30; cat "$T/qemu.log"
  [ "$vm_qrc" = 124 ] && fail "guest timed out after ${VM_TIMEOUT:-240}s"
  fail "guest: $(grep -a '^VMTEST: FAIL' "$T/boot.log" || echo "no result, qemu exit $vm_qrc")"
fi
grep -q '^VMTEST: OK upgrade ' "$T/boot.log" || fail "no result for the upgrade"
for r in $(echo "${VM_KILL:-netlink}" | tr , ' '); do
  grep -q "^VMTEST: OK kill-$r " "$T/boot.log" || fail "no result for kill round $r"
done
echo "PASS: vm-restart (${vm_secs}s)"
