#!/usr/bin/env bash
# Installs the devalloc build into a scratch prefix and builds
# installed_consumer/ against it as a runtime author would: a plain
# find_package(devalloc) offers devalloc::executorch, which brings devalloc's
# core and ExecuTorch's runtime (found again from the package config); the
# program then runs through the installed host plugin. Without ExecuTorch on
# the consumer's side, the plain find_package still succeeds (no
# devalloc::executorch), while COMPONENTS executorch fails saying why.
# Usage: installed_package_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 SOURCE_DIR BUILD_DIR SCRATCH_DIR" >&2
  exit 2
fi
source_dir=$1 build_dir=$2 scratch=$3
prefix="$scratch/prefix"
consumer="$source_dir/integrations/executorch/tests/installed_consumer"
rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build_dir" --prefix "$prefix" >/dev/null
package="$prefix/lib/cmake/devalloc"
for file in devalloc-executorch-targets.cmake devallocExecutorchRuntime.cmake; do
  [[ -f "$package/$file" ]] || { echo "FAIL: $package/$file is not installed" >&2; exit 1; }
done
[[ -f "$prefix/include/devalloc/executorch/device_allocator.hpp" ]] ||
  { echo "FAIL: the adapter's header is not installed" >&2; exit 1; }
# The exported targets name no path of this machine: ExecuTorch is found
# again by the consumer (the config records the build's one as a hint only).
if grep -n "$source_dir\|$build_dir" "$package"/devalloc-executorch-targets*.cmake; then
  echo "FAIL: the exported adapter names a path of the build machine (above)" >&2
  exit 1
fi

# A fresh configure: nothing of the devalloc build tree may leak in.
cmake -S "$consumer" -B "$scratch/build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$scratch/configure.txt"
grep -q '^-- consumer: devalloc::executorch found' "$scratch/configure.txt" ||
  { cat "$scratch/configure.txt" >&2; echo "FAIL: no devalloc::executorch (above)" >&2; exit 1; }
cmake --build "$scratch/build"
DEVALLOC_PLUGIN_PATH= "$scratch/build/executorch_consumer" | tee "$scratch/out.txt"
grep -q '^ok: 256 bytes through DeviceMemoryBuffer on cuda:0 (plugin host)' "$scratch/out.txt"

# The consumer has no ExecuTorch: the rest of the package still works...
cmake -S "$consumer" -B "$scratch/build-no-et" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_executorch=ON > "$scratch/no-et.txt"
grep -q '^-- consumer: no devalloc::executorch' "$scratch/no-et.txt" ||
  { cat "$scratch/no-et.txt" >&2; echo "FAIL: expected no devalloc::executorch (above)" >&2; exit 1; }
# ...and asking for the component fails, naming what is missing.
if cmake -S "$consumer" -B "$scratch/build-no-et-component" -DCMAKE_PREFIX_PATH="$prefix" \
     -DCMAKE_DISABLE_FIND_PACKAGE_executorch=ON -DCONSUMER_COMPONENTS=executorch \
     > "$scratch/no-et-component.txt" 2>&1; then
  cat "$scratch/no-et-component.txt" >&2
  echo "FAIL: COMPONENTS executorch was found without ExecuTorch (above)" >&2
  exit 1
fi
if ! grep -q 'component executorch: ExecuTorch [0-9.]* (its CMake package' "$scratch/no-et-component.txt"; then
  cat "$scratch/no-et-component.txt" >&2
  echo "FAIL: the failure does not say ExecuTorch is missing (above)" >&2
  exit 1
fi
echo "installed devalloc::executorch: ok"
