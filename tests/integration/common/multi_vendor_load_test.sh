#!/usr/bin/env bash
# One plan over several vendor plugins and the host plugin at once: the
# example model's first layer goes to <plugin1>:0, its second layer to
# <plugin2>:0, its embedding to <plugin3>:0, its output head to <plugin4>:0,
# its final norm to <plugin5>:0 (as many as are given), the rest to host;
# `devalloc load --verify` must place each on its own plugin's device (no
# fallback) and verify, with every fake strict. A plugin over a real driver
# (vulkan, opencl) is given as PLUGIN== : no runtime library, nothing strict.
# Usage: multi_vendor_load_test.sh DEVALLOC PYTHON MAKE_MODEL.py
#          PLUGIN=FAKE_LIBRARY=STRICT_VARIABLE...   (one to five)
set -euo pipefail
devalloc=$1 python=$2 make_model=$3
shift 3
groups=("model.layers.0.*" "model.layers.1.*" "model.embed_tokens.*" "lm_head.*"
        "model.norm.*")
if [[ $# -lt 1 || $# -gt ${#groups[@]} ]]; then
  echo "usage: $0 DEVALLOC PYTHON MAKE_MODEL PLUGIN=FAKE=STRICT_VAR... (1 to 5)" >&2
  exit 2
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$make_model" "$work"
specs=("$@") places=() plugins=()
: > "$work/devalloc.toml"
for i in "${!specs[@]}"; do
  spec=${specs[$i]}
  IFS== read -r plugin fake strict <<<"$spec"
  plugins+=("$plugin")
  places+=(--place "${groups[$i]}=$plugin:0")
  if [[ -n $fake ]]; then
    printf '[plugins.%s]\noptions = { runtime_library = "%s" }\n\n' "$plugin" "$fake" \
      >> "$work/devalloc.toml"
  fi
  if [[ -n $strict ]]; then export "$strict=1"; fi
done
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" "${places[@]}" --place '*=host'
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/load.json"
cat "$work/load.json"

"$python" - "$work/load.json" host "${plugins[@]}" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verified"] is True, "not verified"
served = {d["plugin"]: d for d in r["devices"]}
for plugin in sys.argv[2:]:
    assert plugin in served, f"nothing was loaded through {plugin}: {sorted(served)}"
    assert served[plugin]["fallback"] is False, served[plugin]
PY
echo "PASS: one plan loaded and verified over host ${plugins[*]}"
