#!/usr/bin/env bash
# End to end through the CLI, the core and the CUDA plugin on two fake
# devices: a plan whose buffers go to cuda:0 and cuda:1 loads with --verify,
# each buffer on the device its tag names, and the fake (strict) sees no
# misuse. Usage: two_device_load_test.sh DEVALLOC FAKE_LIBCUDA PYTHON MAKE_MODEL.py
set -euo pipefail
devalloc=$1 fake=$2 python=$3 make_model=$4
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$make_model" "$work"
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" \
  --place 'model.layers.0.*=cuda:1' --place '*=cuda:0'
cat > "$work/devalloc.toml" <<TOML
[plugins.cuda]
options = { runtime_library = "$fake" }

[devices."cuda:0"]
use = ["cuda", { index = 0 }]

[devices."cuda:1"]
use = ["cuda", { index = 1 }]
TOML

export DEVALLOC_FAKE_CUDA_STRICT=1 DEVALLOC_FAKE_CUDA_DEVICES=2
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/load.json"
cat "$work/load.json"

# The summary lists one entry per physical device; both must be CUDA
# devices of the fake, none a fallback.
"$python" - "$work/load.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verified"] is True, "not verified"
on = {d["device"]: d for d in r["devices"] if d["plugin"] == "cuda"}
for i in (0, 1):
    assert i in on, f"no buffer loaded on fake CUDA device {i}"
    assert on[i]["device_name"] == f"Fake CUDA Device {i}", on[i]
    assert on[i]["fallback"] is False, on[i]
PY
echo "PASS: loaded and verified on fake CUDA devices 0 and 1"
