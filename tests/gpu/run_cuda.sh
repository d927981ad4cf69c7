#!/usr/bin/env bash
# The CUDA plugin on a real NVIDIA GPU, in one run of a few minutes: the
# conformance suite against the real driver, a load of a generated model of
# several GiB with --verify, and the load's throughput beside the raw
# host-to-device bandwidth of the same machine, measured in the same run,
# and devalloc_bench on cuda:0: the load against the per-tensor strategy and
# the page-cache read limit with the same threads, in the same run.
#
#   tests/gpu/run_cuda.sh                 build from source, then run
#   tests/gpu/run_cuda.sh --pack DIR      build and put what a run needs into
#                                         DIR (no GPU needed), for a GPU
#                                         machine without the build packages
#   tests/gpu/run_cuda.sh --prebuilt DIR  run with what --pack put into DIR
#
# Environment:
#   MODEL_GIB  size of the generated model in GiB (default 4)
#   MODEL_MIB  size in MiB instead (smoke runs against the fake driver)
#   BENCH_ARGS extra arguments of devalloc_bench (default: --repeats 3)
#   BANDWIDTH_MIB  size of the bandwidth copies in MiB, a multiple of 64
#              (default 1024)
#   WORK       scratch folder for the model, plan and logs (default: new in /tmp)
#   CUDA_HOME  the CUDA toolkit: cuda.h and libcuda's link stub (/usr/local/cuda)
#   JOBS       build parallelism (default: all cores)
#   DEVALLOC_GPU_DRIVER  the driver library the plugin opens (libcuda.so.1).
#              A fake driver's absolute path (a libcuda.so.1) runs every
#              step against it, the bandwidth tool too (its folder first on
#              LD_LIBRARY_PATH), to check this script on a machine without a
#              GPU; the figures are then the fake's.
#
# The figures come last, as Markdown to paste into docs/hardware.md. Exits 0
# when conformance, the bandwidth tool, the load, the verified load and the
# benchmark passed. See tests/gpu/README.md.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cuda_home=${CUDA_HOME:-/usr/local/cuda}
model_gib=${MODEL_GIB:-4}
model_size=$model_gib
model_mib=$((model_gib * 1024))
if [ -n "${MODEL_MIB:-}" ]; then model_size=${MODEL_MIB}M; model_mib=$MODEL_MIB; fi
bench_args=${BENCH_ARGS:---repeats 3}
bandwidth_mib=${BANDWIDTH_MIB:-1024}
jobs=${JOBS:-$(nproc)}
driver=${DEVALLOC_GPU_DRIVER:-libcuda.so.1}
mode=source
# The build tree; /build*/ is ignored by git, so it never travels to a GPU
# machine with the working tree.
build_dir=$root/build-gpu
prefix=$build_dir
case "${1:-}" in
  --pack) mode=pack; prefix=$(realpath -m "${2:?--pack needs a folder}") ;;
  --prebuilt) mode=prebuilt; prefix=$(realpath "${2:?--prebuilt needs a folder}") ;;
  "") ;;
  *) echo "usage: $0 [--pack DIR | --prebuilt DIR]" >&2; exit 2 ;;
esac

started=$(date +%s.%N)
step() { printf '\n== [%6.1f s] %s\n' "$(elapsed "$started")" "$*" >&2; }
elapsed() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.3f", b - a }'; }
gb_per_s() {
  awk -v bytes="$1" -v s="$2" 'BEGIN { if (s > 0) printf "%.2f", bytes / s / 1e9; else printf "-" }'
}
# The first number after "key": in a JSON file, which for `devalloc load
# --json` is the first device's figure.
json_number() { grep -o "\"$1\": *[0-9.e+-]*" "$2" | head -n 1 | sed 's/.*: *//'; }

# Builds the CLI, the CUDA plugin and the two tools of this folder into $1.
build() {
  local out=$1 generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  step "configure and build (Release) in $out"
  mkdir -p "$out"
  cmake -S "$root" -B "$out" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DDEVALLOC_BUILD_TESTS=OFF -DDEVALLOC_BUILD_BENCHMARKS=ON \
    -DDEVALLOC_INSTALL=OFF -DDEVALLOC_WERROR=OFF -DDEVALLOC_BUILD_CUDA=ON \
    -DCUDAToolkit_ROOT="$cuda_home" >"$out/configure.log" 2>&1 ||
    { cat "$out/configure.log" >&2; exit 1; }
  cmake --build "$out" -j "$jobs" --target devalloc devalloc_cuda devalloc_bench
  local stubs
  for stubs in "$cuda_home/lib64/stubs" "$cuda_home/targets/x86_64-linux/lib/stubs"; do
    [ -e "$stubs/libcuda.so" ] && break
  done
  # Linked against the stub, whose soname is libcuda.so.1: at run time that
  # is the real driver.
  "${CXX:-g++}" -std=c++20 -O2 -I"$cuda_home/include" -I"$root/abi" \
    "$root/tests/gpu/cuda_bandwidth.cpp" -L"$stubs" -lcuda -ldl \
    -o "$out/bin/devalloc_cuda_bandwidth"
  "${CXX:-g++}" -std=c++20 -O2 "$root/tests/gpu/make_model.cpp" \
    -o "$out/bin/devalloc_make_model"
}

if [ "$mode" = pack ]; then
  build "$build_dir"
  step "pack into $prefix"
  rm -rf "$prefix"
  mkdir -p "$prefix/bin" "$prefix/lib/devalloc/plugins"
  for tool in devalloc devalloc_cuda_bandwidth devalloc_make_model devalloc_bench; do
    strip -o "$prefix/bin/$tool" "$build_dir/bin/$tool"
  done
  strip -o "$prefix/lib/devalloc/plugins/libdevalloc_cuda.so" \
    "$build_dir/lib/devalloc/plugins/libdevalloc_cuda.so"
  # Libraries the CLI needs beyond the C and C++ runtimes (toml++),
  # which a GPU image without the Debian packages lacks.
  ldd "$build_dir/bin/devalloc" | awk '$3 ~ /^\// { print $3 }' |
    grep -Ev '/(libc|libm|libstdc\+\+|libgcc_s|libpthread|libdl|ld-linux[^/]*)\.so' |
    while read -r library; do cp -L "$library" "$prefix/lib/"; done
  du -sh "$prefix" >&2
  echo "packed; on the GPU machine: tests/gpu/run_cuda.sh --prebuilt ${2}" >&2
  exit 0
fi

if [ "$mode" = source ]; then build "$build_dir"; fi
bin=$prefix/bin
plugin=$prefix/lib/devalloc/plugins/libdevalloc_cuda.so
export LD_LIBRARY_PATH="$prefix/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# Only the plugin beside the CLI.
export DEVALLOC_PLUGIN_PATH=
work=${WORK:-$(mktemp -d /tmp/devalloc-gpu.XXXXXX)}
mkdir -p "$work"
echo "scratch folder: $work" >&2

step "device"
device="unknown device"
if command -v nvidia-smi >/dev/null; then
  device=$(nvidia-smi --query-gpu=name,driver_version,memory.total,pci.bus_id \
             --format=csv,noheader -i 0 | sed 's/, /, driver /' || true)
fi
echo "$device" >&2
"$bin/devalloc" plugins --plugin-path "$(dirname "$plugin")" | tee "$work/plugins.txt" >&2

step "conformance against $driver"
conformance=FAILED
if timeout 300 "$bin/devalloc" conformance "$plugin" --option "runtime_library=$driver" \
     >"$work/conformance.log" 2>&1; then
  conformance=passed
fi
tests=$(grep -o '[0-9]* tests from [0-9]* test suites ran' "$work/conformance.log" || true)
failed=$(grep -c '^\[  FAILED  \] [A-Za-z]' "$work/conformance.log" || true)
conformance="$conformance: $tests, $failed failed (log: $work/conformance.log)"
echo "$conformance" >&2

step "raw and plugin bandwidth, $bandwidth_mib MiB"
# The tool is linked against libcuda.so.1, and its plugin opens that name:
# a fake driver's folder first on the search path makes both the fake.
bandwidth_path=${LD_LIBRARY_PATH}
if [ "$driver" != libcuda.so.1 ]; then
  bandwidth_path=$(dirname "$driver")${bandwidth_path:+:$bandwidth_path}
fi
bandwidth=passed
bandwidth_rows=$(LD_LIBRARY_PATH=$bandwidth_path timeout 300 \
                   "$bin/devalloc_cuda_bandwidth" "$plugin" "$bandwidth_mib") || {
  bandwidth=FAILED
  bandwidth_rows="| devalloc_cuda_bandwidth failed (see above) | | |"
}
echo "$bandwidth_rows" >&2

step "generate a $model_mib MiB model"
timeout 600 "$bin/devalloc_make_model" "$work/model.safetensors" "$model_size" >&2
"$bin/devalloc" plan "$work/model.safetensors" -o "$work/plan.json" --place '*=cuda:0' >&2
cat >"$work/devalloc.toml" <<EOF
[plugins.cuda]
options = { runtime_library = "$driver" }

[devices."cuda:0"]
use = ["cuda", { index = 0 }]
EOF

step "load"
t=$(date +%s.%N)
loaded=FAILED
if timeout 300 "$bin/devalloc" load "$work/plan.json" --config "$work/devalloc.toml" \
     --json >"$work/load.json"; then
  loaded=passed
fi
load_wall=$(elapsed "$t")
# Only what a failed load printed would be missing; 0 bytes marks it.
bytes=$(json_number bytes "$work/load.json" || true)
bytes=${bytes:-0}
load_own=$(json_number seconds "$work/load.json" || true)
load_own=${load_own:-0}

step "load --verify"
t=$(date +%s.%N)
verified=FAILED
if timeout 300 "$bin/devalloc" load "$work/plan.json" --config "$work/devalloc.toml" \
     --verify --json >"$work/verify.json"; then
  verified=passed
fi
verify_wall=$(elapsed "$t")

step "benchmark: devalloc_bench on cuda:0, $model_mib MiB"
benched=FAILED
# shellcheck disable=SC2086  # word splitting of BENCH_ARGS is meant
if timeout 300 "$bin/devalloc_bench" --config "$work/devalloc.toml" --device cuda:0 \
     --sizes "$model_mib" --tensors 0 --dir "$work" --json "$work/bench.json" $bench_args \
     >"$work/bench.txt" 2>&1; then
  benched=passed
fi
cat "$work/bench.txt" >&2

mib=$((bytes / 1048576))
cat <<EOF

### CUDA: $device, $(date -u +%Y-%m-%d)

\`tests/gpu/run_cuda.sh\` ($mode build, commit $(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo unknown)): a ${model_mib} MiB model of F16 tensors, read from the page cache; copies of $bandwidth_mib MiB for the bandwidth rows, best of 5.

| what | MiB | GB/s |
|---|---|---|${bandwidth_rows:+
$bandwidth_rows}
| devalloc load, as the load reports it | $mib | $(gb_per_s "$bytes" "$load_own") |
| devalloc load, wall clock of the command | $mib | $(gb_per_s "$bytes" "$load_wall") |
| devalloc load --verify, wall clock of the command | $mib | $(gb_per_s "$bytes" "$verify_wall") |

devalloc_bench on cuda:0 (min / median / max of the interleaved runs; (c) is the page-cache read into touched host memory with the same threads):

\`\`\`text
$(cat "$work/bench.txt")
\`\`\`

- conformance against $driver: $conformance
- bandwidth: $bandwidth; load: $loaded; load with --verify: $verified; benchmark: $benched
- whole script: $(elapsed "$started") s
EOF

[[ $conformance == passed* && $bandwidth == passed && $loaded == passed && $verified == passed && $benched == passed ]]
