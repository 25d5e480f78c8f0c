#!/bin/bash
# Readiness (Type=notify): a small NOTIFY_SOCKET listener sees READY=1 only
# once the export answers (checked at that very moment, with a backing that
# takes a while to open), STATUS= lines, STOPPING=1 on SIGTERM before the
# exit, and no READY=1 at all when start-up fails.
. "$(dirname "$0")/lib.sh"
lib_init service-notify
requires nbdinfo nbdkit python3

# A backing that is slow to open: nbdkit's delay filter on open.
kit_sock=$tmp/kit.sock
timeout 120 nbdkit -f -U "$kit_sock" --filter=delay memory 64M delay-open=1 \
  >"$tmp/nbdkit.log" 2>&1 &
track $!
SOCK=$kit_sock wait_for_socket "$kit_sock" 20

cat > "$tmp/notify.py" <<'PY'
# Usage: notify.py LOG EXPECT_READY FOLIOD ARGS...
# Plays systemd: listens on NOTIFY_SOCKET, starts foliod, and on READY=1
# checks at once that the export answers, then sends SIGTERM and waits for
# STOPPING=1 and the exit.
import os, signal, socket, subprocess, sys, time
log, expect_ready, argv = sys.argv[1], sys.argv[2] == "1", sys.argv[3:]
path = os.path.join(os.path.dirname(log), "notify.sock")
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.bind(path)
s.settimeout(1.0)
env = dict(os.environ, NOTIFY_SOCKET=path)
start = time.monotonic()
p = subprocess.Popen(argv, env=env, stderr=open(log, "a"))
msgs, ready_at, answered, stop_sent = [], None, None, None
def fail(msg):
    p.kill()
    print("FAIL:", msg, "messages:", msgs)
    sys.exit(1)
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    try:
        data = s.recv(4096).decode()
    except socket.timeout:
        if p.poll() is not None:
            break
        continue
    for line in data.split("\n"):
        msgs.append(line)
        if line == "READY=1" and ready_at is None:
            ready_at = time.monotonic() - start
            r = subprocess.run(["nbdinfo", "--size", os.environ["URI"]],
                               capture_output=True)
            answered = r.returncode == 0
            p.send_signal(signal.SIGTERM)
            stop_sent = True
        if line.startswith("MAINPID=") and int(line[8:]) != p.pid:
            fail("MAINPID %s is not foliod's pid %d" % (line, p.pid))
    if stop_sent and "STOPPING=1" in msgs:
        break
rc = p.wait(timeout=60)
# Datagrams sent just before the exit are still queued.
s.settimeout(0.2)
try:
    while True:
        msgs.extend(s.recv(4096).decode().split("\n"))
except socket.timeout:
    pass
if not expect_ready:
    if ready_at is not None:
        fail("READY=1 although start-up failed")
    if rc == 0:
        fail("failed start-up exited 0")
    print("OK: no READY, exit", rc)
    sys.exit(0)
if ready_at is None:
    fail("no READY=1 (exit %s)" % rc)
if not answered:
    fail("READY=1 before the export answered")
if ready_at < 1.0:
    fail("READY=1 after %.2f s, before the backing could be open" % ready_at)
if not any(m.startswith("STATUS=") for m in msgs):
    fail("no STATUS= line")
if "STOPPING=1" not in msgs:
    fail("no STOPPING=1 after SIGTERM")
if msgs.index("STOPPING=1") < msgs.index("READY=1"):
    fail("STOPPING=1 before READY=1")
if rc != 0:
    fail("exit status %d after SIGTERM" % rc)
print("OK: READY after %.2f s, messages %s" % (ready_at, msgs))
PY

export URI="nbd+unix:///disk0?socket=$tmp/sock"
timeout 120 python3 "$tmp/notify.py" "$tmp/foliod.log" 1 \
  "$FOLIOD" --foreground --unix "$tmp/sock" \
  --export "disk0=nbd+unix:///?socket=$kit_sock,connections=1" ||
  fail "notify protocol (log: $(cat "$tmp/foliod.log"))"
FOLIOD_LOG=$tmp/foliod.log check_sanitizer_log "$tmp/foliod.log"

# Start-up failure: no READY=1, non-zero exit.
rm -f "$tmp/notify.sock"
timeout 60 python3 "$tmp/notify.py" "$tmp/foliod-bad.log" 0 \
  "$FOLIOD" --foreground --unix "$tmp/sock2" \
  --export "disk0=file:$tmp/does-not-exist" ||
  fail "failed start-up (log: $(cat "$tmp/foliod-bad.log"))"
echo OK
