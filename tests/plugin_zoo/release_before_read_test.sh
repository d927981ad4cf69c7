#!/usr/bin/env bash
# A load through host_early_release, which releases each until-released
# copy before it has read the source (PLUGIN-14) and reads it only at
# synchronize, one case per ctest entry:
#   release_before_read_test.sh CASE DEVALLOC PYTHON ZOO_DIR SCRATCH
set -euo pipefail
case_name=$1 devalloc=$2 python=$3 zoo_dir=$4 scratch=$5
rm -rf "$scratch" && mkdir -p "$scratch" && cd "$scratch"
export DEVALLOC_PLUGIN_PATH="$zoo_dir"
unset DEVALLOC_VALIDATE

fail() { echo "FAIL: $*" >&2; exit 1; }
# Runs a command that must fail, with stderr matching every pattern.
expect_failure() {
  local patterns=$1; shift
  set +e; "$@" >out.txt 2>err.txt; local rc=$?; set -e
  cat out.txt err.txt
  [ "$rc" -ne 0 ] || fail "succeeded: $*"
  while IFS= read -r pattern; do
    grep -qE -- "$pattern" err.txt || fail "stderr does not match /$pattern/"
  done <<< "$patterns"
}

# 64 KiB of bytes with no period, staged through 4 slots of 4 KiB: each slot
# carries four pieces, so a copy that reads its slot late lands another
# piece's bytes.
"$python" - <<'PY'
import json, random, struct
n = 64 * 1024
data = random.Random(7).randbytes(n)
header = json.dumps({"w": {"dtype": "U8", "shape": [n], "data_offsets": [0, n]}}).encode()
header += b" " * (-len(header) % 8)
with open("model.safetensors", "wb") as f:
    f.write(struct.pack("<Q", len(header)) + header + data)
PY
"$devalloc" plan model.safetensors --place '*=host_early_release:0' -o plan.json >/dev/null
load_settings='[load]
staging = "16KiB"
direct = false'
printf '%s\n' "$load_settings" > plain.toml
printf '[plugins.host_early_release]\nvalidate = "sources"\n\n%s\n' "$load_settings" > sources.toml

case "$case_name" in
load_without_the_layer_passes_with_wrong_bytes_unless_verified)
  # What makes the check necessary: the load reports success...
  "$devalloc" load plan.json --config plain.toml >out.txt 2>err.txt || { cat out.txt err.txt; fail "load failed"; }
  grep -q "16 copies" out.txt || fail "not staged in 16 copies"
  # ...and only a read-back sees the bytes, and points at the tools.
  expect_failure 'verify: tensor "w" in buffer 0 on host_early_release:0 \(plugin host_early_release, device 0 "host memory"\) differs from .*model\.safetensors
plugin host_early_release landed other bytes than it was given
DEVALLOC_VALIDATE=sources, or validate = "sources" under \[plugins\.host_early_release\]
devalloc conformance .*libdevalloc_host_early_release\.so' \
    "$devalloc" load plan.json --config plain.toml --verify
  ;;
load_under_source_checks_fails_naming_plugin14_and_the_plugin)
  expect_failure '^devalloc: validation layer on for plugin host_early_release \(.*libdevalloc_host_early_release\.so\); checks: calls, releases, sources$
^devalloc validation: PLUGIN-14: plugin host_early_release \(.*\): copy_host_to_device\(device 0, dst 0x[0-9a-f]+, src 0x[0-9a-f]+, nbytes 4096, until released\): released the source of this copy before reading it
^devalloc load: synchronizing host_early_release:0 \(plugin host_early_release, .*PLUGIN-14: copy_host_to_device\(.*before reading it' \
    "$devalloc" load plan.json --config sources.toml
  [ "$(grep -c '^devalloc: validation layer on' err.txt)" -eq 1 ] || fail "the layer announced itself more than once"
  # The environment turns on the same check for every plugin.
  expect_failure 'PLUGIN-14: plugin host_early_release .*before reading it' \
    env DEVALLOC_VALIDATE=sources "$devalloc" load plan.json --config plain.toml
  ;;
plugins_shows_the_layer_and_its_checks)
  "$devalloc" plugins --config sources.toml >out.txt 2>err.txt || { cat out.txt err.txt; fail "plugins failed"; }
  cat out.txt
  grep -A4 '^host_early_release ' out.txt | grep -qx '  validation layer on (checks: calls, releases, sources)' ||
    fail "host_early_release does not show its layer"
  if grep -A4 '^host_faulty ' out.txt | grep -q 'validation layer'; then
    fail "host_faulty runs without the layer, but is shown with it"
  fi
  "$devalloc" plugins --config sources.toml --json >out.json 2>err.txt
  "$python" - <<'PY'
import json
plugins = {p["name"]: p for p in json.load(open("out.json"))["plugins"]}
assert plugins["host_early_release"]["validation"] == {"on": True, "checks": ["calls", "releases", "sources"]}, plugins["host_early_release"]
assert plugins["host_faulty"]["validation"] == {"on": False, "checks": []}, plugins["host_faulty"]
PY
  DEVALLOC_VALIDATE=1 "$devalloc" plugins --json >out.json 2>err.txt
  "$python" - <<'PY'
import json
plugins = {p["name"]: p for p in json.load(open("out.json"))["plugins"]}
assert plugins["host_faulty"]["validation"] == {"on": True, "checks": ["calls", "releases"]}, plugins["host_faulty"]
PY
  ;;
*)
  fail "unknown case $case_name"
  ;;
esac
echo "PASS: $case_name"
