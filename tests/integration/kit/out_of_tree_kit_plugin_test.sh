#!/usr/bin/env bash
# Installs the devalloc build into a scratch prefix and builds
# examples/out_of_tree_kit_plugin against it as a vendor would, with the
# core's dependencies (toml++, nlohmann-json, pkg-config for xxhash) made
# unfindable: find_package(devalloc COMPONENTS abi plugin_kit) must not need
# them. Then the installed `devalloc conformance` runs on the plugin.
# Usage: out_of_tree_kit_plugin_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR
set -euo pipefail
source_dir=$1 build_dir=$2 scratch=$3
prefix="$scratch/prefix"
example_build="$scratch/build"
rm -rf "$scratch"
mkdir -p "$scratch"

cmake --install "$build_dir" --prefix "$prefix" >/dev/null
cmake -S "$source_dir/examples/out_of_tree_kit_plugin" -B "$example_build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_DISABLE_FIND_PACKAGE_tomlplusplus=TRUE \
  -DCMAKE_DISABLE_FIND_PACKAGE_nlohmann_json=TRUE \
  -DCMAKE_DISABLE_FIND_PACKAGE_PkgConfig=TRUE
cmake --build "$example_build"

plugin="$example_build/libdevalloc_example_kit.so"
exports=$(nm -D --defined-only "$plugin" | awk '{print $3}')
if [[ "$exports" != "devalloc_plugin_negotiate" ]]; then
  echo "FAIL: $plugin must export devalloc_plugin_negotiate alone; it exports:" >&2
  echo "$exports" >&2
  exit 1
fi
DEVALLOC_PLUGIN_PATH= exec "$prefix/bin/devalloc" conformance "$plugin"
