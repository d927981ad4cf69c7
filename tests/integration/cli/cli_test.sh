#!/usr/bin/env bash
# End-to-end checks of the devalloc program, one case per ctest entry:
#   cli_test.sh CASE DEVALLOC PYTHON SOURCE_DIR ZOO_DIR SCRATCH
set -euo pipefail
case_name=$1 devalloc=$2 python=$3 source_dir=$4 zoo_dir=$5 scratch=$6
# The plugin folder from the program's (ctest sets it from the install layout).
: "${PLUGIN_DIR_FROM_BIN:=../lib/devalloc/plugins}"
rm -rf "$scratch" && mkdir -p "$scratch" && cd "$scratch"

fail() { echo "FAIL: $*" >&2; exit 1; }
# Runs a command that must fail with exit code $1 and a message matching $2.
expect_failure() {
  local code=$1 pattern=$2; shift 2
  set +e; "$@" >out.txt 2>err.txt; local rc=$?; set -e
  cat err.txt
  [ "$rc" -eq "$code" ] || fail "exit code $rc, expected $code: $*"
  grep -qE "$pattern" err.txt || fail "stderr does not match /$pattern/"
}

case "$case_name" in
reference_safetensors_roundtrip)
  # Written by the reference implementation, planned, loaded and verified.
  "$python" - <<'PY'
import numpy as np
from safetensors.numpy import save_file
rng = np.random.default_rng(7)
save_file({
    "encoder.embed.weight": rng.standard_normal((64, 32)).astype(np.float32),
    "encoder.layer.0.weight": rng.standard_normal((32, 32)).astype(np.float16),
    "encoder.layer.0.bias": rng.standard_normal(32).astype(np.float64),
    "decoder.positions": np.arange(100, dtype=np.int64),
    "decoder.mask": rng.integers(0, 2, 77).astype(np.bool_),
    "decoder.bytes": rng.integers(0, 255, 13).astype(np.uint8),
    "decoder.empty": np.zeros((0, 4), dtype=np.float32),
}, "reference.safetensors", metadata={"written_by": "safetensors"})
PY
  "$devalloc" plan reference.safetensors --place 'encoder.*=host:0' --alignment 64 -o plan.json
  "$devalloc" load plan.json --verify --json > load.json
  "$python" - <<'PY'
import json
r = json.load(open("load.json"))
assert r["verified"] is True, r
assert r["constants"] == 6, r          # the empty tensor needs no copy
assert r["bytes"] == 64*32*4 + 32*32*2 + 32*8 + 100*8 + 77 + 13, r
assert len(r["devices"]) == 1 and r["devices"][0]["plugin"] == "host", r
PY
  ;;
example_model_loads_and_verifies)
  cp "$source_dir/examples/small_model/plan.json" "$source_dir/examples/small_model/devalloc.toml" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  cmp plan.json "$source_dir/examples/small_model/plan.json" || fail "make_model.py no longer writes the committed plan"
  "$devalloc" load plan.json --config devalloc.toml --verify | tee out.txt
  grep -q "verified" out.txt || fail "no verified summary"
  grep -qE "methods (decode prefill|prefill decode)" out.txt || fail "both methods not loaded"
  ;;
methods_option_names_at_least_one_method)
  # Leaving --methods out loads all; an empty name is a usage error, never
  # "all" and never dropped from the list.
  cp "$source_dir/examples/small_model/plan.json" "$source_dir/examples/small_model/devalloc.toml" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  expect_failure 2 '^--methods: names no method; leave it out to load all methods' \
    "$devalloc" load plan.json --config devalloc.toml --methods ''
  for list in , 'prefill,,decode' 'prefill,' ',decode'; do
    expect_failure 2 "^--methods: an empty method name in \"$list\"" \
      "$devalloc" load plan.json --config devalloc.toml --methods "$list"
  done
  "$devalloc" load plan.json --config devalloc.toml --methods prefill,decode | tee out.txt
  grep -qE "methods (decode prefill|prefill decode)" out.txt || fail "both methods not loaded"
  ;;
malformed_plan_is_refused)
  printf '{"format": "devalloc-plan", "version": 1, "buffers": [], "tensors": [], "methods": [{"name": 3, "memory_ids": [], "tensors": []}]}' > plan.json
  expect_failure 3 'plan.json: /methods/0/name' "$devalloc" load plan.json
  printf '{"format": ' > broken.json
  expect_failure 3 'broken.json' "$devalloc" load broken.json
  ;;
version_is_the_projects_and_names_the_abi)
  version=$(sed -n 's/^version = "\(.*\)"$/\1/p' "$source_dir/pyproject.toml")
  abi=$(sed -n 's/^#define DEVALLOC_ABI_VERSION_MAJOR \([0-9]*\)$/\1/p; s/^#define DEVALLOC_ABI_VERSION_MINOR \([0-9]*\)$/.\1/p' \
        "$source_dir/abi/devalloc/plugin_abi.h" | tr -d '\n')
  out=$("$devalloc" --version)
  [ "$out" = "devalloc $version (plugin ABI $abi)" ] ||
    { echo "FAIL: --version printed '$out', expected 'devalloc $version (plugin ABI $abi)'" >&2; exit 1; }
  ;;
malformed_config_is_refused)
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  printf '[load]\nstagin = "1MiB"\n' > bad.toml
  expect_failure 3 'bad.toml:2:1: .*stagin' "$devalloc" load plan.json --config bad.toml
  ;;
truncated_safetensors_is_refused)
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  head -c 100000 model.safetensors > cut && mv cut model.safetensors
  expect_failure 3 'model.safetensors' "$devalloc" load plan.json
  ;;
more_shards_than_descriptors_fails_with_exit_1)
  # A load holds one descriptor per source file until it returns: past
  # ulimit -n that is a resource limit (exit 1), not bad input (exit 3).
  "$python" - <<'PY'
import numpy as np
from safetensors.numpy import save_file
for i in range(64):
    save_file({f"w{i}": np.full(4, i, dtype=np.float32)}, f"f{i:02}.safetensors")
PY
  "$devalloc" plan f*.safetensors -o plan.json
  "$devalloc" load plan.json --verify >/dev/null
  expect_failure 1 'f[0-9]+\.safetensors: cannot open: Too many open files' \
    bash -c 'ulimit -n 40 && exec "$0" load plan.json' "$devalloc"
  ;;
unresolvable_device_fails_with_reason)
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  # No config: a tag means the plugin of its name, and there is none.
  sed -i 's/"cuda:0"/"nosuchvendor:0"/' plan.json
  expect_failure 1 'devalloc load: plan\.json: /buffers/0: no device for "nosuchvendor:0" \(memory id 0\): .*libdevalloc_nosuchvendor.so' \
    "$devalloc" load plan.json
  ;;
plugins_lists_zoo_reasons_and_host)
  DEVALLOC_PLUGIN_PATH="$zoo_dir" "$devalloc" plugins > out.txt
  cat out.txt
  grep -A3 '^host ' out.txt | grep -q 'host memory' || fail "host plugin or its device not listed"
  grep -A2 '^zoo_major2 ' out.txt | grep -q 'ABI 2.0 offered, this loader speaks 1.x' || fail "major2 reason"
  grep -A2 '^zoo_no_entry ' out.txt | grep -q 'does not export devalloc_plugin_negotiate' || fail "no_entry reason"
  grep -A2 '^zoo_missing_dep ' out.txt | grep -q 'libdevalloc_zoo_dependency.so' || fail "missing_dep reason"
  grep -A2 '^zoo_small_table ' out.txt | grep -q 'function table is 16 bytes' || fail "small_table reason"
  grep -A2 '^zoo_create_fails ' out.txt | grep -q 'libzoo.so.3 not found' || fail "create_fails reason"
  grep -A2 '^zoo_truncated ' out.txt | grep -q 'cannot be opened: truncated: segment' || fail "truncated reason"
  grep -A2 '^zoo_not_a_library ' out.txt | grep -q 'cannot be opened: not an ELF file$' || fail "not_a_library reason"
  grep -A2 '^zoo_entry_is_data ' out.txt | grep -q 'devalloc_plugin_negotiate is not a function' || fail "entry_is_data reason"
  DEVALLOC_PLUGIN_PATH="$zoo_dir" "$devalloc" plugins --json > out.json
  "$python" -c "
import json; p = {x['name']: x for x in json.load(open('out.json'))['plugins']}
assert p['host']['status'] == 'loaded' and p['host']['devices'], p['host']
assert p['zoo_refuses']['status'] == 'negotiation failed', p['zoo_refuses']"
  ;;
cuda_without_driver_is_unavailable_with_reason)
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  # A config that requires CUDA, with a driver that is not there.
  printf '[plugins.cuda]\noptions = { runtime_library = "/nonexistent/libcuda.so.1" }\n' > cuda.toml
  expect_failure 1 'plan\.json: /buffers/0: no device for "cuda:0" \(memory id 0\): cuda index 0: plugin cuda is unavailable: .*cannot open the CUDA driver "/nonexistent/libcuda.so.1"' \
    "$devalloc" load plan.json --config cuda.toml
  if ! ldconfig -p | grep -q 'libcuda.so.1 '; then
    "$devalloc" plugins > out.txt
    cat out.txt
    grep -A2 '^cuda ' out.txt | grep -q 'unavailable (vendor runtime missing)' || fail "cuda not shown as unavailable"
    grep -A2 '^cuda ' out.txt | grep -q 'cannot open the CUDA driver "libcuda.so.1"' || fail "no reason for cuda"
  fi
  ;;
load_is_valgrind_clean)
  cp "$source_dir/examples/small_model/plan.json" "$source_dir/examples/small_model/devalloc.toml" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  printf '[plugins.host]\noptions = { async = "true" }\n' >> devalloc.toml
  valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    "$devalloc" load plan.json --config devalloc.toml --verify
  # A failing load must leave nothing behind either.
  sed -i 's/"key": "lm_head.weight"/"key": "no.such.key"/' plan.json
  set +e
  valgrind --error-exitcode=9 --leak-check=full --errors-for-leak-kinds=definite,indirect \
    "$devalloc" load plan.json --config devalloc.toml 2>err.txt
  rc=$?
  set -e
  cat err.txt
  [ "$rc" -eq 3 ] || fail "exit code $rc under valgrind, expected 3"
  ;;
shipped_plugins_export_only_the_entry_point)
  plugins=("$(dirname "$devalloc")/$PLUGIN_DIR_FROM_BIN"/libdevalloc_*.so)
  [ -e "${plugins[0]}" ] || fail "no plugins next to $devalloc"
  for so in "${plugins[@]}"; do
    exports=$(nm -D --defined-only "$so" | awk '$2 ~ /^[TDBRVWi]$/ {print $3}')
    echo "$so: $exports"
    [ "$exports" = "devalloc_plugin_negotiate" ] || fail "$so exports: $exports"
  done
  ;;
inspect_shows_resolved_devices)
  cp "$source_dir/examples/small_model/plan.json" "$source_dir/examples/small_model/devalloc.toml" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  # A vendor no machine has, so the fallback is taken everywhere.
  sed -i 's/cuda/nosuchvendor/g' plan.json devalloc.toml
  "$devalloc" inspect plan.json --config devalloc.toml --tensors | tee out.txt
  grep -qE '\[0\] .*planned nosuchvendor:0 -> nosuchvendor:0 \(plugin host, device 0 "host memory"\) \[fallback\]' out.txt \
    || fail "buffer 0 not shown on its fallback"
  grep -q 'kv_cache .*(scratch)' out.txt || fail "scratch tensor not listed"
  ;;
load_marks_a_device_serving_a_fallback_whichever_buffer_comes_first)
  # One device serves a buffer planned for it and one that fell back to it:
  # its row is a fallback row whatever the order of the two buffers.
  "$python" -c "
import numpy as np; from safetensors.numpy import save_file
save_file({'a': np.ones(4, np.float32), 'lm_head.w': np.ones(4, np.float32)}, 'm.safetensors')"
  printf '[devices."nosuchvendor:0"]\nfallback = ["host"]\n' > c.toml
  "$devalloc" plan m.safetensors --place 'lm_head.*=nosuchvendor:0' -o host-first.json
  "$devalloc" plan m.safetensors --place 'a=nosuchvendor:0' -o fallback-first.json
  for p in host-first fallback-first; do
    "$devalloc" load $p.json --config c.toml | tee out.txt
    grep -qE '^  host device 0 "host memory" \[fallback\] ' out.txt || fail "$p: the row is not marked [fallback]"
    "$devalloc" load $p.json --config c.toml --json > out.json
    "$python" -c "import json,sys; d=json.load(open('out.json'))['devices']; sys.exit(0 if len(d) == 1 and d[0]['fallback'] else 1)" ||
      fail "$p: the JSON row is not a fallback"
  done
  ;;
load_warns_of_releases_after_synchronize)
  # A plugin whose releases come after synchronize returned (PLUGIN-20),
  # within release_timeout: the load succeeds, but says on stderr why it
  # waited, and --json counts the late releases per device.
  "$python" -c "
import numpy as np; from safetensors.numpy import save_file
save_file({'w%d' % i: np.full(4096, i, np.uint8) for i in range(4)}, 'm.safetensors')"
  "$devalloc" plan m.safetensors --place '*=late:0' -o plan.json
  cat > c.toml <<TOML
[plugins.late]
library = "$zoo_dir/libdevalloc_host_faulty.so"
options = { release_late_ms = "100" }
[load]
direct = false
TOML
  "$devalloc" load plan.json --config c.toml --verify >out.txt 2>err.txt || { cat out.txt err.txt; fail "load failed"; }
  cat out.txt err.txt
  grep -qE '^devalloc load: warning: plugin late released [1-9][0-9]* (copy|copies) to late device 0 "host memory" after synchronize returned \(PLUGIN-20\); the load waited [0-9.]+ s for (it|them)' err.txt \
    || fail "no warning of the late releases"
  "$devalloc" load plan.json --config c.toml --json >out.json 2>err.txt
  grep -q 'warning: plugin late released' err.txt || fail "no warning with --json"
  "$python" -c "import json,sys; d=json.load(open('out.json'))['devices']; sys.exit(0 if d[0]['late_releases'] >= 1 and d[0]['late_release_seconds'] > 0 else 1)" ||
    fail "the JSON row does not count the late releases"
  # A plugin that releases in time is not warned about.
  sed -i 's/release_late_ms = "100"/release_late_ms = "0"/' c.toml
  "$devalloc" load plan.json --config c.toml --json >out.json 2>err.txt
  ! grep -q 'warning' err.txt || fail "warned of a plugin that released in time"
  "$python" -c "import json,sys; d=json.load(open('out.json'))['devices']; sys.exit(0 if d[0]['late_releases'] == 0 else 1)" ||
    fail "late releases counted for a plugin that released in time"
  ;;
inspect_and_load_check_free_memory)
  # Issue 7: a device that reports less free memory than the plan needs is
  # shown by inspect and refused by load before anything is allocated.
  cp "$source_dir/examples/small_model/plan.json" "$source_dir/examples/small_model/devalloc.toml" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  sed -i 's/cuda/nosuchvendor/g' plan.json devalloc.toml
  printf '[plugins.host]\noptions = { memory_limit = "1048576" }\n' >> devalloc.toml
  set +e; "$devalloc" inspect plan.json --config devalloc.toml >out.txt 2>err.txt; rc=$?; set -e
  cat out.txt err.txt
  [ "$rc" -eq 1 ] || fail "inspect exit code $rc, expected 1"
  grep -qE '^  host device 0 "host memory": plan needs 4\.3 MiB in 4 buffers, 1\.0 MiB free of 1\.0 MiB \[does not fit\]$' out.txt \
    || fail "inspect does not show need against free"
  expect_failure 1 'devalloc load: plan\.json: the load does not fit, nothing was allocated: host device 0 "host memory": plan needs 4\.3 MiB in 4 buffers, 1\.0 MiB free of 1\.0 MiB \(/buffers/0 \(memory id 0\), /buffers/1 \(memory id 1\), /buffers/2 \(memory id 2\), /buffers/3 \(memory id 3\)\)' \
    "$devalloc" load plan.json --config devalloc.toml
  # Without the check, the plugin's allocate is what refuses the load.
  sed -i 's/^\[load\]$/[load]\ncheck_free_memory = false/' devalloc.toml
  expect_failure 1 'buffer [0-9].*memory_limit' "$devalloc" load plan.json --config devalloc.toml
  # With room, inspect shows what is free and exits 0.
  sed -i 's/memory_limit = "1048576"/memory_limit = "8388608"/' devalloc.toml
  "$devalloc" inspect plan.json --config devalloc.toml | tee out.txt
  grep -qE '^  host device 0 "host memory": plan needs 4\.3 MiB in 4 buffers, 8\.0 MiB free of 8\.0 MiB$' out.txt \
    || fail "inspect does not show free memory"
  ;;
one_gpu_through_two_plugin_entries_is_one_device_to_the_fit_check)
  # Two [plugins.*] entries with one library and one driver reach one GPU
  # (one UUID): the fit check adds their buffers up against its free
  # memory instead of counting the GPU twice (fake driver, 4 MiB).
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  cuda_so="$(cd "$(dirname "$devalloc")/$PLUGIN_DIR_FROM_BIN" && pwd)/libdevalloc_cuda.so"
  cat > devalloc.toml <<TOML
[plugins.cuda]
options = { runtime_library = "$FAKE_CUDA_DIR/libcuda.so.1" }
[plugins.cuda_b]
library = "$cuda_so"
options = { runtime_library = "$FAKE_CUDA_DIR/libcuda.so.1" }
[memory]
1 = "cuda_b"
TOML
  export DEVALLOC_FAKE_CUDA_MEMORY_BYTES=4194304
  set +e; "$devalloc" inspect plan.json --config devalloc.toml >out.txt 2>err.txt; rc=$?; set -e
  cat out.txt err.txt
  [ "$rc" -eq 1 ] || fail "inspect exit code $rc, expected 1"
  grep -qE '^  cuda device 0 "[^"]*" \(also as cuda_b device 0 "[^"]*"\): plan needs 4\.3 MiB in 3 buffers, 4\.0 MiB free of 4\.0 MiB \[does not fit\]$' out.txt \
    || fail "inspect does not add up the GPU's buffers from both entries"
  [ "$(sed -n '/^devices:$/,$p' out.txt | grep -c '^  cuda')" -eq 1 ] \
    || fail "the GPU is listed more than once among the devices"
  expect_failure 1 'the load does not fit, nothing was allocated: cuda device 0 "[^"]*" \(also as cuda_b device 0 "[^"]*"\): plan needs 4\.3 MiB in 3 buffers' \
    "$devalloc" load plan.json --config devalloc.toml
  # Each entry's share alone fits: on a GPU with room the load goes through.
  export DEVALLOC_FAKE_CUDA_MEMORY_BYTES=8388608
  "$devalloc" load plan.json --config devalloc.toml --verify
  ;;
plugins_with_config_uses_its_path_options_and_aliases)
  # Issue 7: `devalloc plugins --config` shows the plugins as that config's
  # runtime would load them.
  host_so="$(cd "$(dirname "$devalloc")/$PLUGIN_DIR_FROM_BIN" && pwd)/libdevalloc_host.so"
  cat > devalloc.toml <<TOML
plugin_path = ["$zoo_dir"]
[plugins.host]
options = { memory_limit = "1048576" }
[plugins.tiny]
library = "$host_so"
options = { memory_limit = "4096" }
[plugins.picky]
library = "$host_so"
options = { no_such_option = "1" }
[plugins.absent]
TOML
  "$devalloc" plugins --config devalloc.toml | tee out.txt
  grep -q "^  $zoo_dir (config)" out.txt || fail "the config's plugin_path is not searched"
  grep -q '^zoo_major2 ' out.txt || fail "a plugin of the config's plugin_path is not listed"
  grep -A3 '^host ' out.txt | grep -q 'configured at .*devalloc.toml:2:' || fail "host not shown as configured"
  grep -A3 '^host ' out.txt | grep -q 'host memory, 1.0 MiB' || fail "host options not passed"
  grep -A3 '^tiny ' out.txt | grep -q 'host memory, 4.0 KiB' || fail "alias tiny not created with its options"
  grep -A3 '^picky ' out.txt | grep -q 'no_such_option' || fail "picky's refusal does not name the option"
  grep -A3 '^absent ' out.txt | grep -q 'libdevalloc_absent.so' || fail "absent plugin not listed as not found"
  "$devalloc" plugins --config devalloc.toml --json > out.json
  "$python" -c "
import json; p = {x['name']: x for x in json.load(open('out.json'))['plugins']}
assert p['tiny']['status'] == 'loaded' and p['tiny']['devices'][0]['total_memory_bytes'] == 4096, p['tiny']
assert p['tiny']['configured_at'].startswith('devalloc.toml:4:'), p['tiny']
assert p['picky']['status'] == 'create failed', p['picky']
assert p['zoo_major2']['configured_at'] == '', p['zoo_major2']"
  # An alias that reuses a found plugin's name is listed apart; the file
  # found on the path, which that runtime never uses, is listed as shadowed
  # by the config's library and not opened.
  cat > alias.toml <<TOML
[plugins.host]
library = "$host_so"
options = { memory_limit = "4096" }
TOML
  "$devalloc" plugins --config alias.toml --json > alias.json
  "$python" -c "
import json; hosts = [x for x in json.load(open('alias.json'))['plugins'] if x['name'] == 'host']
assert len(hosts) == 2, hosts
found, alias = hosts
assert found['status'] == 'shadowed' and 'devices' not in found, found
assert found['configured_at'] == '', found
assert found['reason'].startswith('[plugins.host] library = \"$host_so\" (alias.toml:1:'), found
assert found['reason'].endswith(') is used for \"host\" instead'), found
assert alias['status'] == 'loaded' and alias['configured_at'].startswith('alias.toml:1:'), alias
assert alias['devices'][0]['total_memory_bytes'] == 4096, alias"
  "$devalloc" plugins --config alias.toml > alias.txt
  cat alias.txt
  [ "$(grep -c '^host ' alias.txt)" -eq 2 ] || fail "host is not listed twice"
  grep -A2 '^host  *shadowed' alias.txt | grep -q 'library = .* is used for "host" instead' ||
    fail "the file on the path is not shadowed by the config's library"
  # Without --config the host plugin is created with no options.
  "$devalloc" plugins > plain.txt
  grep -A3 '^host ' plain.txt | grep -q 'host memory, 1.0 MiB' && fail "options leaked into a plain listing"
  printf '[plugins.host]\nlibrery = "x"\n' > bad.toml
  expect_failure 3 'bad.toml:2:1: unknown key "librery"' "$devalloc" plugins --config bad.toml
  ;;
hostile_plugin_text_is_escaped_and_json_stays_valid)
  # A plugin's version and device name hold terminal escapes and a byte
  # that is not UTF-8: the text output shows them escaped, --json stays
  # valid (the byte becomes U+FFFD) and a load through the plugin succeeds.
  DEVALLOC_PLUGIN_PATH="$zoo_dir" "$devalloc" plugins > out.txt
  if grep -q $'\x1b' out.txt; then fail "a raw escape reached the output"; fi
  grep -A1 '^zoo_hostile_names ' out.txt | grep -qF '(plugin 0\x1b[31m\xffvvv' || fail "version not escaped"
  # 307 bytes: the message shows the first 200 and the real length.
  grep -A1 '^zoo_hostile_names ' out.txt | grep -qE 'v{190}\.\.\. \(307 bytes\), ABI 1\.[0-9]+\)' ||
    fail "a long version does not end in its length"
  grep -A3 '^zoo_hostile_names ' out.txt | grep -qF '[0] zoo \x1b[2J\xff memory,' || fail "device name not escaped"
  grep -A3 '^zoo_hostile_names ' out.txt | grep -qF ', pci 0000:\x1b[5m01:00.0' || fail "PCI bus id not escaped"
  DEVALLOC_PLUGIN_PATH="$zoo_dir" "$devalloc" plugins --json > out.json
  "$python" -c "
import json; p = {x['name']: x for x in json.load(open('out.json'))['plugins']}
d = p['zoo_hostile_names']
assert d['devices'][0]['name'] == 'zoo \x1b[2J\ufffd memory', d
assert d['version'].startswith(r'0\x1b[31m\xffvvv'), d  # escaped by the loader, as in messages
assert d['version'].endswith('v... (307 bytes)'), d"
  "$python" -c "
import numpy as np
from safetensors.numpy import save_file
save_file({'w': np.arange(64, dtype=np.float32)}, 'model.safetensors')"
  "$devalloc" plan model.safetensors --place '*=zoo_hostile_names:0' -o plan.json
  DEVALLOC_PLUGIN_PATH="$zoo_dir" "$devalloc" load plan.json --verify --json > load.json
  "$python" -c "
import json; r = json.load(open('load.json'))
assert r['verified'] is True and r['constants'] == 1, r
assert r['devices'][0]['plugin'] == 'zoo_hostile_names', r
assert '\ufffd' in json.dumps(r['devices'][0], ensure_ascii=False), r"
  ;;
hostile_names_in_a_plan_are_printed_escaped)
  # Tensor, key and method names are the plan's and the model's, not ours:
  # plan, inspect and load print them escaped, never raw.
  "$python" -c "
import numpy as np
from safetensors.numpy import save_file
save_file({'w\x1b[31mX': np.arange(64, dtype=np.float32)}, 'model.safetensors')"
  "$devalloc" plan model.safetensors -o plan.json > out.txt
  "$python" -c "
import json; p = json.load(open('plan.json'))
p['methods'][0]['name'] = 'm\x1b[32mY'
json.dump(p, open('plan.json', 'w'))"
  "$devalloc" inspect plan.json --tensors >> out.txt 2>&1
  "$devalloc" load plan.json >> out.txt 2>&1
  cat out.txt
  if grep -q $'\x1b' out.txt; then fail "a raw escape reached the output"; fi
  grep -qF 'm\x1b[32mY: 1 tensors' out.txt || fail "inspect: method name not escaped"
  grep -qF 'w\x1b[31mX ' out.txt || fail "inspect: tensor name not escaped"
  grep -qF 'model.safetensors:w\x1b[31mX' out.txt || fail "inspect: source key not escaped"
  grep -qF 'methods m\x1b[32mY' out.txt || fail "load: method name not escaped"
  ;;
plan_option_values_are_usage_errors)
  # A bad value on plan's command line exits 2 (a usage error), quoted as
  # given: never wrapped (-1 to 2^64 - 1), saturated (2^64) or left to a
  # later stage that exits 3.
  "$python" -c "
import numpy as np
from safetensors.numpy import save_file
save_file({'w': np.arange(64, dtype=np.float32)}, 'model.safetensors')"
  for value in -1 0 3 18446744073709551616 1e3 ''; do
    expect_failure 2 "^--alignment: a power of two, not \"$value\"" \
      "$devalloc" plan model.safetensors -o a.json --alignment "$value"
  done
  expect_failure 2 '^--place: placement rule "=host": empty glob' \
    "$devalloc" plan model.safetensors -o p.json --place '=host'
  expect_failure 2 '^--default-device: "bad!" is not a device tag' \
    "$devalloc" plan model.safetensors -o d.json --default-device 'bad!'
  expect_failure 2 '^--output: an empty path' "$devalloc" plan model.safetensors -o ''
  # load --methods splits at commas: such a name could never be loaded.
  expect_failure 2 "^--method: \"a,b\" has a ','" \
    "$devalloc" plan model.safetensors -o m.json --method 'a,b'
  expect_failure 2 '^--method: an empty method name' \
    "$devalloc" plan model.safetensors -o m.json --method ''
  [ ! -e a.json ] && [ ! -e p.json ] && [ ! -e d.json ] && [ ! -e m.json ] || fail "a plan was written"
  "$devalloc" plan model.safetensors -o ok.json --alignment 64 --method a --method b
  ;;
hostile_inputs_are_refused_with_exit_3)
  # Issue 9: each is refused at once, naming the file, with exit code 3;
  # `timeout` turns a hang into a failure.
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  "$python" - <<'PY'
import json, struct
header = b'{"w": {"dtype": "U8", "shape": [1e400], "data_offsets": [0, 1]}}'
open("huge_number.safetensors", "wb").write(struct.pack("<Q", len(header)) + header + b"\0")
plan = json.load(open("plan.json"))
text = json.dumps(plan).replace('"version": 1', '"version": 1e400')
open("huge_number_plan.json", "w").write(text)
PY
  expect_failure 3 'huge_number.safetensors: tensor "w": shape\[0\] is 1e400, expected a non-negative integer' \
    timeout 20 "$devalloc" plan huge_number.safetensors -o out_plan.json
  expect_failure 3 'huge_number_plan.json: /version: expected a non-negative integer, got number 1e400' \
    timeout 20 "$devalloc" load huge_number_plan.json
  # A safetensors argument that is missing or a folder is bad input (3),
  # in devalloc's words, like the plan and config arguments.
  expect_failure 3 'missing.safetensors: cannot open: No such file or directory' \
    "$devalloc" plan missing.safetensors -o out_plan.json
  mkdir -p a_folder.safetensors
  expect_failure 3 'a_folder.safetensors: not a regular file \(a directory\)' \
    "$devalloc" plan a_folder.safetensors -o out_plan.json
  mkfifo fifo.safetensors fifo_plan.json fifo.toml
  expect_failure 3 'fifo.safetensors: not a regular file \(a FIFO\)' \
    timeout 20 "$devalloc" plan fifo.safetensors -o out_plan.json
  expect_failure 3 'fifo_plan.json: not a regular file \(a FIFO\)' \
    timeout 20 "$devalloc" load fifo_plan.json
  expect_failure 3 'fifo.toml: not a regular file \(a FIFO\)' \
    timeout 20 "$devalloc" load plan.json --config fifo.toml
  expect_failure 3 '/dev/zero: not a regular file \(a character device\)' \
    timeout 20 "$devalloc" load plan.json --config /dev/zero
  # A source file that is a FIFO.
  mv model.safetensors real.safetensors && mkfifo model.safetensors
  expect_failure 3 'model.safetensors: not a regular file \(a FIFO\)' \
    timeout 20 "$devalloc" load plan.json
  ;;
output_that_cannot_be_written_fails)
  # What devalloc prints must arrive: a full or closed standard output is a
  # failure (exit 1), not success with the output lost.
  expect_failure 1 'devalloc: cannot write to standard output: No space left on device' \
    sh -c '"$0" plugins --json > /dev/full' "$devalloc"
  expect_failure 1 'devalloc: cannot write to standard output: Bad file descriptor' \
    sh -c '"$0" plugins >&-' "$devalloc"
  "$devalloc" plugins --json > plugins.json
  # A plan written past the file size limit (1 KiB; the plan of 40 tensors
  # is larger): an error naming the file asked for, as SIGXFSZ does not end
  # the program, and nothing left behind.
  header='{'
  for i in $(seq 10 49); do header="$header\"tensor_$i\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[$((i - 10)),$((i - 9))]},"; done
  header="${header%,}}"
  "$python" -c 'import struct, sys; h = sys.argv[1].encode(); open("m.safetensors", "wb").write(struct.pack("<Q", len(h)) + h + bytes(40))' "$header"
  expect_failure 3 'out_plan.json: not written: cannot write the temporary file out_plan.json.tmp-[0-9]+-[0-9]+: File too large' \
    sh -c 'ulimit -f 1; exec "$0" plan m.safetensors -o out_plan.json' "$devalloc"
  [ "$(ls)" = "$(printf 'err.txt\nm.safetensors\nout.txt\nplugins.json')" ] || fail "left behind: $(ls)"
  ;;
external_files_are_refused_when_the_config_says_so)
  # devalloc plan writes "allow_external_files" for a plan outside the
  # model's folder; [load] external_files = false does not honour it, before
  # any source file is opened, for plans one did not make.
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  mkdir plans
  "$devalloc" plan model.safetensors -o plans/plan.json
  grep -q '"allow_external_files": *true' plans/plan.json || fail "plan does not allow external files"
  "$devalloc" load plans/plan.json >/dev/null
  printf '[load]\nexternal_files = false\n' > strict.toml
  for command in load inspect; do
    expect_failure 3 'plan.json: /tensors/0 .*resolves to .*/model.safetensors, outside the plan.s folder .*/plans; the plan sets "allow_external_files", which this runtime does not honour \(\[load\] external_files = false\)' \
      "$devalloc" $command plans/plan.json --config strict.toml
  done
  ;;
fallback_says_why_and_can_be_forbidden)
  # A typo in `use` ("cdua") made every buffer fall back to the host with
  # exit 0 and no word of why. Now each fallback says why its primary
  # failed: a warning on stderr by default, a line of the report with
  # [load] fallback = "allow", and a failed load with "error".
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  printf '[devices."cuda:0"]\nuse = ["cdua", { index = 0 }]\nfallback = ["host"]\n' > c.toml
  how='device "cuda:0" falls back to host device 0 "host memory" \(via "host"\): cdua index 0: plugin cdua is unavailable: .*libdevalloc_cdua\.so'
  why="memory ids 0, 1, 2: $how"
  "$devalloc" load plan.json --config c.toml >out.txt 2>err.txt || { cat out.txt err.txt; fail "load failed"; }
  cat out.txt err.txt
  grep -qE "^devalloc load: warning: fallback: $why" err.txt || fail "no warning saying why"
  # The three buffers fell back the same way: one line names them all.
  [ "$(grep -c 'warning: fallback: ' err.txt)" -eq 1 ] || fail "not one warning for the one fallback"
  "$devalloc" load plan.json --config c.toml --json >out.json 2>err.txt
  grep -qE "^devalloc load: warning: fallback: $why" err.txt || fail "no warning with --json"
  WHY="$why" "$python" -c "
import json, os, re, sys
lines = json.load(open('out.json'))['fallbacks']
sys.exit(0 if len(lines) == 1 and re.match(os.environ['WHY'], lines[0]) else 1)" || fail "--json has no fallbacks saying why"
  "$devalloc" inspect plan.json --config c.toml >out.txt
  grep -qE "^      fallback: memory id 0: $how" out.txt || fail "inspect does not say why"
  printf '[load]\nfallback = "allow"\n' >> c.toml
  "$devalloc" load plan.json --config c.toml >out.txt 2>err.txt
  grep -qE "^  fallback: $why" out.txt || fail "allow: the report does not say why"
  ! grep -q 'warning' err.txt || fail "allow: warned"
  sed -i 's/fallback = "allow"/fallback = "error"/' c.toml
  expect_failure 1 'devalloc load: plan\.json: /buffers/0: memory id 0: device "cuda:0" would fall back to host device 0 "host memory", which \[load\] fallback = "error" forbids: cdua index 0: plugin cdua is unavailable' \
    "$devalloc" load plan.json --config c.toml
  ;;
unused_devices_entry_is_warned_about)
  # [devices."cuda0"] (the colon forgotten) was accepted without a word.
  cp "$source_dir/examples/small_model/plan.json" .
  "$python" "$source_dir/examples/small_model/make_model.py" .
  printf '[devices."cuda0"]\nuse = "host"\n[devices."cuda:0"]\nfallback = ["host"]\n' > c.toml
  for command in load inspect; do
    "$devalloc" $command plan.json --config c.toml >out.txt 2>err.txt || { cat out.txt err.txt; fail "$command failed"; }
    cat err.txt
    grep -qE "^devalloc $command: warning: .*c\.toml:1:10: \[devices\.\"cuda0\"\] is used by no buffer of plan\.json \(its device tags: \"cuda:0\", \"host\"\)$" err.txt \
      || fail "$command: no warning of the unused entry"
    ! grep -q 'devices\."cuda:0"' err.txt || fail "$command: warned of an entry the plan uses"
  done
  ;;
plan_warns_of_a_place_rule_that_places_nothing)
  "$python" -c "
import numpy as np; from safetensors.numpy import save_file
save_file({'model.layers.0.w': np.ones(4, np.float32), 'lm_head.w': np.ones(4, np.float32)}, 'm.safetensors')"
  "$devalloc" plan m.safetensors --place 'layers.*=cuda:0' --place 'lm_head.*=host' -o plan.json >out.txt 2>err.txt
  cat err.txt
  grep -qx 'devalloc plan: warning: --place: placement rule "layers.\*=cuda:0" placed no tensor: it matches none of the 2 tensors' err.txt \
    || fail "no warning of the rule that placed nothing"
  [ "$(wc -l < err.txt)" -eq 1 ] || fail "warned of a rule that placed a tensor"
  ;;
overlong_tags_and_paths_are_refused_with_short_messages)
  # A 1 MiB device tag was a valid tag, echoed four times by the failed
  # load; a source path past PATH_MAX was resolved (10 MB: 517 MB of RSS).
  "$python" - <<'PY'
import json
import numpy as np
from safetensors.numpy import save_file
save_file({"w": np.ones(4, np.float32)}, "m.safetensors")
def plan(device, file):
    return {"format": "devalloc-plan", "version": 1,
            "buffers": [{"memory_id": 0, "device": device, "size": 16}],
            "tensors": [{"name": "w", "dtype": "F32", "shape": [4], "memory_id": 0, "offset": 0,
                         "source": {"file": file, "key": "w"}}],
            "methods": [{"name": "main", "memory_ids": [0], "tensors": ["w"]}]}
json.dump(plan("a" * (1 << 20), "m.safetensors"), open("tag.json", "w"))
json.dump(plan("host", "./" * (5 << 20) + "m.safetensors"), open("path.json", "w"))
open("c.toml", "w").write('[memory]\n0 = "%s"\n' % ("a" * 1000000))
PY
  for command in load inspect; do
    expect_failure 3 '^devalloc '$command': tag\.json: /buffers/0: device "a{200}\.\.\." \(1048576 bytes\) is longer than a device tag may be \(256 bytes\)$' \
      "$devalloc" $command tag.json
    [ "$(wc -c < err.txt)" -lt 1000 ] || fail "$command: a message of $(wc -c < err.txt) bytes"
    expect_failure 3 '^devalloc '$command': path\.json: /tensors/0 "w": source file "(\./){100}\.\.\." \(10485773 bytes\) is longer than a path may be \(4095 bytes\)$' \
      "$devalloc" $command path.json
  done
  "$devalloc" plan m.safetensors -o plan.json
  expect_failure 3 'c\.toml:2:5: memory id 0 in \[memory\] maps to "a{200}\.\.\." \(1000000 bytes\), which is not a device tag' \
    "$devalloc" load plan.json --config c.toml
  [ "$(wc -c < err.txt)" -lt 1000 ] || fail "config: a message of $(wc -c < err.txt) bytes"
  ;;
*) fail "unknown case $case_name" ;;
esac
echo "PASS: $case_name"
