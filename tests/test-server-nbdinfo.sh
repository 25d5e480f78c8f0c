#!/bin/bash
# nbdinfo against foliod: the export, its size, block sizes and flags (a
# writable export and a read-only one), --list with every export and its
# description, and --map showing holes after a trim.
. "$(dirname "$0")/lib.sh"
lib_init server-nbdinfo
requires nbdinfo nbdsh

MiB=$((1024 * 1024))
# 10 MiB + 512: awkward size; data in the first 2 MiB, the rest sparse.
truncate -s $((10 * MiB + 512)) "$tmp/img"
head -c $((2 * MiB)) /dev/urandom | dd of="$tmp/img" conv=notrunc status=none
truncate -s 3M "$tmp/ro"
start_foliod \
  --export "disk0=file:$tmp/img,cache-size=16M,block-size=8K,description=the first disk" \
  --export "ro=file:$tmp/ro,read-only=true"

info=$(timeout 30 nbdinfo --json "$(uri disk0)")
echo "$info"
get () { python3 -c "import json,sys; e=json.load(sys.stdin)['exports'][0]; print(e['$1'])" <<<"$info"; }
[ "$(get export-name)" = disk0 ] || fail "export name"
[ "$(get export-size)" = $((10 * MiB + 512)) ] || fail "size"
[ "$(get block_size_minimum)" = 1 ] || fail "minimum block size"
[ "$(get block_size_preferred)" = 8192 ] || fail "preferred block size = block-size"
[ "$(get block_size_maximum)" = $((64 * MiB)) ] || fail "maximum block size"
[ "$(get description)" = "the first disk" ] || fail "description"
for f in can_flush can_fua can_trim can_zero can_fast_zero can_cache \
         can_multi_conn can_df; do
  [ "$(get $f)" = True ] || fail "$f should be true"
done
[ "$(get is_read_only)" = False ] || fail "disk0 is writable"

ro=$(timeout 30 nbdinfo --json "$(uri ro)")
python3 - "$ro" <<'PY' || fail "read-only export flags"
import json, sys
e = json.loads(sys.argv[1])["exports"][0]
assert e["export-size"] == 3 << 20, e
assert e["is_read_only"] is True, e
# A read-only export advertises no write features.
for f in ("can_trim", "can_zero", "can_fua", "can_fast_zero"):
    assert e[f] is False, f
assert e["can_flush"] is True
PY

# The empty name is the default export: the first one configured.
[ "$(timeout 30 nbdinfo --size "nbd+unix:///?socket=$SOCK")" = $((10 * MiB + 512)) ] ||
  fail "default export"

# --list: both exports.
list=$(timeout 30 nbdinfo --list --json "nbd+unix:///?socket=$SOCK")
python3 - "$list" <<'PY' || fail "nbdinfo --list"
import json, sys
names = sorted(e["export-name"] for e in json.loads(sys.argv[1])["exports"])
assert names == ["disk0", "ro"], names
PY

# An unknown export is refused with an error, and the server lives on.
if timeout 30 nbdinfo "$(uri nosuch)" 2>"$tmp/err"; then
  fail "unknown export accepted"
fi
grep -qi "not found\|unknown\|no such" "$tmp/err" || { cat "$tmp/err"; fail "no clear error"; }

# --map: data at the start, hole after.  Then trim 1 MiB in the data and
# zero another 1 MiB there: both must show as holes / zeroes.
map () { timeout 30 nbdinfo --map --json "$(uri disk0)"; }
python3 - "$(map)" <<'PY' || fail "initial map"
import json, sys
m = json.loads(sys.argv[1])
data = [e for e in m if e["type"] & 1 == 0]
assert data and data[0]["offset"] == 0 and data[0]["length"] >= 2 << 20, m
assert any(e["type"] & 1 for e in m if e["offset"] >= 2 << 20), m
PY
timeout 30 nbdsh -u "$(uri disk0)" -c '
h.trim(1 << 20, 0)
h.zero(512 << 10, 1 << 20)
h.flush()
'
python3 - "$(map)" <<'PY' || fail "map after trim shows no hole at 0"
import json, sys
m = json.loads(sys.argv[1])
print(m)
def at(off):
    return next(e for e in m if e["offset"] <= off < e["offset"] + e["length"])
assert at(0)["type"] & 1, "trimmed range is not a hole"
assert at((1 << 20) + 4096)["type"] & 2, "zeroed range does not read as zero"
assert at((3 << 19) + 4096)["type"] == 0, "data after the zeroed range"
PY

foliod_alive
stop_foliod
echo OK
