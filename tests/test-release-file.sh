#!/bin/bash
# Moving a volume between hosts (issue 35 item 3): two foliods, each with
# its own state directory and store, on one file backing.
#  - while A serves the image, B is refused it (the image's locks);
#  - a client writes through A (left dirty in A's cache), then, on the
#    same connection, `foliod release disk0` on A: the command says it
#    released the export, A's log says so, the data is in the file;
#  - on that connection a write now fails (EPERM, as on a read-only
#    export) and reads go on; a new connection to A is read-only;
#  - B starts on the image, and reads what the client wrote through A;
#  - after B started and wrote, nothing of A's lands: writes through A are
#    refused, A's writeback counter does not move, A stops cleanly, and the
#    file holds B's data;
#  - a second release is refused; `release --stop` of another export
#    stops serving it (not found any more).
. "$(dirname "$0")/lib.sh"
lib_init release-file
requires nbdsh nbdinfo

img=$tmp/disk.img
img2=$tmp/disk2.img
truncate -s 64M "$img" "$img2"
mkdir -p "$tmp/stA" "$tmp/stB"
keep_dirty="cache-size=64M,dirty-expire=3600000,dirty-background=100,dirty-limit=100"

SOCK_PATH=$tmp/sockA start_foliod --state-dir "$tmp/stA" --control "$tmp/ctlA" \
  --export "disk0=file:$img,store=ssd:$tmp/stA/disk0.log,$keep_dirty" \
  --export "disk1=file:$img2,$keep_dirty"
A_PID=$FOLIOD_PID A_LOG=$FOLIOD_LOG A_SOCK=$SOCK
mv "$A_LOG" "$tmp/A.log"
A_LOG=$tmp/A.log
# (start_foliod appends to foliod.log: A's output keeps going to the file
# it was opened as, now A.log.)

start_refused "B while A holds the image" "$img: in use" \
  --state-dir "$tmp/stB" --export "disk0=file:$img"

# A client of A writes 4 MiB (no FLUSH), has the export released under it,
# and tries again.
cat > "$tmp/client.py" <<'EOF'
import errno, os, subprocess, sys, nbd
h = nbd.NBD()
h.connect_uri(os.environ["URI_A"])
assert not h.is_read_only(), "A's export starts read-only"
data = bytes((i * 7 + 1) % 251 for i in range(4 << 20))
h.pwrite(data, 1 << 20)
open(os.environ["TMP"] + "/dataA", "wb").write(data)
r = subprocess.run([os.environ["FOLIOD"], "release", "disk0", "--control",
                    os.environ["TMP"] + "/ctlA"], capture_output=True, text=True)
print("release:", r.returncode, r.stdout.strip(), r.stderr.strip())
if r.returncode != 0 or "released" not in r.stdout:
    sys.exit("release failed")
if "4194304 dirty bytes written back" not in r.stdout:
    sys.exit("the release did not write back the 4 MiB left dirty")
try:
    h.pwrite(b"\xee" * 4096, 0)
    sys.exit("a write through A succeeded after the release")
except nbd.Error as e:
    print("write after release:", e.string)
    if e.errno not in (errno.EPERM, "EPERM"):
        sys.exit("write after release: %s, not EPERM" % e.errno)
if h.pread(4 << 20, 1 << 20) != data:
    sys.exit("A reads other data after the release")
h.shutdown()
EOF
URI_A=$(uri disk0 "$A_SOCK") TMP=$tmp FOLIOD=$FOLIOD \
  timeout $(( 120 * TSCALE )) python3 "$tmp/client.py" \
  > "$tmp/client.out" 2>&1 || fail "client of A: $(cat "$tmp/client.out")"
cat "$tmp/client.out"
grep -q "export disk0: released" "$A_LOG" || fail "A's log does not say so: $(tail -5 "$A_LOG")"
cmp <(head -c $(( 5 << 20 )) "$img" | tail -c +$(( (1 << 20) + 1 ))) "$tmp/dataA" ||
  fail "the file does not hold what was written through A"

# A new connection to A: read-only.
nbdinfo "$(uri disk0 "$A_SOCK")" > "$tmp/infoA" || fail "nbdinfo A"
grep -q "is_read_only: true" "$tmp/infoA" || fail "A's export is not read-only: $(cat "$tmp/infoA")"

# B opens the image now and reads A's data.
SOCK_PATH=$tmp/sockB start_foliod --state-dir "$tmp/stB" --control "$tmp/ctlB" \
  --export "disk0=file:$img,store=ssd:$tmp/stB/disk0.log,cache-size=64M"
B_PID=$FOLIOD_PID B_SOCK=$SOCK
nbdsh -u "$(uri disk0 "$B_SOCK")" -c "
import sys
if h.pread(4 << 20, 1 << 20) != open('$tmp/dataA', 'rb').read():
    sys.exit('B reads other data than A wrote')
h.pwrite(b'\xbb' * (4 << 20), 1 << 20)
h.flush()
" || fail "B"

# Nothing of A's lands after B started.
wb_before=$(foliod_stat "$tmp/ctlA" foliod_writeback_bytes_total)
nbdsh -u "$(uri disk0 "$A_SOCK")" -c "
try:
    h.pwrite(b'\xaa' * 4096, 1 << 20)
    raise SystemExit('A accepted a write after B started')
except nbd.Error:
    pass
" 2>"$tmp/late.err" || fail "late write: $(cat "$tmp/late.err")"
"$FOLIOD" flush disk0 --control "$tmp/ctlA" || fail "foliod flush on A"
wb_after=$(foliod_stat "$tmp/ctlA" foliod_writeback_bytes_total)
[ "$wb_before" = "$wb_after" ] ||
  fail "A wrote back after the release: $wb_before -> $wb_after bytes"

# A second release of disk0 is refused; disk1 released with --stop.
if "$FOLIOD" release disk0 --control "$tmp/ctlA" 2>"$tmp/again.err"; then
  fail "a second release succeeded"
fi
grep -q "already released" "$tmp/again.err" || fail "second release: $(cat "$tmp/again.err")"
"$FOLIOD" release disk1 --stop --control "$tmp/ctlA" > "$tmp/stop.out" ||
  fail "release --stop"
grep -q "no longer served" "$tmp/stop.out" || fail "release --stop: $(cat "$tmp/stop.out")"
if nbdinfo "$(uri disk1 "$A_SOCK")" >/dev/null 2>&1; then
  fail "A still serves disk1 after release --stop"
fi
[ "$(foliod_stat "$tmp/ctlA" foliod_export_released disk0)" = 1 ] &&
  [ "$(foliod_stat "$tmp/ctlA" foliod_export_released disk1)" = 2 ] ||
  fail "foliod stats does not say released: $(grep released "$tmp/stats.prom")"
"$FOLIOD" stats --control "$tmp/ctlA" > "$tmp/table" || fail "foliod stats"
grep -q "disk0: released to another host (foliod release): served read-only" \
  "$tmp/table" || fail "the stats table does not say so: $(cat "$tmp/table")"

# A read-only export holds the image too (it shares no write): its
# release lets a writer in.
img3=$tmp/disk3.img
truncate -s 16M "$img3"
SOCK_PATH=$tmp/sockR start_foliod --state-dir "$tmp/stA" --control "$tmp/ctlR" \
  --export "ro=file:$img3,read-only=true"
R_PID=$FOLIOD_PID
start_refused "a writer next to a read-only export" "$img3: in use" \
  --state-dir "$tmp/stB" --export "rw=file:$img3"
"$FOLIOD" release ro --control "$tmp/ctlR" > "$tmp/ro.out" || fail "release ro"
grep -q "read-only export, nothing to write back; image released" "$tmp/ro.out" ||
  fail "release ro: $(cat "$tmp/ro.out")"
SOCK_PATH=$tmp/sockW start_foliod --state-dir "$tmp/stB" --export "rw=file:$img3"
stop_foliod
FOLIOD_PID=$R_PID stop_foliod

FOLIOD_PID=$A_PID FOLIOD_LOG=$A_LOG stop_foliod
FOLIOD_PID=$B_PID stop_foliod
cmp <(head -c $(( 5 << 20 )) "$img" | tail -c +$(( (1 << 20) + 1 ))) \
  <(head -c $(( 4 << 20 )) /dev/zero | tr '\0' '\273') ||
  fail "the file does not hold B's data at the end"
echo "release: A -> B handed over, no write of A after it"
