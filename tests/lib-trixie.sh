# Debian 13 (trixie) userland for the tests that need newer peers than
# Debian 12 ships: nbdkit 1.42, libnbd 1.22 (nbdsh, nbdinfo: extended
# headers by default), qemu-img/qemu-io 10.  A debootstrap root made by
# the test itself, with trixie only in that root's own sources list --
# never in the host's apt configuration.  Source it after tests/lib.sh.
#
#   trixie_root          make (once, under a lock) or find the root; sets
#                        TRIXIE to its path, or skips (77) when it cannot
#                        be made (no debootstrap, no mirror)
#   trixie_run CMD...    run CMD in the root as root, in a private mount
#                        namespace where /proc, /dev, /tmp and the work
#                        tree ($TOP) are the host's own, so sockets and
#                        built files have the same paths on both sides
#
# The root lives in ${TRIXIE_DIR:-/var/cache/foliod-tests/trixie} and is
# rebuilt when TRIXIE_PKGS changes.  Making it takes a few minutes (the
# packages are fetched from the mirror the host uses); later runs reuse it.
# libpmem2: a shared library of nbdkit-folio-filter-1.42.so (store=pmem:).
TRIXIE_PKGS=${TRIXIE_PKGS:-"nbdkit nbdkit-plugin-dev libnbd-bin python3-libnbd qemu-utils \
qemu-block-extra ca-certificates libpmem2"}
TRIXIE_MIRROR=${TRIXIE_MIRROR:-http://deb.debian.org/debian}

trixie_root() {
  local dir=${TRIXIE_DIR:-/var/cache/foliod-tests/trixie} stamp want
  want="trixie $TRIXIE_PKGS"
  stamp=$dir/.foliod-stamp
  mkdir -p "$(dirname "$dir")"
  (
    flock 9
    if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then exit 0; fi
    command -v debootstrap >/dev/null || { echo "no debootstrap (scripts/install-deps)"; exit 77; }
    rm -rf "$dir"
    echo "lib-trixie: making a Debian 13 root in $dir (a few minutes, once)"
    if ! debootstrap --variant=minbase --include="$(echo "$TRIXIE_PKGS" | tr -s ' \n' ',')" \
        trixie "$dir" "$TRIXIE_MIRROR" > "$dir.log" 2>&1; then
      tail -5 "$dir.log"
      rm -rf "$dir"
      echo "debootstrap of trixie failed (log: $dir.log)"
      exit 77
    fi
    echo "$want" > "$stamp"
  ) 9> "$(dirname "$dir")/.trixie.lock"
  case $? in
    0) ;;
    77) skip "no Debian 13 root: see above" ;;
    *) fail "making the Debian 13 root" ;;
  esac
  TRIXIE=$dir
}

trixie_run() {
  local top=${TOP:-$PWD}
  unshare --mount --fork -- sh -c '
    r=$1 top=$2; shift 2
    mount --make-rprivate / &&
    mount -t proc proc "$r/proc" &&
    mount --rbind /dev "$r/dev" &&
    mount --bind /tmp "$r/tmp" &&
    mkdir -p "$r$top" && mount --bind "$top" "$r$top" &&
    exec chroot "$r" env PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root "$@"
  ' sh "$TRIXIE" "$top" "$@"
}
