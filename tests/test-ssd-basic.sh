#!/bin/bash
# store=ssd:PATH (issue 25), the write-back log on a file: writes that a
# FLUSH or FUA acknowledged survive kill -9 though the backing was never
# written (flush=store, writeback an hour away): they come back from the
# log, dirty; SIGTERM writes them back and the checkpoint says clean, so
# the next start replays nothing; foliod store inspect reads the log;
# a store made for another geometry, and a second foliod on the same
# store, are refused; so are a log with a damaged record (and by foliod
# store writeback, which keeps it) and one with a batch header's page
# lost (one damaged sector of it is survived), a log whose superblocks were wiped,
# and a store that is the backing image itself (issue 33).
. "$(dirname "$0")/lib.sh"
lib_init ssd-basic
requires nbdsh python3

ctl=$tmp/ctl
pidf=$tmp/pid
slow=cache-size=8M,dirty-expire=3600000,writeback-interval=3600000
truncate -s 16M "$tmp/img"
args=(--control "$ctl" --pidfile "$pidf"
  --export "d=file:$tmp/img,store=ssd:$tmp/st,$slow")

stat () { foliod_stat "$ctl" "$1" d; }
cat > "$tmp/io.py" <<'EOF'
import sys
import nbd
mode, sock = sys.argv[1], sys.argv[2]
writes = [(12345, b"A" * 100000), (1048576 + 7, b"B" * 300000),
          (3 << 20, b"C" * 65536), (5 << 20, b"D" * 1000),
          (12345 + 4096, b"E" * 512)]       # over A, flushed after it
h = nbd.NBD()
h.connect_uri("nbd+unix:///d?socket=%s" % sock)
if mode == "write":
    for i, (off, data) in enumerate(writes):
        h.pwrite(data, off, nbd.CMD_FLAG_FUA if i == 1 else 0)
        if i in (0, 4):
            h.flush()
else:
    want = bytearray(6 << 20)
    for off, data in writes:
        want[off:off + len(data)] = data
    got = h.pread(6 << 20, 0)
    if got != bytes(want):
        bad = next(i for i in range(len(want)) if got[i] != want[i])
        sys.exit("byte %d does not read back" % bad)
h.shutdown()
EOF
untouched () {
  cmp -s -n $((6 << 20)) "$tmp/img" /dev/zero
}

start_foliod "${args[@]}"
grep -q "export d: store ssd:$tmp/st: new" "$FOLIOD_LOG" ||
  fail "new store not logged: $(cat "$FOLIOD_LOG")"
# The store line says how the store makes writes durable (no msync here).
grep -q "export d: store ssd:$tmp/st granularity=log (log write, fdatasync) power-safe at FLUSH/FUA; flush=store" \
  "$FOLIOD_LOG" || fail "store line: $(grep 'store ssd' "$FOLIOD_LOG")"
# The log's live counters (issue 25): they move with the writes and syncs.
syncs0=$(stat foliod_store_syncs_total)
records0=$(stat foliod_store_log_records_total)
[ -n "$syncs0" ] && [ -n "$records0" ] ||
  fail "no store log metrics: $(grep foliod_store "$tmp/stats.prom")"
timeout 60 python3 "$tmp/io.py" write "$SOCK" || fail "writes failed"
[ "$(stat foliod_store_syncs_total)" -gt "$syncs0" ] ||
  fail "store syncs did not move: $(grep foliod_store "$tmp/stats.prom")"
[ "$(stat foliod_store_log_records_total)" -gt "$records0" ] ||
  fail "store log records did not move: $(grep foliod_store "$tmp/stats.prom")"
[ "$(stat foliod_store_log_used_bytes)" -gt 400000 ] ||
  fail "store log used: $(grep foliod_store "$tmp/stats.prom")"
[ "$(stat foliod_store_log_size_bytes)" -gt "$(stat foliod_store_log_used_bytes)" ] ||
  fail "store log size: $(grep foliod_store "$tmp/stats.prom")"
awk '$1 == "foliod_store_sync_seconds_total{export=\"d\"}" && $2 > 0 {ok=1}
     END {exit !ok}' "$tmp/stats.prom" ||
  fail "store sync seconds: $(grep foliod_store "$tmp/stats.prom")"
[ "$(stat foliod_store_dirty_bytes)" -gt 400000 ] ||
  fail "store dirty bytes: $(stat foliod_store_dirty_bytes)"
grep -q '^foliod_store_info{export="d",kind="ssd",granularity="log",flush="store"} 1$' \
  "$tmp/stats.prom" || fail "no ssd store in stats: $(grep store_info "$tmp/stats.prom")"
kill9_foliod "$pidf"
untouched || fail "flush=store: the backing was written before writeback"
"$FOLIOD" store inspect "$tmp/st" > "$tmp/inspect" || fail "inspect"
grep -q '^state: not clean' "$tmp/inspect" || fail "inspect: $(cat "$tmp/inspect")"
grep -q '^kind: ssd' "$tmp/inspect" || fail "inspect: $(cat "$tmp/inspect")"

# A second foliod on the same store is refused while the first runs.
start_foliod "${args[@]}"
grep -q "export d: store ssd:$tmp/st: last shutdown NOT clean (crash); recovered [1-9][0-9]* folios" \
  "$FOLIOD_LOG" || fail "recovery not logged: $(tail -5 "$FOLIOD_LOG")"
[ "$(stat foliod_dirty_bytes)" -gt 400000 ] ||
  fail "recovered dirty bytes: $(stat foliod_dirty_bytes)"
timeout 60 python3 "$tmp/io.py" read "$SOCK" || fail "lost writes after kill -9"
untouched || fail "recovered data written back at once (writeback is slow)"
truncate -s 16M "$tmp/img2"
start_refused "a second foliod" "store in use by another process" \
  --export "d=file:$tmp/img2,store=ssd:$tmp/st,$slow"

# SIGTERM: written back, flushed, the checkpoint says clean.
stop_foliod
grep -q "stopped: all data written back" "$FOLIOD_LOG" || fail "not stopped cleanly"
timeout 60 python3 - "$tmp/img" <<'EOF' || fail "backing differs after SIGTERM"
import sys
d = open(sys.argv[1], "rb").read()
writes = [(12345, b"A" * 100000), (1048576 + 7, b"B" * 300000),
          (3 << 20, b"C" * 65536), (5 << 20, b"D" * 1000),
          (12345 + 4096, b"E" * 512)]
want = bytearray(6 << 20)
for off, data in writes:
    want[off:off + len(data)] = data
sys.exit(0 if d[:6 << 20] == bytes(want) else 1)
EOF
"$FOLIOD" store inspect "$tmp/st" > "$tmp/inspect" || fail "inspect"
grep -q '^state: clean$' "$tmp/inspect" || fail "store not clean: $(cat "$tmp/inspect")"
grep -q '^dirty: 0 bytes$' "$tmp/inspect" || fail "store still dirty"

# Clean: nothing replayed.  The backing changes meanwhile (as after a
# clean stop anyone may write it): the log must not write over it.
printf 'Z%.0s' $(seq 1 4096) | dd of="$tmp/img" bs=4096 seek=3 conv=notrunc status=none
start_foliod "${args[@]}"
grep -q "export d: store ssd:$tmp/st: last shutdown clean; recovered 0 folios" \
  "$FOLIOD_LOG" || fail "clean restart: $(tail -5 "$FOLIOD_LOG")"
[ "$(stat foliod_dirty_bytes)" = 0 ] || fail "clean restart replayed the log"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" \
  -c 'assert h.pread(4096, 12288) == b"Z" * 4096' ||
  fail "clean restart: the log wrote over the backing"
kill9_foliod "$pidf"

# After that kill, nothing was written since the clean start: nothing comes
# back and the backing keeps the Z block.
start_foliod "${args[@]}"
grep -q "export d: store ssd:$tmp/st: last shutdown NOT clean (crash); recovered 0 folios" \
  "$FOLIOD_LOG" || fail "kill after clean start: $(tail -5 "$FOLIOD_LOG")"
stop_foliod
cmp -s -i 12288:0 -n 4096 "$tmp/img" <(printf 'Z%.0s' $(seq 1 4096)) ||
  fail "old log records written over the backing"

# foliod store writeback: after a kill -9, the log's dirty blocks go to
# the backing offline, and the store is clean.
start_foliod "${args[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" \
  -c 'h.pwrite(b"P" * 70000, 8 << 20); h.flush()' || fail "write P"
kill9_foliod "$pidf"
timeout 60 "$FOLIOD" store writeback "$tmp/st" > "$tmp/wb" ||
  fail "foliod store writeback: $(cat "$tmp/wb")"
grep -q "73728 dirty bytes written back to file:$tmp/img, flushed; the store is clean" \
  "$tmp/wb" || fail "store writeback said: $(cat "$tmp/wb")"
cmp -s -i $((8 << 20)):0 -n 70000 "$tmp/img" <(printf 'P%.0s' $(seq 1 70000)) ||
  fail "store writeback: the backing lacks the writes"
"$FOLIOD" store inspect "$tmp/st" | grep -q '^state: clean$' ||
  fail "store writeback did not mark the store clean"

# A record whose data fails its checksum, in a part of the log a later
# commit says was flushed (media damage, not a torn write): inspect lists
# its range; the store is refused at start and by foliod store writeback
# (exit 1), naming the damage; the log is kept as it was (the only copy
# of that data), and nothing is written over the backing.
args2=(--control "$ctl" --pidfile "$pidf"
  --export "d=file:$tmp/img,store=ssd:$tmp/st2,$slow")
start_foliod "${args2[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" \
  -c 'h.pwrite(b"Q" * 4096, 10 << 20); h.flush()
h.pwrite(b"R" * 4096, 12 << 20); h.flush()' || fail "write Q, R"
kill9_foliod "$pidf"
# The first batch: 8 KiB of superblocks, its 4 KiB header, then Q's block.
printf 'XXXX' | dd of="$tmp/st2" bs=1 seek=$((12288 + 100)) conv=notrunc status=none
cp "$tmp/st2" "$tmp/st2.damaged"
"$FOLIOD" store inspect "$tmp/st2" > "$tmp/inspect" || fail "inspect"
grep -q "^damaged: export bytes $((10 << 20))-$(((10 << 20) + 4096)) " "$tmp/inspect" ||
  fail "damage not reported: $(cat "$tmp/inspect")"
rc=0
timeout 60 "$FOLIOD" store writeback "$tmp/st2" > "$tmp/wb2" 2>&1 || rc=$?
[ $rc -eq 1 ] || fail "store writeback of a damaged log: exit $rc: $(cat "$tmp/wb2")"
grep -q "the log is damaged: 1 records fail their data checksum (4096 bytes)" \
  "$tmp/wb2" || fail "store writeback did not name the damage: $(cat "$tmp/wb2")"
grep -q "the store is clean" "$tmp/wb2" &&
  fail "store writeback called a damaged store clean: $(cat "$tmp/wb2")"
cmp -s "$tmp/st2" "$tmp/st2.damaged" || fail "store writeback changed the damaged log"
start_refused "a damaged log" "the log is damaged: 1 records fail their data checksum" \
  "${args2[@]}"
cmp -s "$tmp/st2" "$tmp/st2.damaged" || fail "a refused start changed the damaged log"
cmp -s -i $((10 << 20)):0 -n 4096 "$tmp/img" /dev/zero ||
  fail "a damaged record was written over the backing"
cmp -s -i $((12 << 20)):0 -n 4096 "$tmp/img" /dev/zero ||
  fail "a store refused for damage was written back"

# A damaged batch header in the flushed part of the log (later commits
# follow it).  One sector of it: its copy in the next sector stands for
# it, and every FLUSHed version comes back.  Both sectors (the header's
# page lost): the later commits' headers say the log was flushed past
# it, inspect lists it, and the store is refused rather than bring back
# the first version and drop the later commit silently.
args4=(--control "$ctl" --pidfile "$pidf"
  --export "d=file:$tmp/img,store=ssd:$tmp/st4,$slow")
start_foliod "${args4[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" \
  -c 'h.pwrite(b"S" * 4096, 14 << 20); h.flush()
h.pwrite(b"T" * 4096, 14 << 20); h.flush()
h.pwrite(b"U" * 4096, 15 << 20); h.flush()' || fail "write S, T, U"
kill9_foliod "$pidf"
cp "$tmp/st4" "$tmp/st4.sound"
# Batches of one block each: headers at 8, 16 and 24 KiB; T's is the second.
dd if=/dev/urandom of="$tmp/st4" bs=512 count=1 seek=32 conv=notrunc status=none
start_foliod "${args4[@]}"
timeout 30 nbdsh -u "nbd+unix:///d?socket=$SOCK" \
  -c 'assert h.pread(4096, 14 << 20) == b"T" * 4096
assert h.pread(4096, 15 << 20) == b"U" * 4096' ||
  fail "one damaged sector of a batch header: the FLUSHed versions did not come back"
kill9_foliod "$pidf"
cp "$tmp/st4.sound" "$tmp/st4"
dd if=/dev/urandom of="$tmp/st4" bs=512 count=2 seek=32 conv=notrunc status=none
"$FOLIOD" store inspect "$tmp/st4" > "$tmp/inspect4" || fail "inspect"
grep -q "^damaged: 1 batch headers from lsn 8192 " "$tmp/inspect4" ||
  fail "damaged header not reported: $(cat "$tmp/inspect4")"
start_refused "a damaged batch header" \
  "1 batch headers unreadable where the log was flushed past them" "${args4[@]}"
cmp -s -i $((14 << 20)):0 -n 4096 "$tmp/img" /dev/zero ||
  fail "a store with a damaged header was written back"

# Both superblocks wiped (a discard of the first 8 KiB) over a log that
# holds FLUSHed data: refused, not formatted over.
cp "$tmp/st2.damaged" "$tmp/st3"
dd if=/dev/zero of="$tmp/st3" bs=8192 count=1 conv=notrunc status=none
cp "$tmp/st3" "$tmp/st3.wiped"
start_refused "wiped superblocks" "both superblocks are blank, but it holds a foliod log" \
  --export "d=file:$tmp/img,store=ssd:$tmp/st3,$slow"
cmp -s "$tmp/st3" "$tmp/st3.wiped" || fail "a wiped log was formatted over"

# The store's path is the backing image itself: refused, the image intact.
truncate -s 16M "$tmp/img2"
start_refused "store=ssd: the backing" "the store is the backing itself" \
  --export "d=file:$tmp/img2,store=ssd:$tmp/img2,$slow"
cmp -s "$tmp/img2" <(head -c 16M /dev/zero) || fail "the log was written into the image"

# Another geometry: refused, naming it.
start_refused "another cache-size" "store has another geometry" --export "d=file:$tmp/img,store=ssd:$tmp/st,cache-size=16M"
echo ok
