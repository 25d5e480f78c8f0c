#!/bin/bash
# nbdkit-folio-plugin with qemu-img: convert a sparse image into the export
# and compare it through the export; convert out of the export to qcow2 and
# compare; the backing file equals the source once nbdkit has exited.
. "$(dirname "$0")/lib.sh"
plugin_init plugin-qemu
requires qemu-img

# Source: 24 MiB with data runs at odd places and holes between them.
src=$tmp/src.img
MiB=$((1024 * 1024))
truncate -s $((24 * MiB)) "$src"
for spec in 0:100 7:3000 4000:5 9000:1 15000:2500 23999:1; do
  seek=${spec%%:*} count=${spec##*:}   # in KiB
  head -c $((count * 1024)) /dev/urandom |
    dd of="$src" bs=1024 seek="$seek" conv=notrunc status=none
done

# Target backing: old random contents everywhere, so that a convert which
# skipped zeroing the holes would show up in the compare.
dst=$tmp/dst.img
head -c $((24 * MiB)) /dev/urandom > "$dst"

log=$tmp/nbdkit.log
if ! timeout $((300 * TSCALE)) env "${NBDKIT_ENV[@]}" \
     nbdkit -U - "$PLUGIN" backing=file:"$dst" cache-size=4M \
     folio-size=128K block-size=4K \
     --run 'set -e; unset LD_PRELOAD
            qemu-img convert -n -f raw -O raw -W -m 4 '"$src"' "$uri"
            qemu-img compare -f raw -F raw '"$src"' "$uri"
            qemu-img convert -f raw -O qcow2 "$uri" '"$tmp/out.qcow2"'
            qemu-img compare -f qcow2 -F raw '"$tmp/out.qcow2"' '"$src"'
            ' 2>"$log"; then
  cat "$log"; echo "qemu-img through the plugin failed"; exit 1
fi
cat "$log"
check_sanitizer_log "$log"
cmp "$src" "$dst"
echo "backing file equals the source after nbdkit exited"
