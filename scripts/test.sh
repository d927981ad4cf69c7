#!/usr/bin/env bash
# The test command: installs what is missing, builds, and runs every test.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"

BUILD_DIR="$build" bash "$here/scripts/build.sh" "$@"
cd "$build"
ctest --output-on-failure -j "$(nproc)" --timeout 300
