#!/bin/bash
# The protocol fuzzer, briefly: builds the libFuzzer harness
# (tests/fuzz/fuzz-server.c: the real server, handshake and transmission,
# under ASan and UBSan) in build-fuzz/, checks that the recorded seed
# sessions get through the handshake into transmission, then fuzzes for
# FUZZ_SECONDS (default 45).  Fails on any crash, sanitizer report, leak or
# hang; the input that did it is left in build-fuzz/ (crash-*, leak-*,
# timeout-*).  make fuzz FUZZ_SECONDS=N runs longer.
. "$(dirname "$0")/lib.sh"
lib_init fuzz
requires clang

FB=$TOP/build-fuzz
make -C "$TOP" -s fuzz-build FUZZ_BUILD="$FB" >"$tmp/build.log" 2>&1 ||
  { tail -n 30 "$tmp/build.log" >&2; fail "cannot build the fuzzer"; }

# The seeds replay as the clients ran: export chosen, requests served; the
# inputs that once crashed the server (tests/fuzz/regress) no longer do.
FUZZ_LOG=1 "$FB/fuzz-server" "$TOP"/tests/fuzz/corpus/*.bin \
  "$TOP"/tests/fuzz/regress/*.bin >"$tmp/replay.log" 2>&1 ||
  { tail -n 40 "$tmp/replay.log" >&2; fail "a seed input crashes the server"; }
grep -q "export 'disk', structured replies, base:allocation" "$tmp/replay.log" ||
  fail "no seed reaches transmission with structured replies"
grep -q "export 'disk', extended headers, base:allocation" "$tmp/replay.log" ||
  fail "no seed reaches transmission with extended headers"
grep -q "NBD_CMD_DISC" "$tmp/replay.log" || fail "no seed session ends with NBD_CMD_DISC"

FUZZ_BUILD=$FB timeout $(( ${FUZZ_SECONDS:-45} + 120 )) \
  "$TOP/tests/fuzz/run-fuzz" "${FUZZ_SECONDS:-45}" >"$tmp/fuzz.log" 2>&1 || {
  grep -E -A 40 'ERROR|WARNING|SUMMARY|runtime error' "$tmp/fuzz.log" | head -n 80 >&2
  grep -E 'Test unit written to' "$tmp/fuzz.log" >&2 || true
  fail "the fuzzer found a crash"
}
grep -E '^#[0-9]+[[:space:]]+DONE|stat::number_of_executed_units|stat::average_exec_per_sec' \
  "$tmp/fuzz.log"
