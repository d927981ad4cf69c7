#!/usr/bin/env bash
# Builds and runs the benchmarks; arguments go to devalloc_bench
# (see bench/load_bench.cpp: --quick, --json FILE, --sizes MiB,..., --staging-sweep).
# `scripts/bench.sh --drivers [ARGS]` runs devalloc_driver_bench instead: the
# load onto Vulkan (lavapipe) and OpenCL (PoCL) against the drivers' own
# paths (see bench/driver_bench.cpp: --quick, --size MiB, --chunk MiB,
# --repeats N, --only vulkan|opencl).
# Builds build/ (BUILD_DIR) as scripts/build.sh configures it, with its build
# type unchanged (RelWithDebInfo unless that folder was configured otherwise):
# a build type given here would stay in the CMake cache, make the next
# scripts/test.sh rebuild everything, and differ from the documented figures.
# The bench prints the build type it was compiled in.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"
program=devalloc_bench
if [[ "${1:-}" == "--drivers" ]]; then
  program=devalloc_driver_bench
  shift
fi
BUILD_DIR="$build" bash "$here/scripts/build.sh"
"$build/bin/$program" "$@"
