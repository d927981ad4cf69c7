#!/usr/bin/env python3
"""Many small tensors, whole process: devalloc's CLI against the reference reader.

    bench/many_tensors_bench.py [--tensors N] [--elements N] [--repeats N]
                                [--json FILE] [--quick] [--keep] [--dir DIR]
                                [--devalloc CLI]
    scripts/bench.sh --many-tensors [ARGS]  (builds build/ first, then this)

One safetensors file of N tensors (default 100 000) of 16 float32 each
(64 bytes; a 7 MB header), written by safetensors.numpy.save_file. Per
repeat, in an order rotated by one each repeat, three runs:

  reference  the reference reader's loop, in a fresh Python process:
             safe_open(path, "np") and get_tensor(key) for every key, timed
             inside the process from safe_open to the end of the loop (the
             interpreter's start and its imports are not counted: the
             reference is given its best case);
  plan       `devalloc plan FILE -o plan.json`, the whole process, timed
             from outside (start, header read and checked, plan written,
             exit);
  load       `devalloc load plan.json`, the whole process, timed from
             outside (start, plan read and checked, the file's header
             checked, every tensor copied onto host:0, exit).

Ratios are per repeat (devalloc's seconds over the reference's), then the
median (min-max) over the repeats. Before the timed runs, the plan is loaded
once with `--verify` (every tensor's bytes hashed on the device against the
file): a wrong load is exit status 1, a figure never is. Each command also
runs once untimed first, so the page cache holds the file and the plan.

Targets (issue 31 item 7): load <= 0.17x and plan <= 0.11x the reference
loop's time, measured in the same run.
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REFERENCE = r"""
import sys, time
from safetensors import safe_open
start = time.perf_counter()
with safe_open(sys.argv[1], "np") as f:
    for key in f.keys():
        f.get_tensor(key)
print(time.perf_counter() - start)
"""
TARGETS = {"load": 0.17, "plan": 0.11}


def make_model(path, tensors, elements):
    import numpy as np
    from safetensors.numpy import save_file
    values = np.arange(tensors * elements, dtype=np.float32).reshape(tensors, elements)
    save_file({f"layer.{i}.w": values[i] for i in range(tensors)}, path)


def timed(command, env):
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"many_tensors_bench: {' '.join(command)} exited {done.returncode}:\n"
                 f"{done.stderr}")
    return seconds, done.stdout


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tensors", type=int, default=100000)
    parser.add_argument("--elements", type=int, default=16, help="float32 per tensor")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--json", help="write the figures here")
    parser.add_argument("--quick", action="store_true",
                        help="2000 tensors, 2 repeats: a smoke run")
    parser.add_argument("--keep", action="store_true", help="keep the folder of the model")
    parser.add_argument("--dir", help="folder for the model (default: a fresh temporary one)")
    parser.add_argument("--devalloc", default=os.path.join(HERE, "..", "build", "bin", "devalloc"))
    args = parser.parse_args()
    if args.quick:
        args.tensors, args.repeats = min(args.tensors, 2000), min(args.repeats, 2)
    if args.tensors < 1 or args.elements < 1 or args.repeats < 1:
        sys.exit("many_tensors_bench: --tensors, --elements and --repeats must be at least 1")

    folder = args.dir or tempfile.mkdtemp(prefix="devalloc-many-tensors-")
    os.makedirs(folder, exist_ok=True)
    model = os.path.join(folder, "model.safetensors")
    plan = os.path.join(folder, "plan.json")
    env = dict(os.environ)
    try:
        make_model(model, args.tensors, args.elements)
        commands = {
            "reference": [sys.executable, "-c", REFERENCE, model],
            "plan": [args.devalloc, "plan", model, "-o", plan],
            "load": [args.devalloc, "load", plan],
        }
        for name in ("plan", "reference", "load"):  # warm: page cache, the plan written
            timed(commands[name], env)
        timed(commands["load"] + ["--verify"], env)

        names = list(commands)
        seconds = {name: [] for name in names}
        for repeat in range(args.repeats):
            shift = repeat % len(names)
            for name in names[shift:] + names[:shift]:
                wall, out = timed(commands[name], env)
                seconds[name].append(float(out) if name == "reference" else wall)

        ratios = {name: [seconds[name][i] / seconds["reference"][i] for i in range(args.repeats)]
                  for name in TARGETS}
        size = os.path.getsize(model)
        print(f"many_tensors_bench: {args.tensors} tensors of {args.elements * 4} bytes "
              f"({size / 1e6:.1f} MB file), {args.repeats} repeats (median, min-max), "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.2f}")
        for name in names:
            values = seconds[name]
            print(f"  {name:<10} {statistics.median(values):8.4f} s  "
                  f"({min(values):.4f}-{max(values):.4f})  "
                  f"{statistics.median(values) / args.tensors * 1e6:6.2f} us per tensor")
        for name, target in TARGETS.items():
            values = ratios[name]
            print(f"  {name} / reference: {statistics.median(values):.3f}x "
                  f"({min(values):.3f}-{max(values):.3f}); target <= {target}x")
        if args.json:
            with open(args.json, "w") as out:
                json.dump({"date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                           "machine": platform.node(), "tensors": args.tensors,
                           "tensor_bytes": args.elements * 4, "repeats": args.repeats,
                           "seconds": seconds, "ratios": ratios}, out, indent=1)
    finally:
        if not args.keep and not args.dir:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
