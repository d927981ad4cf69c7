#!/usr/bin/env python3
"""Sharded loads: devalloc against the reference reader, W ranks on one machine.

    bench/shard_bench.py [--size MiB] [--cols N] [--ranks 1,2,4] [--repeats N]
                         [--threads N] [--read auto|mmap|pread] [--json FILE]
                         [--quick] [--keep] [--dir DIR] [--devalloc CLI]
    scripts/bench.sh --shards [ARGS]        (builds build/ first, then this)

For each job size W it starts W worker processes at once (one per rank,
subprocess), all on the same safetensors file, whose page cache is warm.
Each rank loads its shard of one 2-D float32 tensor, cut along dim 0
(column-parallel: one contiguous range of the file) and along dim 1
(row-parallel: one run per row, gathered), four ways, all ranks running
the same method at the same moment:

  devalloc  devalloc.Runtime(config).load(plan, rank=r, world_size=W) of a
            plan written by `devalloc plan --world-size W --shard w=dim:D`,
            host plugin (pool = true: warm destination, as
            bench/load_bench.cpp); timed around load() (it reads the plan,
            checks the header and loads) and the numpy view of the shard;
  get_slice the reference reader: safe_open(path, "np").get_slice("w")
            [a:b] or [:, a:b], timed from safe_open;
  whole     each rank reads the whole tensor (get_tensor) and slices after
            (numpy.ascontiguousarray of the slice: a copy along dim 1, a
            view along dim 0), timed from safe_open;
  mmap_copy the bare copy, for scale: a fresh read-only MAP_PRIVATE mapping
            of the file (as devalloc maps it) and one numpy.copyto of the
            slice into a new array, on one thread; no header parsed, nothing
            checked. What this access pattern costs on the machine.

Every method ends with the rank's shard written into the process's memory.
The workers run with glibc's malloc keeping freed memory
(GLIBC_TUNABLES mmap_max=0, trim_threshold max) and every method runs once
untimed first, so no timed run pays the first touch of fresh memory
(1-4 s/GiB on the development VMs) -- the same rule as devalloc_bench.

Per repeat every (split, method) pair runs once, in an order rotated by one
each repeat. Per rank: its own seconds (CLOCK_MONOTONIC, one clock for all
processes); total: the job's wall time, from the first rank's start to the
last rank's end. Figures are medians over the repeats (min-max); ratios are
computed per repeat on the total wall time, then the median taken.

Bytes read per rank: devalloc's own count (Runtime.last_load_report(),
bytes read per file, header included). The reference methods read through
a mapping of the file (safetensors mmaps it), which /proc/self/io counts
nowhere, so theirs are what they copy out of the file: the slice (get_slice)
or the whole tensor (whole), plus the header. Each worker also records the
deltas of /proc/self/io rchar (bytes through read syscalls) and of minor
page faults around each method (in the JSON). The verification pass loads
each shard once more with [load] read = "pread" -- every byte then goes
through pread -- and its rchar delta is printed beside devalloc's own count:
an independent measurement of what devalloc reads.

Verification (once per rank and split, before the timed runs): devalloc's
shard (numpy view of the host plugin's memory) against the reference slice,
compared bit for bit. A mismatch is exit status 1; figures never are.

Targets (issue 32 item 6): a row-split (strided) shard of 1 GiB loads at
>= 0.8x the speed of a contiguous (dim 0) shard of the same size, and each
rank reads <= its share + 1 %. The default model (2 GiB, one tensor) gives
1 GiB shards at W = 2; that pair is the target line, measured twice: with
both ranks running (the W = 2 rows) and with one process loading rank 0's
shard alone (the "solo" rows: no second process on a 2-core machine).
"""
import argparse
import datetime
import json
import math
import mmap
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
TENSOR = "w"
SPLITS = ("dim0", "dim1")
SPLIT_TEXT = {"dim0": "column-split (dim 0, contiguous)", "dim1": "row-split (dim 1, strided)"}
METHODS = ("devalloc", "get_slice", "whole", "mmap_copy")
METHOD_TEXT = {
    "devalloc": "devalloc",
    "get_slice": "get_slice per rank",
    "whole": "whole, then slice",
    "mmap_copy": "bare mmap copy",
}
# glibc keeps freed memory in the heap: a second run writes into warm pages.
WARM_MALLOC = "glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=18446744073709551615"
MiB = 1 << 20
GiB = 1 << 30


# ----------------------------------------------------------------- worker --

def proc_io():
    out = {}
    try:
        with open("/proc/self/io") as f:
            for line in f:
                key, _, value = line.partition(":")
                out[key.strip()] = int(value)
    except OSError:
        pass
    return out


def shard_bounds(extent, world_size, rank):
    part = extent // world_size
    return rank * part, (rank + 1) * part


class Worker:
    def __init__(self, args):
        import numpy
        import devalloc
        from safetensors import safe_open
        self.np = numpy
        self.safe_open = safe_open
        self.model = args.model
        self.rank = args.rank
        self.world_size = args.world_size
        self.plans = {"dim0": args.plan_dim0, "dim1": args.plan_dim1}
        self.runtime = devalloc.Runtime(config=args.config)
        self.pread_runtime = devalloc.Runtime(config=args.pread_config)
        with safe_open(self.model, "np") as f:
            self.shape = tuple(f.get_slice(TENSOR).get_shape())
        with open(self.model, "rb") as f:
            self.data_offset = 8 + int.from_bytes(f.read(8), "little")

    def bounds(self, split):
        dim = 0 if split == "dim0" else 1
        return shard_bounds(self.shape[dim], self.world_size, self.rank)

    def cut(self, sliceable, split):
        a, b = self.bounds(split)
        return sliceable[a:b] if split == "dim0" else sliceable[:, a:b]

    # Each returns (the shard array, what keeps its memory alive).
    def load_devalloc(self, split, runtime):
        program = runtime.load(self.plans[split], rank=self.rank, world_size=self.world_size)
        return program[TENSOR].numpy(), program

    def load_get_slice(self, split):
        with self.safe_open(self.model, "np") as f:
            shard = self.cut(f.get_slice(TENSOR), split)
        return shard, None

    def load_whole(self, split):
        with self.safe_open(self.model, "np") as f:
            whole = f.get_tensor(TENSOR)
        shard = self.np.ascontiguousarray(self.cut(whole, split))
        return shard, whole

    def load_mmap_copy(self, split):
        np = self.np
        with open(self.model, "rb") as f:
            mapping = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
        whole = np.frombuffer(mapping, dtype=np.float32, offset=self.data_offset,
                              count=self.shape[0] * self.shape[1]).reshape(self.shape)
        part = self.cut(whole, split)
        shard = np.empty(part.shape, np.float32)
        np.copyto(shard, part)
        del part, whole  # the mapping closes only once no view of it is left
        mapping.close()
        return shard, None

    def run(self, split, method):
        io0 = proc_io()
        faults0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.monotonic()
        if method == "devalloc":
            shard, keep = self.load_devalloc(split, self.runtime)
        elif method == "get_slice":
            shard, keep = self.load_get_slice(split)
        elif method == "whole":
            shard, keep = self.load_whole(split)
        else:
            shard, keep = self.load_mmap_copy(split)
        end = time.monotonic()
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults0
        io1 = proc_io()
        out = {
            "start": start, "end": end, "seconds": end - start,
            "shard_bytes": int(shard.nbytes), "minor_faults": faults,
            "rchar": io1.get("rchar", 0) - io0.get("rchar", 0),
            "read_bytes": io1.get("read_bytes", 0) - io0.get("read_bytes", 0),
        }
        if method == "devalloc":
            report = self.runtime.last_load_report()
            out["bytes_read"] = int(sum(report["files"].values()))
            out["load_seconds"] = report["seconds"]
        del shard, keep
        return out

    def verify(self, split):
        np = self.np
        io0 = proc_io()
        shard, program = self.load_devalloc(split, self.pread_runtime)
        io1 = proc_io()
        report = self.pread_runtime.last_load_report()
        reference, _ = self.load_get_slice(split)
        same = (shard.shape == reference.shape and shard.dtype == reference.dtype and
                np.array_equal(shard.view(np.uint32), reference.view(np.uint32)))
        out = {"ok": bool(same), "shape": list(shard.shape),
               "reference_shape": list(reference.shape),
               "pread_rchar": io1.get("rchar", 0) - io0.get("rchar", 0),
               "pread_bytes_read": int(sum(report["files"].values())),
               "shard_bytes": int(shard.nbytes)}
        del shard, program, reference
        return out


def worker_main(args):
    # The protocol owns the real stdout: anything else printed goes to stderr.
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    worker = Worker(args)
    channel.write(json.dumps({"ready": True, "pid": os.getpid()}) + "\n")
    for line in sys.stdin:
        step = json.loads(line)
        if step["op"] == "quit":
            break
        try:
            if step["op"] == "verify":
                out = worker.verify(step["split"])
            else:
                out = worker.run(step["split"], step["method"])
        except Exception as e:  # reported, the driver stops the run
            out = {"error": "%s: %s" % (type(e).__name__, e)}
        channel.write(json.dumps(out) + "\n")


# ----------------------------------------------------------------- driver --

def write_model(path, rows, cols):
    """One F32 tensor "w" [rows, cols]; element i holds the bits of i (uint32),
    so that any misplaced element shows. Written in chunks, fsynced."""
    import numpy
    nbytes = rows * cols * 4
    header = json.dumps({TENSOR: {"dtype": "F32", "shape": [rows, cols],
                                  "data_offsets": [0, nbytes]}}, separators=(",", ":"))
    header = header.encode() + b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little"))
        f.write(header)
        chunk = max(cols, (64 * MiB // 4) // cols * cols)
        total = rows * cols
        for first in range(0, total, chunk):
            n = min(chunk, total - first)
            f.write(numpy.arange(first, first + n, dtype=numpy.uint32).tobytes())
        f.flush()
        os.fsync(f.fileno())
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return 8 + len(header)


def warm_page_cache(path):
    start = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(64 * MiB)
        view = memoryview(buf)
        total = 0
        while True:
            n = f.readinto(view)
            if not n:
                break
            total += n
    return total, time.monotonic() - start


def median(values):
    return statistics.median(values) if values else float("nan")


def spread(values, fmt="%.3f"):
    if not values:
        return "-"
    return (fmt + " (" + fmt + "-" + fmt + ")") % (median(values), min(values), max(values))


def machine_header(args, argv):
    lines = []
    now = datetime.datetime.now(datetime.timezone.utc)
    cpu = "?"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = "?"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal"):
                    mem = "%.1f GiB" % (int(line.split()[1]) / (1 << 20))
                    break
    except OSError:
        pass
    import numpy
    import safetensors
    info = {
        "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "host": platform.node(), "kernel": platform.release(), "cpu": cpu,
        "cores": os.cpu_count(), "memory": mem,
        "python": platform.python_version(), "numpy": numpy.__version__,
        "safetensors": safetensors.__version__,
        "command": " ".join([os.path.relpath(sys.argv[0], os.getcwd())] + argv),
        "loadavg_before": os.getloadavg()[0],
    }
    try:
        info["devalloc"] = subprocess.run([args.devalloc, "--version"], capture_output=True,
                                          text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        info["devalloc"] = "?"
    # The build type of the CLI's build folder, where it is one (build/bin/devalloc).
    info["build_type"] = "?"
    cache = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(args.devalloc))),
                         "CMakeCache.txt")
    try:
        with open(cache) as f:
            for line in f:
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    info["build_type"] = line.split("=", 1)[1].strip() or "?"
    except OSError:
        pass
    lines.append("shard_bench: %s, %s (%s cores, %s), Linux %s" %
                 (info["date"], cpu, info["cores"], mem, info["kernel"]))
    lines.append("  %s, %s build; Python %s, numpy %s, safetensors %s; load average %.2f" %
                 (info["devalloc"], info["build_type"], info["python"], info["numpy"],
                  info["safetensors"], info["loadavg_before"]))
    lines.append("  command: %s" % info["command"])
    return info, lines


class Job:
    """W worker processes, one per rank, driven step by step."""

    def __init__(self, args, paths, world_size, ranks=None, env=None):
        self.procs = []
        for rank in (range(world_size) if ranks is None else ranks):
            cmd = [sys.executable, os.path.abspath(__file__), "--worker",
                   "--model", paths["model"], "--rank", str(rank),
                   "--world-size", str(world_size),
                   "--plan-dim0", paths["plan"][("dim0", world_size)],
                   "--plan-dim1", paths["plan"][("dim1", world_size)],
                   "--config", paths["config"], "--pread-config", paths["pread_config"]]
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.PIPE,
                                               stdout=subprocess.PIPE, text=True, env=env,
                                               bufsize=1))
        for p in self.procs:
            self._answer(p)

    def _answer(self, p):
        line = p.stdout.readline()
        if not line:
            raise SystemExit("shard_bench: a worker (pid %d) ended early, exit status %s"
                             % (p.pid, p.wait()))
        out = json.loads(line)
        if "error" in out:
            raise SystemExit("shard_bench: a worker failed: %s" % out["error"])
        return out

    def step(self, **step):
        line = json.dumps(step) + "\n"
        # Every rank gets the step before any answer is awaited: they start together.
        for p in self.procs:
            p.stdin.write(line)
            p.stdin.flush()
        return [self._answer(p) for p in self.procs]

    def close(self):
        for p in self.procs:
            try:
                p.stdin.write(json.dumps({"op": "quit"}) + "\n")
                p.stdin.close()
            except OSError:
                pass
        for p in self.procs:
            p.wait()


def run_job(args, paths, world_size, env, log):
    """Verification, warm-up, then the timed repeats of one job size."""
    job = Job(args, paths, world_size, env=env)
    out = {"world_size": world_size, "verify": {}, "runs": []}
    try:
        for split in SPLITS:
            answers = job.step(op="verify", split=split)
            out["verify"][split] = answers
            for rank, a in enumerate(answers):
                if not a["ok"]:
                    log("VERIFY FAILED: W=%d %s rank %d: devalloc shape %s, reference %s"
                        % (world_size, split, rank, a["shape"], a["reference_shape"]))
        pairs = [(s, m) for s in SPLITS for m in METHODS]
        for split, method in pairs:  # untimed: warms every destination
            job.step(op="run", split=split, method=method)
        for repeat in range(args.repeats):
            order = pairs[repeat % len(pairs):] + pairs[:repeat % len(pairs)]
            for split, method in order:
                answers = job.step(op="run", split=split, method=method)
                out["runs"].append({"repeat": repeat, "split": split, "method": method,
                                    "ranks": answers})
    finally:
        job.close()
    return out


SOLO_METHODS = ("devalloc", "mmap_copy")


def run_solo(args, paths, env):
    """One process loads rank 0's shard of the W=2 plans alone: devalloc and
    the bare copy, each split, rotated."""
    job = Job(args, paths, 2, ranks=[0], env=env)
    runs = []
    pairs = [(s, m) for s in SPLITS for m in SOLO_METHODS]
    try:
        for split, method in pairs:
            job.step(op="run", split=split, method=method)
        for repeat in range(args.solo_repeats):
            order = pairs[repeat % len(pairs):] + pairs[:repeat % len(pairs)]
            for split, method in order:
                a = job.step(op="run", split=split, method=method)[0]
                runs.append({"repeat": repeat, "split": split, "method": method, "rank": a})
    finally:
        job.close()
    return runs


def summarize(job, share_of, header_bytes, tensor_bytes):
    """Per (split, method): total wall and per-rank seconds per repeat, bytes read."""
    W = job["world_size"]
    rows = {}
    for run in job["runs"]:
        key = (run["split"], run["method"])
        row = rows.setdefault(key, {"total": {}, "per_rank": [[] for _ in range(W)],
                                    "bytes_read": [set() for _ in range(W)]})
        ranks = run["ranks"]
        row["total"][run["repeat"]] = max(r["end"] for r in ranks) - min(r["start"] for r in ranks)
        for i, r in enumerate(ranks):
            row["per_rank"][i].append(r["seconds"])
            if run["method"] == "devalloc":
                row["bytes_read"][i].add(r["bytes_read"])
            elif run["method"] == "get_slice":
                row["bytes_read"][i].add(share_of[run["split"]] + header_bytes)
            elif run["method"] == "mmap_copy":
                row["bytes_read"][i].add(share_of[run["split"]])
            else:
                row["bytes_read"][i].add(tensor_bytes + header_bytes)
    for (split, method), row in rows.items():
        base = rows[(split, "devalloc")]["total"]
        row["ratio_vs_devalloc"] = [row["total"][k] / base[k] for k in sorted(row["total"])
                                    if k in base]
    return rows


def fmt_bytes(n):
    return "%.1f MiB" % (n / MiB) if n < 10 * GiB else "%.2f GiB" % (n / GiB)


def main(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=2048,
                    help="MiB in the model's one tensor (default 2048: 1 GiB shards at W=2)")
    ap.add_argument("--cols", type=int, default=8192,
                    help="columns of the tensor [rows, cols] (default 8192: runs of 16 KiB at "
                         "W=2 for the row-split)")
    ap.add_argument("--ranks", default="1,2,4", help="job sizes (default 1,2,4)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--solo-repeats", type=int, default=None,
                    help="repeats of the solo target rows (default 2 x --repeats)")
    ap.add_argument("--threads", type=int, default=0,
                    help="devalloc's [load] threads per rank (default 0: its own default, "
                         "max(devices, min(cores, 4)))")
    ap.add_argument("--read", default="auto", choices=("auto", "mmap", "pread"),
                    help="devalloc's [load] read for the timed loads (default auto)")
    ap.add_argument("--json", help="write every figure to this file")
    ap.add_argument("--quick", action="store_true",
                    help="seconds: a 32 MiB model, 2 repeats (a smoke test; nothing asserted "
                         "but correctness)")
    ap.add_argument("--dir", help="folder for the model (default: a temporary one in $TMPDIR)")
    ap.add_argument("--keep", action="store_true", help="keep the model folder")
    ap.add_argument("--devalloc", default=os.environ.get("DEVALLOC_CLI",
                                                         os.path.join(ROOT, "build/bin/devalloc")),
                    help="the devalloc CLI, for `devalloc plan` (default build/bin/devalloc)")
    # Worker mode (internal).
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("--model", "--plan-dim0", "--plan-dim1", "--config", "--pread-config"):
        ap.add_argument(name, help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--world-size", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)

    if args.quick:
        if "--size" not in " ".join(argv):
            args.size = 32
        if "--cols" not in " ".join(argv):
            args.cols = 1024
        if "--repeats" not in " ".join(argv):
            args.repeats = 2
    if args.solo_repeats is None:
        args.solo_repeats = 2 * args.repeats
    ranks = [int(x) for x in args.ranks.split(",") if x]
    cols = args.cols
    lcm = 1
    for w in ranks:
        lcm = lcm * w // math.gcd(lcm, w)
    rows = args.size * MiB // (4 * cols)
    rows -= rows % lcm
    if rows == 0 or cols % lcm:
        raise SystemExit("shard_bench: --size %d MiB / --cols %d gives no tensor that every job "
                         "size in %s divides" % (args.size, cols, args.ranks))
    if not os.access(args.devalloc, os.X_OK):
        raise SystemExit("shard_bench: no devalloc CLI at %s (build it: scripts/build.sh; or "
                         "--devalloc PATH)" % args.devalloc)

    # The workers import devalloc: the build's staged package unless one is importable.
    env = dict(os.environ)
    try:
        import devalloc  # noqa: F401
    except ImportError:
        staged = os.path.join(ROOT, "build", "python")
        env["PYTHONPATH"] = staged + (os.pathsep + env["PYTHONPATH"]
                                      if env.get("PYTHONPATH") else "")
        sys.path.insert(0, staged)
        import devalloc  # noqa: F401
    env["GLIBC_TUNABLES"] = WARM_MALLOC + (":" + env["GLIBC_TUNABLES"]
                                           if env.get("GLIBC_TUNABLES") else "")

    info, header = machine_header(args, argv)
    for line in header:
        print(line)
    started = time.monotonic()
    work = tempfile.mkdtemp(prefix="devalloc-shard-bench.", dir=args.dir)
    try:
        return bench(args, info, env, work, rows, cols, ranks, started)
    finally:
        if args.keep:
            print("model and plans kept in %s" % work)
        else:
            shutil.rmtree(work, ignore_errors=True)


def bench(args, info, env, work, rows, cols, ranks, started):
    def log(text=""):
        print(text, flush=True)

    model = os.path.join(work, "model.safetensors")
    tensor_bytes = rows * cols * 4
    t = time.monotonic()
    header_bytes = write_model(model, rows, cols)
    log("model: one F32 tensor [%d, %d], %s, written and fsynced in %.1f s; header %d bytes"
        % (rows, cols, fmt_bytes(tensor_bytes), time.monotonic() - t, header_bytes))
    paths = {"model": model, "plan": {}}
    for w in ranks + ([2] if 2 not in ranks else []):
        for split in SPLITS:
            plan = os.path.join(work, "plan-%s-%d.json" % (split, w))
            subprocess.run([args.devalloc, "plan", model, "-o", plan, "--world-size", str(w),
                            "--shard", "%s=%s" % (TENSOR, split.replace("dim", "dim:"))],
                           check=True, stdout=subprocess.DEVNULL)
            paths["plan"][(split, w)] = plan
    paths["config"] = os.path.join(work, "devalloc.toml")
    with open(paths["config"], "w") as f:
        f.write('[plugins.host]\noptions = { pool = "true" }\n[load]\nthreads = %d\nread = "%s"\n'
                % (args.threads, args.read))
    paths["pread_config"] = os.path.join(work, "devalloc-pread.toml")
    with open(paths["pread_config"], "w") as f:
        f.write('[load]\nread = "pread"\n')
    n, seconds = warm_page_cache(model)
    log("page cache warmed: %s read in %.2f s (%.1f GB/s)" % (fmt_bytes(n), seconds,
                                                             n / seconds / 1e9))
    log("devalloc: host plugin pool = true, [load] threads = %d%s, read = %s; workers with "
        "GLIBC_TUNABLES=%s; %d repeats, each (split, method) once per repeat in rotated order; "
        "medians (min-max)" % (args.threads, " (its default)" if args.threads == 0 else "",
                               args.read, WARM_MALLOC, args.repeats))

    results = {"info": info, "model": {"rows": rows, "cols": cols, "tensor_bytes": tensor_bytes,
                                       "header_bytes": header_bytes},
               "devalloc_config": {"threads": args.threads, "read": args.read, "pool": True},
               "repeats": args.repeats, "jobs": []}
    failed = False
    summaries = {}
    for w in ranks:
        t = time.monotonic()
        job = run_job(args, paths, w, env, log)
        results["jobs"].append(job)
        share = {"dim0": tensor_bytes // w, "dim1": tensor_bytes // w}
        summary = summarize(job, share, header_bytes, tensor_bytes)
        summaries[w] = summary
        log()
        log("W = %d: %d rank%s, share %s per rank (dim 1: runs of %d bytes, %d rows); %.0f s, "
            "load average %.2f after" % (w, w, "s" if w > 1 else "", fmt_bytes(share["dim0"]),
                                         cols // w * 4, rows, time.monotonic() - t,
                                         os.getloadavg()[0]))
        for split in SPLITS:
            checks = job["verify"][split]
            ok = all(a["ok"] for a in checks)
            failed |= not ok
            log("  %s: shards %s against get_slice; read = pread: rchar %s per rank, "
                "devalloc's count %s" %
                (SPLIT_TEXT[split], "identical" if ok else "DIFFER",
                 "/".join(str(a["pread_rchar"]) for a in checks),
                 "/".join(str(a["pread_bytes_read"]) for a in checks)))
        log("  %-6s %-18s %-25s %-27s %-6s %-24s %s" %
            ("split", "method", "total s: median (min-max)", "per rank s: medians",
             "GB/s", "bytes read per rank", "time / devalloc's"))
        for split in SPLITS:
            for method in METHODS:
                row = summary[(split, method)]
                totals = list(row["total"].values())
                per_rank = [median(v) for v in row["per_rank"]]
                read = sorted(set().union(*row["bytes_read"]))
                gbs = w * share[split] / median(totals) / 1e9
                ratio = "" if method == "devalloc" else spread(row["ratio_vs_devalloc"], "%.2f")
                log("  %-6s %-18s %-25s %-27s %-6.2f %-24s %s" %
                    (split, METHOD_TEXT[method], spread(totals),
                     " ".join("%.3f" % x for x in per_rank), gbs,
                     " / ".join(fmt_bytes(x) for x in read) + " (%.4fx)" % (max(read) / share[split]),
                     ratio))

    # The targets.
    log()
    log("Targets (issue 32 item 6)")
    target = {}
    shard = tensor_bytes // 2
    size_note = "" if shard == GiB else " (the target names 1 GiB shards; --size 2048 gives them)"

    def row_vs_col(col, row):
        """speed_row / speed_col per repeat: t_col_i / t_row_i."""
        return [col[k] / row[k] for k in sorted(row) if k in col]

    def verdict(ratios):
        return "met" if median(ratios) >= 0.8 else "MISSED"

    if 2 in summaries:
        s = summaries[2]
        out = {}
        for method in ("devalloc", "mmap_copy"):
            out[method] = row_vs_col(s[("dim0", method)]["total"], s[("dim1", method)]["total"])
        per_rank = {split: median([x for v in s[(split, "devalloc")]["per_rank"] for x in v])
                    for split in SPLITS}
        target["concurrent"] = {"shard_bytes": shard, "devalloc_ratio_per_repeat": out["devalloc"],
                                "mmap_copy_ratio_per_repeat": out["mmap_copy"]}
        log("  row-split vs column-split shard of %s%s, both ranks of W = 2 at once (job wall "
            "time, per repeat):" % (fmt_bytes(shard), size_note))
        log("    devalloc speed_row / speed_col = %s (per-rank medians %.3f s col, %.3f s row); "
            "target >= 0.8: %s" % (spread(out["devalloc"], "%.2f"), per_rank["dim0"],
                                   per_rank["dim1"], verdict(out["devalloc"])))
        log("    the bare mmap copy, same shards: %s" % spread(out["mmap_copy"], "%.2f"))
    solo = run_solo(args, paths, env)
    results["solo"] = solo
    times = {}
    for r in solo:
        times.setdefault((r["split"], r["method"]), {})[r["repeat"]] = r["rank"]["seconds"]
    load_seconds = {split: median([r["rank"]["load_seconds"] for r in solo
                                   if r["split"] == split and r["method"] == "devalloc"])
                    for split in SPLITS}
    target["solo"] = {"shard_bytes": shard, "seconds": {"%s/%s" % k: list(v.values())
                                                        for k, v in times.items()},
                      "devalloc_load_seconds_median": load_seconds}
    log("  the same shards, rank 0 alone (one process, %d repeats):" % args.solo_repeats)
    for method in SOLO_METHODS:
        col, row = times[("dim0", method)], times[("dim1", method)]
        ratios = row_vs_col(col, row)
        target["solo"][method + "_ratio_per_repeat"] = ratios
        log("    %-15s col %s s (%.2f GB/s), row %s s (%.2f GB/s); speed_row / speed_col = %s%s" %
            (METHOD_TEXT[method], spread(list(col.values())), shard / median(list(col.values())) / 1e9,
             spread(list(row.values())), shard / median(list(row.values())) / 1e9,
             spread(ratios, "%.2f"),
             "; target >= 0.8: " + verdict(ratios) if method == "devalloc" else ""))
    log("    (devalloc's own load time, LoadReport seconds: col %.3f s, row %.3f s)"
        % (load_seconds["dim0"], load_seconds["dim1"]))
    worst = None
    for w, summary in summaries.items():
        for split in SPLITS:
            row = summary[(split, "devalloc")]
            for read in row["bytes_read"]:
                for r in read:
                    x = r / (tensor_bytes // w)
                    worst = x if worst is None or x > worst else worst
    target["bytes_read_worst_over_share"] = worst
    if worst is not None:
        log("  bytes read by a rank / its share, worst over every W, split and rank (devalloc's "
            "count, header included): %.6f; target <= 1.01: %s" %
            (worst, "met" if worst <= 1.01 else "MISSED"))
    results["targets"] = target
    info["loadavg_after"] = os.getloadavg()[0]
    info["wall_seconds"] = time.monotonic() - started
    log("load average after: %.2f; whole run %.0f s" % (info["loadavg_after"],
                                                         info["wall_seconds"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
        log("wrote %s" % args.json)
    if failed:
        log("shard_bench: a shard differs from the reference slice")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
