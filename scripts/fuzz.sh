#!/usr/bin/env bash
# Builds devalloc's libFuzzer targets (tests/fuzz) with clang-14, ASan and
# UBSan in their own build folder, and runs each for a bounded time.
#
#   scripts/fuzz.sh [SECONDS]    seconds per target (default 60)
#
# Environment: FUZZ_BUILD_DIR (default build-fuzz), FUZZ_JOBS (build jobs,
# default 2), FUZZ_TARGETS (default: all five).
# Only the fuzz targets and the libraries they need are built. New inputs
# go to $FUZZ_BUILD_DIR/corpus/<target> (the committed seeds in
# tests/fuzz/corpus stay as they are); a crash, leak, timeout (10 s) or
# out-of-memory (2 GiB) is written to $FUZZ_BUILD_DIR/artifacts/ and makes
# the script exit 1. Turn each into a regression test in tests/unit.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
build="${FUZZ_BUILD_DIR:-$here/build-fuzz}"
targets=(${FUZZ_TARGETS:-fuzz_safetensors fuzz_plan fuzz_config fuzz_plugin_elf fuzz_plugin_answers})

if ! command -v clang++-14 >/dev/null; then
  echo "fuzz.sh: clang++-14 is missing (scripts/setup.sh installs clang-14 and libclang-rt-14-dev)" >&2
  exit 2
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cmake -S "$here" -B "$build" "${generator[@]}" "${launcher[@]}" \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo -DDEVALLOC_FUZZ=ON -DDEVALLOC_WERROR=OFF \
  -DDEVALLOC_BUILD_TESTS=OFF -DDEVALLOC_BUILD_BENCHMARKS=OFF -DDEVALLOC_INSTALL=OFF >/dev/null
cmake --build "$build" -j "${FUZZ_JOBS:-2}" --target "${targets[@]}"

failed=()
for target in "${targets[@]}"; do
  corpus="$build/corpus/$target"
  artifacts="$build/artifacts/$target"
  mkdir -p "$corpus" "$artifacts"
  echo "== $target: ${seconds}s"
  if ! ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
      "$build/bin/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$corpus" "$here/tests/fuzz/corpus/$target" 2>"$build/$target.log"; then
    tail -n 40 "$build/$target.log" >&2
    failed+=("$target")
  else
    grep -E '^(#[0-9]+.*DONE|stat::number_of_executed_units)' "$build/$target.log" || true
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz.sh: findings in: ${failed[*]} (inputs under $build/artifacts/)" >&2
  exit 1
fi
echo "fuzz.sh: no findings in ${targets[*]} (${seconds}s each)"
