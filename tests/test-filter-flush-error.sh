#!/bin/bash
# nbdkit-folio-filter over a plugin whose flush fails while a file exists
# (nbdkit's sh plugin over a file: 1.32's error filter cannot fail
# flushes alone, and eval's flush= key is the filter's), the log filter between them to see what reaches the
# plugin, and a cache far smaller than the data:
#  - 4 MiB written and flushed; then, while the plugin's flush fails,
#    256 KiB written and the client's FLUSH fails (EIO), twice, and every
#    byte still reads back as written;
#  - once the plugin's flush works again, the next FLUSH first writes
#    again what was written back before the failed one (a failed flush
#    may have lost it) and succeeds;
#  - after nbdkit exits the file holds every byte.
. "$(dirname "$0")/lib.sh"
filter_init filter-flush-error
requires nbdsh python3

img=$tmp/disk.img
truncate -s 16M "$img"
fail_file=$tmp/flush-fails
plog=$tmp/plugin.log

cat > "$tmp/plugin.sh" <<EOF2
#!/bin/bash
case "\$1" in
  get_size) echo 16777216 ;;
  can_write|can_flush) exit 0 ;;
  pread) dd if=$img skip=\$4 count=\$3 iflag=skip_bytes,count_bytes status=none ;;
  pwrite) dd of=$img seek=\$4 conv=notrunc oflag=seek_bytes status=none ;;
  flush) if [ -e $fail_file ]; then echo 'EIO flush fails' >&2; exit 1; fi ;;
  *) exit 2 ;;
esac
EOF2
chmod +x "$tmp/plugin.sh"

cat > "$tmp/fe.py" <<'EOF2'
import os, random, sys
import nbd
fail_file, plog, model_out = sys.argv[1:4]
h = nbd.NBD()
h.connect_uri(os.environ["uri"])
rng = random.Random(7)
model = bytearray(16 << 20)
for k in range(32):                    # 4 MiB in 128 KiB writes, cache 1 MiB
    off = (1 << 20) + k * (128 << 10)
    d = rng.randbytes(128 << 10)
    h.pwrite(d, off)
    model[off:off + len(d)] = d
h.flush()
open(fail_file, "w").close()           # the plugin's flush fails from now
for k in range(4):                     # 256 KiB: room in the cache
    off = (8 << 20) + k * (64 << 10) + 512
    d = rng.randbytes(64 << 10)
    h.pwrite(d, off)
    model[off:off + len(d)] = d
try:
    h.flush()
    sys.exit("FAIL: FLUSH succeeded while the plugin's flush fails")
except nbd.Error as e:
    print("FLUSH failed as it must:", e.string)
try:
    h.flush()
    sys.exit("FAIL: a second FLUSH succeeded while the plugin's flush fails")
except nbd.Error:
    pass
if h.pread(16 << 20, 0) != model:
    sys.exit("FAIL: data read back differs after the failed FLUSH")
os.unlink(fail_file)                   # the plugin's flush works again
h.flush()
# What was written back before a failed plugin flush may be lost: it must
# reach the plugin again after the LAST failed flush (the background
# writeback may do it before the client's good FLUSH, or that FLUSH).
lines = open(plog).read().splitlines()
last_fail = max(i for i, line in enumerate(lines)
                if "...Flush" in line and "return=-1" in line)
rewrites = sum(1 for line in lines[last_fail + 1:] if " Write " in line)
print("writes the plugin got after its last failed flush:", rewrites)
if rewrites == 0:
    sys.exit("FAIL: nothing written again after a failed flush")
if h.pread(16 << 20, 0) != model:
    sys.exit("FAIL: data read back differs after FLUSH")
open(model_out, "wb").write(model)
h.shutdown()
EOF2

timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
  --filter="$FILTER" --filter=log \
  sh "$tmp/plugin.sh" cache-size=1M dirty-expire=600000 logfile="$plog" \
  --run "env -u LD_PRELOAD uri=\$uri python3 $tmp/fe.py $fail_file $plog $tmp/model" \
  >"$tmp/out" 2>"$tmp/log" ||
  { cat "$tmp/out" "$tmp/log"; fail "flush error test failed"; }
cat "$tmp/out"
check_sanitizer_log "$tmp/log"
cmp "$img" "$tmp/model" || fail "the file lacks data after exit"
echo "the file holds every byte after exit"
