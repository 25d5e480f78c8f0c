#!/bin/bash
# The rooms (docs/internals.md, "Rooms"): no two files of src/ or plugins/
# call each other in a cycle, and no file of a lower room calls a higher one
# (util < store < backing < cache < export < server < daemon, plugins beside
# the daemon).  Read off the symbols of the objects make check just built,
# whatever the build (BUILD=build-asan too).
set -euo pipefail
: "${TOP:=$(cd "$(dirname "$0")/.." && pwd)}"
: "${BUILD:=$TOP/build}"
exec /usr/bin/python3 "$TOP/scripts/check-layout" "$BUILD"
