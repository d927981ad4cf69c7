#!/bin/sh
# A plan for a job of ranks, loaded by real launchers (docs/distributed.md):
# `mpirun -n 4` (each rank's share gathered with mpi4py and checked against
# the reference reader), then 2 processes with torchrun's variables set by
# hand. Also the CLI: plan --shard/--expert/--world-size, inspect --rank,
# load --rank --json (bytes read), and a plan for 4 ranks refused by a job
# of 2.
# Usage: sharded_load_test.sh DEVALLOC PYTHON MODE (mpi | torchrun | cli)
set -eu
devalloc=$1
python=$2
mode=$3
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d "${TMPDIR:-/tmp}/devalloc-shard.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$python" "$here/shard_ranks.py" write "$work"
make_plan() {
  "$devalloc" plan "$work/model.safetensors" -o "$work/plan-$1.json" --world-size "$1" \
    --shard '*.col.weight=dim:0' --shard '*.row.weight=dim:1' --expert 'experts.*' >/dev/null
}

case $mode in
mpi)
  make_plan 4
  # Root needs --allow-run-as-root; --oversubscribe: 4 ranks on 2 cores.
  mpirun --allow-run-as-root --oversubscribe -n 4 \
    -x PYTHONPATH -x DEVALLOC_PLUGIN_PATH \
    "$python" "$here/shard_ranks.py" rank "$work" "$work/plan-4.json"
  ;;
torchrun)
  make_plan 2
  for r in 0 1; do
    RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r "$python" "$here/shard_ranks.py" rank "$work" \
      "$work/plan-2.json" &
    eval "pid$r=\$!"
  done
  wait "$pid0"
  wait "$pid1"
  "$python" "$here/shard_ranks.py" check "$work" "$work/plan-2.json" 2
  # Python with the rank given: rank 1's share, and a job of another size
  # refused.
  "$python" - "$work" <<'PY'
import sys, numpy, devalloc
from safetensors.numpy import load_file
work = sys.argv[1]
ref = load_file(work + "/model.safetensors")
program = devalloc.Runtime().load(work + "/plan-2.json", rank=1, world_size=2)
got = numpy.array(devalloc.to_numpy(program["layers.0.row.weight"]))
assert numpy.array_equal(got, ref["layers.0.row.weight"][:, 4:]), got
try:
    devalloc.Runtime().load(work + "/plan-2.json", rank=0, world_size=3)
    raise SystemExit("a plan for 2 ranks loaded in a job of 3")
except devalloc.Error as e:
    assert "the plan is for a job of 2 ranks, this job has 3" in str(e), str(e)
PY
  ;;
cli)
  make_plan 4
  # Without a rank, inspect shows each rank's share; with one, its devices.
  "$devalloc" inspect "$work/plan-4.json" >"$work/ranks.txt"
  grep -q 'for a job of 4 ranks' "$work/ranks.txt"
  grep -q '^  rank 3: ' "$work/ranks.txt"
  "$devalloc" inspect "$work/plan-4.json" --rank 1 --tensors >"$work/rank1.txt"
  grep -q '^rank 1 of 4' "$work/rank1.txt"
  grep -q 'dim 1, start 2, length 2' "$work/rank1.txt"
  # load: the share and the bytes read of rank 2, verified.
  "$devalloc" load "$work/plan-4.json" --rank 2 --verify --json >"$work/load.json"
  "$python" - "$work" <<'PY'
import json, sys
out = json.load(open(sys.argv[1] + "/load.json"))
assert out["rank"] == 2 and out["world_size"] == 4 and out["verified"], out
with open(sys.argv[1] + "/model.safetensors", "rb") as f:
    header = 8 + int.from_bytes(f.read(8), "little")
read = sum(f["bytes_read"] for f in out["files"])
assert read == header + out["bytes"], (read, header, out["bytes"])
PY
  # A job of another size, or no rank at all, is refused saying why.
  if "$devalloc" load "$work/plan-4.json" --rank 0 --world-size 2 2>"$work/err.txt"; then
    echo "a plan for 4 ranks loaded in a job of 2" >&2
    exit 1
  fi
  grep -q 'the plan is for a job of 4 ranks, this job has 2' "$work/err.txt"
  if env -u RANK -u OMPI_COMM_WORLD_RANK -u PMI_RANK -u SLURM_PROCID \
       "$devalloc" load "$work/plan-4.json" 2>"$work/err.txt"; then
    echo "a plan for 4 ranks loaded without a rank" >&2
    exit 1
  fi
  grep -q 'give --rank R' "$work/err.txt"
  # An uneven split without stated sizes is refused naming the tensor.
  if "$devalloc" plan "$work/model.safetensors" -o "$work/bad.json" --world-size 3 \
       --shard '*.col.weight=dim:0' 2>"$work/err.txt"; then
    echo "an uneven split was accepted" >&2
    exit 1
  fi
  grep -q 'tensor "layers.1.col.weight".*not a multiple of 3 ranks' "$work/err.txt" ||
    grep -q 'tensor "layers.0.col.weight".*not a multiple of 3 ranks' "$work/err.txt"
  # ... and accepted with stated sizes.
  "$devalloc" plan "$work/model.safetensors" -o "$work/stated.json" --world-size 3 \
    --shard 'layers.0.col.weight=dim:0:2,2,4' >/dev/null
  "$devalloc" load "$work/stated.json" --rank 2 --verify >/dev/null
  ;;
esac
echo "sharded load ($mode): ok"
