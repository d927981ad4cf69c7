#!/bin/sh
# Runs `devalloc conformance` on a plugin that breaks a rule and checks that
# the suite ran to the end (exit 1, not a signal), that exactly the expected
# tests failed, that the output matches every PATTERN (grep -E), and that it
# points at no source file of the suite (a vendor has none).
#   expect_failures.sh DEVALLOC PLUGIN FILTER 'Group.Test ...' [PATTERN]...
set -u
devalloc=$1 plugin=$2 filter=$3 expected=$4
shift 4
fail() {
  echo "expect_failures: $*" >&2
  exit 1
}
out=$("$devalloc" conformance "$plugin" "--gtest_filter=$filter" 2>&1)
rc=$?
printf '%s\n' "$out"
[ "$rc" -eq 1 ] || fail "exit status $rc, expected 1 (some tests fail, the suite runs to the end)"
# The summary lists each failed test once, without its time.
failed=$(printf '%s\n' "$out" |
  sed -n 's/^\[  FAILED  \] \([A-Za-z0-9_]*\.[A-Za-z0-9_/]*\)$/\1/p' | sort -u | tr '\n' ' ')
want=$(printf '%s\n' $expected | sort -u | tr '\n' ' ')
[ "$failed" = "$want" ] || fail "failed: ${failed:-none}; expected to fail: $want"
for pattern in "$@"; do
  printf '%s\n' "$out" | grep -Eq -- "$pattern" || fail "no line of the output matches: $pattern"
done
if printf '%s\n' "$out" | grep -Eq '[a-z_]+\.(cpp|hpp):[0-9]+'; then
  fail "the output points at a source file of the suite"
fi
exit 0
