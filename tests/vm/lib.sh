# Shared by the qemu guest tests (tests/vm/run, tests/test-vm-pmem.sh):
# source it, with T set to the test's temp dir.
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
log() { echo "vm: $*"; }

# vm_requires TOOL...: skip unless each one is installed.
vm_requires() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || skip "$t not installed (scripts/install-deps)"
  done
}

# vm_kernel: VM_KVER, the newest kernel with a readable /boot/vmlinuz and
# modules (VM_KVER set beforehand wins).
vm_kernel() {
  local k
  if [ -z "${VM_KVER:-}" ]; then
    for k in $(ls -v /lib/modules 2>/dev/null); do
      [ -r "/boot/vmlinuz-$k" ] && VM_KVER=$k
    done
  fi
  [ -n "${VM_KVER:-}" ] && [ -r "/boot/vmlinuz-$VM_KVER" ] ||
    skip "no readable /boot/vmlinuz with modules (linux-image-amd64)"
}

# vm_initrd NAME INIT FILE...: initrd, the initramfs of INIT (with
# VM_MODULES / VM_TOOLS, see mkinitramfs), kept in $BUILD/vm between runs
# and rebuilt when INIT, mkinitramfs or a FILE is newer.
vm_initrd() {
  local name=$1 init=$2 f
  shift 2
  initrd=$T/initrd.cpio
  [ -n "${BUILD:-}" ] && mkdir -p "$BUILD/vm" && initrd=$BUILD/vm/$name-$VM_KVER.cpio
  for f in "$init" "$here/mkinitramfs" /bin/busybox \
           "/lib/modules/$VM_KVER/modules.dep" "$@"; do
    [ "$f" -nt "$initrd" ] && rm -f "$initrd"
  done
  if [ ! -f "$initrd" ]; then
    "$here/mkinitramfs" "$VM_KVER" "$init" "$T/initrd.new" &&
      mv "$T/initrd.new" "$initrd" || fail "building the initramfs"
  fi
}

# The qemu options every test guest has: TCG (KVM did not boot a stock
# kernel in useful time on these hosts), one CPU, no devices but the
# console, exit instead of rebooting.  Then the guest's own.
vm_qemu_args=(-accel tcg -cpu max -smp "${VM_SMP:-1}"
              -nographic -nodefaults -no-reboot -no-user-config)
vm_append="console=ttyS0 edd=off panic=-1 loglevel=4 rdinit=/init"
