#!/usr/bin/env bash
# The test command (README "Quick start"). By default only the default stage,
# which answers in minutes; scripts/gate.sh (what .ci/run runs) runs every
# stage. Stages, in order:
#   default  build/ (RelWithDebInfo, extra arguments go to its configure):
#            every target, every test
#   asan     build/asan (preset asan: ASan + UBSan, no benchmarks): every
#            test but the valgrind ones, which the sanitizers cannot run under
#   tsan     build/tsan (preset tsan): only the target
#            devalloc_concurrent_tests, then the tests labelled "concurrent"
#   fuzz     scripts/fuzz.sh: the libFuzzer targets (clang-14, ASan+UBSan) in
#            build/fuzz, each for FUZZ_SECONDS (default 60)
# Every stage runs even when an earlier one failed; the exit status is 0 only
# when all passed, and the last line printed says which failed.
# STAGES="default tsan" picks stages; ccache is used when installed.
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"
stages="${STAGES:-default}"
jobs="$(nproc)"

launcher=()
if command -v ccache >/dev/null; then
  launcher=(-DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi

summary=()
failed=()
# run_stage NAME COMMAND...: runs it, times it, records its outcome and the
# closing line of its ctest run.
run_stage() {
  local name=$1; shift
  echo "=== test.sh: stage $name ==="
  local start=$SECONDS log
  log="$(mktemp)"
  "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  local took=$((SECONDS - start))
  local result
  result="$(grep -E '^[0-9]+% tests passed' "$log" | tail -1)"
  rm -f "$log"
  if [ "$rc" -eq 0 ]; then
    summary+=("$name: passed in $((took / 60))m$((took % 60))s${result:+ ($result)}")
  else
    summary+=("$name: FAILED (exit $rc) after $((took / 60))m$((took % 60))s${result:+ ($result)}")
    failed+=("$name")
  fi
}

stage_default() {
  # build.sh adds ccache itself, as it does for run-example.sh.
  BUILD_DIR="$build" bash "$here/scripts/build.sh" "$@" &&
    (cd "$build" && ctest --output-on-failure -j "$jobs" --timeout 300)
}

# stage_preset PRESET TARGET CTEST-ARGS...: configure with a preset, build
# TARGET ("all" for everything), run ctest with the arguments.
stage_preset() {
  local preset=$1 target=$2; shift 2
  cmake -S "$here" -B "$build/$preset" --preset "$preset" "${launcher[@]}" >/dev/null &&
    cmake --build "$build/$preset" -j "$jobs" --target "$target" &&
    (cd "$build/$preset" && ctest --output-on-failure -j "$jobs" --timeout 300 "$@")
}

start_all=$SECONDS
bash "$here/scripts/setup.sh" || { echo "test.sh: FAILED: scripts/setup.sh"; exit 1; }
for stage in $stages; do
  case "$stage" in
    default) run_stage default stage_default "$@" ;;
    asan) run_stage asan stage_preset asan all ;;
    # halt_on_error: the first race fails the test, with its report.
    tsan) TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 ${TSAN_OPTIONS:-}" \
            run_stage tsan stage_preset tsan devalloc_concurrent_tests -L concurrent ;;
    fuzz) FUZZ_BUILD_DIR="$build/fuzz" \
            run_stage fuzz bash "$here/scripts/fuzz.sh" "${FUZZ_SECONDS:-60}" ;;
    *) summary+=("$stage: FAILED (unknown stage)"); failed+=("$stage") ;;
  esac
done

total=$((SECONDS - start_all))
echo "=== test.sh: summary ==="
for line in "${summary[@]}"; do echo "  $line"; done
if [ ${#failed[@]} -eq 0 ]; then
  echo "test.sh: all stages passed ($stages) in $((total / 60))m$((total % 60))s"
else
  echo "test.sh: FAILED stages: ${failed[*]} (of $stages) in $((total / 60))m$((total % 60))s"
  exit 1
fi
