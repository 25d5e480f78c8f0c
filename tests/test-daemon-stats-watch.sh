#!/bin/bash
# foliod stats --watch[=SECONDS] --count N: N reports, each the stats
# table and the rates over its interval (reads, hits, bytes read, written
# and written back per second), while a client writes and reads all along.
. "$(dirname "$0")/lib.sh"
lib_init daemon-stats-watch
requires nbdsh

truncate -s 64M "$tmp/img"
ctl=$tmp/ctl.sock
start_foliod --control "$ctl" --export "disk0=file:$tmp/img,cache-size=16M"

# Misuse is refused.
"$FOLIOD" stats --control "$ctl" --watch=0 2>/dev/null && fail "--watch=0 accepted"
"$FOLIOD" stats --control "$ctl" --watch --prometheus 2>/dev/null &&
  fail "--watch with --prometheus accepted"
"$FOLIOD" flush disk0 --control "$ctl" --watch 2>/dev/null && fail "flush --watch accepted"

# A client that writes and reads until the watch is over.
nbdsh -u "$(uri disk0)" -c "
import os
buf = b'w' * 65536
i = 0
while not os.path.exists('$tmp/stop'):
    h.pwrite(buf, (i % 512) * 65536)
    h.pread(65536, (i % 512) * 65536)
    i += 1
" &
client=$!
track $client
"$FOLIOD" stats --control "$ctl" --watch=0.5 --count=3 >"$tmp/watch" 2>&1 ||
  { touch "$tmp/stop"; cat "$tmp/watch"; fail "foliod stats --watch failed"; }
touch "$tmp/stop"
wait $client || fail "the client failed"
cat "$tmp/watch"

[ "$(grep -c '^foliod stats: .*, every 0.5 s$' "$tmp/watch")" = 3 ] ||
  fail "not exactly 3 reports"
# The table as foliod stats prints it, in each report.
# (Column widths follow the numbers: compare the words.)
head=$("$FOLIOD" stats --control "$ctl" | head -n1 | tr -s ' ')
[ "$(tr -s ' ' <"$tmp/watch" | grep -cxF "$head")" = 3 ] ||
  fail "the stats table is not in each report"
[ "$(grep -c '^EXPORT  *READS/S  *HITS/S  *HIT RATIO  *READ/S  *WRITTEN/S  *WRITTEN BACK/S  *DIRTY$' "$tmp/watch")" = 3 ] ||
  fail "no rates table in each report"
# Every interval saw the client read and write: rates above zero.
awk '$1 == "disk0" && NF == 8 { n++; if ($2 > 0 && $6 != "0") ok++ }
     END { exit !(n == 3 && ok == 3) }' "$tmp/watch" ||
  fail "the rates rows do not show the reads and writes"
stop_foliod
echo OK
