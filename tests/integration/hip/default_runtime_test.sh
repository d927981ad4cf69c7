#!/usr/bin/env bash
# Without runtime_library the HIP plugin opens the newest ROCm's runtime on
# the library path: libamdhip64.so.7, else .so.6, else .so.5. The fake HIP
# runtime, built under ROCm 6's and ROCm 7's sonames in folders of their
# own, names its soname in its devices' names; Debian's real .so.5 (no GPU
# here) is on the default path behind them.
# Usage: default_runtime_test.sh DEVALLOC ROCM6_FOLDER ROCM7_FOLDER
set -euo pipefail
devalloc=$1
rocm6=$2
rocm7=$3

# expect LIBRARY_PATH DEVICE_NAME: `devalloc plugins` with that library
# path lists the hip plugin loaded, its device 0 named so.
expect() {
  local out
  out=$(LD_LIBRARY_PATH="$1" "$devalloc" plugins 2>&1 || true)
  if ! grep -A4 -E '^hip ' <<<"$out" | grep -qF "$2"; then
    echo "FAIL: with LD_LIBRARY_PATH=$1 the hip plugin has no device \"$2\":" >&2
    echo "$out" >&2
    exit 1
  fi
}

expect "$rocm6" "Fake HIP Device 0 (libamdhip64.so.6)"
expect "$rocm7" "Fake HIP Device 0 (libamdhip64.so.7)"
# The newest soname wins, whatever the order of the folders.
expect "$rocm6:$rocm7" "Fake HIP Device 0 (libamdhip64.so.7)"
echo "PASS: the plugin opens ROCm 7's, then ROCm 6's runtime by default"
