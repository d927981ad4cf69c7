#!/usr/bin/env bash
# Debian's real Level Zero loader with no driver to load (ZE_ENABLE_ALT_DRIVERS
# names one that does not exist, so that a GPU driver installed on the
# machine cannot answer instead): `devalloc plugins` lists level_zero as
# unavailable, in the loader's own words, and a load that needs it says so.
# Usage: no_driver_test.sh DEVALLOC
set -euo pipefail
devalloc=$1
export ZE_ENABLE_ALT_DRIVERS=/nonexistent/libze_devalloc_none.so.1
out=$("$devalloc" plugins)
echo "$out"
entry=$(grep -A2 '^level_zero ' <<<"$out") || { echo "FAIL: level_zero not listed"; exit 1; }
grep -q 'unavailable (vendor runtime missing)' <<<"$entry" ||
  { echo "FAIL: level_zero not shown as unavailable"; exit 1; }
grep -q 'zeInit(0) failed: ZE_RESULT_ERROR_UNINITIALIZED' <<<"$entry" ||
  { echo "FAIL: the loader's answer is not shown"; exit 1; }
echo "PASS: level_zero unavailable without a driver, with the loader's reason"
