#!/usr/bin/env bash
# Builds and runs the benchmarks; arguments go to devalloc_bench
# (see bench/load_bench.cpp: --quick, --json FILE, --sizes MiB,..., --staging-sweep).
# `scripts/bench.sh --drivers [ARGS]` runs devalloc_driver_bench instead: the
# load onto Vulkan (lavapipe) and OpenCL (PoCL) against the drivers' own
# paths (see bench/driver_bench.cpp: --quick, --size MiB, --chunk MiB,
# --repeats N, --only vulkan|opencl).
# `scripts/bench.sh --shards [ARGS]` runs bench/shard_bench.py instead:
# sharded loads of W = 1, 2, 4 ranks (one process each) against the
# reference get_slice and whole-then-slice (see the script: --quick,
# --size MiB, --cols N, --ranks 1,2,4, --repeats N, --json FILE), with the
# build's CLI and Python package and PYTHON (default: the checkout's .venv,
# which scripts/setup.sh makes with numpy and safetensors).
# `scripts/bench.sh --many-tensors [ARGS]` runs bench/many_tensors_bench.py:
# `devalloc plan` and `devalloc load` of 100 000 small tensors, whole
# process, against the reference get_tensor loop (see the script: --quick,
# --tensors N, --repeats N, --json FILE), with PYTHON as for --shards.
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
elif [[ "${1:-}" == "--shards" ]]; then
  program=shard_bench.py
  shift
elif [[ "${1:-}" == "--many-tensors" ]]; then
  program=many_tensors_bench.py
  shift
fi
BUILD_DIR="$build" bash "$here/scripts/build.sh"
if [[ "$program" == shard_bench.py ]]; then
  python="${PYTHON:-$here/.venv/bin/python}"
  # The build's package and its host plugin; no other plugin is searched.
  PYTHONPATH="$build/python${PYTHONPATH:+:$PYTHONPATH}" DEVALLOC_PLUGIN_PATH= \
    "$python" "$here/bench/shard_bench.py" --devalloc "$build/bin/devalloc" "$@"
  exit
fi
if [[ "$program" == many_tensors_bench.py ]]; then
  # The build's CLI and its host plugin; no other plugin is searched.
  DEVALLOC_PLUGIN_PATH= "${PYTHON:-$here/.venv/bin/python}" \
    "$here/bench/many_tensors_bench.py" --devalloc "$build/bin/devalloc" "$@"
  exit
fi
"$build/bin/$program" "$@"
