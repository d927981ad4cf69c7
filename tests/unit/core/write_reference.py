"""Reference safetensors data for devalloc's unit tests, made and checked by
the `safetensors` package from PyPI, so that devalloc's reader and writer are
compared with the implementation everyone else uses.

    write_reference.py write DIR
        DIR/numpy.safetensors      numpy arrays of every numpy-native dtype,
                                   saved by safetensors.numpy.save_file
        DIR/raw.safetensors        BF16, the F8 types, F4 and C64 from raw
                                   bytes, saved by safetensors.serialize_file
        DIR/manifest.json          {file: {"metadata": {...}, "tensors":
                                   {name: {dtype, shape, hex}}}}
    write_reference.py check FILE EXPECTED.json
        reads FILE with safetensors.deserialize and safe_open; exits 0 when
        every tensor (dtype, shape, bytes) and the metadata equal EXPECTED
        (one file's entry of the manifest format), 1 with a diff otherwise.
"""

import json
import sys

import numpy as np
import safetensors
import safetensors.numpy


def numpy_tensors():
    rng = np.random.default_rng(1234)
    return {
        "model.embed.weight": rng.standard_normal((4, 6)).astype(np.float32),
        "blk.0.attn.q.weight": rng.standard_normal((3, 5)).astype(np.float16),
        "blk.0.norm.weight": rng.standard_normal((7,)).astype(np.float64),
        "positions": np.arange(-5, 5, dtype=np.int64).reshape(2, 5),
        "ids.i32": np.arange(-3, 3, dtype=np.int32),
        "ids.u32": np.arange(6, dtype=np.uint32) * 1000003,
        "ids.i16": np.arange(-4, 4, dtype=np.int16),
        "ids.u16": np.arange(8, dtype=np.uint16) * 4099,
        "ids.u64": np.arange(3, dtype=np.uint64) * 0x0102030405060708,
        "bytes.i8": np.arange(-6, 6, dtype=np.int8),
        "bytes.u8": np.arange(250, 256, dtype=np.uint8),
        "mask": np.array([[True, False, True], [False, False, True]]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 3), dtype=np.float32),
    }


# name: (TensorSpec dtype, logical shape, byte count)
RAW = {
    "lm_head.weight": ("bfloat16", [2, 3], 12),
    "fp8.e4m3": ("float8_e4m3fn", [5], 5),
    "fp8.e5m2": ("float8_e5m2", [2, 2], 4),
    "fp8.e4m3fnuz": ("float8_e4m3fnuz", [3], 3),
    "fp8.e5m2fnuz": ("float8_e5m2fnuz", [1, 3], 3),
    "fp8.e8m0": ("float8_e8m0fnu", [4], 4),
    # Two F4 values per byte; the spec takes the storage shape and the
    # header records the logical one, [2, 4].
    "fp4.e2m1": ("float4_e2m1fn_x2", [2, 2], 4),
    "complex": ("complex64", [2], 16),
}


def write(folder):
    manifest = {}
    tensors = numpy_tensors()
    metadata = {"format": "np", "producer": "write_reference.py"}
    safetensors.numpy.save_file(tensors, f"{folder}/numpy.safetensors", metadata=metadata)
    manifest["numpy.safetensors"] = read(f"{folder}/numpy.safetensors")

    keep_alive = []
    specs = {}
    for index, (name, (dtype, shape, nbytes)) in enumerate(RAW.items()):
        data = ((np.arange(nbytes, dtype=np.uint32) * 37 + index * 11) % 256).astype(np.uint8)
        keep_alive.append(data)
        specs[name] = safetensors.TensorSpec(
            dtype=dtype, shape=shape, data_ptr=data.ctypes.data, data_len=nbytes)
    safetensors.serialize_file(specs, f"{folder}/raw.safetensors", metadata={"kind": "raw"})
    manifest["raw.safetensors"] = read(f"{folder}/raw.safetensors")

    with open(f"{folder}/manifest.json", "w", encoding="utf-8") as out:
        json.dump(manifest, out, indent=1, sort_keys=True)


def read(path):
    with open(path, "rb") as f:
        content = f.read()
    with safetensors.safe_open(path, framework="numpy") as handle:
        metadata = handle.metadata() or {}
    entries = {}
    for name, info in safetensors.deserialize(content):
        entries[name] = {
            "dtype": info["dtype"],
            "shape": list(info["shape"]),
            "hex": bytes(info["data"]).hex(),
        }
    return {"metadata": metadata, "tensors": entries}


def check(path, expected_path):
    with open(expected_path, encoding="utf-8") as f:
        expected = json.load(f)
    actual = read(path)
    if actual == expected:
        return 0
    print(f"{path} differs from {expected_path}:")
    print("  expected:", json.dumps(expected, sort_keys=True))
    print("  actual:  ", json.dumps(actual, sort_keys=True))
    return 1


def main(argv):
    if len(argv) == 3 and argv[1] == "write":
        write(argv[2])
        return 0
    if len(argv) == 4 and argv[1] == "check":
        return check(argv[2], argv[3])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
