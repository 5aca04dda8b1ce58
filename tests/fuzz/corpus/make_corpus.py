#!/usr/bin/env python3
"""Regenerates the seed corpora for tests/fuzz/fuzz_npy.cpp, fuzz_safetensors.cpp and fuzz_cli.cpp.

Small hand-built files (no numpy needed), valid and invalid, each a few hundred bytes at most:
    python3 tests/fuzz/corpus/make_corpus.py
writes tests/fuzz/corpus/npy/*.npy, tests/fuzz/corpus/safetensors/*.safetensors and
tests/fuzz/corpus/cli/*.bin (command lines in fuzz_cli.cpp's input layout, its pools read from it).
"""
import json
import pathlib
import re
import struct

HERE = pathlib.Path(__file__).resolve().parent


def npy(dict_text, payload, major=1, pad=True):
    """An .npy image: magic, version, header length, dict (padded to 64 with spaces + '\\n')."""
    prefix = 10 if major == 1 else 12
    header = dict_text.encode("utf-8")
    if pad:
        header += b"\n"
        while (prefix + len(header)) % 64:
            header = header[:-1] + b" \n"
    length = struct.pack("<H" if major == 1 else "<I", len(header))
    return b"\x93NUMPY" + bytes([major, 0]) + length + header + payload


def d(descr, shape, fortran=False):
    return "{'descr': '%s', 'fortran_order': %s, 'shape': %s, }" % (descr, "True" if fortran else "False", shape)


def safetensors(header, data, pad=True):
    """A safetensors image; `header` is a dict (dumped compactly) or raw text."""
    text = (header if isinstance(header, str) else json.dumps(header, separators=(",", ":"))).encode()
    if pad:
        text += b" " * (-len(text) % 8)
    return struct.pack("<Q", len(text)) + text + data


def entry(dtype, shape, begin, end):
    return {"dtype": dtype, "shape": shape, "data_offsets": [begin, end]}


def cli_pools():
    """fuzz_cli.cpp's kCommands, kFlags and kValues, in order."""
    src = (HERE.parent / "fuzz_cli.cpp").read_text()
    pools = {}
    for name in ("kCommands", "kFlags", "kValues"):
        body = re.search(name + r"\[\][^=]*= \{(.*?)\};", src, re.S).group(1)
        strings = re.findall(r'"((?:[^"\\]|\\.)*)"', body)
        if name == "kCommands":  # pairs
            strings = [" ".join(x for x in strings[i:i + 2] if x) for i in range(0, len(strings), 2)]
        pools[name] = strings
    return pools


def cli_seed(pools, command, args, files):
    """One fuzz_cli input: `args` are (flag, value or None); `files` four (mode, bytes) pairs."""
    out = bytes([pools["kCommands"].index(command), len(args)])
    for flag, value in args:
        out += bytes([pools["kFlags"].index(flag), 255 if value is None else pools["kValues"].index(value)])
    for mode, data in files:
        out += bytes([mode]) + data
    return out


def f32_npy(*dims):  # mode 1: rank, dims (a byte >= 200 is 32), then one byte per element byte
    return (1, bytes([len(dims) - 1]) + bytes(200 if d == 32 else d for d in dims))


def main():
    f32 = struct.pack("<6f", 1, 2, 3, 4, 5, -6.5)
    npy_files = {
        # valid
        "f32_2x3_v1.npy": npy(d("<f4", "(2, 3)"), f32),
        "f8_scalar.npy": npy(d("<f8", "()"), struct.pack("<d", 3.5)),
        "i4_fortran.npy": npy(d("<i4", "(2, 2)", True), struct.pack("<4i", 1, 3, 2, 4)),
        "i8_bigendian.npy": npy(d(">i8", "(2,)"), struct.pack(">2q", -2, 1 << 50)),
        "f2_v2.npy": npy(d("<f2", "(3,)"), struct.pack("<3H", 0x3C00, 0xC000, 0x7C00), major=2),
        "b1_v3_unpadded.npy": npy("{'shape': (1, 3), 'descr': '|b1', 'fortran_order': False}",
                                  b"\x01\x00\x01", major=3, pad=False),
        "f4_empty.npy": npy(d(">f4", "(0, 4)", True), b""),
        # invalid
        "bad_magic.npy": b"\x93NUMPZ\x01\x00" + npy(d("<f4", "()"), b"\0\0\0\0")[8:],
        "short_data.npy": npy(d("<f4", "(2, 3)"), f32[:20]),
        "bad_dict.npy": npy("{'descr': '<f4', 'fortran_order': False, 'shape': (3)}", f32[:12]),
    }
    st_files = {
        # valid
        "all_dtypes.safetensors": safetensors(
            {"__metadata__": {"format": "pt"}, "w": entry("F32", [2, 3], 0, 24), "d": entry("F64", [1], 24, 32),
             "h": entry("F16", [2], 32, 36), "b": entry("BF16", [2], 36, 40), "m": entry("BOOL", [3], 40, 43),
             "i": entry("I32", [1], 44, 48), "l": entry("I64", [], 48, 56)},
            f32 + struct.pack("<d", -1.25) + struct.pack("<4H", 0x3C00, 0x7C00, 0x3F80, 0xC000) + b"\x01\x00\x01\x00"
            + struct.pack("<i", -7) + struct.pack("<q", 1 << 40)),
        "empty.safetensors": safetensors({}, b""),
        "zero_sized.safetensors": safetensors({"z": entry("F32", [0, 5], 0, 0), "s": entry("I32", [], 0, 4)},
                                              struct.pack("<i", 9)),
        "unpadded_gap.safetensors": safetensors('{"a":{"dtype":"I64","shape":[1],"data_offsets":[8,16]}}',
                                                bytes(16), pad=False),
        # invalid
        "overlap.safetensors": safetensors({"a": entry("F32", [2], 0, 8), "b": entry("F32", [2], 4, 12)}, bytes(12)),
        "duplicate.safetensors": safetensors('{"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                             '"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}}', bytes(8)),
        "u8.safetensors": safetensors({"a": entry("U8", [4], 0, 4)}, bytes(4)),
        "huge_header_len.safetensors": struct.pack("<Q", 1 << 40) + b"{}",
        "bad_metadata.safetensors": safetensors({"__metadata__": {"epoch": 3}}, b""),
    }
    p = cli_pools()
    sdpa = [("--query", "@a.npy"), ("--key", "@b.npy"), ("--value", "@c.npy"), ("--out", "@out.npy")]
    mha = [("--weights", "@w.safetensors"), ("--query", "@a.npy"), ("--heads", "4"), ("-o", "@out.npy")]
    small = [f32_npy(1, 2, 3, 4)] * 3 + [(3, b"")]
    cli_files = {
        "run_sdpa.bin": cli_seed(p, "run sdpa", sdpa + [("--backend", "reference"), ("--weights-out", "@out2.npy")],
                                 small),
        "run_sdpa_causal_cpu.bin": cli_seed(p, "run sdpa", sdpa + [("--causal", None), ("--backend", "cpu")], small),
        "run_sdpa_out_is_input.bin": cli_seed(p, "run sdpa", sdpa[:3] + [("--out", "@b.npy")], small),
        "run_mha.bin": cli_seed(p, "run mha", mha + [("--weights-out", "@out2.npy"), ("--backend", "reference")],
                                [f32_npy(1, 3, 32), (0, b"\x00"), (0, b""), (3, b"")]),
        "run_encoder_layer.bin": cli_seed(p, "run encoder-layer",
                                          [("--weights", "@w.safetensors"), ("--src", "@a.npy"), ("--heads", "4"),
                                           ("--causal", None), ("-o", "@outdir"), ("--backend", "reference")],
                                          [f32_npy(1, 3, 32), (0, b""), (0, b""), (4, b"")]),
        "shapes.bin": cli_seed(p, "shapes sdpa", [("--heads", "2"), ("--seq", "4"), ("--head-dim", "8"),
                                                  ("--dump-after", "all")], [(0, b"")] * 4),
        "heatmap_fifo.bin": cli_seed(p, "heatmap", [("--weights", "@a.npy"), ("--tokens-file", "@fifo"),
                                                    ("-o", "@out.npy")], [f32_npy(1, 3, 3)] + [(0, b"")] * 3),
        "bench_overflow.bin": cli_seed(p, "bench sdpa", [("--heads", "4611686018427387904"), ("--seq", "4"),
                                                         ("--head-dim", "8"), ("--seed", "-1")], [(0, b"")] * 4),
    }
    for sub, files in (("npy", npy_files), ("safetensors", st_files), ("cli", cli_files)):
        out = HERE / sub
        out.mkdir(exist_ok=True)
        for name, data in files.items():
            assert len(data) <= 512, name
            (out / name).write_bytes(data)


if __name__ == "__main__":
    main()
