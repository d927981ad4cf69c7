#!/usr/bin/env bash
# A plugin that states DMA constraints (ABI 1.2, PLUGIN-23: sources on a
# 64-byte boundary, at most 256 KiB a transfer) gets only copies that meet
# them, in every [load] read mode, with and without its own staging memory:
# the test plugin (dma_constrained_plugin.cpp) fails any copy that breaks
# one, so `load --verify` exits 0 only when none did. The model's tensors
# start off every 64-byte boundary of the file, and one is larger than a
# transfer. The same plugin keeping its constraints to itself (declare =
# false) fails the O_DIRECT load: the test can fail.
# Usage: dma_constraints_test.sh DEVALLOC PYTHON PLUGIN_DIR
set -euo pipefail
devalloc=$1 python=$2 plugin_dir=$3
# On disk, not tmpfs: O_DIRECT needs a file system that offers it.
work=$(mktemp -d "${TMPDIR:-/var/tmp}/devalloc-dma.XXXXXX")
trap 'rm -rf "$work"' EXIT

"$python" - "$work/model.safetensors" <<'PY'
import sys
import numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(7)
# Odd byte counts put every later tensor off a 64-byte boundary.
sizes = [13, 1000, 333, (1 << 20) + 7, 65, 4097, 300000]
save_file({f"t{i}": rng.integers(0, 255, n, dtype=np.uint8) for i, n in enumerate(sizes)},
          sys.argv[1])
PY
"$devalloc" plan "$work/model.safetensors" --place '*=dma:0' -o "$work/plan.json"

# load MODE STAGING DECLARE: the exit status of `devalloc load --verify`,
# its JSON report in $work/load.json.
load() {
  cat > "$work/devalloc.toml" <<EOF
plugin_path = ["$plugin_dir"]
[plugins.dma]
options = { declare = "$3", staging = "$2" }
[load]
read = "$1"
staging = "4MiB"
EOF
  "$devalloc" load "$work/plan.json" --config "$work/devalloc.toml" --verify --json \
    > "$work/load.json" 2> "$work/load.err"
}

for mode in mmap pread direct_io auto; do
  for staging in true false; do
    if ! load "$mode" "$staging" true; then
      echo "FAIL: read = $mode, staging = $staging: the load broke a stated constraint" >&2
      cat "$work/load.err" >&2
      exit 1
    fi
    "$python" - "$work/load.json" "$mode" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["verified"] is True, r
assert r["copies"] >= 8, f"expected pieces cut at 256 KiB: {r['copies']} copies"
if sys.argv[2] == "direct_io" and r["pipeline"]["read"] == "direct_io":
    # O_DIRECT reads whole blocks: the pieces landed off the boundary and
    # were moved, not handed to the plugin unaligned.
    assert r["pipeline"]["realigned_pieces"] > 0, r["pipeline"]
PY
  done
done

# The control: nothing stated, nothing honoured.
if load direct_io true false; then
  echo "FAIL: a plugin that states no constraint got only aligned sources under O_DIRECT;" \
       "this test could not tell" >&2
  exit 1
fi
grep -q "unaligned source" "$work/load.err"

# The card's two memories are two devices of one uuid, told apart by their
# kind (PLUGIN-24); the plugin passes the conformance suite, whose 1.2
# groups check the constraints and the memories.
"$devalloc" plugins --plugin-path "$plugin_dir" --json > "$work/plugins.json"
"$python" - "$work/plugins.json" <<'PY'
import json, sys
p = {x["name"]: x for x in json.load(open(sys.argv[1]))["plugins"]}["dma"]
kinds = [(d["uuid"], d["memory_kind"]) for d in p["devices"]]
assert len(kinds) == 2 and kinds[0][0] == kinds[1][0] != "", kinds
assert sorted(k for _, k in kinds) == ["hbm", "sram"], kinds
PY
"$devalloc" plugins --plugin-path "$plugin_dir" | grep -q 'memory sram'
DEVALLOC_VALIDATE=1 "$devalloc" conformance "$plugin_dir/libdevalloc_dma.so" --option strict=false \
  > "$work/conformance.txt" 2>&1 ||
  { cat "$work/conformance.txt" >&2; echo "FAIL: conformance" >&2; exit 1; }
echo "PASS: every copy met the stated DMA constraints in every read mode; the card's memories conform"
