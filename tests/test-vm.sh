#!/bin/bash
# The Linux kernel's NBD client against foliod: a Debian kernel boots under
# qemu, attaches foliod's exports with nbd-client -C 4, checks direct I/O
# and ext4 on them; the images are checked on the host after foliod stops.
# Three servers in one boot: foliod on a file, foliod in front of
# nbdkit's memory plugin (remote NBD backing), and foliod on a file with a
# pmem store (store=pmem:FILE).  VM_SERVERS overrides the
# list (see tests/vm/run --help), e.g. VM_SERVERS=nbdkit to check the
# harness without foliod.
set -u
TOP=${TOP:-$(cd "$(dirname "$0")/.." && pwd)}
args=()
for s in ${VM_SERVERS:-foliod foliod-nbd foliod-pmem}; do args+=(--server "$s"); done
exec "$TOP/tests/vm/run" "${args[@]}"
