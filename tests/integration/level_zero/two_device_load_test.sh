#!/usr/bin/env bash
# End to end through the CLI, the core and the Level Zero plugin, with
# Debian's loader running the fake driver on two devices: a plan whose
# buffers go to level_zero:0 and level_zero:1 loads with --verify, each
# buffer on the device its tag names, and the fake (strict) sees no misuse.
# Usage: two_device_load_test.sh DEVALLOC FAKE_DRIVER PYTHON MAKE_MODEL.py
set -euo pipefail
devalloc=$1 fake=$2 python=$3 make_model=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$make_model" "$work"
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" \
  --place 'model.layers.0.*=level_zero:1' --place '*=level_zero:0'
cat > "$work/devalloc.toml" <<TOML
[devices."level_zero:0"]
use = ["level_zero", { index = 0 }]

[devices."level_zero:1"]
use = ["level_zero", { index = 1 }]
TOML

export ZE_ENABLE_ALT_DRIVERS="$fake" DEVALLOC_FAKE_ZE_STRICT=1 DEVALLOC_FAKE_ZE_DEVICES=2
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/load.json"
cat "$work/load.json"

"$python" - "$work/load.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verified"] is True, "not verified"
on = {d["device"]: d for d in r["devices"] if d["plugin"] == "level_zero"}
for i in (0, 1):
    assert i in on, f"no buffer loaded on fake Level Zero device {i}"
    assert on[i]["device_name"] == f"Fake Level Zero Device {i}", on[i]
    assert on[i]["fallback"] is False, on[i]
PY
echo "PASS: loaded and verified on fake Level Zero devices 0 and 1"
