#!/usr/bin/env bash
# The full gate: every stage of scripts/test.sh (default, then ASan + UBSan,
# TSan and the fuzzers); what CI runs through .ci/run. Extra arguments go
# to the default stage's configure, as for scripts/test.sh.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
STAGES="${STAGES:-default asan tsan fuzz}" exec bash "$here/scripts/test.sh" "$@"
