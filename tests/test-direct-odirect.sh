#!/bin/bash
# cache=none on a file on a real file system (not tmpfs) uses O_DIRECT
# (issue 6): strace shows the backing opened with O_DIRECT, the open fd
# carries O_DIRECT (/proc/PID/fdinfo) and the log says so once.  Requests
# that are not aligned to the logical block size (odd offsets, odd lengths,
# the partial sector at the end of a file of odd size) still give correct
# data: bounced, read-modify-write, and what the file holds afterwards is
# exactly what was written.  On tmpfs foliod says once in the log whether
# it got O_DIRECT or fell back to buffered I/O, and the data is right.
# Where O_DIRECT is refused (simulated by a preloaded shim) foliod warns
# once and serves the export with buffered I/O.
. "$(dirname "$0")/lib.sh"
lib_init direct-odirect
requires python3 nbdsh

# A directory on a disk file system: $tmp (lib_init puts it in /tmp), else
# /var/tmp, else the build directory.
dir=
for d in "$tmp" /var/tmp "$BUILD"; do
  t=$(stat -f -c %T "$d" 2>/dev/null) || continue
  case $t in tmpfs|ramfs|overlayfs) continue ;; esac
  [ -w "$d" ] || continue
  dir=$d
  break
done
[ -n "$dir" ] || skip "no directory on a disk file system (all tmpfs)"
if [ "$dir" != "$tmp" ]; then
  dir=$(mktemp -d "$dir/foliod-direct-odirect-XXXXXX")
  trap '_lib_cleanup; rm -rf "$dir"' EXIT
fi
echo "backing directory $dir ($(stat -f -c %T "$dir"))"

# 3 MiB + 1234 bytes: the last 1234 bytes are not a whole sector.
size=$(( 3 * 1024 * 1024 + 1234 ))
img=$dir/img
head -c "$size" /dev/urandom > "$img"

# foliod under strace (when ptrace works here), its pid from --pidfile.
use_strace=0
if command -v strace >/dev/null && strace -qq -e trace=none true 2>/dev/null; then
  use_strace=1
  # LeakSanitizer cannot run under ptrace: leaks are checked elsewhere.
  cat > "$tmp/foliod-strace" <<EOF
#!/bin/sh
ASAN_OPTIONS=\${ASAN_OPTIONS:-}:detect_leaks=0
export ASAN_OPTIONS
exec strace -f -qq -e trace=openat -o "$tmp/strace.log" "$FOLIOD" "\$@"
EOF
  chmod +x "$tmp/foliod-strace"
fi
real_foliod=$FOLIOD
[ "$use_strace" = 1 ] && FOLIOD=$tmp/foliod-strace
start_foliod --pidfile "$tmp/pid" --control "$tmp/ctl" \
  --export "disk0=file:$img,cache=none,cache-size=1M"
FOLIOD=$real_foliod
pid=$(cat "$tmp/pid")

# 1. The backing file is open with O_DIRECT.
if [ "$use_strace" = 1 ]; then
  grep -E "openat\(.*\"$img\", [^)]*O_DIRECT" "$tmp/strace.log" ||
    fail "strace shows no O_DIRECT open of $img: $(grep "$img" "$tmp/strace.log")"
else
  echo "strace unusable here: checking /proc and the log only"
fi
found=0
for fd in /proc/"$pid"/fd/*; do
  [ "$(readlink "$fd")" = "$img" ] || continue
  flags=$(awk '$1 == "flags:" {print $2}' /proc/"$pid"/fdinfo/"${fd##*/}")
  # O_DIRECT is 040000 (octal) on x86, arm64 uses 0200000: ask python.
  python3 -c 'import os, sys; sys.exit(0 if int(sys.argv[1], 8) & os.O_DIRECT else 1)' \
    "$flags" && found=1
done
[ "$found" = 1 ] || fail "no fd of foliod (pid $pid) on $img has O_DIRECT"
[ "$(grep -c "export disk0: O_DIRECT, alignment" "$FOLIOD_LOG")" = 1 ] ||
  fail "the log does not say once that disk0 uses O_DIRECT"

# 2. Unaligned requests, checked against the file itself (cache=none: the
# file holds every completed write).
cat > "$tmp/unaligned.py" <<'EOF'
import os, random, sys
import nbd
uri, img = sys.argv[1], sys.argv[2]
rng = random.Random(int(sys.argv[3]))
h = nbd.NBD()
h.connect_uri(uri)
size = h.get_size()
def file_bytes(off, n):
    with open(img, "rb") as f:
        f.seek(off)
        return f.read(n)
cases = [(0, 1), (1, 1), (511, 2), (1, 511), (513, 4095), (4095, 4098),
         (65535, 131075), (100000, 1), (size - 1, 1), (size - 1234, 1234),
         (size - 1235, 1235), (size - 4096 - 7, 4096 + 7),
         (size - 1500000, 1500000), (12345, 1 << 20)]
cases += [(o, rng.randint(1, 70000)) for o in
          (rng.randrange(size - 70000) for _ in range(20))]
for off, n in cases:
    assert off + n <= size, (off, n)
    got = h.pread(n, off)
    if got != file_bytes(off, n):
        sys.exit("read of %d at %d differs from the file" % (n, off))
    data = rng.randbytes(n)
    before, after = file_bytes(max(0, off - 4096), min(off, 4096)), \
        file_bytes(off + n, 4096)
    h.pwrite(data, off)
    if file_bytes(off, n) != data:
        sys.exit("write of %d at %d: the file does not hold it" % (n, off))
    if file_bytes(max(0, off - 4096), min(off, 4096)) != before or \
       file_bytes(off + n, 4096) != after:
        sys.exit("write of %d at %d changed bytes around it" % (n, off))
    if h.pread(n, off) != data:
        sys.exit("read back of %d at %d differs" % (n, off))
if os.path.getsize(img) != size:
    sys.exit("the file size changed: %d" % os.path.getsize(img))
h.shutdown()
print("%d unaligned cases ok" % len(cases))
EOF
seed=${DIRECT_SEED:-$RANDOM}
echo "seed $seed"
timeout $(( 60 * TSCALE )) python3 "$tmp/unaligned.py" "$(uri disk0)" "$img" "$seed" ||
  fail "unaligned requests with O_DIRECT (seed $seed)"
pr=$("$FOLIOD" stats --control "$tmp/ctl" --prometheus |
     awk '$1 == "foliod_passthrough_read_ops_total{export=\"disk0\"}" {print $2}')
[ "${pr:-0}" -gt 0 ] || fail "no passthrough reads counted"
kill -TERM "$pid"
for ((i = 0; i < 100 * TSCALE; i++)); do
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
kill -0 "$pid" 2>/dev/null && fail "foliod did not exit on SIGTERM"
wait "$FOLIOD_PID" || fail "foliod (under strace) exited with status $?"
FOLIOD_PID=
check_sanitizer_log "$FOLIOD_LOG"
[ "$(stat -c %s "$img")" = "$size" ] || fail "the file size changed"

# 3. tmpfs: the log says once which way it went; data still right.
if [ -d /dev/shm ] && [ "$(stat -f -c %T /dev/shm)" = tmpfs ] && [ -w /dev/shm ]; then
  shm=$(mktemp -d /dev/shm/foliod-direct-odirect-XXXXXX)
  trap '_lib_cleanup; rm -rf "$shm"; [ "$dir" = "$tmp" ] || rm -rf "$dir"' EXIT
  head -c "$size" /dev/urandom > "$shm/img"
  : > "$tmp/foliod.log"
  start_foliod --export "disk0=file:$shm/img,direct-threshold=64K,cache-size=1M"
  n=$(grep -cE "export disk0: (O_DIRECT, alignment|the file system refuses O_DIRECT)" "$FOLIOD_LOG" || true)
  [ "$n" = 1 ] || fail "tmpfs: expected one log line about O_DIRECT, got $n"
  grep -E "export disk0: (O_DIRECT|the file system refuses)" "$FOLIOD_LOG"
  timeout $(( 60 * TSCALE )) python3 "$TOP/tests/tools/mixed-io.py" \
    "$(uri disk0)" "$shm/img" --rounds 40 --conns 2 --threshold 65536 ||
    fail "tmpfs: mixed I/O"
  stop_foliod
fi
# 4. A file system that refuses O_DIRECT (a preloaded shim makes open with
# O_DIRECT fail with EINVAL, as tmpfs did before Linux 6.6): foliod warns
# once, serves the export with buffered I/O, and the data is right.
if command -v cc >/dev/null; then
  cat > "$tmp/nodirect.c" <<'EOF2'
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <sys/syscall.h>
#include <unistd.h>
static int shim_open (const char *path, int flags, va_list ap)
{
  mode_t mode = (flags & (O_CREAT | O_TMPFILE)) ? va_arg (ap, mode_t) : 0;
  if (flags & O_DIRECT) { errno = EINVAL; return -1; }
  return (int) syscall (SYS_openat, AT_FDCWD, path, flags, mode);
}
int open (const char *path, int flags, ...)
{ va_list ap; va_start (ap, flags); int r = shim_open (path, flags, ap); va_end (ap); return r; }
int open64 (const char *path, int flags, ...)
{ va_list ap; va_start (ap, flags); int r = shim_open (path, flags, ap); va_end (ap); return r; }
EOF2
  cc -shared -fPIC -o "$tmp/nodirect.so" "$tmp/nodirect.c" || fail "cannot build the shim"
  preload=$tmp/nodirect.so
  [ "${SAN:-}" = 1 ] && preload="$(gcc -print-file-name=libasan.so) $preload"
  head -c "$size" /dev/urandom > "$img"
  : > "$tmp/foliod.log"
  # Only foliod gets the shim (not the clients lib.sh starts).
  printf '#!/bin/sh\nLD_PRELOAD="%s" exec "%s" "$@"\n' "$preload" "$FOLIOD" \
    > "$tmp/foliod-nodirect"
  chmod +x "$tmp/foliod-nodirect"
  FOLIOD=$tmp/foliod-nodirect start_foliod --pidfile "$tmp/pid" \
    --export "disk0=file:$img,cache=none,cache-size=1M"
  pid=$(cat "$tmp/pid")
  n=$(grep -c "export disk0: the file system refuses O_DIRECT" "$FOLIOD_LOG" || true)
  [ "$n" = 1 ] || fail "O_DIRECT refused: expected one warning in the log, got $n"
  grep -q "export disk0: O_DIRECT, alignment" "$FOLIOD_LOG" &&
    fail "O_DIRECT refused, but the log claims O_DIRECT"
  for fd in /proc/"$pid"/fd/*; do
    [ "$(readlink "$fd")" = "$img" ] || continue
    flags=$(awk '$1 == "flags:" {print $2}' /proc/"$pid"/fdinfo/"${fd##*/}")
    python3 -c 'import os, sys; sys.exit(1 if int(sys.argv[1], 8) & os.O_DIRECT else 0)' \
      "$flags" || fail "the shim did not work: an fd has O_DIRECT"
  done
  timeout $(( 60 * TSCALE )) python3 "$TOP/tests/tools/mixed-io.py" \
    "$(uri disk0)" "$img" --rounds 40 --conns 2 --through ||
    fail "buffered fallback: mixed I/O"
  stop_foliod
fi
echo ok
