#!/usr/bin/python3
"""PyTorch fp32's own error on long attention rows, for tests/numerics/test_long_rows.cpp.

The issue's accuracy rule (FlashAttention's, for fp32): the fused CPU kernels' error against an
fp64 reference must stay within 2 x the error of PyTorch's fp32 attention on the same inputs.
For each case this script builds the inputs exactly as the C++ test does (splitmix64 of a
counter, the top 24 bits as a uniform float in [-1, 1), so both sides hold the same floats;
queries x 3 for a sharper softmax), computes

    fp64:  softmax(q·kᵀ / sqrt(D)) · v           (numpy, float64)
    fp32:  torch.softmax((q @ kᵀ) / sqrt(D)) @ v  (PyTorch 1.13, float32, 2 threads; GQA by
                                                  repeat_interleave of the key/value heads)

and writes long_rows/torch_errors.json: per case max |fp32 − fp64| over the output. Run with
Debian's python3-torch:  /usr/bin/python3 tests/numerics/make_long_rows.py
"""

import json
import os

import numpy as np
import torch

# (name, L, S, D, query heads, key/value heads): L = 1 (a decode step) and 16, D = 32 … 128,
# S up to 131 072, with and without GQA. Keep in step with kCases in test_long_rows.cpp.
CASES = [
    ("L16_S512_D32", 16, 512, 32, 1, 1),
    ("L16_S8192_D32", 16, 8192, 32, 1, 1),
    ("L16_S65536_D32", 16, 65536, 32, 1, 1),
    ("L16_S131072_D64_gqa2", 16, 131072, 64, 2, 1),
    ("L16_S20000_D128_gqa4x2", 16, 20000, 128, 4, 2),
    ("L1_S131072_D64_gqa6x3", 1, 131072, 64, 6, 3),
    ("L1_S131072_D128", 1, 131072, 128, 4, 4),
]

M64 = (1 << 64) - 1


def uniform(count, seed):
    """splitmix64(seed * 1000003 + i) >> 40, as (x / 2^24) * 2 − 1 (exact in float32)."""
    with np.errstate(over="ignore"):
        x = np.arange(count, dtype=np.uint64) + np.uint64((seed * 1000003) & M64)
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return ((x >> np.uint64(40)).astype(np.float64) / 16777216.0 * 2.0 - 1.0).astype(np.float32)


def inputs(case_index, L, S, D, hq, hkv):
    base = 10 * (case_index + 1)
    q = uniform(hq * L * D, base + 1).reshape(1, hq, L, D) * np.float32(3.0)
    k = uniform(hkv * S * D, base + 2).reshape(1, hkv, S, D)
    v = uniform(hkv * S * D, base + 3).reshape(1, hkv, S, D)
    return q, k, v


def main():
    torch.set_num_threads(2)
    out = {}
    for i, (name, L, S, D, hq, hkv) in enumerate(CASES):
        q, k, v = inputs(i, L, S, D, hq, hkv)
        g = hq // hkv
        k64 = np.repeat(k.astype(np.float64), g, axis=1)
        v64 = np.repeat(v.astype(np.float64), g, axis=1)
        s = q.astype(np.float64) @ np.swapaxes(k64, -1, -2) / np.sqrt(D)
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p @ v64) / p.sum(-1, keepdims=True)
        kt = torch.from_numpy(k).repeat_interleave(g, 1)
        vt = torch.from_numpy(v).repeat_interleave(g, 1)
        o = torch.softmax((torch.from_numpy(q) @ kt.transpose(-1, -2)) / (D ** 0.5), -1) @ vt
        err = float(np.abs(o.numpy().astype(np.float64) - ref).max())
        out[name] = {"L": L, "S": S, "D": D, "hq": hq, "hkv": hkv, "torch_fp32_max_abs_error": err,
                     "max_abs_output": float(np.abs(ref).max())}
        print(name, err)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "long_rows", "torch_errors.json")
    with open(path, "w") as f:
        json.dump({"generator": "tests/numerics/make_long_rows.py", "torch": torch.__version__, "cases": out}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
