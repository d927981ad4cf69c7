#!/usr/bin/env bash
# End to end through the CLI, the core and a vendor plugin on two devices of
# its fake runtime: a plan whose buffers go to <plugin>:0 and <plugin>:1
# loads with --verify, each buffer on the device its tag names, and the
# fake (strict) sees no misuse.
# Usage: two_device_load_test.sh DEVALLOC PLUGIN FAKE_LIBRARY DEVICE_NAME_PREFIX
#                                STRICT_VARIABLE PYTHON MAKE_MODEL.py
set -euo pipefail
devalloc=$1 plugin=$2 fake=$3 device_prefix=$4 strict=$5 python=$6 make_model=$7
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$make_model" "$work"
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" \
  --place "model.layers.0.*=$plugin:1" --place "*=$plugin:0"
cat > "$work/devalloc.toml" <<TOML
[plugins.$plugin]
options = { runtime_library = "$fake" }

[devices."$plugin:0"]
use = ["$plugin", { index = 0 }]

[devices."$plugin:1"]
use = ["$plugin", { index = 1 }]
TOML

export "$strict=1"
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/load.json"
cat "$work/load.json"

# The summary lists one entry per physical device; both must be devices of
# the fake, none a fallback.
"$python" - "$work/load.json" "$plugin" "$device_prefix" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
plugin, prefix = sys.argv[2], sys.argv[3]
assert r["verified"] is True, "not verified"
on = {d["device"]: d for d in r["devices"] if d["plugin"] == plugin}
for i in (0, 1):
    assert i in on, f"no buffer loaded on fake {plugin} device {i}"
    assert on[i]["device_name"] == f"{prefix}{i}", on[i]
    assert on[i]["fallback"] is False, on[i]
PY
echo "PASS: loaded and verified on fake $plugin devices 0 and 1"
