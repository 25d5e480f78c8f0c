#!/bin/bash
# Real DAX: foliod inside a qemu guest (TCG) with its pmem store on ext4
# -o dax over an emulated NVDIMM (MAP_SYNC, cache-line persistence), a
# client writing with FLUSH and FUA, a hard reset of the guest in the
# middle (sysrq b), a second boot on the same NVDIMM file: foliod
# recovers the store and every acknowledged write reads back, through
# foliod and then from the backing file after SIGTERM.  The guest side is
# tests/vm/init-pmem; the backing file is on the same DAX file system, so
# that what writeback put there survives the reset too, and the backing's
# identity (device, inode) the store checks is the same in both boots.
#
# Environment: FOLIOD, BUILD (the tools and the kept initramfs), VM_KVER,
# VM_SEED (the data's seed, printed; from the clock by default),
# VM_KEEP=1 (keep the temp dir), VM_TIMEOUT (seconds per boot, default
# 150: a boot took 20-35 s under TCG, more on a loaded host).
set -uo pipefail

TOP=${TOP:-$(cd "$(dirname "$0")/.." && pwd)}
BUILD=${BUILD:-$TOP/build}
. "$TOP/tests/vm/lib.sh"
vm_requires /usr/sbin/mke2fs
acklog=$BUILD/tests/tools/nbd-acklog
[ -x "${FOLIOD:-}" ] || fail "FOLIOD not set or not executable"
[ -x "$acklog" ] || fail "$acklog not built"
vm_setup
pids=()

foliod=$(realpath "$FOLIOD")
acklog=$(realpath "$acklog")
vm_initrd initrd "$TOP/tests/vm/init-pmem" "nfit nd_pmem ext4" \
  "$foliod $acklog /usr/sbin/mke2fs"

# 64 MiB backing, 16 MiB of store: background writeback starts at 10 %
# dirty, so at the reset some acknowledged data is in the backing and
# some only in the store.  Ranges: 80 KiB apart (nbd-acklog).
seed=${VM_SEED:-$(( $(date +%s) % 100000 ))}
ranges=600 reset_after=300
export_spec="disk=file:/mnt/backing,cache-size=16M,store=pmem:/mnt/store"
common="vmtest.foliod=$foliod vmtest.acklog=$acklog vmtest.export=$export_spec"
common+=" vmtest.seed=$seed vmtest.ranges=$ranges"

# boot N ARGS: one boot on the NVDIMM file; console in $T/console-N.log.
boot() {
  local n=$1 rc
  shift
  log "boot $n: $*"
  vm_boot "${VM_TIMEOUT:-150}" "$initrd" "loglevel=4 rdinit=/init $common $*" \
    -machine pc,nvdimm=on -m 512M,slots=2,maxmem=2G -nic none \
    -object memory-backend-file,id=pm0,share=on,mem-path="$T/nvdimm",size=256M \
    -device nvdimm,id=nv0,memdev=pm0
  rc=$vm_qrc
  mv "$T/console.log" "$T/console-$n.log"
  mv "$T/qemu.log" "$T/qemu-$n.log"
  tr -d '\r' < "$T/console-$n.log" > "$T/boot-$n.log"
  grep -a 'vmtest:\|VMTEST:\|foliod\[\|verify:' "$T/boot-$n.log" |
    grep -v '^ack ' | sed 's/^.*\(vmtest:\)/\1/'
  if [ $rc != 0 ] || grep -q '^VMTEST: FAIL' "$T/boot-$n.log"; then
    tail -n 30 "$T/boot-$n.log"; cat "$T/qemu-$n.log"
    [ $rc = 124 ] && fail "boot $n: guest timed out after ${VM_TIMEOUT:-150}s"
    fail "boot $n: $(grep '^VMTEST: FAIL' "$T/boot-$n.log" || echo "qemu exit $rc")"
  fi
}

# Boot 1: fsdax, mke2fs, foliod, writes, reset.
boot 1 vmtest.phase=write vmtest.resetafter=$reset_after
b1=$T/boot-1.log
grep -q 'VMTEST: PASS' "$b1" && fail "boot 1 passed: it should have been reset"
grep -q 'sysrq: Resetting' "$b1" || fail "boot 1: no sysrq reset on the console"
grep 'foliod\[.*granularity=' "$b1" | grep -q 'granularity=cache-line' ||
  fail "boot 1: foliod's log does not say granularity=cache-line"
# The acknowledged ranges: the writer prints "ack I" once range I is
# answered.  Below the highest one only those still in flight are not.
acks=$(grep -c '^ack [0-9]*$' "$b1")
[ "$acks" -ge $((reset_after / 2)) ] ||
  fail "boot 1: $acks acks on the console, wanted the reset after $reset_after"
max=$(grep '^ack [0-9]*$' "$b1" | cut -d' ' -f2 | sort -n | tail -n1)
skips=$(comm -23 <(seq 0 "$max" | sort) <(grep '^ack ' "$b1" | cut -d' ' -f2 | sort) |
        sort -n | paste -sd, -)
log "boot 1: $acks writes acknowledged (ranges 0-$max but ${skips:-none}), seed $seed"
# Past the last range issued nothing was written: 8 ranges there must read
# as zeros.  (Without the writer's last line, lost on the console, the
# check is left out rather than guessed.)
issued=$(sed -n 's/^resetting: [0-9]* acked, ranges 0-\([0-9]*\) issued$/\1/p' "$b1")
zeros=$((${issued:-0} + 1)),8
[ -n "$issued" ] || { zeros=0,0; log "boot 1: no 'resetting:' line: no zeros check"; }

# Boot 2: the same NVDIMM; recovery; every acknowledged range.
boot 2 vmtest.phase=verify vmtest.acked=$((max + 1)) vmtest.skip=${skips:--} \
  vmtest.zeros=$zeros
b2=$T/boot-2.log
grep -q '^VMTEST: PASS' "$b2" || fail "boot 2: no VMTEST: PASS"
grep -q '^state: not clean' "$b2" ||
  fail "boot 2: the store did not read 'not clean' after the reset"
# foliod's recovery line; some acknowledged data must have been only in
# the store (background writeback starts at 10 % of it), or the test
# would prove nothing about the store.
rec=$(grep 'foliod\[.*last shutdown NOT clean (crash); recovered' "$b2")
[ -n "$rec" ] || fail "boot 2: foliod logged no recovery after an unclean shutdown"
dirty=$(echo "$rec" | sed -n 's/.* \([0-9]*\) dirty bytes.*/\1/p')
[ "${dirty:-0}" -gt 0 ] || fail "boot 2: recovered no dirty bytes: $rec"
grep -q '^state: clean' "$b2" || fail "boot 2: the store is not clean after SIGTERM"
n=$(grep -c '^verify: .* 0 differ$' "$b2")
[ "$n" = 2 ] || fail "boot 2: $n of 2 verify passes clean"
echo "PASS: vm-pmem ($acks acknowledged writes survived the reset, $dirty dirty bytes recovered from the store)"
