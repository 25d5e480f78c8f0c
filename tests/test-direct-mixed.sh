#!/bin/bash
# Direct I/O stays coherent with the cache (issue 6): cached and direct
# requests (below and above direct-threshold, aligned and not), zeroes and
# trims, interleaved over four connections on neighbouring bytes of the same
# folios and blocks (tests/tools/mixed-io.py).  Every read equals the
# reference; after every flush the backing FILE equals it (with
# writethrough and cache=none: after every round, flush or not).
# Run for writeback + direct-threshold, writethrough (+ threshold) and
# cache=none, on a file backing, then writeback + threshold on an nbd:
# backing (nbdkit file serving the same kind of file, when nbdkit is
# installed); the counters must show each mode took the path it claims:
#   writeback+threshold  passthrough reads and writes > 0, cached ones too;
#   cache=none           passthrough bytes = all bytes clients read + wrote.
# DIRECT_SEED=N replays one seed (it is printed on failure).
. "$(dirname "$0")/lib.sh"
lib_init direct-mixed
requires python3 nbdsh
MIXED=$TOP/tests/tools/mixed-io.py
ROUNDS=${DIRECT_ROUNDS:-240}

# 2 MiB + 1536 bytes: a short last block; a 1 MiB cache so that the random
# traffic evicts (and the background writeback runs) as it goes.
size=$(( 2 * 1024 * 1024 + 1536 ))
geom="cache-size=1M,folio-size=64K,block-size=4K"

# metric NAME: one counter of export disk0.
metric () {
  "$FOLIOD" stats --control "$tmp/ctl" --prometheus |
    awk -v n="$1" '$1 == n "{export=\"disk0\"}" {print $2}'
}

# run_mode LABEL OPTIONS MIXED-ARGS...  (BACKING: default file:$tmp/img)
run_mode () {
  local label=$1 opts=$2
  shift 2
  start_foliod --control "$tmp/ctl" --export "disk0=${BACKING:-file:$tmp/img},$opts"
  echo "== $label: $opts"
  timeout $(( 120 * TSCALE )) python3 "$MIXED" "$(uri disk0)" "$tmp/img" \
    --rounds "$ROUNDS" --threshold 65536 --block 4096 \
    ${DIRECT_SEED:+--seed "$DIRECT_SEED"} "$@" ||
    fail "$label: mixed cached/direct I/O is not coherent (see above)"
  pr=$(metric foliod_passthrough_read_bytes_total)
  pw=$(metric foliod_passthrough_write_bytes_total)
  ro=$(metric foliod_passthrough_read_ops_total)
  wo=$(metric foliod_passthrough_write_ops_total)
  cr=$(metric foliod_client_read_bytes_total)
  cw=$(metric foliod_client_write_bytes_total)
  hm=$(( $(metric foliod_read_hits_total) + $(metric foliod_read_misses_total) ))
  dirty=$(metric foliod_dirty_bytes)
  echo "   passthrough: reads $ro ($pr bytes), writes $wo ($pw bytes);" \
       "client read $cr written $cw bytes; cached reads $hm; dirty $dirty"
  [ "$dirty" = 0 ] || fail "$label: $dirty bytes still dirty after the final flush"
  stop_foliod
}

# Writeback with a 64 KiB threshold: dirty blocks stay in the cache until
# a flush (or eviction), so direct reads must overlay them and direct
# writes must update or clean them.
new_image () {
  rm -f "$tmp/img"
  head -c "$size" /dev/urandom > "$tmp/img"
}

new_image
run_mode writeback "$geom,direct-threshold=64K,dirty-expire=3600000"
[ "$ro" -gt 0 ] && [ "$wo" -gt 0 ] || fail "writeback: no direct requests counted"
[ "$pr" -lt "$cr" ] && [ "$pw" -lt "$cw" ] && [ "$hm" -gt 0 ] ||
  fail "writeback: every request went direct, none through the cache"

new_image
run_mode writethrough "$geom,cache=writethrough,direct-threshold=64K" --through
[ "$wo" -gt 0 ] && [ "$pw" -lt "$cw" ] ||
  fail "writethrough: expected both cached and direct writes"

new_image
run_mode none "$geom,cache=none" --through
[ "$pr" = "$cr" ] && [ "$pw" = "$cw" ] ||
  fail "cache=none: passthrough bytes ($pr read, $pw written) differ from" \
       "client bytes ($cr read, $cw written)"
[ "$hm" = 0 ] || fail "cache=none: $hm reads went through the cache"

if command -v nbdkit >/dev/null; then
  new_image
  rm -f "$tmp/remote.sock"
  nbdkit -f --exit-with-parent -U "$tmp/remote.sock" -P "$tmp/remote.pid" \
    file "$tmp/img" > "$tmp/remote.log" 2>&1 &
  track $!
  for ((i = 0; i < 100 * TSCALE; i++)); do
    [ -s "$tmp/remote.pid" ] && break
    sleep 0.1
  done
  [ -s "$tmp/remote.pid" ] || fail "nbdkit did not start: $(cat "$tmp/remote.log")"
  BACKING="nbd+unix:///?socket=$tmp/remote.sock" \
    run_mode nbd-backing "$geom,direct-threshold=64K,dirty-expire=3600000" \
    --rounds $(( ROUNDS / 2 ))
  [ "$ro" -gt 0 ] && [ "$wo" -gt 0 ] || fail "nbd-backing: no direct requests counted"
  kill "$(cat "$tmp/remote.pid")"
else
  echo "nbdkit not installed: no run on an nbd: backing"
fi
echo "ok"
