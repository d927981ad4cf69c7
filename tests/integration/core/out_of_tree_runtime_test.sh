#!/usr/bin/env bash
# Installs the devalloc build into a scratch prefix, builds
# examples/out_of_tree_runtime against it as a runtime author would (it
# links devalloc::core), and runs it: it plans and loads a model through the
# installed host plugin. The installed package must not ask its consumers
# for Boost, which only the loader's sources use, nor hand them the build's
# own warnings target, nor xxHash, which is compiled into the core (the
# installed CLI and the runtime built here do not need it at run time); and the installed CLI names no source file by the build
# machine's path. Installed under umask 002 (a user with a private
# group, on Fedora and often Debian), its folders are still not
# group-writable, so the installed program trusts its own plugins.
# Usage: out_of_tree_runtime_test.sh SOURCE_DIR BUILD_DIR SCRATCH_DIR
set -euo pipefail

if [[ $# -ne 3 ]]; then
  echo "usage: $0 SOURCE_DIR BUILD_DIR SCRATCH_DIR" >&2
  exit 2
fi
source_dir=$1 build_dir=$2 scratch=$3
prefix="$scratch/prefix"
rm -rf "$scratch"
mkdir -p "$scratch/model"

(umask 002 && cmake --install "$build_dir" --prefix "$prefix" >/dev/null)
DEVALLOC_PLUGIN_PATH= "$prefix/bin/devalloc" plugins > "$scratch/plugins.txt" 2>&1 || true
if ! grep -q '^host  *loaded' "$scratch/plugins.txt"; then
  cat "$scratch/plugins.txt" >&2
  echo "FAIL: the installed program does not load its own host plugin (above)" >&2
  exit 1
fi
if grep -n "Boost" "$prefix"/lib/cmake/devalloc/*.cmake; then
  echo "FAIL: the installed package names Boost (above)" >&2
  exit 1
fi
if grep -n 'XXHASH\|libxxhash' "$prefix"/lib/cmake/devalloc/*.cmake; then
  echo "FAIL: the installed package asks its consumers for xxHash (above)" >&2
  exit 1
fi
# xxHash is no run-time dependency of a program with the core.
needs_no_xxhash() {
  if readelf -d "$1" | grep -E 'NEEDED.*xxhash'; then
    echo "FAIL: $1 needs xxHash at run time (above)" >&2
    exit 1
  fi
}
needs_no_xxhash "$prefix/bin/devalloc"
if grep -n 'devalloc_warnings\|LINK_ONLY:>' "$prefix"/lib/cmake/devalloc/*.cmake; then
  echo "FAIL: the installed package exports a build-only target or an empty entry (above)" >&2
  exit 1
fi
# Each include folder once: "a;a" is the same folder twice.
if grep -nE 'INTERFACE_INCLUDE_DIRECTORIES "([^;"]*;)*([^;"]+);(([^;"]*;)*)\2[;"]' \
     "$prefix"/lib/cmake/devalloc/*.cmake; then
  echo "FAIL: the installed package lists an include folder twice (above)" >&2
  exit 1
fi
objcopy -O binary --only-section=.rodata "$prefix/bin/devalloc" "$scratch/rodata"
if strings -a "$scratch/rodata" | grep -F "$source_dir/"; then
  echo "FAIL: bin/devalloc names source files by their path in $source_dir (above)" >&2
  exit 1
fi
# A fresh configure: nothing of the devalloc build tree may leak in.
cmake -S "$source_dir/examples/out_of_tree_runtime" -B "$scratch/build" \
  -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$scratch/build"
needs_no_xxhash "$scratch/build/example_runtime"
DEVALLOC_PLUGIN_PATH= "$scratch/build/example_runtime" "$scratch/model" | tee "$scratch/out.txt"
grep -q '^loaded 2 constants (4160 bytes) on host' "$scratch/out.txt"
