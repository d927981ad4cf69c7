#!/usr/bin/env bash
# On a machine without an AMD GPU, Debian's real libamdhip64.so.5 answers
# hipGetDeviceCount with hipErrorNoDevice: `devalloc plugins` must list the
# HIP plugin as unavailable and quote the runtime's own words.
# Usage: real_runtime_unavailable_test.sh DEVALLOC
set -euo pipefail
devalloc=$1
out=$("$devalloc" plugins 2>&1 || true)
echo "$out"
line=$(grep -A3 -E '(^|[^_])hip\b' <<<"$out" || true)
if ! grep -q "unavailable" <<<"$line"; then
  echo "FAIL: the hip plugin is not listed as unavailable" >&2
  exit 1
fi
if ! grep -q "hipGetDeviceCount failed: hipErrorNoDevice" <<<"$line"; then
  echo "FAIL: the runtime's own words (hipErrorNoDevice) are missing" >&2
  exit 1
fi
echo "PASS: hip unavailable with the runtime's words"
