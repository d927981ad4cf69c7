#!/usr/bin/env bash
# End to end through the CLI, the core and the OpenCL plugin on PoCL: a plan
# of the example model (many tensors, several buffers) placed on opencl:0
# loads with --verify onto PoCL's device, and `devalloc plugins` lists the
# plugin as loaded with that device.
# Usage: cli_load_test.sh DEVALLOC PYTHON MAKE_MODEL.py
set -euo pipefail
devalloc=$1 python=$2 make_model=$3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$make_model" "$work"
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" --place "*=opencl:0"
# Only PoCL's platform, so that the device is PoCL's whatever else is
# installed.
cat > "$work/devalloc.toml" <<'TOML'
[plugins.opencl]
options = { platform = "Portable Computing Language" }
TOML
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/load.json"
cat "$work/load.json"
"$devalloc" plugins > "$work/plugins.txt"
cat "$work/plugins.txt"

"$python" - "$work/load.json" "$work/plugins.txt" <<'PY'
import json, re, sys
r = json.load(open(sys.argv[1]))
plugins = open(sys.argv[2]).read()
assert r["verified"] is True, "not verified"
on = [d for d in r["devices"] if d["plugin"] == "opencl"]
assert on, f"nothing was loaded through opencl: {r['devices']}"
assert all(d["device"] == 0 and d["fallback"] is False for d in on), on
assert not [d for d in r["devices"] if d["plugin"] != "opencl"], r["devices"]
name = on[0]["device_name"]
assert name, on
block = re.search(r"^opencl +loaded.*?(?=^\S|\Z)", plugins, re.M | re.S)
assert block, "devalloc plugins does not list opencl as loaded"
assert f"[0] {name}" in block.group(0), (name, block.group(0))
PY
echo "PASS: loaded and verified on opencl:0 ($(grep -o '"device_name": *"[^"]*"' "$work/load.json" | head -1))"
