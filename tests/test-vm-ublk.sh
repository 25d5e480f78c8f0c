#!/bin/bash
# foliod's ublk front end in a qemu guest (TCG): Debian 12's kernel has no
# ublk_drv, so the guest boots bookworm-backports' 6.12 kernel, fetched
# once into $BUILD/vm/bpo by tests/vm/bpo-kernel (a private sources list,
# never the host's apt configuration).  foliod runs inside the guest;
# tests/vm/init-ublk says what is checked: fio verify, ublk and NBD on one
# export, ext4 with a checksummed file set, ublk del while mounted,
# ublk=yes at start, kill -9 and foliod upgrade under fio (user recovery:
# no I/O error, the data verified).  Skips (77) without qemu or the
# kernel (no network).
set -u
TOP=${TOP:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${BUILD:-$TOP/build}
. "$TOP/tests/vm/lib.sh"
vm_requires fio nbdcopy nbdinfo flock depmod
[ -x "${FOLIOD:-}" ] || fail "FOLIOD not set or not executable"
FOLIOD=$(realpath "$FOLIOD")
kdir=$BUILD/vm/bpo
VM_KVER=$("$TOP/tests/vm/bpo-kernel" "$kdir") ||
  skip "cannot fetch Debian bookworm-backports' kernel into $kdir (network?)"
VM_KERNEL=$kdir/root/boot/vmlinuz-$VM_KVER
VM_MODROOT=$kdir/root
pids=()
vm_setup

vm_initrd initrd "$TOP/tests/vm/init-ublk" "ublk_drv ext4" \
  "$FOLIOD /usr/bin/fio /usr/bin/nbdcopy /usr/bin/nbdinfo /usr/sbin/mke2fs /usr/sbin/e2fsck"
# TCG, one CPU: the guest took 175-230 s on a loaded 2-core host before
# the recovery steps, 387 s with them beside another guest.
vm_boot "${VM_UBLK_TIMEOUT:-700}" "$initrd" \
  "loglevel=4 rdinit=/init vmtest.foliod=$FOLIOD" -m 1536
grep -a 'vmtest:\|VMTEST:' "$T/console.log" | tr -d '\r' | sed 's/^.*\(vmtest:\)/\1/'
result=$(grep -a '^VMTEST: \(PASS\|FAIL\)' "$T/console.log" | tr -d '\r' | tail -n1)
if [ "$result" != "VMTEST: PASS" ]; then
  tail -n 40 "$T/console.log"; cat "$T/qemu.log"
  [ "$vm_qrc" = 124 ] && fail "guest timed out"
  fail "guest: ${result:-no result line}"
fi
echo "PASS: ublk in the guest ($VM_KVER, ${vm_secs}s)"
