#!/bin/bash
# nbdkit-folio-plugin error paths, with nbdkit's error filter on a remote
# server as the backing:
#  - a backing write error reaches the client on FLUSH (and on a FUA
#    write), the data stays dirty and a later flush writes it back;
#  - a backing read error reaches the client of a read that misses;
#  - nbdkit survives all of it, and no dirty data is lost at exit.
. "$(dirname "$0")/lib.sh"
plugin_init plugin-err
requires nbdsh
[ -f "$TOP/src/backing/nbd.c" ] || skip "nbd backing not built"

img=$tmp/remote.img
head -c $((4 * 1024 * 1024)) /dev/urandom > "$img"
# Writes fail while $tmp/wfail exists, reads while $tmp/rfail exists.
nbdkit -f -U "$tmp/remote.sock" --filter=error file "$img" \
  error-pwrite=EIO error-pwrite-rate=100% error-pwrite-file="$tmp/wfail" \
  error-zero=EIO error-zero-rate=100% error-zero-file="$tmp/wfail" \
  error-pread=EIO error-pread-rate=100% error-pread-file="$tmp/rfail" \
  2>"$tmp/remote.log" &
remote_pid=$!
track $remote_pid
for _ in $(seq $((300 * TSCALE))); do [ -S "$tmp/remote.sock" ] && break; sleep 0.1; done
[ -S "$tmp/remote.sock" ] || { echo "remote nbdkit did not start"; exit 1; }

cat > "$tmp/err.py" <<'EOF'
import errno, os, sys
import nbd
tmp, img = os.environ["TMP"], os.environ["IMG"]
h = nbd.NBD()
h.connect_uri(os.environ["URI"])

def on_disk(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)

def expect_error(what, fn):
    try:
        fn()
    except nbd.Error as e:
        print(what, "failed as expected:", e.errno)
        return
    sys.exit("FAIL: %s succeeded although the backing fails" % what)

# 1. Write error on flush; the data stays dirty and is retried.
data = os.urandom(100000)
h.pwrite(data, 12345)                    # lands in the cache
open(tmp + "/wfail", "w").close()
expect_error("flush", h.flush)
expect_error("FUA write", lambda: h.pwrite(os.urandom(4096), 1 << 20,
                                           nbd.CMD_FLAG_FUA))
if h.pread(len(data), 12345) != data:
    sys.exit("FAIL: cached data changed after a failed writeback")
os.unlink(tmp + "/wfail")
h.flush()
if on_disk(12345, len(data)) != data:
    sys.exit("FAIL: data not written back by the flush after the error")
print("write error reported, data kept dirty and written later")

# 2. Read error on a miss (a range never read before).
open(tmp + "/rfail", "w").close()
expect_error("read", lambda: h.pread(65536, 3 << 20))
os.unlink(tmp + "/rfail")
if h.pread(65536, 3 << 20) != on_disk(3 << 20, 65536):
    sys.exit("FAIL: read after the error returns wrong data")
print("read error reported")

# 3. Dirty data left at exit must be written back at unload.
tail = os.urandom(5000)
h.pwrite(tail, 2 << 20)
with open(tmp + "/tail", "wb") as f:
    f.write(tail)
h.shutdown()
EOF

log=$tmp/nbdkit.log
if ! TMP=$tmp IMG=$img timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" \
     nbdkit -U - "$PLUGIN" backing="nbd+unix:///?socket=$tmp/remote.sock" \
     cache-size=1M dirty-expire=600000 writeback-interval=60000 \
     --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/err.py" 2>"$log"; then
  cat "$log"; echo "FAIL"; exit 1
fi
cat "$log"
check_sanitizer_log "$log"
# The errors were logged by the plugin with context.
grep -q 'folio: flush' "$log" || { echo "FAIL: flush error not logged"; exit 1; }
cmp -n 5000 -i 0:$((2 << 20)) "$tmp/tail" "$img" ||
  { echo "FAIL: dirty data lost at exit"; exit 1; }
echo "errors ok"
