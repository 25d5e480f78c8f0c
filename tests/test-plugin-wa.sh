#!/bin/bash
# nbdkit-folio-plugin write amplification: 4 KiB random writes write back
# 4096 bytes each (only the dirty blocks, never whole 64 KiB folios).
#  1. file backing, folios made uptodate by a full read first: the plugin's
#     cache statistics (logged at unload with -v) show backing writes ==
#     client writes;
#  2. file backing, cold cache: the same, and block-aligned writes read
#     nothing from the backing;
#  3. nbd backing (when built): a remote nbdkit with the log filter counts
#     the bytes that really arrive, independently of the cache's counters.
. "$(dirname "$0")/lib.sh"
plugin_init plugin-wa
requires python3

MiB=$((1024 * 1024))
size=$((32 * MiB))
nwrites=1000

cat > "$tmp/wa.py" <<'EOF'
import os, random
import nbd
h = nbd.NBD()
h.connect_uri(os.environ["URI"])
size = h.get_size()
if os.environ["WARM"] == "1":
    for off in range(0, size, 1 << 20):     # make every folio uptodate
        h.pread(min(1 << 20, size - off), off)
rng = random.Random()
blocks = rng.sample(range(size // 4096), int(os.environ["NWRITES"]))
for b in blocks:                            # distinct 4 KiB blocks
    h.pwrite(rng.randbytes(4096), b * 4096)
h.flush()
h.shutdown()
EOF

# stat NAME LOG: a counter from the plugin's statistics line.
stat () {
  grep -o "folio: stats.* $1=[0-9]*" "$2" | tail -n1 | sed 's/.*=//'
}

# run_file WARM: one run on the file backing; checks the plugin statistics.
run_file () {
  local warm=$1 img=$tmp/disk.img log=$tmp/file-$1.log
  head -c $size /dev/urandom > "$img"
  if ! WARM=$warm NWRITES=$nwrites timeout $((300 * TSCALE)) env "${NBDKIT_ENV[@]}" \
       nbdkit -v -U - "$PLUGIN" backing=file:"$img" cache-size=64M \
       folio-size=64K block-size=4K \
       --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/wa.py" 2>"$log"; then
    tail -n 50 "$log"; exit 1
  fi
  check_sanitizer_log "$log"
  grep 'folio: stats' "$log" | sed 's/.*folio: /  /'
  local cw bw br
  cw=$(stat client_write_bytes "$log")
  bw=$(stat backing_write_bytes "$log")
  br=$(stat backing_read_bytes "$log")
  [ -n "$cw" ] && [ -n "$bw" ] && [ -n "$br" ] ||
    { echo "no statistics line in the log"; exit 1; }
  echo "warm=$warm: client wrote $cw, backing written $bw," \
       "write amplification $(awk "BEGIN{printf \"%.2f\", $bw/$cw}")"
  [ "$cw" -eq $((nwrites * 4096)) ] || { echo "client bytes $cw"; exit 1; }
  [ "$bw" -eq $((nwrites * 4096)) ] ||
    { echo "FAIL: backing writes $bw != $((nwrites * 4096))"; exit 1; }
  if [ "$warm" = 1 ]; then
    [ "$br" -le $size ] || { echo "FAIL: read $br bytes for a $size device"; exit 1; }
  else
    [ "$br" -eq 0 ] ||
      { echo "FAIL: block-aligned writes read $br bytes from the backing"; exit 1; }
  fi
}
run_file 1
run_file 0

# 3. Over NBD, counted by the remote server itself.
if ! [ -f "$TOP/src/backing/nbd.c" ]; then
  echo "nbd backing not built: remote measurement skipped"
  exit 0
fi
remote=$tmp/remote.img
head -c $size /dev/urandom > "$remote"
rm -f "$tmp/remote.log"
nbdkit -f -U "$tmp/remote.sock" --filter=log file "$remote" \
  logfile="$tmp/remote.log" &
remote_pid=$!
track $remote_pid
for _ in $(seq $((300 * TSCALE))); do [ -S "$tmp/remote.sock" ] && break; sleep 0.1; done
[ -S "$tmp/remote.sock" ] || { echo "remote nbdkit did not start"; exit 1; }

log=$tmp/nbd.log
if ! WARM=1 NWRITES=$nwrites timeout $((300 * TSCALE)) env "${NBDKIT_ENV[@]}" \
     nbdkit -v -U - "$PLUGIN" backing="nbd+unix:///?socket=$tmp/remote.sock" \
     cache-size=64M folio-size=64K block-size=4K \
     --run 'env -u LD_PRELOAD URI="$uri" python3 '"$tmp/wa.py" 2>"$log"; then
  tail -n 50 "$log"; exit 1
fi
check_sanitizer_log "$log"
kill "$remote_pid"; wait "$remote_pid" || true; remote_pid=

# Sum the counts of Write and Zero requests the remote received.
written=0
while read -r c; do
  written=$((written + c))
done < <(grep -E ' (Write|Zero) id=' "$tmp/remote.log" | grep -o 'count=0x[0-9a-f]*' |
         sed 's/count=//')
echo "nbd backing: client wrote $((nwrites * 4096)), remote received $written," \
     "write amplification $(awk "BEGIN{printf \"%.2f\", $written/($nwrites*4096)}")"
[ "$written" -eq $((nwrites * 4096)) ] ||
  { echo "FAIL: remote received $written bytes"; exit 1; }
