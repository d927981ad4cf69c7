#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), then configures and builds
# devalloc into build/ (override with BUILD_DIR). Extra arguments go to the
# CMake configure step.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"

bash "$here/scripts/setup.sh"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here" -B "$build" "${generator[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
