#!/bin/bash
# make install DESTDIR=...: the installed daemon and nbdkit plugin work from
# there, man pages render, units point at the installed paths, an existing
# config is never overwritten; make uninstall removes everything it put
# there (a modified config is kept, and said so).
. "$(dirname "$0")/lib.sh"
lib_init service-install
requires nbdinfo nbdkit man

dest=$tmp/root
prefix=/usr/local
mk () { timeout 300 make -s -C "$TOP" BUILD="$BUILD" SAN="${SAN:-}" DESTDIR="$dest" PREFIX=$prefix "$@"; }
mk install >"$tmp/install.log" 2>&1 || fail "make install: $(cat "$tmp/install.log")"

bin=$dest$prefix/sbin/foliod
plugindir=$(pkg-config --variable=plugindir nbdkit 2>/dev/null)
plugin=$dest${plugindir:-/usr/lib/x86_64-linux-gnu/nbdkit/plugins}/nbdkit-folio-plugin.so
conf=$dest$prefix/etc/foliod/foliod.conf
units=$dest$prefix/lib/systemd/system
for f in "$bin" "$plugin" "$conf" "$units/foliod.service" "$units/foliod.socket" \
         "$units/foliod@.service" "$dest$prefix/share/man/man8/foliod.8" \
         "$dest$prefix/share/man/man5/foliod.conf.5" \
         "$dest$prefix/share/man/man1/nbdkit-folio-plugin.1"; do
  [ -f "$f" ] || fail "not installed: ${f#$dest}"
done
[ -x "$bin" ] || fail "foliod not executable"

# The installed daemon works.
"$bin" --version | grep -q '^foliod ' || fail "installed foliod --version"
"$bin" --check-config "$conf" >/dev/null || fail "installed config refused"
truncate -s 16M "$tmp/img"
FOLIOD=$bin start_foliod --export "disk0=$tmp/img"
nbdinfo --size "$(uri disk0)" | grep -qx 16777216 || fail "installed foliod does not serve"
stop_foliod

# The installed plugin works in nbdkit.  In the sanitizer build nbdkit
# needs the ASan runtime preloaded (see plugin_init in lib.sh).
kit_env=()
if [ "${SAN:-}" = 1 ]; then
  printf '%s\n' '#include <locale.h>' 'void freelocale (locale_t l) { (void) l; }' |
    cc -shared -fPIC -x c -o "$tmp/san-shim.so" - || fail "cannot build the shim"
  kit_env=(LD_PRELOAD="$(gcc -print-file-name=libasan.so) $tmp/san-shim.so")
fi
timeout 60 env "${kit_env[@]}" nbdkit -f -U "$tmp/kit.sock" "$plugin" \
  backing="file:$tmp/img" >"$tmp/nbdkit.log" 2>&1 &
track $!
FOLIOD_LOG=$tmp/nbdkit.log wait_for_socket "$tmp/kit.sock" 20
nbdinfo --size "nbd+unix:///?socket=$tmp/kit.sock" | grep -qx 16777216 ||
  fail "installed plugin does not serve"

# Man pages render without warnings.
for m in man8/foliod.8 man5/foliod.conf.5; do
  MANWIDTH=80 man --warnings -l "$dest$prefix/share/man/$m" 2>"$tmp/man.err" >/dev/null
  [ ! -s "$tmp/man.err" ] || fail "$m: $(cat "$tmp/man.err")"
done

# Units name the installed binary and config.
grep -q "^ExecStart=$prefix/sbin/foliod .*--config $prefix/etc/foliod/foliod.conf" \
  "$units/foliod.service" || fail "foliod.service ExecStart: $(grep ExecStart "$units/foliod.service")"

# An existing config is never overwritten.
echo "# local change" >> "$conf"
mk install >"$tmp/install2.log" 2>&1 || fail "second make install"
grep -q "# local change" "$conf" || fail "make install overwrote the config"

# Uninstall: everything goes, except the modified config (reported).
mk uninstall >"$tmp/uninstall.log" 2>&1 || fail "make uninstall: $(cat "$tmp/uninstall.log")"
grep -q "keeping modified" "$tmp/uninstall.log" || fail "uninstall did not mention the kept config"
left=$(find "$dest" -type f -o -type l | grep -v "^$conf\$" || true)
[ -z "$left" ] || fail "left after uninstall: $left"
[ -f "$conf" ] || fail "uninstall removed a modified config"

# With an unmodified config, uninstall removes it too.
rm -rf "$dest"
mk install >/dev/null 2>&1 || fail "third make install"
mk uninstall >/dev/null 2>&1 || fail "second make uninstall"
left=$(find "$dest" -type f -o -type l)
[ -z "$left" ] || fail "left after uninstall: $left"
echo OK
