#!/bin/bash
# Moving an rbd volume between two foliods with kill -9 in the hand-off
# (issue 35 item 3).  One Ceph cluster, a few seeded rounds (the seed is
# printed; RELEASE_KILL_SEED=N replays it).  Each round:
#  - foliod A (its own state directory, a pmem or ssd store: a FLUSH is
#    answered by the store, so acknowledged data lives on A's host until
#    written back) serves rbd/img; a client writes versioned 4 KiB blocks
#    through A and FLUSHes after each batch, logging what it tried and
#    what a FLUSH acknowledged;
#  - `foliod release disk0` on A while that client still writes (the
#    client is moved: its writes get EPERM and it stops);
#  - in some rounds A is killed with SIGKILL at a random point of the
#    release (0 .. the release's duration, measured in the first round);
#    if the release had not returned, the operator's path (foliod(8) CEPH
#    RBD): make sure A is gone, break its lock (rbd lock rm), start A again
#    on its own store (it writes the store back), release again;
#  - foliod B (its own state directory and store) starts; in some rounds
#    it is killed with SIGKILL at a random point of its start and started
#    again on its store (its dead lock broken first);
#  - a client writes new versions through B with FLUSH; A, if it still
#    runs, serves the export read-only meanwhile and is stopped last;
#  - rbd export: every block holds its newest acknowledged version, or a
#    later one that was tried and not acknowledged: no acknowledged write
#    of A lost, none of A's older data over B's.
# RELEASE_KILL_SKIP_RESTART=1 leaves out the restart of A (B takes over
# after the lock is broken): the check then finds A's acknowledged writes
# lost whenever A was killed before its release wrote them back (e.g.
# with RELEASE_KILL_DELAY_MS=0, which fixes the delay of A's kills).
# The check is also seen to fail on the first round's image with the
# block B wrote last zeroed.
. "$(dirname "$0")/lib.sh"
lib_init release-rbd-kill
. "$(dirname "$0")/lib-ceph.sh"
requires nbdsh

seed=${RELEASE_KILL_SEED:-$(( $(date +%s%N) % 32768 ))}
echo "seed $seed (RELEASE_KILL_SEED=$seed replays it)"
RANDOM=$seed
rounds=4
blocks=256
ceph_up 16M
mkdir -p "$tmp/stA" "$tmp/stB"
keep_dirty="cache-size=4M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

# The client (run by nbdsh, h connected): batches of 1..8 writes of
# versioned blocks, each batch FLUSHed; "try B V TAG" before a write,
# "ack V" once a FLUSH covered every write up to version V, "err ..." and
# out at the first failure (EPERM once the release began, or A gone).
cat > "$tmp/client.py" <<'EOF'
import os, random
env = os.environ
log = open(env["CLOG"], "a", buffering=1)
rng = random.Random(int(env["CSEED"]))
nb, ver, tag = int(env["CBLOCKS"]), int(env["CVER"]), env["CTAG"]
for i in range(int(env["CBATCHES"])):
    try:
        for _ in range(rng.randint(1, 8)):
            b = rng.randrange(nb)
            ver += 1
            log.write("try %d %d %s\n" % (b, ver, tag))
            s = ("%s b%04d v%08d|" % (tag, b, ver)).encode()
            h.pwrite((s * (4096 // len(s) + 1))[:4096], b * 4096)
        h.flush()
        log.write("ack %d\n" % ver)
    except nbd.Error as e:
        log.write("err %s\n" % e)
        break
EOF

# The check: rbd/img against the clients' logs.
cat > "$tmp/check.py" <<'EOF'
import re, sys
image, nb, logs = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
tried = {}                      # block -> [(ver, tag)]
acked = {}                      # block -> newest acknowledged version
for name in logs:
    pending = []
    for line in open(name):
        w = line.split()
        if w[0] == "try":
            b, v = int(w[1]), int(w[2])
            tried.setdefault(b, []).append((v, w[3]))
            pending.append((b, v))
        elif w[0] == "ack":
            for b, v in pending:
                acked[b] = max(acked.get(b, 0), v)
            pending = []
bad = 0
data = open(image, "rb").read(nb * 4096)
for b in range(nb):
    blk = data[b * 4096:(b + 1) * 4096]
    newest = acked.get(b, 0)
    allowed = {v: t for v, t in tried.get(b, []) if v >= newest}
    if blk == bytes(4096):
        got = 0
    else:
        m = re.match(rb"(\S+) b(\d{4}) v(\d{8})\|", blk)
        got = int(m.group(3)) if m else -1
        s = m.group(0) if m else b""
        if not m or int(m.group(2)) != b or \
           blk != (s * (4096 // len(s) + 1))[:4096]:
            got = -1
    if got == newest or (got in allowed and got != 0):
        continue
    bad += 1
    if bad <= 10:
        print("block %d: holds %s, newest acknowledged %d %s, later tried %s"
              % (b, "zeroes" if got == 0 else "garbage" if got < 0 else
                 "version %d" % got, newest,
                 "(%s)" % allowed.get(newest, "") if newest else "(none)",
                 sorted(v for v in allowed if v > newest)))
print("%d blocks checked, %d acknowledged, %d wrong"
      % (nb, len(acked), bad))
sys.exit(1 if bad else 0)
EOF

# client LOG TAG VER BATCHES SOCKET SEED: the client; BATCHES=0 runs until
# a write fails.
client () {
  local n=$4
  [ "$n" = 0 ] && n=1000000
  CLOG=$1 CTAG=$2 CVER=$3 CBATCHES=$n CSEED=$6 \
    CBLOCKS=$blocks nbdsh -u "$(uri disk0 "$5")" \
    -c "exec(open('$tmp/client.py').read())"
}

now_ms () { echo $(( $(date +%s%N) / 1000000 )); }

# acks LOG: how many FLUSHes the log says were acknowledged.
acks () { grep -c '^ack' "$1" 2>/dev/null || true; }

# start_a STORE: foliod A on its store; A_PID is its (wrapper's) pid.
start_a () {
  SOCK_PATH=$tmp/sockA start_foliod --pidfile "$tmp/pidA" --state-dir "$tmp/stA" \
    --control "$tmp/ctlA" --export "disk0=$(rbd_backing),store=$1,$keep_dirty"
  A_PID=$FOLIOD_PID
}

# stop_a: SIGTERM A if it runs (released: it writes nothing back).
stop_a () {
  [ -n "$A_PID" ] || return 0
  FOLIOD_PID=$A_PID
  stop_foliod
  A_PID=
}

# break_dead_lock: after a kill -9, the dead foliod's lock (if it held
# one) is broken by hand, as foliod(8) says, once it is gone.
break_dead_lock () {
  if rbd_cmd lock ls rbd/img | grep -q "exclusive lock"; then
    echo "the dead foliod held the lock: rbd lock rm"
    "$CLUSTER" break-locks "$CEPH_DIR" || fail "rbd lock rm"
  fi
}

release_ms=1000 b_start_ms=1000
for ((r = 1; r <= rounds; r++)); do
  kind=ssd; ((RANDOM % 2)) && kind=pmem
  if ((r == 1)); then kill=none; elif ((RANDOM % 3)); then kill=A; else kill=B; fi
  storeA=$kind:$tmp/stA/r$r.store
  storeB=ssd:$tmp/stB/r$r.log
  echo "--- round $r: store=$kind, kill -9 of $kill"

  start_a "$storeA"
  : > "$tmp/logA$r"
  client "$tmp/logA$r" "A$r" $((r * 1000000)) 0 "$tmp/sockA" $RANDOM &
  cpid=$!
  i=0
  while [ "$(acks "$tmp/logA$r")" -lt 5 ] && ((i++ < 300)); do
    kill -0 "$cpid" 2>/dev/null || fail "the client through A stopped: $(tail -1 "$tmp/logA$r")"
    sleep 0.1
  done
  [ "$(acks "$tmp/logA$r")" -ge 5 ] || fail "the client through A is stuck"

  t0=$(now_ms)
  "$FOLIOD" release disk0 --control "$tmp/ctlA" > "$tmp/release.out" 2>&1 &
  rpid=$!
  if [ "$kill" = A ]; then
    delay=$(( RANDOM % (release_ms * 12 / 10 + 1) ))
    delay=${RELEASE_KILL_DELAY_MS:-$delay}
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    echo "kill -9 of A ${delay} ms into its release"
    FOLIOD_PID=$A_PID kill9_foliod "$tmp/pidA"
    A_PID=
  fi
  wait "$rpid" || true
  ((r == 1)) && release_ms=$(( $(now_ms) - t0 ))
  wait "$cpid" || true
  echo "A: $(acks "$tmp/logA$r") FLUSHes acknowledged, then $(tail -1 "$tmp/logA$r")"
  cat "$tmp/release.out"
  if grep -q "released" "$tmp/release.out"; then
    echo "A's release returned"
  else
    [ "$kill" = A ] || fail "A's release failed"
    break_dead_lock
    if [ -z "${RELEASE_KILL_SKIP_RESTART:-}" ]; then
      echo "A's release did not return: A restarts on its store, releases again"
      start_a "$storeA"
      "$FOLIOD" release disk0 --control "$tmp/ctlA" || fail "A's second release"
    fi
  fi

  argsB=(--pidfile "$tmp/pidB" --state-dir "$tmp/stB"
    --export "disk0=$(rbd_backing),store=$storeB,cache-size=4M")
  if [ "$kill" = B ]; then
    delay=$(( RANDOM % (b_start_ms * 12 / 10 + 1) ))
    rm -f "$tmp/pidB"
    "$FOLIOD" --foreground --unix "$tmp/sockB" "${argsB[@]}" >>"$tmp/b.log" 2>&1 &
    bpid=$!
    track "$bpid"
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    echo "kill -9 of B ${delay} ms into its start"
    kill -KILL "$bpid" 2>/dev/null || true
    { wait "$bpid"; } 2>/dev/null || true
    break_dead_lock
  fi
  t0=$(now_ms)
  SOCK_PATH=$tmp/sockB start_foliod "${argsB[@]}"
  ((r == 1)) && b_start_ms=$(( $(now_ms) - t0 ))
  : > "$tmp/logB$r"
  client "$tmp/logB$r" "B$r" $((r * 1000000 + 500000)) 10 "$tmp/sockB" $RANDOM ||
    fail "the client through B"
  grep -q '^err' "$tmp/logB$r" && fail "a write through B failed: $(tail -1 "$tmp/logB$r")"
  stop_foliod
  stop_a

  rm -f "$tmp/image"
  rbd_cmd export --no-progress rbd/img "$tmp/image" || fail "rbd export"
  logs=()
  for ((i = 1; i <= r; i++)); do logs+=("$tmp/logA$i" "$tmp/logB$i"); done
  python3 "$tmp/check.py" "$tmp/image" "$blocks" "${logs[@]}" ||
    fail "round $r (seed $seed): the image lost acknowledged writes or holds older ones"
  if ((r == 1)); then
    # The check can fail: the block B wrote last, zeroed in the image.
    b=$(grep '^try' "$tmp/logB1" | tail -1 | cut -d' ' -f2)
    dd if=/dev/zero of="$tmp/image" bs=4096 seek="$b" count=1 conv=notrunc status=none
    if python3 "$tmp/check.py" "$tmp/image" "$blocks" "${logs[@]}" > "$tmp/check.out"; then
      fail "the check passes an image that lost an acknowledged write"
    fi
    echo "(the check on a damaged copy: $(head -1 "$tmp/check.out"))"
  fi
done
echo "release took ${release_ms} ms, B's start ${b_start_ms} ms (round 1)"
echo OK
