#!/bin/bash
# Issue 33 item 8 across a restart of foliod: a pmem store closed cleanly
# keeps its clean blocks (a warm restart), and a remote cannot say
# whether its image changed while foliod was down.  The store holds
# blocks of image A; the remote comes back serving image B (same size,
# flags, no description): the next foliod must not serve A's warm blocks
# next to B's.  It refuses the store at start-up, naming the reason;
# with the remote on A again it starts and serves the warm cache.
. "$(dirname "$0")/lib.sh"
lib_init remote-identity-store
. "$(dirname "$0")/lib-remote.sh"
requires nbdsh python3

make_ab_images
start_remote "$tmp/remote.sock" file "$tmp/a.img"
export_args="disk0=$(remote_uri),cache-size=16M,readahead=0,store=pmem:$tmp/store"
start_foliod --export "$export_args"

# read_at OFF: the first byte the client reads at OFF, or "error".
read_at () {
  timeout $((60 * TSCALE)) nbdsh -u "$(uri disk0)" \
    -c "try: print(h.pread(4096, $1)[:1].decode())
except nbd.Error as e: print('error')" 2>/dev/null
}
for ((m = 0; m < 16; m += 2)); do
  [ "$(read_at $((m << 20)))" = A ] || fail "first read at ${m} MiB"
done
stop_foliod                     # clean: the store keeps the blocks

# The same image: a warm restart.
start_foliod --export "$export_args"
[ "$(read_at 0)" = A ] || fail "the warm restart"
stop_foliod

# Another image behind the same spec: refused at start.
stop_remote
start_remote "$tmp/remote.sock" file "$tmp/b.img"
start_refused "a warm store over another image" \
  "differs from the backing's" --export "$export_args"

# Back on A: used again.
stop_remote
start_remote "$tmp/remote.sock" file "$tmp/a.img"
start_foliod --export "$export_args"
[ "$(read_at $((4 << 20)))" = A ] || fail "the store after the remote came back"
stop_foliod
stop_remote
cmp -s "$tmp/b.img" "$tmp/b.orig" || fail "image B was written"
echo OK
