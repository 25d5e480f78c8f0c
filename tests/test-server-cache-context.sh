#!/bin/bash
# The foliod:cache metadata context: per extent, whether the data is in
# the cache (1), dirty (2: a FLUSH or shutdown would write it) and unstable
# (4), as foliod(8) documents; listed with base:allocation, selectable
# alone or with it (one block status chunk per context), and what
# nbdinfo --map=foliod:cache prints.
. "$(dirname "$0")/lib.sh"
lib_init server-cache-context
requires nbdsh nbdinfo

random_file "$tmp/img" 4
ctl=$tmp/ctl.sock
start_foliod --control "$ctl" --export \
  "disk0=file:$tmp/img,cache-size=16M,folio-size=64K,block-size=4K,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

nbdinfo --list "$(uri disk0)" >"$tmp/info" || fail "nbdinfo --list"
grep -q "foliod:cache" "$tmp/info" || fail "foliod:cache not listed: $(cat "$tmp/info")"

# 4 KiB written at 72 KiB (block 2 of folio 1), 64 KiB read at 192 KiB
# (folio 3); nothing else touched.
nbdsh -u "$(uri disk0)" -c '
h.pwrite(b"w" * 4096, 73728)
h.pread(65536, 196608)
' || fail "nbdsh workload"

# map CONTEXTS...: a line "CONTEXT OFFSET LENGTH FLAGS" per extent.
map () {
  python3 - "$(uri disk0)" "$@" <<'PY'
import sys, nbd
uri, ctxs = sys.argv[1], sys.argv[2:]
h = nbd.NBD()
for c in ctxs:
    h.add_meta_context(c)
h.connect_uri(uri)
got = {}
def cb(meta, off, ents, err):
    got.setdefault(meta, []).append(list(ents))
    return 0
h.block_status(h.get_size(), 0, cb)
for c in ctxs:
    assert len(got.get(c, [])) == 1, (c, got)
    off = 0
    e = got[c][0]
    for i in range(0, len(e), 2):
        print(c, off, e[i], e[i + 1])
        off += e[i]
h.shutdown()
PY
}
map foliod:cache >"$tmp/map" || fail "block status of foliod:cache"
cat "$tmp/map"
expect () {
  grep -qx "$1" "$tmp/map" || fail "expected extent '$1'"
}
expect "foliod:cache 0 73728 0"
expect "foliod:cache 73728 4096 3"
expect "foliod:cache 77824 118784 0"
expect "foliod:cache 196608 65536 1"
expect "foliod:cache 262144 3932160 0"

# Both contexts at once: one chunk each; base:allocation unchanged.
map base:allocation foliod:cache >"$tmp/map2" || fail "block status of both"
grep -q "^base:allocation 0 4194304 0$" "$tmp/map2" ||
  fail "base:allocation wrong with both: $(cat "$tmp/map2")"
[ "$(grep -c '^foliod:cache' "$tmp/map2")" = 5 ] || fail "foliod:cache wrong with both"

# After foliod flush nothing is dirty: what was dirty is cached, clean.
"$FOLIOD" flush disk0 --control "$ctl" || fail "foliod flush"
map foliod:cache >"$tmp/map"
expect "foliod:cache 73728 4096 1"

# What nbdinfo shows.
nbdinfo --map=foliod:cache "$(uri disk0)" >"$tmp/nbdinfo" || fail "nbdinfo --map=foliod:cache"
cat "$tmp/nbdinfo"
grep -Eq '^ *196608 +65536 +1' "$tmp/nbdinfo" || fail "nbdinfo does not show the cached folio"
stop_foliod
echo OK
