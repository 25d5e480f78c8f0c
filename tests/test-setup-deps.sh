#!/bin/bash
# scripts/install-deps: "make run" installs only what builds and runs
# foliod, "make check" the test toolchain too; apt's lock is waited for
# (bounded), not a reason to give up.  apt-get and dpkg-query are fakes on
# PATH here: nothing is installed.
. "$(dirname "$0")/lib.sh"
lib_init setup-deps
deps=$TOP/scripts/install-deps

# The sets: run holds none of the test toolchain, check holds all of run.
run=$("$deps" --list run) || fail "install-deps --list run"
check=$("$deps" --list check) || fail "install-deps --list check"
for p in qemu-system-x86 linux-image-amd64 clang llvm cppcheck clang-tidy \
         valgrind lintian debhelper libcmocka-dev fio; do
  grep -qx "$p" <<<"$run" && fail "run set holds the test package $p"
  grep -qx "$p" <<<"$check" || fail "check set lacks $p"
done
for p in $run; do
  grep -qx "$p" <<<"$check" || fail "check set lacks run package $p"
done
# Every library foliod links comes from a package of the run set.
for pc in libnbd libpmem2 zlib openssl libmicrohttpd; do
  f=$(pkg-config --variable=pcfiledir "$pc")/$pc.pc
  owner=$(dpkg -S "$f" 2>/dev/null | head -n1 | cut -d: -f1)
  [ -n "$owner" ] || continue      # not from a package here: nothing to check
  grep -qx "$owner" <<<"$run" || fail "$pc ($owner) is not in the run set"
done
owner=$(dpkg -S /usr/include/ev.h | cut -d: -f1)
grep -qx "$owner" <<<"$run" || fail "libev ($owner) is not in the run set"
grep -q '^run: deps-run$' "$TOP/Makefile" || fail "make run does not use the run set"

# The lock: a fake apt whose lists lock is held for the first two updates.
mkdir "$tmp/bin"
cat >"$tmp/bin/dpkg-query" <<'FAKE'
#!/bin/sh
echo "unknown ok not-installed"
FAKE
cat >"$tmp/bin/apt-get" <<FAKE
#!/bin/sh
echo "apt-get \$*" >>"$tmp/calls"
case " \$* " in
  *" update "*)
    n=\$(grep -c " update" "$tmp/calls")
    if [ "\$n" -le 2 ]; then
      echo "E: Could not get lock /var/lib/apt/lists/lock. It is held by process 1 (apt-get)" >&2
      exit 100
    fi ;;
esac
exit 0
FAKE
chmod +x "$tmp/bin/"*
PATH=$tmp/bin:$PATH FOLIOD_APT_LOCK_TIMEOUT=120 FOLIOD_APT_RETRY=1 \
  "$deps" run >"$tmp/out" 2>&1 || { cat "$tmp/out"; fail "install-deps gave up on a held lock"; }
cat "$tmp/out"
[ "$(grep -c ' update' "$tmp/calls")" = 3 ] || fail "update not retried until the lock was free"
grep -q -- "-o DPkg::Lock::Timeout=120 install" "$tmp/calls" ||
  fail "apt-get install does not wait for the dpkg lock"
grep -q "waiting up to 120s" "$tmp/out" || fail "install-deps does not say it waits"
# It installs the run set only.
grep " install " "$tmp/calls" | grep -q qemu-system-x86 && fail "run installs qemu-system-x86"
echo OK
