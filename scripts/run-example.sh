#!/usr/bin/env bash
# The main job on the example model: installs what is missing, builds, then
# loads and verifies examples/small_model on the best device available (the
# config falls back to the built-in host plugin without a GPU).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${BUILD_DIR:-$here/build}"
example="$here/examples/small_model"

BUILD_DIR="$build" bash "$here/scripts/build.sh"
if [ ! -f "$example/model.safetensors" ]; then
  "$here/.venv/bin/python" "$example/make_model.py" "$example"
fi
exec "$build/bin/devalloc" load "$example/plan.json" \
  --config "$example/devalloc.toml" --verify "$@"
