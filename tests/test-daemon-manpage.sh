#!/bin/bash
# Documentation matches the code: every option in `foliod --help` has an
# entry in foliod(8) and every option foliod(8) documents is in --help;
# every [server] key and export key is documented in foliod.conf(5) and in
# the example conf/foliod.conf (with its default, commented or set), and
# neither documents a key the code does not know.
# (Matching is done with bash patterns: forks are slow on a loaded box.)
. "$(dirname "$0")/lib.sh"
lib_init daemon-manpage

nl=$'\n'
help=$("$FOLIOD" --help)
# Man page text with roff escapes resolved ("\-\-" -> "--").
man8=$nl$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$TOP/man/foliod.8")
man5=$nl$(sed -e 's/\\-/-/g' -e 's/\\f[BIRP]//g' "$TOP/man/foliod.conf.5")
conf=$nl$(cat "$TOP/conf/foliod.conf")

help_opts=$(grep -oE -- '--[a-z][a-z-]+' <<<"$help" | sort -u)
man_opts=$(grep -E '^\.(B|BI|BR) ' <<<"$man8" | grep -oE -- '--[a-z][a-z-]+' | sort -u)
[ -n "$help_opts" ] || fail "no options in --help"

# Each option has its own entry: ".B --opt", ".BI --opt ARG" or
# ".BR -x \", \" --opt ARG".
has_entry () {
  local o=$1 p
  for p in ".B $o$nl" ".BI $o " ".BR $o " ".BR -?  \", \" $o$nl" \
           ".BR -? \", \" $o " ".BR -? \", \" $o$nl"; do
    [[ $man8 == *"$nl"$p* ]] && return 0
  done
  return 1
}
for o in $help_opts; do
  has_entry "$o" || fail "option $o of --help has no entry in foliod(8)"
done
for o in $man_opts; do
  [[ "$nl$help_opts$nl" == *"$nl$o$nl"* ]] ||
    fail "foliod(8) documents $o but --help does not list it"
done
# Short options: "-x, --opt" in --help is ".BR -x \", \" --opt" in the page.
while read -r s l; do
  s=${s%,}
  [[ $man8 == *"$nl.BR $s \", \" $l"[$' \n']* ]] || fail "foliod(8) lacks '$s, $l'"
done < <(grep -oE -- '-[a-zA-Z], --[a-z-]+' <<<"$help")

# Keys: server keys are the long options of the "Server options" block;
# export keys are listed under "Export keys".
server_keys=$(sed -n '/^Server options/,/^$/p' <<<"$help" | grep -oE -- '--[a-z-]+' | sed 's/^--//')
export_keys=$(sed -n '/^Export keys/,/^$/p' <<<"$help" | awk '/^  [a-z]/ {print $1}')
[ "$(wc -l <<<"$server_keys")" -ge 10 ] || fail "few server keys found: $server_keys"
[ "$(wc -l <<<"$export_keys")" -ge 10 ] || fail "few export keys found: $export_keys"
all_keys="$nl$server_keys$nl$export_keys$nl"
for k in $server_keys $export_keys; do
  [[ $man5 == *"$nl.BI $k "* || $man5 == *"$nl.BR $k "* ]] ||
    fail "key '$k' not documented in foliod.conf(5)"
  [[ $conf == *"$nl$k = "* || $conf == *"$nl#$k = "* ]] ||
    fail "key '$k' not in conf/foliod.conf"
done
for k in $(grep -oE '^\.(BI|BR) [a-z][a-z-]+ " = ' <<<"$man5" | awk '{print $2}'); do
  [[ $all_keys == *"$nl$k$nl"* ]] ||
    fail "foliod.conf(5) documents '$k', unknown to foliod --help"
done
for k in $(grep -oE '^#?[a-z][a-z_-]+ = ' <<<"$conf" | tr -d '#= '); do
  [[ $all_keys == *"$nl$k$nl"* ]] ||
    fail "conf/foliod.conf sets '$k', unknown to foliod --help"
done
echo OK
