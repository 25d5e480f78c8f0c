#!/bin/bash
# contrib/grafana/foliod-dashboard.json: valid JSON whose every query
# names only metrics a live foliod serves at /metrics (metrics-listen);
# and the metrics it adds for it say something after a workload: the dirty
# thresholds in force, the time backing writes, backing flushes and client
# FLUSHes took.
. "$(dirname "$0")/lib.sh"
lib_init contrib-dashboard
requires curl nbdsh python3

dash=$TOP/contrib/grafana/foliod-dashboard.json
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
truncate -s 64M "$tmp/img"
start_foliod --metrics-listen "127.0.0.1:$port" --export \
  "disk0=file:$tmp/img,cache-size=32M,dirty-background=10,dirty-limit=20"
nbdsh -u "$(uri disk0)" -c '
for i in range(16):
    h.pwrite(b"d" * 65536, i * 65536)
h.flush()
h.pread(65536, 0)
' || fail "workload"
timeout 10 curl -sf -o "$tmp/metrics" "http://127.0.0.1:$port/metrics" || fail "GET /metrics"

# Every metric name in the dashboard's queries (expr, and the variable's
# definition and query).
python3 - "$dash" >"$tmp/names" <<'PY' || fail "the dashboard is not valid JSON with queries"
import json, re, sys
d = json.load(open(sys.argv[1]))
exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
assert exprs and all(p["targets"] for p in d["panels"])
for v in d["templating"]["list"]:
    if v["type"] == "query":
        exprs += [v["definition"], v["query"]["query"]]
print("\n".join(sorted(set(n for e in exprs for n in re.findall(r"foliod_[a-z_]+", e)))))
PY
[ -s "$tmp/names" ] || fail "no metric names in the dashboard"
while read -r name; do
  grep -Eq "^$name(\{| )" "$tmp/metrics" || fail "the dashboard names $name, which /metrics does not serve"
done <"$tmp/names"
echo "$(wc -l <"$tmp/names") metric names, all served"

# value NAME: the sample of export disk0.
value () { awk -v n="$1" '$1 == n "{export=\"disk0\"}" { print $2 }' "$tmp/metrics"; }
[ "$(value foliod_dirty_background_bytes)" -gt 0 ] || fail "no dirty-background threshold"
[ "$(value foliod_dirty_limit_bytes)" -gt "$(value foliod_dirty_background_bytes)" ] ||
  fail "dirty-limit not above dirty-background"
for m in foliod_backing_write_seconds_total foliod_backing_flush_seconds_total \
         foliod_flush_seconds_total; do
  python3 -c 'import sys; sys.exit(not float(sys.argv[1]) > 0)' "$(value $m)" ||
    fail "$m is $(value $m) after writes and a FLUSH"
done
[ "$(value foliod_backing_write_ops_total)" -ge 1 ] || fail "no backing write counted"
stop_foliod
echo OK
