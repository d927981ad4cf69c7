#!/usr/bin/env bash
# End to end through the CLI, the core and the Vulkan plugin on lavapipe
# (pinned by VK_DRIVER_FILES in the test's environment): `devalloc plugins`
# lists vulkan as loaded with llvmpipe's name, and a multi-tensor model
# planned onto vulkan:0 loads with --verify, every buffer on that device
# (no fallback): once read straight into the mapped device memory
# (HOST_MAPPABLE), once with `direct = false`, through the plugin's
# staging memory and copies.
# Usage: cli_load_test.sh DEVALLOC PYTHON MAKE_MODEL.py
set -euo pipefail
devalloc=$1 python=$2 make_model=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$devalloc" plugins > "$work/plugins.txt"
cat "$work/plugins.txt"
entry=$(grep -A3 '^vulkan ' "$work/plugins.txt") || fail "vulkan not listed"
grep -q 'loaded (plugin' <<<"$entry" || fail "vulkan not loaded"
grep -q '\[0\] llvmpipe' <<<"$entry" || fail "llvmpipe is not device 0 of vulkan"

"$python" "$make_model" "$work"
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" --place '*=vulkan:0'
check() {  # check LOAD_JSON MODE: mode is "direct" or "copies"
  "$python" - "$1" "$2" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mode = sys.argv[2]
assert r["verified"] is True, "not verified"
devices = r["devices"]
assert devices, "nothing was loaded"
for d in devices:
    assert d["plugin"] == "vulkan", d
    assert d["device"] == 0, d
    assert "llvmpipe" in d["device_name"], d
    assert d["fallback"] is False, d
if mode == "direct":
    assert r["direct_reads"] > 0 and r["copies"] == 0, r
else:
    assert r["copies"] > 0 and r["direct_reads"] == 0, r
PY
}
"$devalloc" load "$work/plan.json" --verify --json > "$work/direct.json"
cat "$work/direct.json"
check "$work/direct.json" direct

printf '[load]\ndirect = false\n' > "$work/devalloc.toml"
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/copies.json"
cat "$work/copies.json"
check "$work/copies.json" copies
echo "PASS: plan on vulkan:0 loaded and verified on lavapipe, mapped and copied"
