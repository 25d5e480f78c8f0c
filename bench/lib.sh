# bench/lib.sh: helpers shared by the bench scripts (sourced, bash).
#
# Every script: `. "$(dirname "$0")/lib.sh"; bench_init`.  bench_init makes
# a temp dir ($T), installs a trap that stops every server started through
# server_start, and sets the tunables below.
#
# Environment (all optional):
#   FOLIOD, PLUGIN, BUILD, TOP   the daemon, the nbdkit plugin and the
#                        build dir (default $TOP/build)
#   LOADGEN              the load generator (default $BUILD/bench/loadgen)
#   BENCH_SECONDS        seconds per measured run (default 20)
#   BENCH_SIZE           export size (default 1G)
#   BENCH_SHORT=1        smoke run: 3 s runs, 256M export, fewer ops
#   BENCH_TMPDIR         where the temp dir goes (default /var/tmp: a real
#                        disk, not tmpfs)
#   BENCH_KEEP=1         keep the temp dir (logs) after the run
#   BENCH_VERBOSE=1      print each measurement to stderr as it is made
#   BENCH_FOLIOD_ARGS    extra foliod options (e.g. "--workers 8")

TOP=${TOP:-$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)}
BUILD=${BUILD:-$TOP/build}
FOLIOD=${FOLIOD:-$BUILD/foliod}
PLUGIN=${PLUGIN:-$BUILD/nbdkit-folio-plugin.so}
LOADGEN=${LOADGEN:-$BUILD/bench/loadgen}
BENCHDIR=$TOP/bench
export PATH=/usr/bin:$PATH

if [ "${BENCH_SHORT:-0}" = 1 ]; then
  BENCH_SECONDS=${BENCH_SECONDS:-3}
  BENCH_SIZE=${BENCH_SIZE:-256M}
else
  BENCH_SECONDS=${BENCH_SECONDS:-20}
  BENCH_SIZE=${BENCH_SIZE:-1G}
fi
BENCH_FOLIOD_ARGS=${BENCH_FOLIOD_ARGS:-}
CLK_TCK=$(getconf CLK_TCK)

bench_pids=""

# Size with K/M/G suffix -> bytes.
to_bytes() {
  local v=$1 n u
  n=${v%%[KkMmGgTt]*}
  u=${v#"$n"}
  case $u in
    "") echo "$n" ;;
    [Kk]*) echo $((n << 10)) ;;
    [Mm]*) echo $((n << 20)) ;;
    [Gg]*) echo $((n << 30)) ;;
    [Tt]*) echo $((n << 40)) ;;
  esac
}

note() { echo "bench: $*" >&2; }
vnote() { [ "${BENCH_VERBOSE:-0}" = 1 ] && echo "bench: $*" >&2; return 0; }

bench_cleanup() {
  local p
  for p in $bench_pids; do
    kill -TERM "$p" 2>/dev/null || true
  done
  for p in $bench_pids; do
    timeout 60 tail --pid="$p" -f /dev/null 2>/dev/null || kill -KILL "$p" 2>/dev/null || true
  done
  if [ -n "${T:-}" ] && [ "${BENCH_KEEP:-0}" != 1 ]; then
    rm -rf "$T"
  elif [ -n "${T:-}" ]; then
    note "kept $T"
  fi
}

bench_init() {
  [ -x "$LOADGEN" ] || { note "no $LOADGEN: run make BUILD=$BUILD all"; exit 1; }
  command -v fio >/dev/null || { note "fio missing (scripts/install-deps)"; exit 1; }
  command -v nbdkit >/dev/null || { note "nbdkit missing"; exit 1; }
  T=$(mktemp -d "${BENCH_TMPDIR:-/var/tmp}/foliod-bench.XXXXXX")
  export TMPDIR=$T          # nbdkit's cache filter puts its cache file here
  trap bench_cleanup EXIT
  trap 'exit 130' INT TERM
  SIZE_BYTES=$(to_bytes "$BENCH_SIZE")
}

have_foliod() { [ -x "$FOLIOD" ]; }

# uri SOCKET [EXPORT]
uri() { echo "nbd+unix:///${2-disk0}?socket=$1"; }

# server_start NAME URI CMD... : start CMD in the background (logging to
# $T/NAME.log), wait until URI answers.  Sets SERVER_PID.  Returns 1 (with
# the log's tail on stderr) when the server does not come up.
server_start() {
  local name=$1 u=$2 i
  shift 2
  "$@" >"$T/$name.log" 2>&1 &
  SERVER_PID=$!
  bench_pids="$bench_pids $SERVER_PID"
  for i in $(seq 1 300); do
    if ! kill -0 "$SERVER_PID" 2>/dev/null; then
      note "$name failed to start: $(tail -n 3 "$T/$name.log" | tr '\n' ' ')"
      return 1
    fi
    if probe "$u"; then
      [ "$1" = "$FOLIOD" ] && wait_populated "$name" "$@"
      return 0
    fi
    sleep 0.1
  done
  note "$name did not answer on $u within 30 s: $(tail -n 3 "$T/$name.log" | tr '\n' ' ')"
  server_stop "$SERVER_PID"
  return 1
}

# wait_populated NAME CMD...: a foliod whose exports have the ram store
# (no store= in CMD) faults its cache memory in on a background thread
# once it listens, and logs when that is done: wait for it (60 s at most),
# so that no measurement pays for those page faults (they were 675 us of
# CPU per op in a 3 s run).
wait_populated() {
  local name=$1 i
  shift
  case "$*" in *store=*) return 0 ;; esac
  for i in $(seq 1 600); do
    grep -q -e "cache populated" -e "populate the cache" \
      -e "could be populated" -e "MADV_POPULATE_WRITE" "$T/$name.log" &&
      return 0
    sleep 0.1
  done
  note "$name: cache not populated after 60 s"
}

# server_stop PID: SIGTERM, wait (foliod writes dirty data back first).
server_stop() {
  local p=$1 rest="" q
  kill -TERM "$p" 2>/dev/null || true
  if ! timeout 300 tail --pid="$p" -f /dev/null 2>/dev/null; then
    note "pid $p did not exit after SIGTERM, killing"
    kill -KILL "$p" 2>/dev/null || true
  fi
  wait "$p" 2>/dev/null || true
  for q in $bench_pids; do [ "$q" = "$p" ] || rest="$rest $q"; done
  bench_pids=$rest
}

# cpu_ticks PID: user+system clock ticks of the process (all threads).
cpu_ticks() {
  local s
  s=$(cat "/proc/$1/stat" 2>/dev/null) || { echo 0; return; }
  s=${s##*) }                      # the comm field may hold spaces
  set -- $s
  echo $(( ${12} + ${13} ))        # fields 14 and 15 of stat
}

# runq_ns PID: nanoseconds the process's live threads have spent runnable
# but waiting for a CPU (the second field of each thread's schedstat; the
# threads that have exited are not counted).
runq_ns() {
  cat /proc/"$1"/task/*/schedstat 2>/dev/null | awk '{ s += $2 } END { printf "%.0f", s }'
}

# Random image of N bytes (urandom, 1 MiB blocks).
make_random_image() {
  local path=$1 bytes=$2
  head -c "$bytes" /dev/urandom >"$path"
}

# fill_export URI IMAGE: copy IMAGE onto the export.
fill_export() {
  nbdcopy --flush "$2" "$1"
}

# flush_export URI: one NBD flush (between workloads; not measured).
flush_export() {
  "$LOADGEN" --flush-only "$1" || note "flush of $1 failed"
}

# probe URI: true when the export answers (also over TLS: loadgen accepts
# tls-certificates= in the URI, nbdinfo does not).
probe() {
  "$LOADGEN" --mode seqread --bs 512 --ops 1 --qd 1 "$1" >/dev/null 2>&1
}

# warm_export URI: read the whole export once (1 MiB sequential, qd 8).
# Not fatal: the measurements that follow show a broken server.
warm_export() {
  "$LOADGEN" --mode seqread --bs 1M --qd 8 --ops $((SIZE_BYTES >> 20)) "$1" >/dev/null ||
    note "warm pass on $1 failed"
}

# run_fio JOBFILE URI [VAR=VALUE...]: run a fio job on URI with the
# BENCH_* variables in its environment; prints "ops iops bytes_per_s"
# summed over its jobs.  Its JSON report stays in $T/fio.json (for
# fio_sync_lat_ms) until the next run.
run_fio() {
  local job=$1 u=$2 out=$T/fio.json
  shift 2
  if ! env NBD_URI="$u" BENCH_SECONDS="$BENCH_SECONDS" BENCH_SIZE="$BENCH_SIZE" "$@" \
      fio --output-format=json --output="$out" "$job" >"$T/fio.stdout" 2>&1; then
    note "fio $job failed: $(tail -n 3 "$T/fio.stdout" | tr '\n' ' ')"
    return 1
  fi
  python3 - "$out" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))
ops = iops = bw = 0
err = 0
for job in j["jobs"]:
    err |= job.get("error", 0)
    for d in ("read", "write", "trim"):
        ops += job[d]["total_ios"]
        iops += job[d]["iops"]
        bw += job[d]["bw_bytes"]
if err:
    sys.exit(1)
print(ops, round(iops), bw)
EOF
}

# fio_sync_lat_ms PCT: the PCT (50, 99) percentile of the flush (fsync)
# latency of the last run_fio, in ms; n/a when it had none.
fio_sync_lat_ms() {
  python3 - "$T/fio.json" "$1" <<'EOF'
import json, sys
try:
    j = json.load(open(sys.argv[1]))
    p = j["jobs"][0]["sync"]["lat_ns"]["percentile"]["%.6f" % float(sys.argv[2])]
    print("%.3f" % (p / 1e6))
except (OSError, ValueError, KeyError, IndexError):
    print("n/a")
EOF
}

# set_rate BITS LINK_URI: change the bandwidth of a link started with
# rate-file=$T/rate (the rate filter rereads the file; give it a moment),
# then empty its token bucket (2 s of burst at the new rate, which would
# flatter short runs) by reading and writing 2.5 s worth of data straight
# through the link (the filter keeps one bucket per direction; the data
# written is random over random, and the server under test never reads it
# back).  Sets DRAIN_WRITTEN (bytes written to empty the bucket).
set_rate() {
  local bits ops
  echo "$1" >"$T/rate.new"
  mv "$T/rate.new" "$T/rate"
  sleep 2
  bits=$(to_bytes "$1")
  ops=$(( bits / 8 * 5 / 2 / 1048576 + 1 ))
  "$LOADGEN" --mode seqread --bs 1M --qd 4 --ops "$ops" "$2" >/dev/null &&
  "$LOADGEN" --mode seqwrite --bs 1M --qd 4 --ops "$ops" "$2" >/dev/null ||
    note "emptying the link's buckets failed"
  DRAIN_WRITTEN=$(( ops * 1048576 ))
}

# run_loadgen URI ARGS...: prints "ops iops bytes_per_s flushes".
run_loadgen() {
  local u=$1 line
  shift
  if ! line=$("$LOADGEN" "$@" "$u" 2>"$T/loadgen.err"); then
    note "loadgen $* failed: $(tail -n 3 "$T/loadgen.err" | tr '\n' ' ')"
    return 1
  fi
  vnote "loadgen: $line"
  echo "$line" | awk '{
    for (i = 1; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
    printf "%s %s %.0f %s\n", v["ops"], v["ops_per_s"], v["mb_per_s"] * 1e6, v["flushes"]
  }'
}

# Results: RES[workload.server]=value, CPU[workload.server]=us/op,
# RUNQ[workload.server]=the server's threads waiting for a CPU, on average
# over the run (runq_ns).
declare -A RES CPU OPS RUNQ

# measure WORKLOAD SERVER PID UNIT CMD...: run CMD (run_fio or run_loadgen),
# store its IOPS (UNIT=iops) or MB/s (UNIT=mbps) and the server's CPU
# microseconds per operation.
# BENCH_PERF=1: record each measurement of a BENCH_PERF_SERVERS server
# (foliod nbdkit_folio nbdkit_memory) with perf and print its top functions
# (self time) on stderr once it ends.  perf costs the server CPU: the
# figures of such a run are for the profiles only.
PERF_PID=""
perf_start() {
  local wl=$1 srv=$2 pid=$3
  [ "${BENCH_PERF:-0}" = 1 ] || return 0
  case " ${BENCH_PERF_SERVERS:-foliod nbdkit_folio nbdkit_memory} " in
  *" $srv "*) ;;
  *) return 0 ;;
  esac
  PERF_TAG="$wl $srv"
  PERF_DATA=$T/perf.$wl.$srv.data
  perf record -q -g -p "$pid" -o "$PERF_DATA" 2>/dev/null &
  PERF_PID=$!
  sleep 0.2
}
perf_stop() {
  [ -n "$PERF_PID" ] || return 0
  kill -INT "$PERF_PID" 2>/dev/null || true
  wait "$PERF_PID" 2>/dev/null || true
  PERF_PID=""
  echo "bench: perf top functions, $PERF_TAG (self %):" >&2
  perf report -i "$PERF_DATA" --no-children --stdio --sort symbol \
    --percent-limit 1.5 -g none 2>/dev/null |
    awk '/^ *[0-9.]+%/ { printf "bench:   %8s %s %s\n", $1, $2, $3 }' | head -15 >&2
  # By object: how much is the kernel's, the server's own, the cache's.
  echo "bench: perf by object, $PERF_TAG (self %):" >&2
  perf report -i "$PERF_DATA" --no-children --stdio --sort dso \
    --percent-limit 1 -g none 2>/dev/null |
    awk '/^ *[0-9.]+%/ { printf "bench:   %8s %s\n", $1, $2 }' | head -8 >&2
  rm -f "$PERF_DATA"
}

measure() {
  local wl=$1 srv=$2 pid=$3 unit=$4 c0 c1 q0 q1 t0 t1 out ops iops bw
  shift 4
  q0=$(runq_ns "$pid")
  t0=$(date +%s%N)
  c0=$(cpu_ticks "$pid")
  perf_start "$wl" "$srv" "$pid"
  if ! out=$("$@"); then
    perf_stop
    [ -n "${RES[$wl.$srv]:-}" ] || RES[$wl.$srv]=fail
    return 0
  fi
  c1=$(cpu_ticks "$pid")
  q1=$(runq_ns "$pid")
  t1=$(date +%s%N)
  perf_stop
  read -r ops iops bw _ <<<"$out"
  local val cpu old=${RES[$wl.$srv]:-}
  if [ "$unit" = iops ]; then
    val=$iops
  else
    val=$(awk -v b="$bw" 'BEGIN { printf "%.1f", b / 1e6 }')
  fi
  cpu=$(awk -v t=$((c1 - c0)) -v hz="$CLK_TCK" -v n="$ops" \
    'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "n/a" }')
  vnote "$wl $srv $val $unit cpu_us_per_op=$cpu"
  # Repeated measurements (rounds): keep the best.
  if [ -n "$old" ] && [ "$old" != fail ] &&
     awk -v a="$val" -v b="$old" 'BEGIN { exit !(a + 0 <= b + 0) }'; then
    return 0
  fi
  RES[$wl.$srv]=$val
  CPU[$wl.$srv]=$cpu
  OPS[$wl.$srv]=$ops
  RUNQ[$wl.$srv]=$(awk -v q=$((q1 - q0)) -v t=$((t1 - t0)) \
    'BEGIN { if (t > 0) printf "%.2f", q / t; else print "n/a" }')
}

# ratio A B: A/B with two decimals, n/a unless both are numbers.
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    if (a ~ /^[0-9.]+$/ && b ~ /^[0-9.]+$/ && b + 0 > 0) printf "%.2f", a / b
    else printf "n/a" }'
}

# print_line WORKLOAD UNIT RATIOS SERVERS...: one result line plus one CPU
# line.  RATIOS is a list of A:B (printed as ratio_A_vs_B, or ratio_vs_B
# when A is foliod).
print_line() {
  local wl=$1 unit=$2 ratios=$3 s r a b name line cline
  shift 3
  line="$wl unit=$unit"
  cline="${wl}_cpu_us_per_op"
  for s in "$@"; do
    line="$line $s=${RES[$wl.$s]:-n/a}"
    cline="$cline $s=${CPU[$wl.$s]:-n/a}"
  done
  for r in $ratios; do
    a=${r%%:*} b=${r#*:}
    name=ratio_${a}_vs_$b
    [ "$a" = foliod ] && name=ratio_vs_$b
    line="$line $name=$(ratio "${RES[$wl.$a]:-}" "${RES[$wl.$b]:-}")"
  done
  echo "$line"
  echo "$cline"
}

# make_pki DIR: a CA and a server certificate in the layout qemu, nbdkit
# and foliod read (ca-cert.pem, server-cert.pem, server-key.pem).
make_pki() {
  local d=$1
  mkdir -p "$d"
  (
    cd "$d" &&
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca-key.pem -out ca-cert.pem \
      -days 2 -subj /CN=foliod-bench-ca \
      -addext basicConstraints=critical,CA:TRUE \
      -addext keyUsage=critical,keyCertSign,cRLSign &&
    openssl req -newkey rsa:2048 -nodes -keyout server-key.pem -out server.csr \
      -subj /CN=localhost &&
    printf '%s\n' 'subjectAltName=DNS:localhost,IP:127.0.0.1' \
      'extendedKeyUsage=serverAuth' 'keyUsage=critical,digitalSignature,keyEncipherment' \
      >server.ext &&
    openssl x509 -req -in server.csr -CA ca-cert.pem -CAkey ca-key.pem \
      -CAcreateserial -out server-cert.pem -days 2 -extfile server.ext
  ) >"$d/openssl.log" 2>&1
}

# stats_bytes FILE OP: bytes of OP (read, write, ...) in an nbdkit stats
# filter file ("read: 136 ops, 0.000230 s, 3.16 MiB, ..."); 0 if absent.
stats_bytes() {
  awk -v op="$2" '
    $1 == op ":" {
      split($0, f, ", ")
      n = split(f[3], v, " ")
      m = v[1]; u = v[2]
      if (u == "KiB") m *= 1024
      else if (u == "MiB") m *= 1048576
      else if (u == "GiB") m *= 1073741824
      else if (u == "TiB") m *= 1099511627776
      printf "%.0f\n", m; found = 1 }
    END { if (!found) print 0 }' "$1"
}

# stats_ops FILE OP: request count of OP in an nbdkit stats file.
stats_ops() {
  awk -v op="$2" '$1 == op ":" { print $2; found = 1 } END { if (!found) print 0 }' "$1"
}

# foliod_metric CONTROL_SOCKET NAME: a foliod counter (Prometheus name),
# summed over exports; 0 when the daemon does not answer.
foliod_metric() {
  "$FOLIOD" stats --control "$1" --prometheus 2>/dev/null |
    awk -v n="$2" '$1 == n || index($1, n "{") == 1 { s += $NF } END { printf "%.0f\n", s }'
}
