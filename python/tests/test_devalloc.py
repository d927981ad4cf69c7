"""The Python package against the host plugin it ships: plans, loads, DLPack
tensors into numpy (values checked against the safetensors files), errors,
progress and lifetimes."""
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import load_file, save_file

import devalloc


@pytest.fixture(scope="module")
def example(tmp_path_factory):
    """The example model (F32/F16/BF16, two methods) and a config that puts
    its "cuda:0" on the host plugin."""
    folder = tmp_path_factory.mktemp("example")
    subprocess.run([sys.executable, os.environ["DEVALLOC_MAKE_MODEL"], str(folder)], check=True)
    (folder / "devalloc.toml").write_text('[devices."cuda:0"]\nuse = ["host", { index = 0 }]\n')
    return folder


@pytest.fixture(scope="module")
def mixed(tmp_path_factory):
    """F32, F16 and I64 tensors in one file, planned onto the host."""
    folder = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(7)
    tensors = {
        "w.f32": rng.standard_normal((3, 5)).astype(np.float32),
        "w.f16": rng.standard_normal((64,)).astype(np.float16),
        "ids.i64": np.arange(-20, 20, dtype=np.int64).reshape(4, 10) * 123456789,
    }
    save_file(tensors, str(folder / "mixed.safetensors"))
    plan = devalloc.plan([folder / "mixed.safetensors"], place={"ids.*": "host"},
                         out=folder / "plan.json")
    return folder, plan


def test_plugins_lists_the_host_plugin_shipped_in_the_package():
    found = {p["name"]: p for p in devalloc.plugins()}
    host = found["host"]
    assert host["outcome"] == "loaded", host
    assert os.path.dirname(host["path"]) == os.path.realpath(devalloc.plugin_dir)
    assert host["devices"][0]["dlpack_device"] == (1, 0)


def test_devalloc_plugin_path_comes_before_the_package_plugins(tmp_path, monkeypatch):
    # A user's folder in DEVALLOC_PLUGIN_PATH may replace a bundled plugin.
    mine = tmp_path / "mine"
    mine.mkdir(mode=0o755)
    shutil.copy(os.path.join(devalloc.plugin_dir, "libdevalloc_host.so"), mine)
    monkeypatch.setenv("DEVALLOC_PLUGIN_PATH", str(mine))
    found = [p for p in devalloc.plugins() if p["name"] == "host"]
    assert [os.path.dirname(p["path"]) for p in found] == [
        str(mine), os.path.realpath(devalloc.plugin_dir)], found
    assert [p["outcome"] for p in found] == ["loaded", "shadowed"], found
    # A Runtime searches in the same order: the miss lists the folders.
    plan = tmp_path / "plan.json"
    save_file({"w": np.zeros(4, np.float32)}, str(tmp_path / "m.safetensors"))
    devalloc.plan(tmp_path / "m.safetensors", place={"*": "nosuch:0"}, out=plan)
    with pytest.raises(devalloc.Error) as error:
        devalloc.Runtime().load(plan)
    message = str(error.value)
    assert str(mine) in message and devalloc.plugin_dir in message, message
    assert message.index(str(mine)) < message.index(devalloc.plugin_dir), message


def test_f32_f16_i64_tensors_reach_numpy_with_the_file_values(mixed):
    folder, plan = mixed
    program = devalloc.Runtime().load(plan)
    expected = load_file(str(folder / "mixed.safetensors"))
    assert sorted(program.names()) == sorted(expected)
    for name, values in expected.items():
        tensor = program[name]
        assert tensor.dtype == {"float32": "F32", "float16": "F16", "int64": "I64"}[values.dtype.name]
        assert tensor.shape == values.shape
        assert tensor.__dlpack_device__() == (1, 0)
        array = np.from_dlpack(tensor)
        assert array.dtype == values.dtype
        np.testing.assert_array_equal(array, values)
        # The array is a view of the plugin's memory, not a copy.
        assert array.__array_interface__["data"][0] == tensor.address


def test_five_line_flow_on_the_example_model(example):
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    program = runtime.load(example / "plan.json", methods=["decode"], verify=True)
    head = np.from_dlpack(program["lm_head.weight"])
    with safe_open(str(example / "model.safetensors"), "np") as source:  # it has BF16 too
        np.testing.assert_array_equal(head, source.get_tensor("lm_head.weight"))
    assert program.methods() == ["decode"]
    assert program["lm_head.weight"].plugin == "host"


def test_a_method_loads_only_its_tensors(example):
    program = devalloc.Runtime(config=example / "devalloc.toml").load(
        example / "plan.json", methods="prefill")
    assert "lm_head.weight" not in program
    assert "model.norm.weight" in program
    with pytest.raises(KeyError, match="lm_head.weight"):
        program["lm_head.weight"]


def test_methods_none_loads_all_and_an_empty_list_or_name_is_an_error(example):
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    assert sorted(runtime.load(example / "plan.json").methods()) == ["decode", "prefill"]
    for methods in ([], (), ""):
        with pytest.raises((ValueError, devalloc.Error), match="names no method|no method"):
            runtime.load(example / "plan.json", methods=methods)
    with pytest.raises(ValueError, match="pass None to load all"):
        runtime.load(example / "plan.json", methods=[])
    with pytest.raises(devalloc.Error, match='no method ""'):
        runtime.load(example / "plan.json", methods=["prefill", ""])


def test_a_progress_that_is_not_callable_is_refused_before_loading(example):
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    with pytest.raises(TypeError, match="progress: a callable"):
        runtime.load(example / "plan.json", progress=5)


def test_star_import_brings_what_the_docs_name():
    names = {}
    exec("from devalloc import *", names)
    for name in ("Runtime", "Program", "Tensor", "Error", "plan", "plugins", "plugin_dir",
                 "to_numpy"):
        assert name in names, name


def test_bf16_is_refused_for_numpy_with_the_dtype_named(example):
    program = devalloc.Runtime(config=example / "devalloc.toml").load(example / "plan.json")
    tensor = program["model.embed_tokens.weight"]
    assert tensor.dtype == "BF16"
    with pytest.raises(TypeError, match='"model.embed_tokens.weight" has dtype BF16'):
        devalloc.to_numpy(tensor)
    with pytest.raises(TypeError, match="has dtype BF16, which numpy has no type for"):
        tensor.numpy()
    # numpy's own refusal, in its own words.
    with pytest.raises((BufferError, RuntimeError, TypeError)):
        np.from_dlpack(tensor)
    # A dtype numpy has goes through the same helpers.
    np.testing.assert_array_equal(program["model.norm.weight"].numpy(), np.ones(256, np.float32))


def test_dlpack_capsules_versioned_and_legacy(mixed):
    _, plan = mixed
    tensor = devalloc.Runtime().load(plan)["w.f32"]
    assert "dltensor_versioned" in repr(tensor.__dlpack__(max_version=(1, 1)))
    assert "dltensor" in repr(tensor.__dlpack__())
    with pytest.raises(BufferError):
        tensor.__dlpack__(dl_device=(2, 0))


def test_a_tensor_keeps_its_program_alive(mixed):
    folder, plan = mixed
    expected = load_file(str(folder / "mixed.safetensors"))["ids.i64"]
    program = devalloc.Runtime().load(plan)
    tensor = program["ids.i64"]
    del program
    gc.collect()
    array = np.from_dlpack(tensor)
    del tensor
    gc.collect()
    # The array holds the tensor, which holds the program and its buffers.
    np.testing.assert_array_equal(array, expected)


def test_progress_reports_every_byte(example):
    seen = []
    devalloc.Runtime(config=example / "devalloc.toml").load(
        example / "plan.json", progress=lambda done, total: seen.append((done, total)))
    assert seen, "progress was never called"
    total = seen[-1][1]
    assert total > 0 and seen[-1][0] == total
    assert all(done <= t == total for done, t in seen)


def test_an_exception_in_progress_reaches_the_caller(example):
    def fail(done, total):
        raise RuntimeError("stop here")
    with pytest.raises(RuntimeError, match="stop here"):
        devalloc.Runtime(config=example / "devalloc.toml").load(example / "plan.json", progress=fail)


def test_a_progress_that_raised_is_not_called_again(example):
    # The load stops, and the callback, whose exception the caller gets,
    # hears of it no more.
    calls = []

    def fail(done, total):
        calls.append(done)
        raise RuntimeError("stop at call %d" % len(calls))
    with pytest.raises(RuntimeError, match="^stop at call 1$"):
        devalloc.Runtime(config=example / "devalloc.toml").load(example / "plan.json", progress=fail)
    assert len(calls) == 1


def _model_of_4_mib_tensors(folder, size):
    """A model of size bytes in tensors of 4 MiB of ones (so that loading
    it touches its destination), its plan, and a config that loads it with
    one thread in staged pieces of 1 MiB."""
    save_file({"t%03d" % i: np.ones(1 << 20, dtype=np.float32) for i in range(size >> 22)},
              str(folder / "big.safetensors"))
    devalloc.plan(folder / "big.safetensors", out=folder / "plan.json")
    (folder / "devalloc.toml").write_text(
        '[load]\nthreads = 1\nstaging = "4MiB"\ndirect = false\nread = "pread"\n')


def _run_script(script, folder, mode):
    """Runs script in a fresh interpreter; the words it printed."""
    done = subprocess.run([sys.executable, "-c", script, str(folder), mode],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


_PEAK_GROWTH_OF_A_LOAD = r"""
import sys, devalloc


def peak():
    # This process's own peak RSS in bytes (getrusage's ru_maxrss keeps
    # the parent's from before exec).
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024

class Stop(Exception):
    pass

folder, stop = sys.argv[1], sys.argv[2] == "stop"
runtime = devalloc.Runtime(config=folder + "/devalloc.toml")
calls = []

def progress(done, total):
    calls.append(done)
    if stop:
        raise Stop("enough")

before = peak()
try:
    program = runtime.load(folder + "/plan.json", progress=progress)
    outcome = "loaded"
except Stop:
    outcome = "stopped"
growth = peak() - before
print(outcome, len(calls), growth)
"""


def test_a_progress_that_raises_stops_the_load(tmp_path):
    # A callback raises to cancel a load: the load stops there, instead of
    # copying the rest of the model first. Seen in the peak memory of a
    # fresh process: a load of 64 MiB in pieces of 1 MiB touches all of its
    # destination (so the measure sees a whole load), a load stopped at its
    # first progress call a few MiB (its staging and first piece).
    size = 64 << 20
    _model_of_4_mib_tensors(tmp_path, size)

    def run(mode):
        outcome, calls, growth = _run_script(_PEAK_GROWTH_OF_A_LOAD, tmp_path, mode)
        return outcome, int(calls), int(growth)

    outcome, calls, whole = run("go on")
    assert outcome == "loaded" and calls > 1
    assert whole >= size * 3 // 4, "the measure does not see a whole load: %d bytes" % whole
    outcome, calls, stopped = run("stop")
    assert outcome == "stopped" and calls == 1
    assert stopped <= size // 4, "the load went on after its callback raised: %d bytes" % stopped


_CTRL_C_DURING_A_LOAD = r"""
import os, signal, sys, threading, time, devalloc


def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024


folder, interrupt = sys.argv[1], sys.argv[2] == "interrupt"
runtime = devalloc.Runtime(config=folder + "/devalloc.toml")
start = rss()
peak = [start]


def watch():
    # Sends Ctrl-C's signal once the load has copied 8 MiB, as a user
    # would while it runs; notes the memory the load reaches.
    sent = False
    while not done.is_set():
        now = rss()
        peak[0] = max(peak[0], now)
        if interrupt and not sent and now - start >= 8 << 20:
            os.kill(os.getpid(), signal.SIGINT)
            sent = True
        time.sleep(0.001)


done = threading.Event()
watcher = threading.Thread(target=watch)
watcher.start()
try:
    program = runtime.load(folder + "/plan.json")
    outcome = "loaded"
except KeyboardInterrupt:
    outcome = "interrupted"
done.set()
watcher.join()
print(outcome, peak[0] - start)
"""


def test_ctrl_c_during_a_load_stops_it(tmp_path):
    # The load runs without the GIL, and Python runs signal handlers on the
    # main thread only when it runs Python: Ctrl-C used to be seen only
    # once the whole model was loaded. Now KeyboardInterrupt comes from
    # load, which stops within about 5 ms. A load of 256 MiB (no progress
    # callback) reaches its whole size in memory; interrupted after 8 MiB,
    # well under half of it.
    size = 256 << 20
    _model_of_4_mib_tensors(tmp_path, size)

    def run(mode):
        outcome, growth = _run_script(_CTRL_C_DURING_A_LOAD, tmp_path, mode)
        return outcome, int(growth)

    outcome, whole = run("let it load")
    assert outcome == "loaded"
    assert whole >= size * 3 // 4, "the measure does not see a whole load: %d bytes" % whole
    outcome, interrupted = run("interrupt")
    assert outcome == "interrupted"
    assert interrupted <= size // 2, "the load went on after Ctrl-C: %d bytes" % interrupted


def test_config_error_carries_file_and_line(tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text('[load]\nstaging = "lots"\n')
    with pytest.raises(devalloc.Error) as caught:
        devalloc.Runtime(config=config)
    error = caught.value
    assert error.code == "invalid_argument"
    assert error.file == str(config) and error.line == 2, error.message
    assert "staging" in str(error)


def test_load_error_names_the_device_and_plugin(example):
    # Without the config, "cuda:0" means the cuda plugin, absent from the package.
    with pytest.raises(devalloc.Error, match="cuda:0") as caught:
        devalloc.Runtime().load(example / "plan.json")
    assert caught.value.file is None or os.path.exists(caught.value.file)


def test_a_plugin_that_releases_after_synchronize_is_warned_of(mixed, tmp_path):
    # PLUGIN-20 breached within [load] release_timeout: the load succeeds,
    # with a RuntimeWarning naming the plugin; in time, no warning.
    zoo = os.environ.get("DEVALLOC_PLUGIN_ZOO_DIR")
    if not zoo:
        pytest.skip("needs the test build's plugin zoo (DEVALLOC_PLUGIN_ZOO_DIR)")
    folder, _ = mixed
    plan = devalloc.plan([folder / "mixed.safetensors"], place={"*": "late:0"},
                         out=tmp_path / "plan.json")
    config = tmp_path / "late.toml"
    for late_ms in (50, 0):
        config.write_text(f'[plugins.late]\nlibrary = "{zoo}/libdevalloc_host_faulty.so"\n'
                          f'options = {{ release_late_ms = "{late_ms}" }}\n'
                          '[load]\ndirect = false\n')
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            program = devalloc.Runtime(config=config).load(plan)
        said = [str(w.message) for w in caught if w.category is RuntimeWarning]
        if late_ms:
            assert len(said) == 1 and re.match(
                r'plugin late released [1-9]\d* (copy|copies) to late device 0 "host memory" after '
                r"synchronize returned \(PLUGIN-20\); the load waited [0-9.]+ s", said[0]), said
        else:
            assert said == []
        np.testing.assert_array_equal(np.from_dlpack(program["w.f32"]),
                                      load_file(str(folder / "mixed.safetensors"))["w.f32"])


def test_a_file_truncated_while_it_loads_is_an_error_not_a_crash(tmp_path):
    # Read through the mapping; another program truncates the file after
    # the first piece: devalloc.Error naming the file, and the interpreter
    # (whose faulthandler pytest turned on) lives on.
    model = tmp_path / "m.safetensors"
    save_file({f"w{i}": np.full(1 << 20, i, np.uint8) for i in range(8)}, str(model))
    plan = devalloc.plan([model], out=tmp_path / "plan.json")
    config = tmp_path / "c.toml"
    config.write_text('[load]\nread = "mmap"\nthreads = 1\nstaging = "1MiB"\ndirect = false\n')
    cut = []

    def truncate(done, total):
        if not cut:
            os.truncate(model, 4096)
            cut.append(done)

    with pytest.raises(devalloc.Error, match=r"m\.safetensors: the page at offset \d+ could not "
                                             r"be read \(SIGBUS\): the file was truncated"):
        devalloc.Runtime(config=config).load(plan, progress=truncate)
    assert cut


@pytest.mark.parametrize("verify", [False, True])
def test_a_file_rewritten_in_place_while_it_loads_fails_the_load_naming_it(tmp_path, verify):
    # open("wb") over the model (what save_file does: the same inode) after
    # the first piece: the load read some of the old bytes and would read
    # the rest from the new ones, at the old header's offsets. It raises,
    # verify or not (the verify pass would hash the same mixed mapping).
    model = tmp_path / "m.safetensors"
    old = {f"w{i}": np.full(1 << 20, i, np.uint8) for i in range(8)}
    save_file(old, str(model))
    plan = devalloc.plan([model], out=tmp_path / "plan.json")
    config = tmp_path / "c.toml"
    config.write_text('[load]\nthreads = 1\nstaging = "1MiB"\ndirect = false\n')
    new = {f"w{i}": np.full(1 << 20, 7 - i, np.uint8) for i in range(8)}
    save_file(new, str(tmp_path / "new.safetensors"))
    written = []

    def rewrite(done, total):
        if not written:
            with open(model, "wb") as f:
                f.write((tmp_path / "new.safetensors").read_bytes())
            # A time of its own: a write in the clock tick of the open may
            # leave the file's times as they were.
            os.utime(model, ns=(1_000_000_000_000_000_000, 1_000_000_000_000_000_000))
            written.append(done)

    with pytest.raises(devalloc.Error, match=r"m\.safetensors: modified in place while it was "
                                             r"being loaded .*renaming it over the old one"):
        devalloc.Runtime(config=config).load(plan, verify=verify, progress=rewrite)
    assert written
    # A load now reads the file as it is.
    program = devalloc.Runtime(config=config).load(plan, verify=True)
    assert int(np.from_dlpack(program["w0"])[0]) == 7


def test_missing_plan_is_an_error_naming_it(tmp_path):
    with pytest.raises(devalloc.Error, match="nowhere.json"):
        devalloc.Runtime().load(tmp_path / "nowhere.json")


def run_in_daemon_threads(targets, timeout=20):
    """Runs each target in a daemon thread and returns what they raised; a
    thread still running after `timeout` seconds fails the test (a deadlock
    fails it instead of hanging the run)."""
    import threading
    errors = []

    def run(target):
        try:
            target()
        except Exception as e:  # noqa: BLE001 - reported by the caller
            errors.append(e)

    threads = [threading.Thread(target=run, args=(t,), daemon=True) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=timeout)
    assert not any(t.is_alive() for t in threads), "a load did not return: a deadlock?"
    return errors


def test_two_threads_loading_through_one_runtime_both_finish(example):
    # A load that ends takes the GIL back: nothing of the Runtime may be
    # held then that a load waiting without the GIL needs (this hung for
    # good once).
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    results = []

    def load():
        for _ in range(5):
            results.append(runtime.load(example / "plan.json"))

    assert run_in_daemon_threads([load, load], timeout=60) == []
    assert len(results) == 10


def test_loads_of_one_runtime_run_at_once_each_calling_only_its_own_progress(example):
    import threading
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    plan = example / "plan.json"
    # Each method's total, from a load of its own.
    totals = {}
    for method in ("prefill", "decode"):
        seen = []
        runtime.load(plan, method, progress=lambda done, total: seen.append(total))
        totals[method] = seen[-1]
    assert totals["prefill"] < totals["decode"]

    # Each load's first call waits for the other load's: both are inside
    # their callbacks at once (loads of one Runtime ran one after the other
    # before, and the barrier broke).
    both_inside = threading.Barrier(2, timeout=10)
    calls = {"prefill": [], "decode": []}
    inside = {"prefill": 0, "decode": 0}

    def load(method):
        def progress(done, total):
            inside[method] += 1
            assert inside[method] == 1, "two calls of one load at once"
            calls[method].append((done, total))
            if len(calls[method]) == 1:
                both_inside.wait()
            inside[method] -= 1
        return lambda: runtime.load(plan, method, progress=progress)

    assert run_in_daemon_threads([load("prefill"), load("decode")]) == []
    for method, seen in calls.items():
        assert seen, method
        assert all(total == totals[method] for _, total in seen), (method, seen)
        assert all(a[0] < b[0] for a, b in zip(seen, seen[1:])), (method, seen)
        assert seen[-1][0] == totals[method], (method, seen)


def test_two_runtimes_whose_progress_callbacks_load_through_each_other_both_finish(example):
    # The ABBA case: each load's callback loads through the other Runtime
    # while the other's load is inside its own callback. A Runtime held
    # through its loads deadlocked here. In a process of its own, which
    # os._exit ends whatever its threads do: a deadlocked callback would
    # keep the interpreter's exit waiting for it.
    script = (
        "import os, sys, threading, devalloc\n"
        "folder = sys.argv[1]\n"
        "plan = folder + '/plan.json'\n"
        "a, b = (devalloc.Runtime(folder + '/devalloc.toml') for _ in range(2))\n"
        "both_inside = threading.Barrier(2, timeout=10)\n"
        "inner = {}\n"
        "def run(first, other):\n"
        "    def progress(done, total):\n"
        "        if first not in inner:\n"
        "            inner[first] = None\n"
        "            both_inside.wait()\n"
        "            inner[first] = other.load(plan)\n"
        "    first.load(plan, progress=progress)\n"
        "threads = [threading.Thread(target=run, args=r, daemon=True) for r in ((a, b), (b, a))]\n"
        "for t in threads:\n"
        "    t.start()\n"
        "for t in threads:\n"
        "    t.join(20)\n"
        "alive = [t.is_alive() for t in threads]\n"
        "loaded = [p is not None and 'lm_head.weight' in p for p in inner.values()]\n"
        "print('alive', alive, 'loaded', loaded, flush=True)\n"
        "os._exit(3 if any(alive) else 0 if loaded == [True, True] else 4)\n")
    done = subprocess.run([sys.executable, "-c", script, str(example)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, (done.stdout, done.stderr)


def test_a_load_from_its_own_runtimes_progress_callback_works(example):
    # Nothing of the Runtime is held while a callback runs: a load through
    # the same Runtime is another load, as from any other thread.
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    inner = []

    def reenter(done, total):
        if not inner:
            inner.append(runtime.load(example / "plan.json", "prefill"))

    outer = runtime.load(example / "plan.json", progress=reenter)
    assert len(inner) == 1
    assert inner[0].methods() == ["prefill"] and "lm_head.weight" in outer
    name = "model.layers.0.self_attn.q_proj.weight"
    np.testing.assert_array_equal(np.from_dlpack(inner[0][name]), np.from_dlpack(outer[name]))


def test_more_dimensions_than_dlpack_export_takes_is_a_buffer_error(tmp_path):
    # numpy makes at most 64 dimensions: the file is written by hand.
    import json
    import struct
    header = json.dumps({"w": {"dtype": "F32", "shape": [1] * 129,
                               "data_offsets": [0, 4]}}).encode()
    header += b" " * (-len(header) % 8)
    (tmp_path / "deep.safetensors").write_bytes(
        struct.pack("<Q", len(header)) + header + bytes(4))
    plan = devalloc.plan([tmp_path / "deep.safetensors"], out=tmp_path / "plan.json")
    tensor = devalloc.Runtime().load(plan)["w"]
    assert len(tensor.shape) == 129
    with pytest.raises(BufferError, match="129 dimensions"):
        tensor.__dlpack__()


def test_a_place_tag_is_checked_as_given_not_split_at_an_equals_sign(tmp_path):
    save_file({"w": np.zeros(4, dtype=np.float32)}, str(tmp_path / "m.safetensors"))
    for tag in ("cuda:0=x", "x=cuda:0"):
        with pytest.raises(devalloc.Error, match="is not a device tag"):
            devalloc.plan([tmp_path / "m.safetensors"], place={"w": tag}, out=tmp_path / "p.json")


def exits_cleanly_while_daemon_threads_load(tmp_path, loop):
    # Two daemon threads run `loop` (the source of a function
    # loop(progress) that loads forever, given `runtime` and `plan`), one
    # with a progress callback and one without; the interpreter exits 0.3 s
    # later, three times over.
    rng = np.random.default_rng(7)
    save_file({f"w{i}": rng.standard_normal((256, 256)).astype(np.float32) for i in range(16)},
              str(tmp_path / "m.safetensors"))
    (tmp_path / "devalloc.toml").write_text(
        '[load]\nstaging = "64KiB"\nthreads = 2\ndirect = false\nverify = true\n')
    script = (
        "import sys, threading, time, devalloc\n"
        "folder = sys.argv[1]\n"
        "plan = devalloc.plan([folder + '/m.safetensors'], out=folder + '/plan.json')\n"
        "runtime = devalloc.Runtime(folder + '/devalloc.toml')\n"
        + loop +
        "threading.Thread(target=loop, args=(lambda d, t: None,), daemon=True).start()\n"
        "threading.Thread(target=loop, args=(None,), daemon=True).start()\n"
        "time.sleep(0.3)\n")
    for _ in range(3):
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "leaked" not in done.stderr, done.stderr


def test_the_interpreter_exits_cleanly_while_a_daemon_thread_loads(tmp_path):
    # A thread taking the GIL back during exit used to abort the process.
    exits_cleanly_while_daemon_threads_load(tmp_path, (
        "def loop(progress):\n"
        "    while True:\n"
        "        runtime.load(plan, progress=progress)\n"))


def test_the_interpreter_exits_cleanly_while_a_daemon_threads_progress_callback_loads(tmp_path):
    # A callback that loads keeps the exit waiting for it: its load, and
    # that load's own callback, must not be parked (it hung for good).
    exits_cleanly_while_daemon_threads_load(tmp_path, (
        "def loop(inner_progress):\n"
        "    def progress(done, total):\n"
        "        runtime.load(plan, progress=inner_progress)\n"
        "    while True:\n"
        "        runtime.load(plan, progress=progress)\n"))


def test_error_locations_are_read_only_where_a_message_starts(tmp_path, example):
    folder = tmp_path / "dir:7: x"
    folder.mkdir()
    (folder / "devalloc.toml").write_text('[load]\nstagin = "1MiB"\n')
    with pytest.raises(devalloc.Error) as caught:
        devalloc.Runtime(config=folder / "devalloc.toml")
    assert (caught.value.file, caught.value.line, caught.value.column) == \
        (str(folder / "devalloc.toml"), 2, 1), caught.value.message

    (tmp_path / "bad.json").write_text('{\n "format": "devalloc-plan",\n "version": 1,,\n}')
    with pytest.raises(devalloc.Error) as caught:
        devalloc.Runtime().load(tmp_path / "bad.json")
    assert (caught.value.file, caught.value.line, caught.value.column) == \
        (str(tmp_path / "bad.json"), 3, 15), caught.value.message

    # A name inside the message that looks like "file:5: " is not a location.
    with pytest.raises(devalloc.Error) as caught:
        devalloc.Runtime(config=example / "devalloc.toml").load(example / "plan.json",
                                                                methods=["a:5: b"])
    assert (caught.value.file, caught.value.line, caught.value.column) == (None, None, None)
    # Nor one with a line and a column, in a quoted tensor name.
    named = tmp_path / "named.safetensors"
    save_file({"w:5:6: x": np.zeros(2, np.float32), "v: header line 5, column 6":
               np.zeros(2, np.float32)}, str(named))
    for name in ("w:5:6: x", "v: header line 5, column 6"):
        twice = tmp_path / "twice.json"
        devalloc.plan(named, out=twice)
        text = twice.read_text()
        plan = json.loads(text)
        entry = next(row for row in plan["tensors"] if row[0] == name)  # [name, dtype, ...]
        plan["tensors"].append(list(entry))
        twice.write_text(json.dumps(plan))
        with pytest.raises(devalloc.Error, match="twice") as caught:
            devalloc.Runtime().load(twice)
        assert (caught.value.file, caught.value.line, caught.value.column) == \
            (None, None, None), caught.value.message


def test_small_input_cases_found_from_outside(mixed, tmp_path):
    folder, plan = mixed
    program = devalloc.Runtime().load(plan)
    # A key with a NUL is shown whole, escaped, not cut at the NUL.
    with pytest.raises(KeyError, match=r"w\.f32\\\\x00tail"):
        program["w.f32\0tail"]
    # One file given as bytes is one file, as for Runtime and load.
    out = devalloc.plan(os.fsencode(folder / "mixed.safetensors"), out=tmp_path / "p.json")
    assert devalloc.Runtime().load(out)["w.f32"].shape == (3, 5)


def test_to_numpy_refuses_memory_off_the_host_naming_the_tensor():
    class OnADevice:  # what a tensor of the CUDA plugin answers
        name, dtype, device = "w", "F32", "cuda:0 (plugin cuda, device 0 \"GPU\")"

        def __dlpack_device__(self):
            return (2, 0)

    with pytest.raises(BufferError, match='tensor "w" is in the memory of cuda:0'):
        devalloc.to_numpy(OnADevice())

    class Bf16OnADevice(OnADevice):  # the device is said first, whatever the dtype
        dtype = "BF16"

    with pytest.raises(BufferError, match='tensor "w" is in the memory of cuda:0'):
        devalloc.to_numpy(Bf16OnADevice())


def group_writable_copy_of_the_package(site):
    """The package as pip leaves it under umask 002, copied into site: files
    0664, folders (the package's, its plugins', site's) 0775."""
    package = site / "devalloc"
    shutil.copytree(os.path.dirname(devalloc.__file__), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    for folder, _, files in os.walk(site):
        os.chmod(folder, 0o775)
        for name in files:
            os.chmod(os.path.join(folder, name), 0o664)
    return package


def test_a_package_installed_with_umask_002_loads_its_own_host_plugin(mixed, tmp_path):
    # Its plugins are trusted as much as its Python code, which Python runs
    # from the same (group-writable) folder; they were refused, and so every
    # load failed with no_such_device.
    folder, plan = mixed
    site = tmp_path / "site"
    group_writable_copy_of_the_package(site)
    script = (
        "import sys, devalloc\n"
        "assert devalloc.__file__.startswith(sys.argv[1]), devalloc.__file__\n"
        "host = [p for p in devalloc.plugins() if p['name'] == 'host']\n"
        "print(host[0]['outcome'], host[0]['reason'])\n"
        "program = devalloc.Runtime().load(sys.argv[2])\n"
        "print(sorted(program.names()), program['w.f32'].plugin)\n")
    done = subprocess.run([sys.executable, "-c", script, str(site), str(plan)],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env=dict(os.environ, PYTHONPATH=str(site)))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines() == [
        "loaded ", "['ids.i64', 'w.f16', 'w.f32'] host"], done.stdout


def plugin_folder_of_the_user(folder, mode):
    """folder (mode) with a copy of the host plugin named "mine"."""
    folder.mkdir()
    shutil.copy(os.path.join(devalloc.plugin_dir, "libdevalloc_host.so"),
                folder / "libdevalloc_mine.so")
    os.chmod(folder / "libdevalloc_mine.so", 0o755)
    os.chmod(folder, mode)
    return folder


def test_a_group_writable_plugin_folder_of_the_user_loads_only_when_trusted(mixed, tmp_path):
    # The package's own trust is its folder's alone; a user's folder is
    # trusted by trust_plugin_path, as by the CLI's --trust-plugin-path,
    # which the refusal (made for Python) does not name.
    mine = plugin_folder_of_the_user(tmp_path / "mine", 0o775)
    refused = [p for p in devalloc.plugins(mine) if p["name"] == "mine"]
    assert [p["outcome"] for p in refused] == ["untrusted"], refused
    reason = refused[0]["reason"]
    assert f"folder {mine} is group-writable (mode 0775)" in reason, reason
    assert "to trust it anyway: trust_plugin_path=FOLDER, [security] trust_paths" in reason, reason
    assert "--trust-plugin-path" not in reason, reason
    for trusted in (mine, str(mine), [mine], [tmp_path]):
        found = [p for p in devalloc.plugins(mine, trust_plugin_path=trusted)
                 if p["name"] == "mine"]
        assert [p["outcome"] for p in found] == ["loaded"], (trusted, found)

    folder, _ = mixed
    plan = devalloc.plan(folder / "mixed.safetensors", place={"*": "mine:0"},
                         out=tmp_path / "plan.json")
    config = tmp_path / "devalloc.toml"
    config.write_text(f'plugin_path = ["{mine}"]\n')
    with pytest.raises(devalloc.Error, match="group-writable") as caught:
        devalloc.Runtime(config).load(plan)
    assert "trust_plugin_path=FOLDER" in str(caught.value)
    assert "--trust-plugin-path" not in str(caught.value)
    program = devalloc.Runtime(config, trust_plugin_path=mine).load(plan)
    assert program["w.f32"].plugin == "mine"


def test_an_empty_folder_to_search_or_trust_is_refused_as_the_cli_refuses_it():
    with pytest.raises(ValueError, match="^plugin_path: an empty path names no folder"):
        devalloc.plugins([""])
    with pytest.raises(ValueError, match="^trust_plugin_path: an empty path names nothing"):
        devalloc.plugins(trust_plugin_path="")
    with pytest.raises(ValueError, match="^trust_plugin_path: an empty path names nothing"):
        devalloc.Runtime(trust_plugin_path=[""])


def test_one_folder_given_as_a_str_or_path_is_one_folder_not_its_characters(tmp_path):
    mine = plugin_folder_of_the_user(tmp_path / "mine", 0o755)
    for given in (str(mine), mine, os.fsencode(mine), [mine]):
        found = [(os.path.dirname(p["path"]), p["outcome"]) for p in devalloc.plugins(given)
                 if p["name"] == "mine"]
        assert found == [(str(mine), "loaded")], (given, found)
    with pytest.raises(TypeError, match="^plugin_path: a path .* not NoneType"):
        devalloc.plugins(None)
    with pytest.raises(TypeError, match="^plugin_path: a path .* not int"):
        devalloc.plugins([mine, 1])


def test_plan_takes_one_method_name_as_one_method_as_load_does(mixed, tmp_path):
    folder, _ = mixed
    out = devalloc.plan(folder / "mixed.safetensors", out=tmp_path / "p.json", methods="decode")
    assert [m["name"] for m in json.loads(open(out).read())["methods"]] == ["decode"]
    assert devalloc.Runtime().load(out, methods="decode").methods() == ["decode"]
    with pytest.raises(TypeError, match="^methods: each name is a str, not NoneType"):
        devalloc.plan(folder / "mixed.safetensors", out=tmp_path / "p.json", methods=[None])


def test_plan_refuses_what_names_no_tensor_or_no_placement(mixed, tmp_path):
    folder, _ = mixed
    model, out = folder / "mixed.safetensors", tmp_path / "p.json"
    for files in ([], ()):
        with pytest.raises(ValueError, match="^files: no safetensors file given"):
            devalloc.plan(files, out=out)
    assert not out.exists()
    with pytest.raises(TypeError, match="^files: a path .* not NoneType"):
        devalloc.plan(None, out=out)
    with pytest.raises(TypeError, match=r"^place: a mapping of tensor name globs to device tags"
                                        r".* not list"):
        devalloc.plan(model, place=[("w.*", "host")], out=out)
    with pytest.raises(TypeError, match="^place: each glob and device tag is a str, not int: int"):
        devalloc.plan(model, place={1: 2}, out=out)
    with pytest.raises(TypeError, match="^default_device: a device tag"):
        devalloc.plan(model, default_device=None, out=out)
    with pytest.raises(TypeError, match="^out: a path"):
        devalloc.plan(model, out=None)


@pytest.mark.parametrize("alignment,error", [
    (-1, ValueError), (0, ValueError), (3, ValueError), (2**64, ValueError),
    (1.5, TypeError), ("256", TypeError), (True, TypeError)])
def test_plan_names_the_alignment_it_refuses_and_what_it_must_be(mixed, tmp_path, alignment, error):
    folder, _ = mixed
    with pytest.raises(error, match="^alignment: a.* power of two"):
        devalloc.plan(folder / "mixed.safetensors", out=tmp_path / "p.json", alignment=alignment)


def test_plan_takes_any_power_of_two_alignment_up_to_2_63(mixed, tmp_path):
    folder, _ = mixed
    out = devalloc.plan(folder / "mixed.safetensors", out=tmp_path / "p.json",
                        alignment=np.int64(4096))
    rows = json.loads(open(out).read())["tensors"]  # [name, dtype, shape, memory_id, offset, ...]
    assert rows and all(row[4] % 4096 == 0 for row in rows)
    with pytest.raises(devalloc.Error, match="would exceed 2\\^64 bytes"):
        devalloc.plan(folder / "mixed.safetensors", out=tmp_path / "p.json", alignment=2**63)


def test_load_names_the_argument_it_refuses(example):
    runtime = devalloc.Runtime(config=example / "devalloc.toml")
    plan = example / "plan.json"
    for verify in ("yes", 1, 0.0):
        with pytest.raises(TypeError, match="^verify: True, False or None"):
            runtime.load(plan, verify=verify)
    with pytest.raises(TypeError, match="^methods: each name is a str, not NoneType"):
        runtime.load(plan, methods=[None])
    with pytest.raises(TypeError, match="^methods: a name .* not int"):
        runtime.load(plan, methods=123)
    with pytest.raises(TypeError, match="^plan: a path .* not NoneType"):
        runtime.load(None)
    with pytest.raises(ValueError, match="^config: a path with a NUL character"):
        devalloc.Runtime(config="a\0b")
    with pytest.raises(TypeError, match="^config: a path .* not int"):
        devalloc.Runtime(config=123)


def test_dlpack_names_the_argument_it_refuses(mixed):
    # A positional stream gave nanobind's "incompatible function arguments";
    # a str stream and copy="y" were taken.
    _, plan = mixed
    tensor = devalloc.Runtime().load(plan)["w.f32"]
    with pytest.raises(TypeError, match=r"^__dlpack__\(\): stream: None or an int .* not str$"):
        tensor.__dlpack__(stream="x")
    with pytest.raises(TypeError, match=r"^__dlpack__\(\): stream: None or an int .* not bool$"):
        tensor.__dlpack__(True)
    with pytest.raises(TypeError, match=r"^__dlpack__\(\): copy: True, False or None, not str$"):
        tensor.__dlpack__(copy="y")
    with pytest.raises(TypeError, match=r"at most one positional argument \(stream\), got 2"):
        tensor.__dlpack__(None, None)
    with pytest.raises(TypeError, match="stream both by position and by keyword"):
        tensor.__dlpack__(None, stream=None)
    assert np.array_equal(np.from_dlpack(tensor), tensor.numpy())
    tensor.__dlpack__(None)  # a positional stream, as the array API allows


def test_a_key_that_is_not_a_str_is_in_no_program(mixed):
    _, plan = mixed
    program = devalloc.Runtime().load(plan)
    assert "w.f32" in program
    for key in (None, 1, b"w.f32", ("w.f32",)):
        assert key not in program
        with pytest.raises(KeyError, match="a tensor name is a str, not " + type(key).__name__):
            program[key]


def test_a_name_no_utf8_spells_is_in_no_program(mixed):
    # A lone surrogate raised RuntimeError: std::bad_cast.
    _, plan = mixed
    program = devalloc.Runtime().load(plan)
    for key in ("\ud800", "w.f32\udcff", "\ud800" * 1000):
        assert key not in program
        with pytest.raises(KeyError, match="lone surrogate") as error:
            program[key]
        # str() of a KeyError is the repr of its message, which repeats the
        # key as Python's repr writes it.
        assert error.value.args[0].startswith("no tensor " + repr(key[:200])), error.value
    with pytest.raises(KeyError) as error:
        program["\ud800" * 1000]
    assert len(error.value.args[0]) < 1500 and "(1000 characters)" in error.value.args[0]


def test_an_empty_config_or_plan_path_names_the_argument(example):
    # Runtime(config="") said "Error: : cannot open...".
    with pytest.raises(ValueError, match="^config: an empty path names no file; pass None"):
        devalloc.Runtime(config="")
    with pytest.raises(ValueError, match="^plan: an empty path names no file"):
        devalloc.Runtime().load("")


def test_a_place_glob_that_places_nothing_is_warned_of(mixed, tmp_path):
    folder, _ = mixed
    with pytest.warns(UserWarning, match=r'^place: placement rule "layers\.\*=host" placed no '
                                         r'tensor: it matches none of the 3 tensors$'):
        devalloc.plan(folder / "mixed.safetensors", place={"layers.*": "host", "w.*": "host"},
                      out=tmp_path / "p.json")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devalloc.plan(folder / "mixed.safetensors", place={"w.*": "host"}, out=tmp_path / "p.json")


def test_a_fallback_says_why_and_the_config_can_forbid_it(example, tmp_path):
    # A typo in `use` loaded everything onto the host without a word of why.
    config = tmp_path / "c.toml"
    config.write_text('[devices."cuda:0"]\nuse = ["cdua", { index = 0 }]\nfallback = ["host"]\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        program = devalloc.Runtime(config=config).load(example / "plan.json")
    said = [str(w.message) for w in caught if w.category is RuntimeWarning]
    # One per buffer planned for "cuda:0" (memory ids 0, 1, 2), each with why.
    assert len(said) == 3, said
    assert re.match(r'fallback: memory id 0: device "cuda:0" falls back to host device 0 '
                    r'"host memory" \(via "host"\): cdua index 0: plugin cdua is unavailable',
                    said[0]), said
    tensor = program["model.norm.weight"]
    assert tensor.is_fallback
    assert tensor.fallback_reason.startswith("cdua index 0: plugin cdua is unavailable"), tensor
    config.write_text(config.read_text() + '[load]\nfallback = "allow"\n')
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        devalloc.Runtime(config=config).load(example / "plan.json")
    config.write_text(config.read_text().replace('"allow"', '"error"'))
    with pytest.raises(devalloc.Error, match=r'device "cuda:0" would fall back to host device 0 '
                                             r'"host memory", which \[load\] fallback = "error" '
                                             r'forbids: cdua index 0') as error:
        devalloc.Runtime(config=config).load(example / "plan.json")
    assert error.value.code == "no_such_device"


def test_the_version_is_pyprojects():
    pyproject = os.path.join(os.path.dirname(__file__), "..", "..", "pyproject.toml")
    with open(pyproject) as f:
        version = re.search(r'^version = "([^"]+)"$', f.read(), re.M).group(1)
    assert devalloc.__version__ == version


def test_the_package_needs_only_the_c_and_cxx_runtimes_and_tomlplusplus():
    """What python.md promises of the wheel: xxHash is compiled in; the
    extension and the plugin it ships need no other library than toml++."""
    from devalloc import _native
    package = os.path.dirname(devalloc.__file__)
    plugins = [os.path.join(package, "plugins", name)
               for name in os.listdir(os.path.join(package, "plugins"))]
    allowed = re.compile(r"(libtomlplusplus|libstdc\+\+|libgcc_s|libc|libm|ld-linux-x86-64|libdl|libpthread)\.so")
    for binary in [_native.__file__] + plugins:
        dynamic = subprocess.run(["readelf", "-d", binary], check=True,
                                 capture_output=True, text=True).stdout
        needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", dynamic)
        assert needed, binary
        assert [n for n in needed if not allowed.match(n)] == [], binary


def test_help_is_useful_without_the_repository():
    import pydoc
    text = pydoc.render_doc(devalloc, renderer=pydoc.plaintext)
    assert "in the repository" not in text
    for said in ("Runtime(config)", "trust_plugin_path", "DEVALLOC_PLUGIN_PATH", "plugin_dir"):
        assert said in text, said
    assert "DLPack" in devalloc.Tensor.__doc__ and "KeyError" in devalloc.Program.__doc__
    documented = {
        devalloc.Tensor.name: "name in the plan", devalloc.Tensor.dtype: "safetensors dtype",
        devalloc.Tensor.shape: "tuple", devalloc.Tensor.nbytes: "bytes",
        devalloc.Tensor.address: "address", devalloc.Tensor.device: "device it is on",
        devalloc.Tensor.plugin: "plugin", devalloc.Tensor.device_index: "index",
        devalloc.Tensor.is_fallback: "fallback", devalloc.Tensor.__dlpack__: "capsule",
        devalloc.Tensor.__dlpack_device__: "DLPack device type",
        devalloc.Program.names: "loaded tensors", devalloc.Program.methods: "loaded methods",
    }
    for member, said in documented.items():
        assert said in (member.__doc__ or ""), (member, member.__doc__)
    for function in (devalloc.plan, devalloc.plugins, devalloc.Runtime, devalloc.Runtime.load):
        assert len(function.__doc__) > 200, function


def test_a_message_naming_a_path_that_is_not_utf8_is_a_devalloc_error(mixed, tmp_path):
    # A folder whose name is not UTF-8 (made by another tool, a Latin-1
    # locale): the message names it, and is still a devalloc.Error with its
    # reason, the bytes shown escaped (by the core, which escapes paths in
    # messages, and by the binding for any text that is not), never a
    # UnicodeDecodeError.
    folder, _ = mixed
    odd = os.fsencode(tmp_path) + b"/d\xff"
    os.mkdir(odd)
    source = odd + b"/m.safetensors"
    shutil.copy(os.fsencode(folder / "mixed.safetensors"), source)
    with pytest.raises(devalloc.Error, match="given twice") as caught:
        devalloc.plan([source, odd + b"/./m.safetensors"], out=tmp_path / "p.json")
    assert caught.value.code == "invalid_argument"
    assert "d\\xff" in caught.value.message, caught.value.message

    # Through a load: a plan in that folder naming a file outside it.
    plan = odd + b"/plan.json"
    devalloc.plan(folder / "mixed.safetensors", out=plan)
    with open(plan) as f:
        text = json.load(f)
    text["allow_external_files"] = False
    with open(plan, "w") as f:
        json.dump(text, f)
    with pytest.raises(devalloc.Error, match="outside the plan's folder") as caught:
        devalloc.Runtime().load(plan)
    assert "d\\xff" in caught.value.message, caught.value.message


def test_paths_and_plugin_names_that_are_not_utf8_reach_python(tmp_path):
    # A plugin folder whose name is not UTF-8: its plugins are listed, each
    # path as os.fsdecode gives it (os.fsencode gets the bytes back), and a
    # config there shows it in plugin_path the same way.
    odd = os.fsencode(tmp_path) + b"/d\xff"
    os.mkdir(odd, 0o755)
    host = os.fsencode(os.path.join(devalloc.plugin_dir, "libdevalloc_host.so"))
    shutil.copy(host, odd + b"/libdevalloc_mine.so")
    found = {p["name"]: p for p in devalloc.plugins(plugin_path=odd)}
    assert found["mine"]["outcome"] == "loaded", found["mine"]
    assert os.fsencode(found["mine"]["path"]) == odd + b"/libdevalloc_mine.so"
    with open(odd + b"/devalloc.toml", "w") as f:
        f.write('plugin_path = ["."]\n')
    runtime = devalloc.Runtime(config=odd + b"/devalloc.toml")
    assert os.path.normpath(os.fsencode(runtime.plugin_path[0])) == odd

    # A plugin whose version and device name are not UTF-8 (PLUGIN-10 asks
    # only for NUL-terminated text) is listed, those bytes as \xNN, beside
    # every other plugin of the search path.
    zoo = os.environ.get("DEVALLOC_PLUGIN_ZOO_DIR")
    if not zoo:
        pytest.skip("needs the test build's plugin zoo (DEVALLOC_PLUGIN_ZOO_DIR)")
    folder = tmp_path / "hostile"
    folder.mkdir(mode=0o755)
    shutil.copy(os.path.join(zoo, "libdevalloc_zoo_hostile_names.so"), folder)
    found = {p["name"]: p for p in devalloc.plugins(plugin_path=folder)}
    hostile = next(p for name, p in found.items() if "hostile" in p["path"])
    assert hostile["outcome"] == "loaded", hostile
    assert "\\xff" in hostile["version"] and "\\xff" in hostile["devices"][0]["name"]
    assert found["host"]["outcome"] == "loaded"


def test_a_load_from_an_atexit_handler_that_runs_after_the_packages_own_finishes(tmp_path):
    # atexit handlers run last registered first: one registered before
    # devalloc was imported runs after devalloc's own hook, which parks
    # threads that take the GIL back. Its load (on the thread that exits)
    # and that load's progress callback must not be parked: it hung for good.
    save_file({"w": np.arange(4, dtype=np.float32)}, str(tmp_path / "m.safetensors"))
    script = (
        "import atexit, sys\n"
        "folder = sys.argv[1]\n"
        "def late(progress):\n"
        "    import devalloc\n"
        "    program = devalloc.Runtime().load(folder + '/plan.json', progress=progress)\n"
        "    print('late load', progress is not None, len(program), flush=True)\n"
        "atexit.register(late, None)\n"
        "atexit.register(late, lambda done, total: None)\n"
        "import threading, devalloc\n"
        "plan = devalloc.plan([folder + '/m.safetensors'], out=folder + '/plan.json')\n"
        "def loop():\n"
        "    while True:\n"
        "        devalloc.Runtime().load(plan, progress=lambda done, total: None)\n"
        "threading.Thread(target=loop, daemon=True).start()\n")
    done = subprocess.run([sys.executable, "-c", script, str(tmp_path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "late load True 1\nlate load False 1\n", done.stdout + done.stderr
    assert "leaked" not in done.stderr, done.stderr


def test_a_config_that_refuses_external_files_refuses_a_plan_that_allows_them(mixed, tmp_path):
    # devalloc.plan sets "allow_external_files" for a plan outside the
    # model's folder; [load] external_files = false does not honour it.
    folder, _ = mixed
    plans = tmp_path / "plans"
    plans.mkdir()
    devalloc.plan(folder / "mixed.safetensors", out=plans / "plan.json")
    assert json.loads((plans / "plan.json").read_text())["allow_external_files"] is True
    devalloc.Runtime().load(plans / "plan.json")
    (tmp_path / "strict.toml").write_text("[load]\nexternal_files = false\n")
    with pytest.raises(devalloc.Error, match="which this runtime does not honour") as caught:
        devalloc.Runtime(config=tmp_path / "strict.toml").load(plans / "plan.json")
    assert caught.value.code == "invalid_argument"
    assert "outside the plan's folder" in caught.value.message, caught.value.message
