# Helpers for the rbd backing tests (tests/test-rbd-*.sh): a one-node Ceph
# cluster of the test's own (tests/ceph/cluster) in $tmp/ceph, stopped at
# exit.  Source after lib.sh:
#
#   . "$(dirname "$0")/lib.sh"
#   lib_init rbd-x
#   . "$(dirname "$0")/lib-ceph.sh"
#   ceph_up 64M                     # pool rbd, image rbd/img of 64M
#   rbd_import_model 64 16 4       # $tmp/model: 64M, random 16M..20M; rbd/img
#   start_foliod --export "disk0=$(rbd_backing),cache-size=4M"
#   rbd_cmd export rbd/img "$tmp/out"

requires ceph-mon ceph-osd rbd

CEPH_DIR=$tmp/ceph
CEPH_CONF=$CEPH_DIR/ceph.conf
CLUSTER=$TOP/tests/ceph/cluster

_ceph_cleanup () {
  # foliod first: its librbd client would otherwise wait for the OSD.
  if [ -n "${FOLIOD_PID:-}" ]; then
    pkill -KILL -P "$FOLIOD_PID" 2>/dev/null || true
  fi
  "$CLUSTER" down "$CEPH_DIR" || true
  _lib_cleanup
}
trap _ceph_cleanup EXIT

# ceph_up [IMAGE-SIZE]: start the cluster, pool rbd, image rbd/img.
ceph_up () {
  "$CLUSTER" up "$CEPH_DIR" "${1:-64M}" >/dev/null ||
    fail "the Ceph cluster did not start (logs in $CEPH_DIR/log)"
}

# rbd_import_model SIZE_MB AT_MB DATA_MB: $tmp/model, SIZE_MB of zeroes
# with DATA_MB of random data at AT_MB (never read by foliod yet: reads
# of it miss), imported as rbd/img in place of the image ceph_up made.
rbd_import_model () {
  truncate -s "$1M" "$tmp/model"
  head -c "$3M" /dev/urandom |
    dd of="$tmp/model" bs=1M seek="$2" conv=notrunc status=none
  rbd_cmd rm rbd/img >/dev/null 2>&1 || fail "rbd rm"
  rbd_cmd import --no-progress "$tmp/model" rbd/img || fail "rbd import"
}

# rbd_cmd ARGS...: the rbd tool on the test's cluster.
rbd_cmd () {
  timeout $((120 * TSCALE)) rbd -c "$CEPH_CONF" "$@"
}

# rbd_backing [IMAGE]: the export keys for an image of the cluster.
rbd_backing () {
  echo "rbd:rbd/${1:-img},ceph-conf=$CEPH_CONF,ceph-id=admin"
}
