#!/bin/bash
# foliod under a real systemd as PID 1 (a qemu guest booted from the
# host's own root file system): socket activation, Type=notify, reload
# (TLS), stop (writeback), the journal, systemd-analyze security, and a
# disk attached the Debian way.  See tests/vm/run-systemd.
set -u
TOP=${TOP:-$(cd "$(dirname "$0")/.." && pwd)}
exec "$TOP/tests/vm/run-systemd" "$@"
