#!/bin/bash
# nbdkit's own tests of its cache filter (tests/test-cache*.sh in nbdkit's
# source, the same in Debian 12's 1.32 and upstream; read there, not
# copied), their steps rewritten here with --filter=folio for
# --filter=cache: make check has no network to fetch nbdkit's source, so
# the steps are ours.  Which apply:
#   test-cache.sh            yes: write through the cache, read, FLUSH, file
#   test-cache-unaligned.sh  yes: an export size not a multiple of a block
#   test-cache-on-read.sh    yes, without cache-on-read=true (not a key of
#                            ours: the folio cache always keeps what it read)
#   test-cache-on-read-caches.sh  yes, without its timing: it asserts that
#                            a second read of a 64K block and a read after
#                            a write do not wait for the plugin's 10 s
#                            read delay; here the log filter under the
#                            cache shows that they do not reach the plugin
#   test-cache-block-size.sh yes, with block-size=128K folio-size=128K for
#                            cache-min-block-size=128K (a key of nbdkit's
#                            only): a 64K read fills the whole 128K block,
#                            so a change of the file behind the cache in
#                            its other half stays unseen, the next block's
#                            does not
#   test-cache-max-size.sh   its steps yes (qemu-io writes and reads 40M
#                            through cache-size=10M for cache-max-size=10M,
#                            patterns checked on read here), its assertion
#                            no: it measures nbdkit's cache temp file in
#                            /proc/PID/fd, ours is cache-size of memory;
#                            here the cache's own counters (nbdkit -v) must
#                            show evictions, and the file the data
#   test-cacheextents.sh     no: another filter (cacheextents)
# and nbdkit's tests of generic filter behaviour the folio filter relies on:
#   test-fua.sh              yes, as what reaches the plugin (log filter
#                            under the cache): a client's FUA write reaches
#                            a plugin with native FUA as a write with FUA,
#                            one without it (an sh plugin whose can_fua
#                            says none: 1.32's fua filter refuses its own
#                            fuamode=none) as a write then a flush
#   test-eflags.sh           yes, for the flags the filter sets: nbdinfo
#                            sees flush, FUA, trim, zero, fast zero,
#                            multi-conn, cache, base:allocation, and
#                            read-only under -r, over a plugin with no
#                            zero and no extents (nozero, noextents)
#   test-parallel-*.sh       no: they assert an order of completion from
#                            delays (timing); parallel clients are
#                            test-filter-file-nbd.sh's
#   test-layers.sh           no: it checks nbdkit's own call order with
#                            its own test filters
. "$(dirname "$0")/lib.sh"
filter_init filter-nbdkit-cache-tests
requires nbdsh nbdinfo qemu-io python3

run () {   # run NAME NBDSH-SCRIPT NBDKIT-ARGS...
  local name=$1 script=$2
  shift 2
  cd "$tmp"
  timeout $((60 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
    --filter="$FILTER" "$@" \
    --run "env -u LD_PRELOAD nbdsh -u \"\$uri\" -c '$script'" \
    >"$tmp/$name.out" 2>&1 || { cat "$tmp/$name.out"; fail "$name"; }
  check_sanitizer_log "$tmp/$name.out"
  cd - >/dev/null
  echo "$name: ok"
}

# test-cache.sh
truncate -s 128K "$tmp/cache.img"
run test-cache.sh '
buf = b"abcd" * 16384
h.pwrite(buf, 32768)
zero = h.pread(32768, 0)
assert zero == bytearray(32768)
buf2 = h.pread(65536, 32768)
assert buf == buf2
h.flush()
with open("cache.img", "rb") as file:
    zero = file.read(32768)
    assert zero == bytearray(32768)
    buf2 = file.read(65536)
    assert buf == buf2
' file cache.img

# test-cache-unaligned.sh
truncate -s 130000 "$tmp/cache-unaligned.img"
run test-cache-unaligned.sh '
buf = b"abcdefghijklm" * 10000
h.pwrite(buf, 0)
buf2 = h.pread(130000, 0)
assert buf == buf2
h.flush()
with open("cache-unaligned.img", "rb") as file:
    buf2 = file.read(130000)
    assert buf == buf2
' file cache-unaligned.img

# test-cache-on-read.sh
run test-cache-on-read.sh '
buf = b"abcd" * 16384
h.pwrite(buf, 32768)
zero = h.pread(32768, 0)
assert zero == bytearray(32768)
buf2 = h.pread(65536, 32768)
assert buf == buf2
' memory 128K

# test-cache-on-read-caches.sh: what reaches the plugin (log filter below).
head -c 64K /dev/urandom > "$tmp/onread.img"
run test-cache-on-read-caches.sh '
def plugin_reads():
    return sum(1 for line in open("onread.log") if " Read " in line)
buf0 = open("onread.img", "rb").read()
assert h.pread(65536, 0) == buf0
first = plugin_reads()
print("plugin reads after the first read:", first)
assert first >= 1
assert h.pread(65536, 0) == buf0
assert plugin_reads() == first, "the second read reached the plugin"
buf = b"abcd" * 16384
h.pwrite(buf, 0)
assert h.pread(65536, 0) == buf
assert plugin_reads() == first, "a read after a write reached the plugin"
' --filter=log file onread.img logfile=onread.log

# test-cache-block-size.sh
truncate -s 256K "$tmp/cache-block-size.img"
run test-cache-block-size.sh '
zero = h.pread(64 * 1024, 0)
assert zero == bytearray(64 * 1024)
buf = b"abcd" * 16 * 1024
with open("cache-block-size.img", "r+b") as file:   # behind the cache
    file.seek(64 * 1024)
    file.write(buf * 2)
with open("cache-block-size.img", "rb") as file:
    file.seek(64 * 1024)
    assert file.read(128 * 1024) == buf * 2
zero = h.pread(64 * 1024, 64 * 1024)    # the rest of the 128K block
assert zero == bytearray(64 * 1024), "a 64K read did not fill its 128K block"
buf2 = h.pread(64 * 1024, 128 * 1024)   # the next block: not read yet
assert buf == buf2
' file cache-block-size.img block-size=128K folio-size=128K readahead=0

# test-cache-max-size.sh: qemu-io through a 10M cache.
truncate -s 1G "$tmp/cache-max-size.img"
cd "$tmp"
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -v -U - \
  --filter="$FILTER" file cache-max-size.img cache-size=10M \
  --run 'env -u LD_PRELOAD qemu-io -f raw "$uri" \
    -c "w -P 0x11 0 10M" -c "w -P 0x22 20M 10M" -c "r -P 0x22 20M 10M" \
    -c "r -P 0 30M 10M" -c "w -P 0x33 40M 10M" -c "r -P 0x11 0 10M" \
    -c "r -P 0x33 40M 10M" -c flush' \
  >"$tmp/max-size.out" 2>&1 || { tail -30 "$tmp/max-size.out"; fail test-cache-max-size.sh; }
cd - >/dev/null
check_sanitizer_log "$tmp/max-size.out"
! grep -q "Pattern verification failed" "$tmp/max-size.out" ||
  fail "test-cache-max-size.sh: qemu-io read other data than written"
ev=$(sed -n 's/.*folio: stats .*evictions=\([0-9]*\).*/\1/p' "$tmp/max-size.out" | tail -1)
[ "${ev:-0}" -gt 0 ] ||
  fail "test-cache-max-size.sh: 30M written through cache-size=10M and no eviction (${ev:-no stats})"
for r in "0 10 17" "20 10 34" "40 10 51"; do    # MiB offset, MiB, byte
  set -- $r
  cmp -n $(($2 << 20)) <(head -c $(($2 << 20)) /dev/zero | tr '\0' "\\$(printf %o "$3")") \
    <(tail -c +$((($1 << 20) + 1)) "$tmp/cache-max-size.img") ||
    fail "test-cache-max-size.sh: the file lacks what was written at $1M"
done
echo "test-cache-max-size.sh: ok ($ev evictions)"

# test-fua.sh: a FUA write reaches the plugin with FUA, or as a write
# then a flush when the plugin has no FUA.
truncate -s 1M "$tmp/fua.img"
fua_py='
h.pwrite(b"f" * 65536, 0, nbd.CMD_FLAG_FUA)
log = open(LOG).read().splitlines()
w = [i for i, l in enumerate(log) if " Write " in l and "offset=0x0 " in l]
assert w, "no write reached the plugin"
'
run test-fua.sh-native "LOG = \"fua1.log\"$fua_py
assert \"fua=1\" in log[w[0]], log[w[0]]
" --filter=log file fua.img logfile=fua1.log
cat > "$tmp/nofua.sh" <<EOF2
#!/bin/bash
case "\$1" in
  get_size) echo 1048576 ;;
  can_write|can_flush) exit 0 ;;
  can_fua) echo none ;;
  pread) env -u LD_PRELOAD dd if=$tmp/fua.img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
  pwrite) env -u LD_PRELOAD dd of=$tmp/fua.img seek=\$4 conv=notrunc oflag=seek_bytes status=none ;;
  flush) ;;
  *) exit 2 ;;
esac
EOF2
chmod +x "$tmp/nofua.sh"
run test-fua.sh-none "LOG = \"fua2.log\"$fua_py
assert \"fua=0\" in log[w[0]], log[w[0]]
assert any(\" Flush \" in l for l in log[w[0]:]), \"no flush after the write\"
" --filter=log sh nofua.sh logfile=fua2.log

# test-eflags.sh: the flags the filter advertises.
for ro in "" -r; do
  timeout $((60 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit $ro -U - \
    --filter="$FILTER" --filter=nozero --filter=noextents memory 1M \
    --run 'env -u LD_PRELOAD nbdinfo --json "$uri"' >"$tmp/eflags.out" 2>&1 ||
    { cat "$tmp/eflags.out"; fail "test-eflags.sh $ro"; }
  python3 - "$tmp/eflags.out" "$ro" <<'EOF2' || fail "test-eflags.sh $ro"
import json, sys
e = json.load(open(sys.argv[1]))["exports"][0]
ro = sys.argv[2] == "-r"
want = {"can_flush": True, "can_multi_conn": True, "can_cache": True,
        "is_read_only": ro}
if not ro:    # nbdkit advertises no write flag on a read-only export
    want.update(can_fua=True, can_trim=True, can_zero=True, can_fast_zero=True)
bad = {k: (e.get(k), v) for k, v in want.items() if e.get(k) != v}
if "base:allocation" not in e.get("contexts", []):
    bad["contexts"] = (e.get("contexts"), "base:allocation")
if bad:
    sys.exit("flags (seen, wanted): %s" % bad)
EOF2
  echo "test-eflags.sh ${ro:-(read-write)}: ok"
done
