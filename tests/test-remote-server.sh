#!/bin/bash
# The server's client tests with a remote backing: test-server-nbdsh,
# -nbdinfo, -qemu and -nbdcopy (256 MiB) run unchanged, but every
# file:PATH export they configure is served by  nbdkit file PATH  on a Unix
# socket and foliod's backing becomes nbd+unix:///?socket=...  (a wrapper
# given to them as $FOLIOD).  Their checks of the backing file after
# SIGTERM then check what reached the remote.
. "$(dirname "$0")/lib.sh"
lib_init remote-server
. "$(dirname "$0")/lib-remote.sh"

wrapped=$tmp/wrapped.log
cat > "$tmp/foliod" <<'SH'
#!/bin/bash
# foliod, with each file:PATH export moved behind an nbdkit remote that
# lives as long as foliod (same pid: exec below; --exit-with-parent).
args=()
for a in "$@"; do
  if [[ $a =~ ^([^=,]+)=file:([^,]+)(,.*)?$ ]]; then
    name=${BASH_REMATCH[1]} path=${BASH_REMATCH[2]} opts=${BASH_REMATCH[3]}
    sock=$path.remote$$.sock
    ro=()
    [[ $opts == *read-only=true* ]] && ro=(-r)
    rm -f "$sock" "$sock.pid"
    # Own session: stop_foliod's SIGTERM to timeout(1) reaches its whole
    # process group, and the remote must outlive foliod's final writeback.
    setsid nbdkit -f --exit-with-parent -U "$sock" -P "$sock.pid" "${ro[@]}" file "$path" &
    for ((i = 0; i < 200; i++)); do
      [ -s "$sock.pid" ] && break
      sleep 0.1
    done
    [ -s "$sock.pid" ] || { echo "remote for $name did not start" >&2; exit 1; }
    echo "$name $path" >> "$WRAPPED_LOG"
    a="$name=nbd+unix:///?socket=$sock$opts"
  fi
  args+=("$a")
done
exec "$REAL_FOLIOD" "${args[@]}"
SH
chmod +x "$tmp/foliod"

for t in ${REMOTE_SERVER_TESTS:-nbdsh nbdinfo qemu nbdcopy}; do
  script=$TOP/tests/test-server-$t.sh
  [ -x "$script" ] || fail "missing $script"
  before=0
  [ -f "$wrapped" ] && before=$(wc -l < "$wrapped")
  start=$(date +%s)
  rc=0
  REAL_FOLIOD=$FOLIOD FOLIOD=$tmp/foliod WRAPPED_LOG=$wrapped NBDCOPY_MIB=256 \
    timeout $((300 * TSCALE)) "$script" > "$tmp/$t.log" 2>&1 || rc=$?
  if [ "$rc" -ne 0 ]; then
    tail -n 40 "$tmp/$t.log"
    [ "$rc" -eq 77 ] && skip "test-server-$t.sh skipped"
    fail "test-server-$t.sh with a remote backing (exit $rc)"
  fi
  after=$(wc -l < "$wrapped")
  [ "$after" -gt "$before" ] || fail "test-server-$t.sh started no remote"
  echo "test-server-$t.sh: passed over nbd+unix ($((after - before)) remote(s), $(( $(date +%s) - start )) s)"
  grep -E '^copy in' "$tmp/$t.log" || true
done
echo OK
