#!/bin/bash
# The README's commands and paths against the code:
#  - each shell block marked <!-- readme-check: run --> runs as written
#    (in a private network namespace, so its port 10809 is its own, with
#    build/ the tree's build), and the foliod it starts stops cleanly;
#  - the stats header marked <!-- readme-check: stats-header --> has the
#    words of the real `foliod stats` header;
#  - every /run/foliod path the docs name is one the units, the example
#    config or the package use; every make target they name exists; every tree path they name
#    (src/..., tests/..., docs/...) exists;
#  - every --option given to foliod in a command is one foliod knows.
. "$(dirname "$0")/lib.sh"
lib_init readme
requires python3 nbdinfo nbdsh unshare ip

readme=$TOP/README.md
docs=("$readme" "$TOP/docs/internals.md" "$TOP/tests/README.md" "$TOP/bench/README.md")
for d in "${docs[@]}"; do [ -f "$d" ] || fail "$d missing"; done

# block MARK: the fenced block after the line <!-- readme-check: MARK -->.
block () {
  awk -v m="<!-- readme-check: $1 -->" '
    $0 == m { want = 1; next }
    want && /^```/ { if (inside) exit; inside = 1; next }
    inside { print }' "$readme"
}

# 1. The run blocks.
block run >"$tmp/run.sh"
[ -s "$tmp/run.sh" ] || fail "no block marked readme-check: run"
mkdir "$tmp/run"
ln -s "$BUILD" "$tmp/run/build"
cat "$tmp/run.sh"
(cd "$tmp/run" &&
 unshare -n bash -c 'ip link set lo up && set -ex && . "$1"' run "$tmp/run.sh") \
  >"$tmp/run.out" 2>&1 || { cat "$tmp/run.out"; fail "the README's quick start block failed"; }
cat "$tmp/run.out"
pid=$(cat "$tmp/run/demo/foliod.pid" 2>/dev/null || true)
if [ -n "$pid" ]; then
  track "$pid"
  wait_gone "$pid" 600 || fail "the quick start's foliod did not stop"
fi
grep -q "stopped: all data written back" "$tmp/run/demo/foliod.log" ||
  fail "the quick start's foliod did not stop cleanly: $(cat "$tmp/run/demo/foliod.log")"
grep -q "EXPORT.*HIT RATIO" "$tmp/run.out" || fail "foliod stats printed no table"

# 2. The stats header against the real one (from the run above).
want=$(grep -m1 '^EXPORT' "$tmp/run.out" | tr -s ' ')
got=$(block stats-header | head -n1 | tr -s ' ')
[ -n "$got" ] || fail "no block marked readme-check: stats-header"
[ "$got" = "$want" ] || fail "README stats header '$got', foliod stats prints '$want'"

# 3. Paths and targets.
python3 - "$TOP" "${docs[@]}" <<'PY' || fail "the docs name what is not there"
import os, re, subprocess, sys
top, docs = sys.argv[1], sys.argv[2:]
bad = []
make = open(os.path.join(top, "Makefile")).read()
targets = set(re.findall(r"^([a-z][a-z0-9-]*):", make, re.M))
# Runtime paths are defined by the units, the example config and the
# package (the daemon takes them from there).
code = ""
for sub in ("systemd", "conf", "debian"):
    for root, _, files in os.walk(os.path.join(top, sub)):
        for f in files:
            try:
                code += open(os.path.join(root, f), errors="replace").read()
            except OSError:
                pass
help_text = subprocess.run([os.environ["FOLIOD"], "--help"], capture_output=True,
                           text=True).stdout
tree = ("src", "tests", "bench", "docs", "contrib", "scripts", "conf",
        "systemd", "debian", "man", "plugins", "include")
for d in docs:
    text = open(d).read()
    name = os.path.relpath(d, top)
    for p in set(re.findall(r"/run/foliod[A-Za-z0-9_./-]*", text)):
        p = p.rstrip(".")
        if p not in code:
            bad.append(f"{name}: {p} is not a path the units, config or package use")
    for t in set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", text)):
        if t not in targets | {"install", "uninstall"}:
            bad.append(f"{name}: make {t}: no such target")
    for m in re.finditer(r"(?<![\w/.$-])((?:%s)/[A-Za-z0-9_.+/-]*[A-Za-z0-9_])" % "|".join(tree), text):
        p = m.group(1)
        if text[m.end():m.end() + 2].startswith(("*", "-*")) or \
           re.search(r"[A-Z]{3,}", p):
            continue                        # a glob or a placeholder
        # a program named by its source (tests/tools/bad-client.c)
        if not any(os.path.exists(os.path.join(base, p + ext))
                   for base in (top, os.path.dirname(d)) for ext in ("", ".c")):
            bad.append(f"{name}: {p} does not exist")
    # --options of foliod command lines
    for line in text.splitlines():
        m = re.match(r"\s*(?:sudo )?(?:build/|/usr/sbin/)?foliod\s(.*)", line)
        if not m:
            continue
        for o in re.findall(r"(?<![\w-])--[a-z][a-z-]*", m.group(1)):
            if o not in help_text:
                bad.append(f"{name}: foliod {o}: not an option of foliod --help")
print("\n".join(bad))
sys.exit(1 if bad else 0)
PY

grep -qx '    make run        # build and start foliod on its built-in configuration' "$readme" ||
  fail "the README lost its make run line"
grep -qx '    make check      # build and run every test (unit, real clients, a VM)' "$readme" ||
  fail "the README lost its make check line"
echo OK
