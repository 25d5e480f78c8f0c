#!/bin/bash
# The Debian packages (make deb): what they contain (daemon, units and the
# drop-in that runs them as user foliod, man pages, the conffile, the
# nbdkit plugin where nbdkit looks), lintian --pedantic has nothing to say,
# and dpkg installs, reinstalls (an edited conffile is kept), removes and
# purges them cleanly in a scratch root.  Maintainer scripts run
# chrootless there with DPKG_ROOT set (dpkg --force-script-chrootless):
# the user, the state directory and the unit symlinks must land in the
# scratch root, never on this host.  Starting the service under a real
# systemd is tests/vm's part.
#
# DEB_OUT=DIR (make check-deb) tests the packages already built there;
# otherwise this runs make deb (build-deb/, about 20 s).
. "$(dirname "$0")/lib.sh"
lib_init deb
requires dpkg dpkg-deb nbdkit systemd-sysusers deb-systemd-helper python3
[ "$(id -u)" = 0 ] || skip "dpkg --root needs root (file owners)"

if [ -z "${DEB_OUT:-}" ]; then
  timeout 600 make -C "$TOP" deb >"$tmp/make-deb.log" 2>&1 ||
    fail "make deb: $(tail -n 30 "$tmp/make-deb.log")"
  DEB_OUT=$TOP/build-deb
fi
requires lintian
shopt -s nullglob
debs=("$DEB_OUT"/foliod_*_amd64.deb)
plugin_debs=("$DEB_OUT"/nbdkit-plugin-folio_*_amd64.deb)
changes=("$DEB_OUT"/foliod_*_amd64.changes)
[ ${#debs[@]} = 1 ] && [ ${#plugin_debs[@]} = 1 ] && [ ${#changes[@]} = 1 ] ||
  fail "want one foliod, nbdkit-plugin-folio .deb and .changes in $DEB_OUT: $(ls "$DEB_OUT")"
deb=${debs[0]} plugin_deb=${plugin_debs[0]}
version=$(dpkg-deb -f "$deb" Version)

# lintian: clean at --pedantic (overrides carry their reasons).
lintian --pedantic --fail-on error,warning,info,pedantic "${changes[0]}" \
  >"$tmp/lintian.log" 2>&1 || fail "lintian: $(cat "$tmp/lintian.log")"
grep -E '^[EWIP]: ' "$tmp/lintian.log" && fail "lintian tags above"

# Contents.
plugindir=$(nbdkit --dump-config | sed -n 's/^plugindir=//p')
[ -n "$plugindir" ] || fail "nbdkit --dump-config has no plugindir"
dpkg-deb -c "$deb" | awk '{ print $6 }' | sed 's|^\./|/|' >"$tmp/files"
dpkg-deb -c "$plugin_deb" | awk '{ print $6 }' | sed 's|^\./|/|' >"$tmp/plugin-files"
for f in /usr/sbin/foliod /etc/foliod/foliod.conf \
         /lib/systemd/system/foliod.service /lib/systemd/system/foliod.socket \
         /lib/systemd/system/foliod@.service \
         /lib/systemd/system/foliod.service.d/debian.conf \
         /lib/systemd/system/foliod@.service.d/debian.conf \
         /usr/lib/sysusers.d/foliod.conf /usr/lib/tmpfiles.d/foliod.conf \
         /usr/share/man/man8/foliod.8.gz /usr/share/man/man5/foliod.conf.5.gz \
         /usr/share/doc/foliod/README.Debian /usr/share/doc/foliod/copyright; do
  grep -qx "$f" "$tmp/files" || fail "foliod package lacks $f"
done
for f in "$plugindir/nbdkit-folio-plugin.so" \
         /usr/share/man/man1/nbdkit-folio-plugin.1.gz; do
  grep -qx "$f" "$tmp/plugin-files" || fail "plugin package lacks $f"
done
dpkg-deb -f "$plugin_deb" Depends | grep -qw nbdkit || fail "plugin does not depend on nbdkit"
dpkg-deb -e "$deb" "$tmp/control"
[ "$(cat "$tmp/control/conffiles")" = /etc/foliod/foliod.conf ] ||
  fail "conffiles: $(cat "$tmp/control/conffiles")"

# Upgrade with the service running (issue 35): the maintainer scripts
# must upgrade foliod in place (systemctl reload runs foliod upgrade, the
# connections survive), not restart it.  The package's own prerm and
# postinst run as dpkg would run them on a systemd host, in a mount
# namespace where /run is a tmpfs with /run/systemd/system, and with
# every program they call replaced by a stub that logs its arguments
# (nothing of this host is touched).  SYSTEMD_ACTIVE is what systemctl
# list-units reports running; RELOAD_FAILS makes the reload fail.  (The
# reload under a real systemd, a client connected across it:
# tests/vm/systemd-guest, deb-upgrade.)
stubs=$tmp/stubs
mkdir -p "$stubs"
for c in systemd-sysusers systemd-tmpfiles deb-systemd-helper; do
  printf '#!/bin/sh\necho "%s $*" >> "$STUB_LOG"\n' "$c" > "$stubs/$c"
done
cat > "$stubs/systemctl" <<'EOF2'
#!/bin/sh
echo "systemctl $*" >> "$STUB_LOG"
case $* in *list-units*) for u in $SYSTEMD_ACTIVE; do
  echo "$u loaded active running $u"; done;; esac
EOF2
cat > "$stubs/deb-systemd-invoke" <<'EOF2'
#!/bin/sh
echo "deb-systemd-invoke $*" >> "$STUB_LOG"
[ "$1" = reload ] && [ -n "${RELOAD_FAILS:-}" ] && exit 1
exit 0
EOF2
chmod +x "$stubs"/*
# maint SCRIPT ARGS...: the package's SCRIPT; the stubs' log on stdout.
maint () {
  local script=$tmp/control/$1; shift
  : > "$tmp/stub.log"
  [ -x "$script" ] || return 0
  STUB_LOG=$tmp/stub.log PATH=$stubs:$PATH unshare -m sh -c \
    'mount -t tmpfs tmpfs /run && mkdir -p /run/systemd/system && exec "$@"' \
    sh "$script" "$@" >"$tmp/maint.out" 2>&1 ||
    fail "$(basename "$script") $*: $(cat "$tmp/maint.out")"
  cat "$tmp/stub.log"
}
unshare -m true 2>/dev/null || skip "no mount namespace (unshare -m) for the maintainer scripts"
export SYSTEMD_ACTIVE=foliod.service RELOAD_FAILS=
for s in preinst prerm; do
  log=$(maint $s upgrade "$version")
  echo "$log" | grep -q 'stop\|restart' && fail "$s upgrade: $log"
done
log=$(maint postinst configure "$version")
echo "$log" | grep -qx 'deb-systemd-invoke reload foliod.service' ||
  fail "postinst configure (an upgrade, foliod running) did not reload: $log"
echo "$log" | grep -q 'restart\|stop' &&
  fail "postinst configure (an upgrade, foliod running) restarted or stopped: $log"
# A failed reload (no control socket, a new binary that does not start):
# restarted as before, and said.
log=$(RELOAD_FAILS=1 maint postinst configure "$version")
echo "$log" | grep -qx 'deb-systemd-invoke restart foliod.service' ||
  fail "postinst: no restart after a failed reload: $log"
grep -q 'in-place upgrade of foliod.service failed' "$tmp/maint.out" ||
  fail "postinst did not say the reload failed: $(cat "$tmp/maint.out")"
# A running instance is reloaded too; nothing runs: nothing reloaded.
log=$(SYSTEMD_ACTIVE="foliod.service foliod@b.service" maint postinst configure "$version")
echo "$log" | grep -qx 'deb-systemd-invoke reload foliod@b.service' ||
  fail "postinst did not reload the running foliod@b: $log"
log=$(SYSTEMD_ACTIVE= maint postinst configure "$version")
echo "$log" | grep -q 'reload foliod\|restart' && fail "postinst, nothing running: $log"
# A first install starts it and reloads nothing.
log=$(maint postinst configure)
echo "$log" | grep -qx 'deb-systemd-invoke start foliod.service' ||
  fail "postinst configure (install) did not start foliod: $log"
echo "$log" | grep -q 'reload foliod\|restart' && fail "postinst configure (install): $log"

# Install into a scratch root.  What this host has before, to check after
# that nothing of it changed.
host_state () {
  getent passwd foliod || true
  ls -ld /var/lib/foliod /etc/foliod 2>/dev/null || true
  ls /etc/systemd/system/multi-user.target.wants 2>/dev/null || true
}
host_state >"$tmp/host.before"
root=$tmp/root
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates"
: >"$root/var/lib/dpkg/status"
# --force-depends: the scratch root has no libc; --log: not the host's.
dpkg_r () {
  timeout 120 dpkg --root="$root" --force-script-chrootless --force-depends \
    --log="$tmp/dpkg.log" "$@" >>"$tmp/dpkg.out" 2>&1 ||
    fail "dpkg $*: $(tail -n 20 "$tmp/dpkg.out")"
}
status () { dpkg-query --root="$root" -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null || true; }
dpkg_r -i "$deb" "$plugin_deb"
[ "$(status foliod)" = "ii " ] || fail "foliod not installed: '$(status foliod)'"
[ "$(status nbdkit-plugin-folio)" = "ii " ] || fail "plugin not installed"

# The installed daemon runs and reports the package's upstream version.
"$root/usr/sbin/foliod" --version | grep -qx "foliod ${version%-*}" ||
  fail "foliod --version: $("$root/usr/sbin/foliod" --version | head -n 1), package $version"
"$root/usr/sbin/foliod" --check-config "$root/etc/foliod/foliod.conf" >/dev/null ||
  fail "the shipped conffile does not pass --check-config"
nbdkit --dump-plugin "$root$plugindir/nbdkit-folio-plugin.so" |
  grep -q '^name=folio$' || fail "nbdkit cannot load the packaged plugin"

# postinst: the foliod user, /var/lib/foliod owned by it, foliod.service
# enabled, foliod.socket not (it listens on every address).
uid=$(awk -F: '$1 == "foliod" { print $3 }' "$root/etc/passwd")
[ -n "$uid" ] || fail "no foliod user in the root's /etc/passwd"
[ "$(stat -c '%u %a' "$root/var/lib/foliod")" = "$uid 750" ] ||
  fail "/var/lib/foliod: $(stat -c '%u %a' "$root/var/lib/foliod"), want $uid 750"
[ -L "$root/etc/systemd/system/multi-user.target.wants/foliod.service" ] ||
  fail "foliod.service not enabled"
[ -e "$root/etc/systemd/system/sockets.target.wants/foliod.socket" ] &&
  fail "foliod.socket enabled"
grep -qx 'User=foliod' "$root/lib/systemd/system/foliod.service.d/debian.conf" ||
  fail "drop-in does not set User=foliod"

# Reinstall (an upgrade to the same version) keeps an edited conffile and
# the state directory's contents.
echo "# edited by the admin" >>"$root/etc/foliod/foliod.conf"
echo data >"$root/var/lib/foliod/disk0.img"
dpkg_r -i "$deb"
grep -q "edited by the admin" "$root/etc/foliod/foliod.conf" ||
  fail "reinstall replaced the edited conffile"
[ -f "$root/var/lib/foliod/disk0.img" ] || fail "reinstall lost the state directory"

# Remove: the program goes, the conffile, state and user stay.
dpkg_r -r foliod nbdkit-plugin-folio
[ "$(status foliod)" = "rc " ] || fail "after remove: '$(status foliod)'"
[ -e "$root/usr/sbin/foliod" ] && fail "remove left /usr/sbin/foliod"
[ -e "$root$plugindir/nbdkit-folio-plugin.so" ] && fail "remove left the plugin"
[ -f "$root/etc/foliod/foliod.conf" ] || fail "remove deleted the conffile"
[ -f "$root/var/lib/foliod/disk0.img" ] || fail "remove deleted the state directory"

# Purge: conffile and unit symlinks go; the user stays; the disk images
# in the state directory stay, and purge says so (issue 26).  A socket
# foliod left there goes.
python3 -c 'import socket, sys; socket.socket(socket.AF_UNIX).bind(sys.argv[1])' \
  "$root/var/lib/foliod/control.sock"
: >"$tmp/dpkg.out"
dpkg_r -P foliod nbdkit-plugin-folio
[ -z "$(status foliod)" ] || [ "$(status foliod)" = "pn " ] ||
  fail "after purge: '$(status foliod)'"
[ "$(cat "$root/var/lib/foliod/disk0.img")" = data ] ||
  fail "purge deleted the disk image"
grep -qF "purge kept /var/lib/foliod" "$tmp/dpkg.out" ||
  fail "purge did not say where the images are: $(cat "$tmp/dpkg.out")"
left=$(cd "$root" && find . -path ./var/lib/dpkg -prune -o \( -type f -o -type l -o -type s \) -print |
       grep -v -e '^\./etc/\(passwd\|group\|shadow\|gshadow\|\.pwd\.lock\)$' \
               -e '^\./var/lib/foliod/disk0\.img$' || true)
[ -z "$left" ] || fail "purge left: $left"
grep -q '^foliod:' "$root/etc/passwd" || fail "purge removed the foliod user"
# Install and purge again without images: the empty directory goes.
rm "$root/var/lib/foliod/disk0.img"
dpkg_r -i "$deb"
dpkg_r -P foliod
[ -e "$root/var/lib/foliod" ] && fail "purge left the empty /var/lib/foliod"

host_state >"$tmp/host.after"
cmp -s "$tmp/host.before" "$tmp/host.after" ||
  fail "the maintainer scripts changed this host: $(diff "$tmp/host.before" "$tmp/host.after")"
echo "OK ($version)"
