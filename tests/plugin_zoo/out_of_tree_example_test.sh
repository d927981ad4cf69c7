#!/usr/bin/env bash
# Installs the devalloc build into a scratch prefix, builds
# examples/out_of_tree_plugin against it as a vendor would, and runs the
# installed `devalloc conformance` on the result.
# Usage: out_of_tree_example_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 SOURCE_DIR BUILD_DIR SCRATCH_DIR" >&2
  exit 2
fi
source_dir=$1
build_dir=$2
scratch=$3
prefix="$scratch/prefix"
example_build="$scratch/build"

rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build_dir" --prefix "$prefix"

# A fresh configure: nothing of the devalloc build tree may leak in.
cmake -S "$source_dir/examples/out_of_tree_plugin" -B "$example_build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$example_build"

plugin="$example_build/libdevalloc_example.so"
exports=$(nm -D --defined-only "$plugin" | awk '{print $3}')
if [[ "$exports" != "devalloc_plugin_negotiate" ]]; then
  echo "FAIL: $plugin must export devalloc_plugin_negotiate alone; it exports:" >&2
  echo "$exports" >&2
  exit 1
fi

# The installed plugins only: no search path from the environment.
DEVALLOC_PLUGIN_PATH= exec "$prefix/bin/devalloc" conformance "$plugin"
