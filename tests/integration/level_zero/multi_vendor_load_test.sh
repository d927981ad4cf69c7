#!/usr/bin/env bash
# One plan over several vendors at once, end to end through the CLI: memory
# ids mapped to cuda:0, level_zero:0, host (and hip:0 when a fake HIP runtime
# is given) load with --verify, each through its own plugin against its
# fake, none by fallback, and no fake (strict) sees misuse.
# Usage: multi_vendor_load_test.sh DEVALLOC PYTHON MAKE_MODEL.py FAKE_CUDA FAKE_ZE [FAKE_HIP]
set -euo pipefail
devalloc=$1 python=$2 make_model=$3 fake_cuda=$4 fake_ze=$5 fake_hip=${6:-}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$python" "$make_model" "$work"
place=(--place 'model.layers.0.*=cuda:0' --place 'model.layers.1.*=level_zero:0')
expected="cuda level_zero host"
if [ -n "$fake_hip" ]; then
  place+=(--place 'model.embed_tokens.*=hip:0')
  expected="$expected hip"
fi
"$devalloc" plan "$work/model.safetensors" -o "$work/plan.json" "${place[@]}" --place '*=host'

{
  echo '[plugins.cuda]'
  echo "options = { runtime_library = \"$fake_cuda\" }"
  if [ -n "$fake_hip" ]; then
    echo '[plugins.hip]'
    echo "options = { runtime_library = \"$fake_hip\" }"
  fi
} > "$work/devalloc.toml"

export DEVALLOC_FAKE_CUDA_STRICT=1 DEVALLOC_FAKE_ZE_STRICT=1 DEVALLOC_FAKE_HIP_STRICT=1
export ZE_ENABLE_ALT_DRIVERS="$fake_ze"
"$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
  > "$work/load.json"
cat "$work/load.json"

"$python" - "$work/load.json" $expected <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verified"] is True, "not verified"
by_plugin = {}
for d in r["devices"]:
    assert d["fallback"] is False, d
    by_plugin.setdefault(d["plugin"], []).append(d)
for name in sys.argv[2:]:
    assert name in by_plugin, f"nothing loaded through plugin {name}: {sorted(by_plugin)}"
assert sorted(by_plugin) == sorted(sys.argv[2:]), sorted(by_plugin)
PY
echo "PASS: one plan loaded and verified through: $expected"
