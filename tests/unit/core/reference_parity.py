"""Hostile safetensors files judged by the reference reader and by devalloc.

    reference_parity.py DEVALLOC SCRATCH_DIR

Writes each case to SCRATCH_DIR, reads it with the reference `safetensors`
package (safetensors.deserialize) and with `DEVALLOC plan FILE`, and compares
the verdicts:
  - what the reference refuses, devalloc refuses (exit 3, naming the file);
  - what the reference accepts, devalloc accepts, unless the case is one of
    STRICTER, the differences docs/safetensors.md lists with their reasons
    (devalloc must then refuse it, so the list stays true);
  - devalloc never crashes, hangs or exits with another code.
Exits 0 when every case agrees, 1 with a line per disagreement.
"""

import os
import struct
import subprocess
import sys

import safetensors

E = '{"dtype":"U8","shape":[%d],"data_offsets":[%d,%d]}'


def sf(header, data=b""):
    if isinstance(header, str):
        header = header.encode()
    return struct.pack("<Q", len(header)) + header + data


def one(name, n=1, begin=0):
    return '"%s":%s' % (name, E % (n, begin, begin + n))


CASES = {
    # Layout of the data section.
    "valid": sf("{%s,%s}" % (one("a", 2), one("b", 2, 2)), bytes(4)),
    "unordered_header": sf("{%s,%s}" % (one("b", 2, 2), one("a", 2)), bytes(4)),
    "gap_between_tensors": sf("{%s,%s}" % (one("a", 2), one("b", 2, 6)), bytes(8)),
    "gap_before_first": sf("{%s}" % one("a", 2, 2), bytes(4)),
    "bytes_after_last": sf("{%s}" % one("a", 2), bytes(8)),
    "data_but_no_tensor": sf("{}", bytes(4)),
    "metadata_only_with_data": sf('{"__metadata__":{}}', bytes(2)),
    "empty_file_header": sf("{}"),
    "overlap": sf("{%s,%s}" % (one("a", 4), one("b", 4, 2)), bytes(6)),
    "tensor_inside_another": sf("{%s,%s}" % (one("a", 8), one("b", 2, 2)), bytes(8)),
    "empty_tensor_at_a_boundary": sf(
        '{%s,"e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]}}' % one("a", 4), bytes(4)),
    "empty_tensor_inside_another": sf(
        '{%s,"e":{"dtype":"F32","shape":[0],"data_offsets":[2,2]}}' % one("a", 4), bytes(4)),
    "empty_tensor_past_the_end": sf(
        '{%s,"e":{"dtype":"F32","shape":[0],"data_offsets":[5,5]}}' % one("a", 4), bytes(4)),
    "end_past_the_file": sf("{%s}" % one("a", 8), bytes(4)),
    "offsets_reversed": sf('{"a":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}}', bytes(4)),
    # The header itself.
    "short_file": b"abc",
    "header_length_past_the_file": struct.pack("<Q", 100) + b"{}",
    "header_length_above_100000000": struct.pack("<Q", 100_000_001) + b"{}",
    "header_not_an_object": sf("[]"),
    "leading_space": sf(" {%s}" % one("a"), bytes(1)),
    "trailing_spaces": sf("{%s}   " % one("a"), bytes(1)),
    "trailing_nul": sf("{%s}\0" % one("a"), bytes(1)),
    "trailing_invalid_utf8": sf(("{%s}" % one("a")).encode() + b"\xff", bytes(1)),
    "byte_order_mark": sf("\ufeff{%s}" % one("a"), bytes(1)),
    "newlines": sf("{\n%s\n}" % one("a"), bytes(1)),
    "deep_nesting": sf('{"a":' + "[" * 200 + "]" * 200 + "}"),
    "very_deep_nesting": sf('{"a":' + "[" * 100000 + "]" * 100000 + "}"),
    "invalid_json": sf('{"a":{"dtype":"U8",,}}'),
    "unclosed_string": sf('{"a'),
    "lone_surrogate": sf('{"\\ud800":%s}' % E % (1, 0, 1), bytes(1)),
    "invalid_utf8_in_name": sf(b'{"\xff":' + (E % (1, 0, 1)).encode() + b"}", bytes(1)),
    "raw_control_character_in_name": sf('{"a\x01":%s}' % E % (1, 0, 1), bytes(1)),
    # Numbers.
    "number_1e400": sf('{"a":{"dtype":"U8","shape":[1e400],"data_offsets":[0,1]}}', bytes(1)),
    "integer_above_64_bits": sf(
        '{"a":{"dtype":"U8","shape":[18446744073709551616],"data_offsets":[0,1]}}', bytes(1)),
    "negative_dimension": sf('{"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}', bytes(1)),
    "minus_zero_dimension": sf('{"a":{"dtype":"U8","shape":[-0],"data_offsets":[0,0]}}'),
    "fractional_dimension": sf('{"a":{"dtype":"U8","shape":[1.0],"data_offsets":[0,1]}}', bytes(1)),
    "exponent_dimension": sf('{"a":{"dtype":"U8","shape":[1e0],"data_offsets":[0,1]}}', bytes(1)),
    "negative_offset": sf('{"a":{"dtype":"U8","shape":[1],"data_offsets":[-1,0]}}', bytes(1)),
    "size_overflows": sf(
        '{"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0]}}'),
    # Entries.
    "shape_and_offsets_disagree": sf('{"a":{"dtype":"U8","shape":[2],"data_offsets":[0,1]}}', bytes(1)),
    "zero_dimension_with_bytes": sf('{"a":{"dtype":"U8","shape":[0],"data_offsets":[0,1]}}', bytes(1)),
    "unknown_dtype": sf('{"a":{"dtype":"F33","shape":[1],"data_offsets":[0,1]}}', bytes(1)),
    "lower_case_dtype": sf('{"a":{"dtype":"u8","shape":[1],"data_offsets":[0,1]}}', bytes(1)),
    "packed_partial_byte": sf('{"a":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}}', bytes(2)),
    "three_offsets": sf('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1,2]}}', bytes(1)),
    "missing_field": sf('{"a":{"dtype":"U8","data_offsets":[0,1]}}', bytes(1)),
    "entry_not_an_object": sf('{"a":[1]}'),
    "unknown_field": sf('{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}', bytes(1)),
    "tensor_named_twice": sf("{%s,%s}" % (one("a"), one("a")), bytes(1)),
    "field_twice": sf('{"a":{"dtype":"U8","dtype":"U8","shape":[1],"data_offsets":[0,1]}}', bytes(1)),
    "nul_in_name": sf('{"a\\u0000b":%s}' % E % (1, 0, 1), bytes(1)),
    "escaped_control_in_name": sf('{"a\\u001b":%s}' % E % (1, 0, 1), bytes(1)),
    # Metadata.
    "metadata_strings": sf('{"__metadata__":{"k":"v"},%s}' % one("a"), bytes(1)),
    "metadata_null": sf('{"__metadata__":null,%s}' % one("a"), bytes(1)),
    "metadata_integer": sf('{"__metadata__":{"k":3},%s}' % one("a"), bytes(1)),
    "metadata_array": sf('{"__metadata__":{"k":[1]},%s}' % one("a"), bytes(1)),
    "metadata_not_an_object": sf('{"__metadata__":["v"],%s}' % one("a"), bytes(1)),
    "metadata_nul": sf('{"__metadata__":{"k":"v\\u0000"},%s}' % one("a"), bytes(1)),
}

# Accepted by the reference, refused by devalloc on purpose; each is listed
# in docs/safetensors.md with its reason.
STRICTER = {
    "unknown_field",
    "tensor_named_twice",
    "field_twice",
    "nul_in_name",
    "metadata_nul",
}


def reference_accepts(data):
    try:
        safetensors.deserialize(data)
        return True, ""
    except Exception as error:  # the reference raises SafetensorError
        return False, str(error)


def devalloc_verdict(devalloc, path, scratch):
    try:
        run = subprocess.run(
            [devalloc, "plan", path, "-o", os.path.join(scratch, "plan.json")],
            capture_output=True, text=True, errors="replace", timeout=30)
    except subprocess.TimeoutExpired:
        return None, "timed out after 30 s"
    return run.returncode, run.stderr.strip()


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    devalloc, scratch = argv[1], argv[2]
    os.makedirs(scratch, exist_ok=True)
    problems = []
    for name, data in CASES.items():
        path = os.path.join(scratch, name + ".safetensors")
        with open(path, "wb") as out:
            out.write(data)
        accepted, why = reference_accepts(data)
        code, message = devalloc_verdict(devalloc, path, scratch)
        verdict = {0: "accepts", 3: "refuses"}.get(code, "exit %s" % code)
        print("%-32s reference %-8s devalloc %s" % (
            name, "accepts" if accepted else "refuses", verdict))
        if code not in (0, 3):
            problems.append("%s: devalloc %s: %s" % (name, verdict, message))
        elif code == 3 and path not in message:
            problems.append("%s: the message does not name the file: %s" % (name, message))
        elif not accepted and code == 0:
            problems.append("%s: the reference refuses (%s), devalloc accepts" % (name, why))
        elif accepted and code == 3 and name not in STRICTER:
            problems.append("%s: the reference accepts, devalloc refuses: %s" % (name, message))
        elif accepted and code == 0 and name in STRICTER:
            problems.append("%s: listed as refused by devalloc only, but devalloc accepts" % name)
    for problem in problems:
        print("MISMATCH " + problem)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
