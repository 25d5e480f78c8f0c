#!/bin/bash
# store=pmem:PATH on a regular file: acknowledged writes survive kill -9
# (flush=store: they are in the store, not yet in the backing, and come
# back from it); SIGTERM writes them back and marks the store clean; a
# warm restart then serves the reads as hits without touching the
# backing.  flush=backing, writethrough and cache=none with a pmem store
# keep their promises; the nbdkit plugin takes the same keys.
. "$(dirname "$0")/lib.sh"
lib_init pmem-basic
requires nbdsh python3

ctl=$tmp/ctl
pidf=$tmp/pid
# Writeback would have to wait an hour: after a kill -9 the data can only
# come back from the store.
slow=cache-size=8M,dirty-expire=3600000,writeback-interval=3600000
for n in d b w n; do truncate -s 16M "$tmp/img-$n"; done
args=(--control "$ctl" --pidfile "$pidf"
  --export "d=file:$tmp/img-d,store=pmem:$tmp/st-d,$slow"
  --export "b=file:$tmp/img-b,store=pmem:$tmp/st-b,flush=backing,$slow"
  --export "w=file:$tmp/img-w,store=pmem:$tmp/st-w,cache=writethrough,$slow"
  --export "n=file:$tmp/img-n,store=pmem:$tmp/st-n,cache=none,$slow")

# stat NAME [EXPORT]: a counter of foliod stats (export d).
stat () { foliod_stat "$ctl" "$1" "${2:-d}"; }

# The writes: unaligned, with FLUSH, with FUA, and one never flushed (safe
# against the death of the process: the store is a shared mapping).
cat > "$tmp/io.py" <<'EOF'
import os, sys
import nbd
mode, sock = sys.argv[1], sys.argv[2]
writes = [(12345, b"A" * 100000), (1048576 + 7, b"B" * 300000),
          (3 << 20, b"C" * 65536), (5 << 20, b"D" * 1000)]
for name in ("d", "b", "w", "n"):
    h = nbd.NBD()
    h.connect_uri("nbd+unix:///%s?socket=%s" % (name, sock))
    for i, (off, data) in enumerate(writes):
        if mode == "write":
            if i == 1:
                h.pwrite(data, off, nbd.CMD_FLAG_FUA)
            else:
                h.pwrite(data, off)
            if i == 0:
                h.flush()
        else:
            got = h.pread(len(data), off)
            if got != data:
                sys.exit("export %s: write %d does not read back" % (name, i))
    h.shutdown()
EOF
# in_backing EXPORT: does its backing file hold every write?
in_backing () {
  python3 - "$tmp/img-$1" <<'EOF'
import sys
d = open(sys.argv[1], "rb").read()
writes = [(12345, b"A" * 100000), (1048576 + 7, b"B" * 300000),
          (3 << 20, b"C" * 65536), (5 << 20, b"D" * 1000)]
sys.exit(0 if all(d[o:o + len(w)] == w for o, w in writes) else 1)
EOF
}
untouched () {
  cmp -s -n $((6 << 20)) "$tmp/img-$1" /dev/zero
}

start_foliod "${args[@]}"
grep -qE "export d: store pmem:$tmp/st-d granularity=(page|cache-line) " \
  "$FOLIOD_LOG" || fail "no granularity line in the log"
grep -q "export d: store pmem:$tmp/st-d: new" "$FOLIOD_LOG" ||
  fail "new store not logged"
timeout 60 python3 "$tmp/io.py" write "$SOCK" || fail "writes failed"
[ "$(stat foliod_store_dirty_bytes)" -gt 400000 ] ||
  fail "store dirty bytes: $(stat foliod_store_dirty_bytes)"
grep -qE '^foliod_store_info\{export="d",kind="pmem",granularity="(page|cache-line)",flush="store"\} 1$' \
  "$tmp/stats.prom" || fail "no store info in stats: $(grep store_info "$tmp/stats.prom")"
grep -q 'export="b",kind="pmem",.*flush="backing"' "$tmp/stats.prom" ||
  fail "export b: flush=backing not in stats"
kill9_foliod "$pidf"

# flush=store: FLUSH and FUA were answered by the store alone.
untouched d || fail "flush=store: the backing was written before writeback"
# flush=backing: the flushed and FUA writes are in the backing already.
python3 - "$tmp/img-b" <<'EOF' || fail "flush=backing: FLUSH/FUA data not in the backing"
import sys
d = open(sys.argv[1], "rb").read()
assert d[12345:112345] == b"A" * 100000
assert d[1048583:1348583] == b"B" * 300000
EOF
in_backing w || fail "writethrough: not in the backing before the reply"
in_backing n || fail "cache=none: not in the backing"

# Restart on the same stores: everything acknowledged reads back.
start_foliod "${args[@]}"
grep -q "export d: store pmem:$tmp/st-d: last shutdown NOT clean (crash); recovered [1-9][0-9]* folios" \
  "$FOLIOD_LOG" || fail "recovery not logged"
[ "$(stat foliod_dirty_bytes)" -gt 400000 ] ||
  fail "recovered dirty bytes: $(stat foliod_dirty_bytes)"
timeout 60 python3 "$tmp/io.py" read "$SOCK" || fail "lost writes after kill -9"
untouched d || fail "recovered data written back at once (writeback is slow)"

# SIGTERM: written back, flushed, store marked clean.
stop_foliod
grep -q "stopped: all data written back" "$FOLIOD_LOG" || fail "not stopped cleanly"
for n in d b w n; do in_backing $n || fail "export $n: backing differs after SIGTERM"; done
"$FOLIOD" store inspect "$tmp/st-d" > "$tmp/inspect" || fail "inspect"
grep -q '^state: clean$' "$tmp/inspect" || fail "store not clean: $(cat "$tmp/inspect")"
grep -q '^dirty: 0 bytes$' "$tmp/inspect" || fail "store still dirty"

# Warm restart: every block kept, reads are hits, the backing is not read.
start_foliod "${args[@]}"
grep -q "export d: store pmem:$tmp/st-d: last shutdown clean; recovered" \
  "$FOLIOD_LOG" || fail "warm restart not logged"
timeout 60 python3 "$tmp/io.py" read "$SOCK" || fail "warm restart reads"
[ "$(stat foliod_read_misses_total)" = 0 ] || fail "warm restart: misses"
[ "$(stat foliod_read_hits_total)" -ge 4 ] || fail "warm restart: no hits"
[ "$(stat foliod_backing_read_bytes_total)" = 0 ] ||
  fail "warm restart read the backing"
stop_foliod

# The plugin: same keys; kill -9, then foliod store writeback recovers it.
# (SAN=1: the plugin would need the ASan preload of plugin_init.)
if [ "${SAN:-}" != 1 ] && command -v nbdkit >/dev/null && [ -f "${PLUGIN:-}" ]; then
  truncate -s 16M "$tmp/img-p"
  psock=$tmp/psock
  timeout 120 nbdkit -f -U "$psock" -P "$tmp/nbdkit.pid" "$PLUGIN" \
    backing="file:$tmp/img-p" store="pmem:$tmp/st-p" cache-size=8M \
    dirty-expire=3600000 writeback-interval=3600000 2>"$tmp/nbdkit.log" &
  npid=$!
  track "$npid"
  for ((i = 0; i < 100; i++)); do [ -S "$psock" ] && break; sleep 0.1; done
  [ -S "$psock" ] || fail "nbdkit did not start: $(cat "$tmp/nbdkit.log")"
  timeout 30 nbdsh -u "nbd+unix:///?socket=$psock" \
    -c 'h.pwrite(b"P" * 70000, 4097); h.flush()' || fail "plugin write"
  kill -KILL "$(cat "$tmp/nbdkit.pid")"
  wait "$npid" 2>/dev/null || true
  cmp -s -n $((1 << 20)) "$tmp/img-p" /dev/zero ||
    fail "plugin flush=store: backing written before writeback"
  timeout 60 "$FOLIOD" store writeback "$tmp/st-p" > "$tmp/wb" ||
    fail "foliod store writeback: $(cat "$tmp/wb")"
  grep -q "73728 dirty bytes written back to file:$tmp/img-p, flushed; the store is clean" \
    "$tmp/wb" || fail "store writeback said: $(cat "$tmp/wb")"
  python3 -c '
import sys
d = open(sys.argv[1], "rb").read()
sys.exit(0 if d[4097:74097] == b"P" * 70000 else 1)' "$tmp/img-p" ||
    fail "store writeback: the backing lacks the plugin's writes"
  "$FOLIOD" store inspect "$tmp/st-p" | grep -q '^state: clean$' ||
    fail "store writeback did not mark the store clean"
  # Clean now: the plugin reopens it warm and exits cleanly.
  timeout 60 nbdkit -U - "$PLUGIN" backing="file:$tmp/img-p" \
    store="pmem:$tmp/st-p" cache-size=8M \
    --run 'nbdsh -u "$uri" -c "assert h.pread(70000, 4097) == b\"P\" * 70000"' ||
    fail "plugin warm restart"
fi
echo ok
