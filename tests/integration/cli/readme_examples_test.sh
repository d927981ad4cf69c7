#!/usr/bin/env bash
# The README's "Three ways in" shell blocks run verbatim from the repository
# root after the main command, as a newcomer would paste them: each must
# exit 0. (They name build/ and .venv/, so the test is registered for the
# build folder build/ of the source tree only.)
# Usage: readme_examples_test.sh SOURCE_DIR PYTHON
set -euo pipefail
source_dir=$1 python=$2
cd "$source_dir"
# What scripts/run-example.sh makes before its load.
if [ ! -f examples/small_model/model.safetensors ]; then
  "$python" examples/small_model/make_model.py examples/small_model
fi
blocks=$(mktemp -d)
trap 'rm -rf "$blocks"' EXIT
"$python" - README.md "$blocks" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
section = text.split("## Three ways in", 1)[1].split("\n## ", 1)[0]
blocks = re.findall(r"```sh\n(.*?)```", section, re.S)
assert blocks, "no shell block under 'Three ways in'"
for i, block in enumerate(blocks):
    open(f"{sys.argv[2]}/{i}.sh", "w").write(block)
PY
for block in "$blocks"/*.sh; do
  echo "=== README block $(basename "$block"):"
  cat "$block"
  bash -euo pipefail "$block" || { echo "FAIL: this README block exits non-zero" >&2; exit 1; }
done
echo "PASS: every shell block of the README's \"Three ways in\" runs"
