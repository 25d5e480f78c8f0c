#!/bin/bash
# foliod under a real systemd as PID 1 (a qemu guest booted from the
# host's own root file system): the Debian package installed, upgraded
# (to a newer version, with the service running), removed and purged; socket
# activation, Type=notify, reload (TLS), stop (writeback), the journal,
# systemd-analyze security, and a disk attached the Debian way.  See
# tests/vm/run-systemd.  The packages come from make deb (build-deb/,
# about 20 s) unless VM_DEBS names a directory that has them; VM_DEBS=
# (empty) installs foliod with make install instead.
set -u
TOP=${TOP:-$(cd "$(dirname "$0")/.." && pwd)}
if [ -z "${VM_DEBS+set}" ]; then
  log=$(mktemp)
  if ! make -C "$TOP" deb >"$log" 2>&1; then
    echo "FAIL: make deb:"; tail -n 30 "$log"; rm -f "$log"; exit 1
  fi
  rm -f "$log"
  export VM_DEBS=$TOP/build-deb
fi
exec "$TOP/tests/vm/run-systemd" "$@"
