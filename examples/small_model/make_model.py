#!/usr/bin/env python3
"""Writes the example model: model.safetensors (about 4 MB, F32/F16/BF16
tensors named like a small decoder-only language model) and plan.json (two
methods, "prefill" and "decode", sharing the weights).

Deterministic: the same bytes on every run. Needs numpy only; the file is
written by hand from the safetensors format so that BF16 needs no framework.

    python3 make_model.py [OUTPUT_DIR]
"""
import json
import os
import struct
import sys

import numpy as np

VOCAB, DIM, HIDDEN, LAYERS, HEADS, CONTEXT = 1024, 256, 688, 2, 4, 128
ALIGN = 256


def bf16(values):
    """float32 -> bfloat16 bits, round to nearest even."""
    bits = values.astype(np.float32).view(np.uint32)
    rounding = ((bits >> 16) & 1) + 0x7FFF
    return ((bits + rounding) >> 16).astype(np.uint16)


def tensors():
    rng = np.random.default_rng(20261202)

    def normal(*shape, scale=0.02):
        return (rng.standard_normal(shape, dtype=np.float32) * scale)

    out = [("model.embed_tokens.weight", "BF16", [VOCAB, DIM], bf16(normal(VOCAB, DIM)))]
    for i in range(LAYERS):
        p = f"model.layers.{i}."
        for proj in ("q_proj", "k_proj", "v_proj", "o_proj"):
            out.append((p + f"self_attn.{proj}.weight", "F16", [DIM, DIM],
                        normal(DIM, DIM).astype(np.float16)))
        out.append((p + "mlp.gate_proj.weight", "F16", [HIDDEN, DIM],
                    normal(HIDDEN, DIM).astype(np.float16)))
        out.append((p + "mlp.up_proj.weight", "F16", [HIDDEN, DIM],
                    normal(HIDDEN, DIM).astype(np.float16)))
        out.append((p + "mlp.down_proj.weight", "F16", [DIM, HIDDEN],
                    normal(DIM, HIDDEN).astype(np.float16)))
        out.append((p + "input_layernorm.weight", "F32", [DIM],
                    np.ones(DIM, dtype=np.float32)))
        out.append((p + "post_attention_layernorm.weight", "F32", [DIM],
                    np.ones(DIM, dtype=np.float32)))
    out.append(("model.norm.weight", "F32", [DIM], np.ones(DIM, dtype=np.float32)))
    half = DIM // HEADS // 2
    inv_freq = 1.0 / (10000.0 ** (np.arange(half, dtype=np.float32) / half))
    out.append(("model.rotary_emb.inv_freq", "F32", [half], inv_freq.astype(np.float32)))
    out.append(("lm_head.weight", "F16", [VOCAB, DIM], normal(VOCAB, DIM).astype(np.float16)))
    return out


def write_safetensors(path, items):
    header, blobs, offset = {"__metadata__": {"format": "pt", "source": "devalloc example"}}, [], 0
    for name, dtype, shape, array in items:
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-(8 + len(text)) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for blob in blobs:
            f.write(blob)
    os.replace(tmp, path)


def write_plan(path, items):
    # Buffer 0: the shared weights; 1: the output head, decode only;
    # 2: the KV cache, planned scratch memory; 3: the rotary table on the host.
    def home(name):
        if name == "lm_head.weight":
            return 1
        if name == "model.rotary_emb.inv_freq":
            return 3
        return 0

    sizes, tensors_out = {0: 0, 1: 0, 2: 0, 3: 0}, []
    for name, dtype, shape, array in items:
        mid = home(name)
        offset = -(-sizes[mid] // ALIGN) * ALIGN
        nbytes = np.ascontiguousarray(array).nbytes
        sizes[mid] = offset + nbytes
        tensors_out.append({"name": name, "dtype": dtype, "shape": shape, "memory_id": mid,
                            "offset": offset,
                            "source": {"file": "model.safetensors", "key": name}})
    kv_shape = [LAYERS, 2, CONTEXT, DIM]
    tensors_out.append({"name": "kv_cache", "dtype": "F16", "shape": kv_shape, "memory_id": 2,
                        "offset": 0, "source": None})
    sizes[2] = int(np.prod(kv_shape)) * 2

    weights = [t["name"] for t in tensors_out if t["memory_id"] in (0, 3)]
    plan = {
        "format": "devalloc-plan",
        "version": 1,
        "buffers": [
            {"memory_id": 0, "device": "cuda:0", "size": sizes[0], "alignment": ALIGN},
            {"memory_id": 1, "device": "cuda:0", "size": sizes[1], "alignment": ALIGN},
            {"memory_id": 2, "device": "cuda:0", "size": sizes[2], "alignment": ALIGN},
            {"memory_id": 3, "device": "host", "size": sizes[3], "alignment": ALIGN},
        ],
        "tensors": tensors_out,
        "methods": [
            {"name": "prefill", "memory_ids": [0, 2, 3], "tensors": weights + ["kv_cache"]},
            {"name": "decode", "memory_ids": [0, 1, 2, 3],
             "tensors": weights + ["lm_head.weight", "kv_cache"]},
        ],
    }
    # One line per buffer, tensor and method, so that the plan reads (and
    # diffs) line by line.
    lines = ['{', f' "format": "{plan["format"]}",', f' "version": {plan["version"]},']
    for i, section in enumerate(("buffers", "tensors", "methods")):
        entries = [json.dumps(e) for e in plan[section]]
        lines.append(f' "{section}": [')
        lines.append(",\n".join("  " + e for e in entries))
        lines.append(" ]" + ("," if i < 2 else ""))
    lines.append("}")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.dirname(os.path.abspath(__file__))
    items = tensors()
    write_safetensors(os.path.join(out, "model.safetensors"), items)
    write_plan(os.path.join(out, "plan.json"), items)


if __name__ == "__main__":
    main()
