#!/bin/bash
# Documentation matches the code: every option in `foliod --help` is in
# foliod(8) and every option foliod(8) documents is accepted by --help;
# every [server] key and export key is documented in foliod.conf(5) and in
# the example conf/foliod.conf (with its default, commented or set).
. "$(dirname "$0")/lib.sh"
lib_init daemon-manpage

"$FOLIOD" --help > "$tmp/help"
# Man page text with roff escapes resolved ("\-\-" -> "--").
sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$TOP/man/foliod.8" > "$tmp/man8"
sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$TOP/man/foliod.conf.5" > "$tmp/man5"

help_opts=$(grep -oE -- '--[a-z][a-z-]+' "$tmp/help" | sort -u)
man_opts=$(grep -E '^\.(TP|B|BI|BR|IP)|^\.B' -A1 "$tmp/man8" | grep -oE -- '--[a-z][a-z-]+' | sort -u)
[ -n "$help_opts" ] || fail "no options in --help"
# Each option has its own entry: ".B --opt", ".BI --opt ARG" or
# ".BR -x \", \" --opt ARG".
for o in $help_opts; do
  grep -qE -- "^\.(B|BI|BR) (-[a-zA-Z] \", \" )?$o( |$)" "$tmp/man8" ||
    fail "option $o of --help has no entry in foliod(8)"
done
for o in $man_opts; do
  echo "$help_opts" | grep -qx -- "$o" ||
    fail "foliod(8) documents $o but --help does not list it"
done
# Short options: the pairs in --help appear as such in the man page.
grep -oE -- '-[a-zA-Z], --[a-z-]+' "$tmp/help" | while read -r s l; do
  s=${s%,}
  grep -qE -- "^\.BR $s \", \" $l\b" "$tmp/man8" ||
    fail "foliod(8) lacks '$s, $l'"
done

# Keys: server keys are the long options of the "Server options" block;
# export keys are listed under "Export keys".
server_keys=$(sed -n '/^Server options/,/^$/p' "$tmp/help" | grep -oE -- '--[a-z-]+' | sed 's/^--//')
export_keys=$(sed -n '/^Export keys/,/^$/p' "$tmp/help" | awk '/^  [a-z]/ {print $1}')
[ "$(echo "$server_keys" | wc -l)" -ge 10 ] || fail "few server keys found: $server_keys"
[ "$(echo "$export_keys" | wc -l)" -ge 10 ] || fail "few export keys found: $export_keys"
for k in $server_keys $export_keys; do
  grep -qE "^\.(BI|BR|B) $k( |$)" "$tmp/man5" ||
    fail "key '$k' not documented in foliod.conf(5)"
  grep -qE "^#?$k = " "$TOP/conf/foliod.conf" ||
    fail "key '$k' not in conf/foliod.conf"
done
# And nothing documented that the code does not know.
for k in $(grep -oE '^\.(BI|BR|B) [a-z][a-z-]+ " = ' "$tmp/man5" | awk '{print $2}'); do
  echo "$server_keys $export_keys" | tr ' ' '\n' | grep -qx "$k" ||
    fail "foliod.conf(5) documents '$k', unknown to foliod --help"
done
for k in $(grep -oE '^#?[a-z][a-z_-]+ = ' "$TOP/conf/foliod.conf" | tr -d '#=' ); do
  echo "$server_keys $export_keys" | tr ' ' '\n' | grep -qx "$k" ||
    fail "conf/foliod.conf sets '$k', unknown to foliod --help"
done
echo OK
