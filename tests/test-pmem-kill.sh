#!/bin/bash
# kill -9 loop (issue 14): foliod with a pmem store on a regular file,
# 2-4 libnbd clients writing random unaligned ranges (512 B - 256 KiB)
# with and without FLUSH and FUA, SIGKILL at a random moment, a restart on
# the same store, and every write acknowledged before the kill reads back
# (tests/tools/pmem-kill.py says what "reads back" allows for writes still
# in flight).  After the rounds, SIGTERM: the backing file equals the
# model exactly.  The cache (4 MiB) is smaller than the export (16 MiB),
# so eviction and writeback run between the kills; about half of the
# starts let dirty data fill 90% of it (more to recover, dirty folios
# evicted under the writers), the others keep the default limits.
#
# PMEM_KILL_ROUNDS (100; make check-crash: 1000), PMEM_KILL_SEED=N replays
# one seed (printed first), STORE=ram runs the same loop on the ram store
# (it loses acknowledged writes: a demonstration that the test sees it),
# STORE=ssd on the SSD log store (only FLUSHed and FUA writes must survive
# there: tests/test-ssd-kill.sh).
. "$(dirname "$0")/lib.sh"
lib_init pmem-kill 64
[ -x /usr/bin/python3 ] && /usr/bin/python3 -c 'import nbd' 2>/dev/null ||
  skip "python3 with the libnbd module (python3-libnbd) not installed"

rounds=${PMEM_KILL_ROUNDS:-100}
seed=${PMEM_KILL_SEED:-$(od -An -N6 -tu8 /dev/urandom | tr -d ' ')}
echo "seed $seed (PMEM_KILL_SEED=$seed replays it), $rounds rounds"

img=$tmp/img
random_file "$img" 16
case ${STORE:-pmem} in
pmem) store=",store=pmem:$tmp/store" ;;
ssd)  store=",store=ssd:$tmp/store"     # keeps what FLUSH/FUA made durable
      # A log of 12 MiB (a file made beforehand is used at its size) for
      # the 4 MiB cache: the loop's writes fill it, so that kills land in
      # the middle of reclaims.
      truncate -s 12M "$tmp/store" ;;
ram)  store="" ;;
*)    fail "STORE=${STORE}: pmem, ssd or ram" ;;
esac
SOCK=$tmp/sock
FOLIOD_LOG=$tmp/foliod.log
driver=(/usr/bin/python3 "$TOP/tests/tools/pmem-kill.py" --socket "$SOCK"
        --backing "$img" --seed "$seed" --tscale "$TSCALE")
[ "${STORE:-pmem}" = ssd ] && driver+=(--flushed-only)

# The control: nbdkit's file plugin writes to the file before it replies,
# so a kill loses nothing it acknowledged; the model must agree.
if command -v nbdkit >/dev/null; then
  timeout --signal=KILL $(( 60 * TSCALE )) "${driver[@]}" --nbdkit-file \
    --rounds 5 --log "$tmp/nbdkit.log" ||
    fail "the model fails nbdkit file, which loses nothing (seed $seed)"
fi

# A round is at most ~0.7 s of writes plus a restart and a 16 MiB read
# back: 3 s each is far more than it takes.
timeout --signal=KILL $(( (rounds * 3 + 60) * TSCALE )) \
  "${driver[@]}" --foliod "$FOLIOD" --export "disk0=file:$img,cache-size=4M$store" \
  --vary ",dirty-background=50,dirty-limit=90" \
  --rounds "$rounds" --log "$FOLIOD_LOG" ||
  fail "kill -9 loop failed (seed $seed; see above)"
check_sanitizer_log "$FOLIOD_LOG"
if [ "${STORE:-pmem}" = ssd ]; then
  # The log went round: its start moved past the end of the ring, which
  # only a reclaim does between kills (a crash's restart keeps it).
  "$FOLIOD" store inspect "$tmp/store" > "$tmp/inspect" ||
    fail "store inspect: $(cat "$tmp/inspect")"
  lsn=$(sed -n 's/.*checkpoint at lsn \([0-9]*\) .*/\1/p' "$tmp/inspect")
  echo "log checkpoint at lsn ${lsn:-?} (12 MiB store)"
  [ "${lsn:-0}" -gt $((12 << 20)) ] ||
    fail "the kill loop never filled the log: no kill during a reclaim"
fi
echo "ok"
