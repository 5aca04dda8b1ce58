#!/usr/bin/env python3
"""Seeds of fuzz_model_folder (config.json, model.safetensors.index.json and tokenizer.model split
at the line "@@qkv-file@@") and of fuzz_tokenizer's crafted normalization tables (issue 28 item 3):
the qwen2 fixture's own files, and each hostile case of issue 28 on top of them.
    python3 tests/fuzz/corpus/make_model_folder_corpus.py
"""
import json
import pathlib
import struct

here = pathlib.Path(__file__).resolve().parent
tests = here.parent.parent
qwen2 = tests / "numerics" / "llama_fixtures" / "qwen2"
config = (qwen2 / "config.json").read_bytes()
index = (qwen2 / "model.safetensors.index.json").read_bytes()
spm = (tests / "numerics" / "tokenizer" / "tokenizer.model").read_bytes()
SPLIT = b"\n@@qkv-file@@\n"


def varint(n):
    out = b""
    while n >= 0x80:
        out += bytes([n & 0x7F | 0x80])
        n >>= 7
    return out + bytes([n])


def field(number, payload):  # a length-delimited protobuf field
    return varint(number << 3 | 2) + varint(len(payload)) + payload


def with_charsmap(units, text):
    """The tokenizer with a NormalizerSpec.precompiled_charsmap: trie size, Darts units, text."""
    trie = b"".join(struct.pack("<I", u) for u in units)
    return spm + field(3, field(2, struct.pack("<I", len(trie)) + trie + text))


sound = [0x80000000] * 768  # 'a' -> 'b'
sound[0] = 256 << 10
sound[256 ^ ord("a")] = (865 << 10) | (1 << 8) | ord("a")
sound[512] = 0x80000000
outside = [0xFFFFFC00] + [0] * 255  # the root's offset points outside the table (libsentencepiece: SIGSEGV)
cycle = list(sound)
cycle[512 ^ ord("a")] = (97 << 10) | (1 << 8) | ord("a")  # a match per 'a', forever

deep = json.loads(config)
deep["hidden_size"] = "@DEEP@"
deep = json.dumps(deep).encode().replace(b'"@DEEP@"', b"[" * 5000 + b"]" * 5000)
long_type = json.loads(config)
long_type["model_type"] = "x" * 4000 + "\n"
nul_shard = json.loads(index)
nul_shard["weight_map"]["model.norm.weight"] = "model-00001\0-of-00002.safetensors"

seeds = {
    "qwen2": (config, index, spm),
    "qwen2_sound_charsmap": (config, index, with_charsmap(sound, b"b\0")),
    "qwen2_charsmap_outside": (config, index, with_charsmap(outside, b"x\0")),
    "qwen2_charsmap_cycle": (config, index, with_charsmap(cycle, b"b\0")),
    "deep_hidden_size": (deep, index, b""),
    "long_model_type": (json.dumps(long_type).encode(), index, b""),
    "nul_in_shard_name": (config, json.dumps(nul_shard).encode(), b""),
}
for name, parts in seeds.items():
    (here / "model_folder" / name).write_bytes(SPLIT.join(parts))
for name in ("sound_charsmap", "charsmap_outside", "charsmap_cycle"):
    (here / "tokenizer" / name).write_bytes(seeds["qwen2_" + name][2])
