# Shared by the qemu guest tests (tests/vm/run, tests/vm/run-systemd):
# the machine checks, the temp dir, the cached initramfs and the bounded
# qemu boot.  Source it; it sets VM_KVER and T.
#
#   vm_requires TOOL...        skip (77) unless every tool is installed
#   vm_setup                   find the kernel (VM_KVER) and make $T; on
#                              exit vm_on_exit (if defined) runs, then $T
#                              goes (kept with VM_KEEP=1)
#   vm_initrd OUTVAR INIT MODULES [TOOLS]
#                              the initramfs for INIT (tests/vm/mkinitramfs),
#                              kept in $BUILD/vm between runs, rebuilt when
#                              an input is newer or the lists change
#   vm_boot SECS INITRD APPEND [qemu args]
#
# A kernel other than the host's: VM_KERNEL (its vmlinuz) and VM_MODROOT
# (the root its /lib/modules/$VM_KVER lies under, depmod run), with
# VM_KVER set (tests/vm/bpo-kernel fetches Debian's backports kernel).
#                              boot $VM_KVER (TCG, serial console in
#                              $T/console.log) for at most SECS seconds;
#                              sets vm_qrc (qemu's exit, 124: timed out)
#                              and vm_secs (how long it ran)
vm_here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)

skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
log() { echo "vm: $*"; }

vm_requires() {
  local t
  for t in "$@"; do
    command -v "$t" >/dev/null || skip "$t not installed (scripts/install-deps)"
  done
}

vm_cleanup() {
  declare -F vm_on_exit >/dev/null && vm_on_exit
  if [ "${VM_KEEP:-0}" = 1 ]; then log "kept $T"; else rm -rf "$T"; fi
}

vm_setup() {
  local k
  vm_requires qemu-system-x86_64 cpio modprobe /bin/busybox
  if [ -z "${VM_KVER:-}" ]; then
    for k in $(ls -v /lib/modules 2>/dev/null); do
      [ -r "/boot/vmlinuz-$k" ] && VM_KVER=$k
    done
  fi
  [ -n "${VM_KVER:-}" ] && [ -r "${VM_KERNEL:-/boot/vmlinuz-$VM_KVER}" ] ||
    skip "no readable /boot/vmlinuz with modules (linux-image-amd64)"
  T=$(mktemp -d /tmp/foliod-vm.XXXXXX)
  case $T in *,*) fail "temp dir name has a comma: $T";; esac
  trap vm_cleanup EXIT
  trap 'exit 129' HUP
  trap 'exit 130' INT
  trap 'exit 143' TERM
}

vm_initrd() {
  local var=$1 init=$2 modules=$3 tools=${4:-} out f
  out=$T/initrd-$(basename "$init").cpio
  if [ -n "${BUILD:-}" ]; then
    mkdir -p "$BUILD/vm" && out=$BUILD/vm/initrd-$(basename "$init")-$VM_KVER.cpio
  fi
  for f in "$init" "$vm_here/mkinitramfs" /bin/busybox \
           "${VM_MODROOT:-}/lib/modules/$VM_KVER/modules.dep" $tools; do
    [ "$f" -nt "$out" ] && rm -f "$out"
  done
  [ "$(cat "$out.lists" 2>/dev/null)" = "$modules;$tools" ] || rm -f "$out"
  if [ ! -f "$out" ]; then
    MODROOT=${VM_MODROOT:-} \
      "$vm_here/mkinitramfs" "$VM_KVER" "$init" "$T/initrd.new" "$modules" "$tools" &&
      mv "$T/initrd.new" "$out" && echo "$modules;$tools" > "$out.lists" ||
      fail "building the initramfs for $init"
  fi
  printf -v "$var" %s "$out"
}

vm_boot() {
  local secs=$1 initrd=$2 append=$3 start qpid; shift 3
  log "booting $VM_KVER (timeout ${secs}s)"
  start=$(date +%s)
  timeout "$secs" qemu-system-x86_64 \
    -accel tcg -cpu max -smp "${VM_SMP:-1}" \
    -nographic -nodefaults -no-reboot -no-user-config \
    -serial "file:$T/console.log" \
    -kernel "${VM_KERNEL:-/boot/vmlinuz-$VM_KVER}" -initrd "$initrd" \
    -append "console=ttyS0 edd=off panic=-1 $append" \
    "$@" >"$T/qemu.log" 2>&1 &
  # In the background so that a signal to the script reaches its trap at
  # once (timeout passes SIGTERM on to qemu).
  qpid=$!; pids+=($qpid)
  wait $qpid
  vm_qrc=$?
  vm_secs=$(( $(date +%s) - start ))
  log "guest ran ${vm_secs}s, qemu exit $vm_qrc"
}
