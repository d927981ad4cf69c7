"""devalloc: put a model's planned constants on devices through drop-in plugins.

A plan (a JSON file) says on which device each tensor of some safetensors
files goes; a Runtime loads the plan's methods through vendor plugins and
returns a Program of Tensors, which numpy, torch and any DLPack consumer
view without a copy:

    import devalloc, numpy
    devalloc.plan("model.safetensors", place={"lm_head.*": "cuda:0"}, out="plan.json")
    runtime = devalloc.Runtime(config="devalloc.toml")   # or Runtime() for the defaults
    program = runtime.load("plan.json", methods=["decode"], verify=True)
    weights = numpy.from_dlpack(program["model.norm.weight"])  # host tensors

    plan(files, ...)    writes a plan for every tensor of the files
    Runtime(config)     a runtime config and its plugins; .load(plan) -> Program
    Program             the loaded tensors: program[name], name in program,
                        names(), methods(), len(program)
    Tensor              one tensor in device memory: name, dtype, shape,
                        device, __dlpack__, numpy()
    plugins()           every plugin on the search path, loaded or why not
    Error               every devalloc failure: message, code, file, line, column

Plugins: the package ships the host plugin (plugin_dir), so a plan for
"host" loads without an accelerator. Vendor plugins (libdevalloc_cuda.so,
...) are found in the config's plugin_path, then DEVALLOC_PLUGIN_PATH, then
plugin_dir. A plugin file is opened only if nobody but root and the current
user can change it or a folder above it; trust_plugin_path=FOLDER (on
Runtime and plugins(), as the CLI's --trust-plugin-path) trusts the plugins
at or below FOLDER anyway. The package's own plugin_dir is trusted as its
Python code is. help(devalloc.Runtime), help(devalloc.plan) and so on say
more.
"""
import numbers as _numbers
import os as _os
from collections.abc import Mapping as _Mapping

from . import _native
from ._errors import Error

__all__ = ["Error", "Program", "Runtime", "Tensor", "plan", "plugin_dir", "plugins", "to_numpy"]

# pyproject.toml's version, compiled into the extension by its build.
__version__ = _native.__version__

Program = _native.Program
Tensor = _native.Tensor

# Where the plugins shipped with the package (the host plugin) live.
plugin_dir = _os.path.join(_os.path.dirname(__file__), "plugins")

# Safetensors dtypes numpy has a type for.
_NUMPY_DTYPES = {"BOOL", "U8", "I8", "U16", "I16", "U32", "I32", "U64", "I64",
                 "F16", "F32", "F64", "C64"}

_PATH_TYPES = (str, bytes, _os.PathLike)


def _path(value, what):
    """value as os.fspath gives it; what names the argument in a refusal."""
    try:
        path = _os.fspath(value)
    except TypeError:
        raise TypeError("%s: a path (str, bytes or os.PathLike), not %s"
                        % (what, type(value).__name__)) from None
    if ("\0" if isinstance(path, str) else b"\0") in path:
        raise ValueError("%s: a path with a NUL character names no file" % what)
    return path


def _paths(value, what):
    """One path (str, bytes, os.PathLike), which is one path and never its
    characters, or an iterable of paths; as a list."""
    if isinstance(value, _PATH_TYPES):
        return [_path(value, what)]
    try:
        items = list(value)
    except TypeError:
        raise TypeError("%s: a path (str, bytes or os.PathLike) or an iterable of paths, not %s"
                        % (what, type(value).__name__)) from None
    return [_path(item, what) for item in items]


def _folders(value, what, empty):
    """_paths, where an empty path is refused as the CLI refuses it: it would
    mean the current folder, which is never implied."""
    folders = _paths(value, what)
    if any(len(folder) == 0 for folder in folders):
        raise ValueError("%s: an empty path %s; write '.' for the current folder" % (what, empty))
    return folders


def _trusted(trust_plugin_path):
    return _folders(trust_plugin_path, "trust_plugin_path", "names nothing to trust")


def _names(value, what):
    """One name (a str, which is one name, never its characters) or an
    iterable of names; as a list."""
    if isinstance(value, str):
        return [value]
    try:
        names = list(value)
    except TypeError:
        raise TypeError("%s: a name (str) or an iterable of names, not %s"
                        % (what, type(value).__name__)) from None
    for name in names:
        if not isinstance(name, str):
            raise TypeError("%s: each name is a str, not %s" % (what, type(name).__name__))
    return names


def plugins(plugin_path=(), trust_plugin_path=()):
    """Every plugin on the search path, loaded or with the reason why not.

    The search path is plugin_path (one folder, or an iterable of folders),
    then DEVALLOC_PLUGIN_PATH, then the package's own plugin_dir. Each plugin
    is a dict: name, path, outcome ("loaded" or why not), reason, and for a
    loaded one version, abi and devices (each with name, total_memory_bytes,
    uuid, pci_bus_id and dlpack_device).

    trust_plugin_path (one path, or an iterable of paths), as the CLI's
    --trust-plugin-path: plugin files at or below these skip the owner and
    permission checks (ignored while running with elevated privileges).
    """
    return _native.plugins(
        _folders(plugin_path, "plugin_path", "names no folder"),
        _trusted(trust_plugin_path), [plugin_dir])


def plan(files, place=None, out="plan.json", default_device="host", alignment=256,
         methods=("main",)):
    """Writes a plan for every tensor of the safetensors files to out and
    returns its path, as the CLI's `devalloc plan`.

    files           one path (str, bytes, os.PathLike) or an iterable of them;
                    at least one
    place           a mapping of tensor name globs to device tags, the first
                    matching glob wins: {"model.layers.*": "cuda:0"}
    default_device  the device tag of the tensors no glob matches
    alignment       of each tensor in its buffer: a power of two, 1 to 2**63
    methods         one method name, or an iterable of names; each method
                    loads every tensor
    An existing out that is not a regular file is refused, never replaced.
    """
    files = _paths(files, "files")
    if not files:
        raise ValueError("files: no safetensors file given; a plan needs at least one")
    out = _path(out, "out")
    if place is None:
        place = {}
    if not isinstance(place, _Mapping):
        raise TypeError('place: a mapping of tensor name globs to device tags, first match '
                        'wins ({"model.layers.*": "cuda:0"}), not %s' % type(place).__name__)
    rules = list(place.items())
    for glob, tag in rules:
        if not isinstance(glob, str) or not isinstance(tag, str):
            raise TypeError("place: each glob and device tag is a str, not %s: %s"
                            % (type(glob).__name__, type(tag).__name__))
    if not isinstance(default_device, str):
        raise TypeError('default_device: a device tag (str) such as "host" or "cuda:0", not %s'
                        % type(default_device).__name__)
    if isinstance(alignment, bool) or not isinstance(alignment, _numbers.Integral):
        raise TypeError("alignment: an int, a power of two, not %s" % type(alignment).__name__)
    alignment = int(alignment)
    if not 0 < alignment < 2**64 or alignment & (alignment - 1):
        raise ValueError("alignment: a power of two from 1 to 2**63, not %d" % alignment)
    _native.write_plan(files, out, rules, default_device, alignment, _names(methods, "methods"))
    return out


class Runtime:
    """A runtime config and the plugins it loads.

    config             a runtime config file (TOML), or None for the defaults
                       (a device tag "name:N" is plugin name, device N). It
                       is read once, here.
    trust_plugin_path  one path, or an iterable of paths, as the CLI's
                       --trust-plugin-path: plugin files at or below these
                       skip the owner and permission checks (added to the
                       config's [security] trust_paths; ignored while running
                       with elevated privileges).

    Plugins are searched in the config's plugin_path, DEVALLOC_PLUGIN_PATH,
    then the package's plugin_dir. Each plugin is created once, by the first
    load that needs it; loads from several threads run side by side.
    """

    def __init__(self, config=None, trust_plugin_path=()):
        if config is not None:
            config = _path(config, "config")
            if len(config) == 0:
                raise ValueError("config: an empty path names no file; pass None for the defaults")
        self._native = _native.Runtime(config, _trusted(trust_plugin_path), [plugin_dir])

    @property
    def plugin_path(self):
        """The config's plugin_path, then the package's plugin folder
        (DEVALLOC_PLUGIN_PATH is searched between the two)."""
        return self._native.plugin_path

    def load(self, plan, methods=None, verify=None, progress=None, rank=None, world_size=None):
        """Loads the methods of the plan file and returns the Program.

        methods   one method name, an iterable of names, or None for all (an
                  empty list is a ValueError, not "all")
        verify    True reads every constant back and compares hashes with the
                  file; None does as the config's [load] verify says
        progress  progress(done, total), called with the bytes this load
                  issued so far, from its loading threads, one call at a time
        rank, world_size  for a plan made for several ranks: this process's
                  rank (world_size defaults to the plan's); None takes them
                  from the launcher (torchrun, mpirun, srun)
        All or nothing: a failure raises devalloc.Error and keeps nothing.
        Loads of one Runtime may run at once, each with its own progress.
        """
        plan = _path(plan, "plan")
        if len(plan) == 0:
            raise ValueError("plan: an empty path names no file")
        if methods is None:
            methods = []
        else:
            methods = _names(methods, "methods")
            if not methods:
                # An empty list loading everything would surprise; None says all.
                raise ValueError("methods: an empty list names no method; pass None to load all")
        if verify is not None and not isinstance(verify, bool):
            raise TypeError("verify: True, False or None (as the config's [load] verify says), "
                            "not %s" % type(verify).__name__)
        if progress is not None and not callable(progress):
            # Said now, not from a loading thread at the first call.
            raise TypeError("progress: a callable progress(done, total) or None, not %r"
                            % type(progress).__name__)
        for value, name in ((rank, "rank"), (world_size, "world_size")):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 0):
                raise TypeError("%s: a whole number or None, not %r" % (name, value))
        return self._native.load(plan, methods, verify, progress, rank, world_size)

    def last_load_report(self):
        """What this thread's last successful load did: {"files": {path:
        bytes read, header included}, "bytes": constant bytes copied,
        "constants": n, "seconds": s}."""
        return self._native.last_load_report()


_DLPACK_CPU = 1


def to_numpy(tensor):
    """numpy.from_dlpack(tensor), refusing with a clear error what numpy
    cannot hold: a dtype it lacks (BF16, F8, ...) or memory off the host."""
    import numpy
    # The device first: memory numpy cannot read is refused whatever its dtype.
    device_type, _ = tensor.__dlpack_device__()
    if device_type != _DLPACK_CPU:
        raise BufferError(
            f'tensor "{tensor.name}" is in the memory of {tensor.device}, which numpy cannot '
            f"read (DLPack device type {device_type}); hand it to a framework of that "
            f"device (torch.from_dlpack) or copy it to the host first")
    if tensor.dtype not in _NUMPY_DTYPES:
        raise TypeError(
            f'tensor "{tensor.name}" has dtype {tensor.dtype}, which numpy has no type '
            f"for; hand it to a framework that has one (torch.from_dlpack) instead")
    return numpy.from_dlpack(tensor)


Tensor.numpy = to_numpy
