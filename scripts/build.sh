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
# ccache when installed. Set here, not by the callers: run-example.sh and
# test.sh must configure build/ identically, or the second rebuilds it all.
launcher=()
command -v ccache >/dev/null &&
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$here" -B "$build" "${generator[@]}" "${launcher[@]}" "$@" >/dev/null
cmake --build "$build" -j "$(nproc)"
