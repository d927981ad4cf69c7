#!/usr/bin/env bash
# Builds and runs the benchmarks; arguments go to devalloc_bench
# (see bench/load_bench.cpp: --quick, --json FILE, --sizes MiB,..., --staging-sweep).
# Builds build/ (BUILD_DIR) as scripts/build.sh configures it, with its build
# type unchanged (RelWithDebInfo unless that folder was configured otherwise):
# a build type given here would stay in the CMake cache, make the next
# scripts/test.sh rebuild everything, and differ from the documented figures.
# The bench prints the build type it was compiled in.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"
BUILD_DIR="$build" bash "$here/scripts/build.sh"
"$build/bin/devalloc_bench" "$@"
