#!/bin/bash
# Warnings from below the server reach the log of a detached foliod
# (issue 32 item 4, review F11): a detached foliod points stderr at
# /dev/null, so a line written to stderr by a store or a backing is lost
# exactly where it matters.  Here the pmem store's SIGBUS line (written
# from the signal handler) must land in log-file, with the timestamp and
# level every other line there has; and the store's file must not be
# served on.
. "$(dirname "$0")/lib.sh"
lib_init log-detached
requires nbdsh

keys=cache-size=4M,dirty-expire=3600000,writeback-interval=3600000
truncate -s 8M "$tmp/a.img"
day_before=$(date +%F)
start_detached --log-file "$tmp/log" \
  --export "a=file:$tmp/a.img,store=pmem:$tmp/a.store,$keys"
pid=$DETACHED_PID
timeout 30 nbdsh -u "$(uri a)" -c 'h.pwrite(b"a" * 65536, 0); h.flush()' ||
  fail "write"

# Cut the store to its metadata: every data page is gone.
truncate -s 2M "$tmp/a.store"
timeout 30 nbdsh -u "$(uri a)" -c '
for i in range(64):
    h.pwrite(b"A" * 65536, i * 65536)
    h.pread(65536, i * 65536)
' >/dev/null 2>&1 || true
wait_gone "$pid" 100 || fail "foliod served a truncated store"
day_after=$(date +%F)
cat "$tmp/log"

line=$(grep "store $tmp/a.store: SIGBUS at byte" "$tmp/log") ||
  fail "the SIGBUS line is not in log-file"
echo "$line" | grep -Eq "^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3} foliod\[$pid\] error: store $tmp/a.store: SIGBUS at byte [0-9]+ of the store \(the file was truncated, or a media error\): foliod cannot use it, exiting$" ||
  fail "the SIGBUS line lacks the log's timestamp, pid or level: $line"
case "$line" in
  "$day_before"T* | "$day_after"T*) ;;
  *) fail "the SIGBUS line's date is not today's: $line" ;;
esac
echo OK
