#!/bin/bash
# nbdkit-folio-filter over a plugin whose flush fails while a file exists
# (nbdkit's sh plugin over a file: 1.32's error filter cannot fail
# flushes alone, and eval's flush= key is the filter's), the log filter between them to see what reaches the
# plugin, and a cache far smaller than the data:
#  - 4 MiB written and flushed; then, while the plugin's flush fails,
#    256 KiB written and the client's FLUSH fails (EIO), twice, and every
#    byte still reads back as written;
#  - once the plugin's flush works again, the next FLUSH first writes
#    again what was written back before the failed one (a failed flush
#    may have lost it) and succeeds;
#  - after nbdkit exits the file holds every byte.
. "$(dirname "$0")/lib.sh"
filter_init filter-flush-error
requires nbdsh python3

filter_flush_error_files
timeout $((120 * TSCALE)) env "${NBDKIT_ENV[@]}" nbdkit -U - \
  --filter="$FILTER" --filter=log \
  sh "$tmp/plugin.sh" cache-size=1M dirty-expire=600000 logfile="$plog" \
  --run "env -u LD_PRELOAD uri=\$uri python3 $tmp/fe.py $fail_file $plog $tmp/model" \
  >"$tmp/out" 2>"$tmp/log" ||
  { cat "$tmp/out" "$tmp/log"; fail "flush error test failed"; }
cat "$tmp/out"
check_sanitizer_log "$tmp/log"
cmp "$img" "$tmp/model" || fail "the file lacks data after exit"
echo "the file holds every byte after exit"
