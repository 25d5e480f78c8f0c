#!/bin/bash
# nbdkit-folio-filter in front of nbdkit's curl plugin (issue 36: "in front
# of memory, file, nbd and curl plugins"): a 16 MiB image served over HTTP
# by a small range-capable server of the test's own on loopback, read
# through `nbdkit --filter=folio curl URL`.  A user checks that the data
# is the image's, byte for byte, twice, and that the second pass is served
# by the cache: the HTTP server counts the range requests it answered, and
# the second pass must add none.  With `nbdkit -r` a write is refused;
# without it (the curl plugin offers writes as HTTP PUT, which this server
# refuses) a write is cached and the FLUSH after it fails.
. "$(dirname "$0")/lib.sh"
filter_init filter-curl
requires nbdsh python3
[ -e "$(nbdkit --dump-config | sed -n 's/^plugindir=//p')/nbdkit-curl-plugin.so" ] ||
  skip "nbdkit's curl plugin is not installed"

head -c 16M /dev/urandom > "$tmp/img"
cat > "$tmp/range-server.py" <<'EOF2'
# A static file server with Range support (nbdkit's curl plugin reads
# with ranges); it counts the ranged GETs it answered in COUNT.
import http.server, os, re, sys
PATH, COUNT = sys.argv[1], sys.argv[2]
n = 0
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def head(self, body):
        size = os.path.getsize(PATH)
        m = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if m:
            a = int(m.group(1)); b = min(int(m.group(2) or size - 1), size - 1)
            self.send_response(206)
            self.send_header("Content-Range", "bytes %d-%d/%d" % (a, b, size))
        else:
            a, b = 0, size - 1
            self.send_response(200)
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(b - a + 1))
        self.end_headers()
        return a, b, bool(m)
    def do_HEAD(self):
        self.head(False)
    def do_GET(self):
        global n
        a, b, ranged = self.head(True)
        with open(PATH, "rb") as f:
            f.seek(a); self.wfile.write(f.read(b - a + 1))
        if ranged:
            n += 1
            with open(COUNT, "w") as c: c.write(str(n))
s = http.server.HTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
EOF2
echo 0 > "$tmp/count"
python3 "$tmp/range-server.py" "$tmp/img" "$tmp/count" > "$tmp/port" 2>"$tmp/range-server.log" &
track $!
for i in $(seq $((600 * TSCALE))); do [ -s "$tmp/port" ] && break; sleep 0.1; done
port=$(cat "$tmp/port")
[ -n "$port" ] || fail "the HTTP server did not start"

cat > "$tmp/read.py" <<'EOF2'
import os, sys
img = open(os.environ["IMG"], "rb").read()
count = lambda: int(open(os.environ["COUNT"]).read())
def whole():
    return b"".join(h.pread(1 << 20, off) for off in range(0, len(img), 1 << 20))
assert h.get_size() == len(img), "size %d" % h.get_size()
assert whole() == img, "first pass differs from the image"
first = count()
assert whole() == img, "second pass differs from the image"
second = count() - first
print("HTTP range requests: first pass %d, second pass %d" % (first, second))
assert first > 0, "the first pass made no HTTP request"
assert second == 0, "the second pass went to HTTP: %d requests" % second
try:
    h.pwrite(b"x" * 4096, 0)
    sys.exit("a write to a read-only (-r) export succeeded")
except nbd.Error as e:
    print("write refused:", e.errno)
EOF2
# Writable (no -r): nbdkit's curl plugin says it can write (an HTTP PUT),
# which this server refuses (501).  A write lands in the cache; the FLUSH
# after it must fail, never report durable what the server refused.
cat > "$tmp/write.py" <<'EOF2'
h.pwrite(b"x" * 4096, 0)
try:
    h.flush()
    raise SystemExit("FLUSH succeeded though the HTTP server refused the write")
except nbd.Error as e:
    print("flush failed as it must:", e.errno)
EOF2
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" IMG="$tmp/img" COUNT="$tmp/count" \
  nbdkit -r -U - --filter="$FILTER" curl "http://127.0.0.1:$port/img" \
  cache-size=32M \
  --run 'env -u LD_PRELOAD nbdsh -u "$uri" -c "exec(open(\"'"$tmp/read.py"'\").read())"' \
  >"$tmp/out" 2>"$tmp/log" ||
  { cat "$tmp/out" "$tmp/log"; fail "folio filter over curl"; }
cat "$tmp/out"
check_sanitizer_log "$tmp/log"
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" \
  nbdkit -U - --filter="$FILTER" curl "http://127.0.0.1:$port/img" \
  cache-size=32M \
  --run 'env -u LD_PRELOAD nbdsh -u "$uri" -c "exec(open(\"'"$tmp/write.py"'\").read())"' \
  >"$tmp/wout" 2>"$tmp/wlog" ||
  { cat "$tmp/wout" "$tmp/wlog"; fail "folio filter over a curl export that refuses writes"; }
cat "$tmp/wout"
echo OK
