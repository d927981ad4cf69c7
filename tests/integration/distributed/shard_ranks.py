"""One rank of a sharded load, and the check of all ranks' shares.

    shard_ranks.py write DIR            writes DIR/model.safetensors
    shard_ranks.py rank DIR PLAN        loads this rank's share (the rank from
                                        the launcher's environment), exports
                                        it through DLPack and, under MPI,
                                        gathers every rank's share on rank 0
                                        and checks it; without MPI writes
                                        DIR/rank<R>.npz for `check`
    shard_ranks.py check DIR PLAN W     checks DIR/rank<R>.npz of W ranks

The check, against the reference safetensors reader of the same file:
column-split tensors (dim 0) concatenate along axis 0 to the whole tensor,
row-split ones (dim 1) along axis 1; replicated tensors are whole on every
rank; each expert is on rank (its number mod W) alone; and each rank read
its share of the file's data plus the header, not the model.
"""
import json
import os
import pathlib
import sys

import numpy
from safetensors.numpy import load_file, save_file

COLUMN = ["layers.0.col.weight", "layers.1.col.weight"]
ROW = ["layers.0.row.weight", "layers.1.row.weight"]
REPLICATED = ["norm.weight", "embed.bias"]
EXPERTS = ["experts.%d.w" % i for i in range(6)]


def write(folder):
    rng = numpy.random.default_rng(7)
    tensors = {
        "layers.0.col.weight": rng.standard_normal((8, 6), dtype=numpy.float32),
        "layers.1.col.weight": rng.integers(-100, 100, (16, 3), dtype=numpy.int16),
        "layers.0.row.weight": rng.standard_normal((6, 8), dtype=numpy.float32),
        # Runs of 3 bytes per row: a strided read of odd sizes.
        "layers.1.row.weight": rng.integers(-100, 100, (5, 12), dtype=numpy.int8),
        "norm.weight": rng.standard_normal(6, dtype=numpy.float32),
        "embed.bias": rng.standard_normal(10, dtype=numpy.float64),
    }
    for name in EXPERTS:
        tensors[name] = rng.standard_normal((4, 4), dtype=numpy.float32)
    save_file(tensors, str(pathlib.Path(folder) / "model.safetensors"))


def header_bytes(path):
    with open(path, "rb") as f:
        return 8 + int.from_bytes(f.read(8), "little")


def load_share(folder, plan):
    import devalloc
    runtime = devalloc.Runtime()
    program = runtime.load(plan)
    share = {t: numpy.array(devalloc.to_numpy(program[t]), copy=True) for t in program.names()}
    files = runtime.last_load_report()["files"]
    read = sum(files.values())
    return share, read


def check(folder, shares, reads, world):
    reference = load_file(str(pathlib.Path(folder) / "model.safetensors"))
    header = header_bytes(pathlib.Path(folder) / "model.safetensors")
    problems = []
    for name in COLUMN + ROW:
        parts = [shares[r][name] for r in range(world)]
        whole = numpy.concatenate(parts, axis=0 if name in COLUMN else 1)
        if not numpy.array_equal(whole, reference[name]):
            problems.append("%s: the shards do not concatenate to the tensor" % name)
    for name in REPLICATED:
        for r in range(world):
            if not numpy.array_equal(shares[r][name], reference[name]):
                problems.append("%s on rank %d differs from the file" % (name, r))
    for i, name in enumerate(EXPERTS):
        owners = [r for r in range(world) if name in shares[r]]
        if owners != [i % world]:
            problems.append("%s is on ranks %s, not %d" % (name, owners, i % world))
        elif not numpy.array_equal(shares[i % world][name], reference[name]):
            problems.append("%s differs from the file" % name)
    for r in range(world):
        share = sum(a.nbytes for a in shares[r].values())
        if reads[r] != header + share:
            problems.append("rank %d read %d bytes, its share is %d + a %d-byte header"
                            % (r, reads[r], share, header))
        model = sum(a.nbytes for a in reference.values())
        if world > 1 and share >= model:
            problems.append("rank %d placed the whole model" % r)
    for p in problems:
        print("FAIL:", p, file=sys.stderr)
    return not problems


def main():
    mode, folder = sys.argv[1], sys.argv[2]
    if mode == "write":
        write(folder)
        return 0
    plan = sys.argv[3]
    if mode == "rank":
        share, read = load_share(folder, plan)
        # Under mpirun only: importing mpi4py elsewhere starts a singleton
        # MPI process of its own.
        comm = None
        if "OMPI_COMM_WORLD_SIZE" in os.environ or "PMI_SIZE" in os.environ:
            from mpi4py import MPI
            comm = MPI.COMM_WORLD
        if comm is None:
            rank = int(os.environ["RANK"])
            numpy.savez(pathlib.Path(folder) / ("rank%d.npz" % rank), **share)
            (pathlib.Path(folder) / ("rank%d.json" % rank)).write_text(json.dumps(read))
            return 0
        gathered = comm.gather((share, read), root=0)
        ok = True
        if comm.Get_rank() == 0:
            ok = check(folder, [g[0] for g in gathered], [g[1] for g in gathered],
                       comm.Get_size())
            print("%d ranks: %s" % (comm.Get_size(), "shares match the reference" if ok
                                    else "MISMATCH"))
        ok = comm.bcast(ok, root=0)
        return 0 if ok else 1
    if mode == "check":
        world = int(sys.argv[4])
        shares, reads = [], []
        for r in range(world):
            with numpy.load(pathlib.Path(folder) / ("rank%d.npz" % r)) as z:
                shares.append({k: z[k] for k in z.files})
            reads.append(json.loads((pathlib.Path(folder) / ("rank%d.json" % r)).read_text()))
        ok = check(folder, shares, reads, world)
        print("%d ranks: %s" % (world, "shares match the reference" if ok else "MISMATCH"))
        return 0 if ok else 1
    raise SystemExit("unknown mode " + mode)


if __name__ == "__main__":
    sys.exit(main())
