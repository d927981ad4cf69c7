#!/usr/bin/env bash
# Builds and runs the benchmarks; arguments go to devalloc_bench
# (see bench/load_bench.cpp: --quick, --json FILE, --sizes MiB,..., --staging-sweep).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"
BUILD_DIR="$build" bash "$here/scripts/build.sh" -DCMAKE_BUILD_TYPE=Release
"$build/bin/devalloc_bench" "$@"
