#!/bin/bash
# The NBD Unix socket is created 0660 whatever the umask (issue 34 item
# 7b): under umask 000 it used to be 0777, open to every user of the host.
. "$(dirname "$0")/lib.sh"
lib_init unix-mode
requires nbdinfo

truncate -s 1M "$tmp/img"
umask 000
start_foliod --export "disk0=file:$tmp/img"
umask 022
mode=$(stat -c %a "$SOCK")
echo "socket mode under umask 000: $mode"
[ "$mode" = 660 ] || fail "the NBD socket is mode $mode under umask 000, not 660"
nbdinfo --size "$(uri disk0)" >/dev/null || fail "the socket does not serve"
stop_foliod
