#!/bin/bash
# nbdkit-folio-plugin takes the direct-I/O options too (issue 6):
#   cache=none            nbdkit holds the backing open with O_DIRECT (on a
#                         disk file system), every completed write is in the
#                         file at once, passthrough counters = client bytes;
#   direct-threshold=64K  cached and direct requests over several
#                         connections stay coherent (tests/tools/mixed-io.py).
# The plugin reports its counters at unload (nbdkit -v debug line).
. "$(dirname "$0")/lib.sh"
plugin_init direct-plugin
requires python3

size=$(( 2 * 1024 * 1024 + 1536 ))
img=$tmp/img
MIXED=$TOP/tests/tools/mixed-io.py

# run_plugin LABEL CHECK_ODIRECT MIXED-ARGS -- PLUGIN-ARGS...
run_plugin () {
  local label=$1 check=$2 margs=()
  shift 2
  while [ "$1" != -- ]; do margs+=("$1"); shift; done
  shift
  rm -f "$img"
  head -c "$size" /dev/urandom > "$img"
  # The --run shell's parent is nbdkit: its fds show the open flags.
  cat > "$tmp/run.sh" <<EOF
set -e
if [ "$check" = 1 ]; then
  found=0
  for fd in /proc/\$NBDKIT_PID/fd/*; do
    [ "\$(readlink "\$fd")" = "$img" ] || continue
    flags=\$(awk '\$1 == "flags:" {print \$2}' /proc/\$NBDKIT_PID/fdinfo/\${fd##*/})
    python3 -c 'import os, sys; sys.exit(0 if int(sys.argv[1], 8) & os.O_DIRECT else 1)' "\$flags" && found=1
  done
  [ \$found = 1 ] || { echo "FAIL: nbdkit has no O_DIRECT fd on $img"; exit 1; }
  echo "nbdkit holds $img with O_DIRECT"
fi
exec python3 "$MIXED" "\$URI" "$img" ${margs[*]}
EOF
  echo "== $label: $*"
  if ! timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -v -U - \
       "$PLUGIN" backing=file:"$img" "$@" \
       --run 'env -u LD_PRELOAD NBDKIT_PID=$PPID URI="$uri" sh '"$tmp/run.sh" > "$tmp/out" 2> "$tmp/log"; then
    cat "$tmp/out"
    grep -v "debug: " "$tmp/log" | tail -n 20
    fail "$label"
  fi
  cat "$tmp/out"
  check_sanitizer_log "$tmp/log"
  stats=$(grep -o "folio: stats direct_read_bytes=.*" "$tmp/log" | tail -n 1)
  [ -n "$stats" ] || fail "$label: no stats line at unload"
  echo "   $stats"
  dr=$(sed -n 's/.*direct_read_bytes=\([0-9]*\).*/\1/p' <<<"$stats")
  dw=$(sed -n 's/.*direct_write_bytes=\([0-9]*\).*/\1/p' <<<"$stats")
}

odirect=1
case $(stat -f -c %T "$tmp") in tmpfs|ramfs) odirect=0 ;; esac

run_plugin cache=none "$odirect" --rounds 60 --through -- \
  cache=none cache-size=1M
[ "$dr" -gt 0 ] && [ "$dw" -gt 0 ] || fail "cache=none: no passthrough counted"

run_plugin direct-threshold "$odirect" --rounds 80 --threshold 65536 -- \
  direct-threshold=64K cache-size=1M folio-size=64K block-size=4K
[ "$dr" -gt 0 ] && [ "$dw" -gt 0 ] || fail "direct-threshold: no passthrough counted"
echo ok
