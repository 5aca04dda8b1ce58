#!/usr/bin/python3
"""PyTorch's own bf16 attention error, for tests/numerics/test_bf16_attention.cpp.

The issue's rule for half precision (FlashAttention's, adapted): qkv's bf16 attention error
against an fp64 reference must stay within 2 x the error of PyTorch 1.13's own bf16 CPU
computation of the same attention against the same reference, + 1e-3. For each case this script
builds the inputs exactly as the C++ test does (splitmix64 of a counter, the top 24 bits as a
uniform float in [-1, 1), queries x 3, then rounded to bfloat16 — so both sides hold the same
bf16 values), computes

    fp64:  softmax(q·kᵀ / sqrt(D) + mask) · v                  (numpy, float64, from the bf16 values)
    bf16:  torch.softmax(q @ kᵀ / sqrt(D) + mask, -1) @ v      (PyTorch, bfloat16 throughout: no
                                                                 upcast, 2 threads)

(mask: −inf above the diagonal when causal; −inf on the padded keys, the last `pad` of them) and
writes bf16_attention/torch_errors.json: per case max |bf16 − fp64| over the output. Run with
Debian's python3-torch:  /usr/bin/python3 tests/numerics/make_bf16_attention.py

The backward (BACKWARD_CASES, test Bf16AttentionBackward): the same inputs for case index
50 + i, dO = uniform(base + 4), and per case max |bf16 − fp64| of PyTorch 1.13's autograd gradients
dq, dk, dv (bfloat16 throughout, as above) against the fp64 gradients from the same bf16 values
(dV = Pᵀ dO, dS = P ∘ (dO Vᵀ − rowsum(dO ∘ O)), dQ = dS K / sqrt(D), dK = dSᵀ Q / sqrt(D)),
written to bf16_attention/torch_backward_errors.json with each gradient's max |fp64|.

f16: PyTorch 1.13 has no f16 matmul or softmax on the CPU ("addmm_impl_cpu_" not implemented for
'Half'), so the framework's f16 error is PyTorch's CUDA semantics emulated in NumPy from the same
inputs rounded to float16: each matmul accumulates in f32 and rounds its result to f16 (cuBLAS's
f16 GEMM), the scaled scores and the mask are f16 additions, the softmax runs in f32 on the f16
scores and rounds its result to f16 (PyTorch's half softmax kernel) — written per case as
framework_f16_max_abs_error.
"""

import json
import os

import numpy as np
import torch

from make_long_rows import uniform  # the same counter hash as the C++ tests

# (name, N, D, heads, causal, padded keys). Keep in step with kCases in test_bf16_attention.cpp.
CASES = [
    ("N128_D64", 128, 64, 2, False, 0),
    ("N257_D32_causal", 257, 32, 2, True, 0),
    ("N512_D64_causal", 512, 64, 2, True, 0),
    ("N1000_D128_padded", 1000, 128, 2, False, 100),
    ("N2048_D64", 2048, 64, 2, False, 0),
    ("N333_D40_causal_padded", 333, 40, 2, True, 33),
]

# (name, N, D, heads, causal, padded keys). Keep in step with kBackwardCases in test_bf16_attention.cpp.
BACKWARD_CASES = [
    ("N128_D64", 128, 64, 2, False, 0),
    ("N257_D32_causal", 257, 32, 2, True, 0),
    ("N512_D128_padded", 512, 128, 2, False, 64),
    ("N333_D40_causal_padded", 333, 40, 2, True, 33),
]


def inputs(case_index, N, D, H):
    base = 20 * (case_index + 1)
    bf = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # round to nearest even, as qkv
    q = bf(uniform(H * N * D, base + 1).reshape(1, H, N, D) * np.float32(3.0))
    k = bf(uniform(H * N * D, base + 2).reshape(1, H, N, D))
    v = bf(uniform(H * N * D, base + 3).reshape(1, H, N, D))
    return q, k, v


def inputs_f16(case_index, N, D, H):
    """The same uniform values as inputs(), rounded to float16 (nearest even, as qkv)."""
    base = 20 * (case_index + 1)
    q = (uniform(H * N * D, base + 1).reshape(1, H, N, D) * np.float32(3.0)).astype(np.float16)
    k = uniform(H * N * D, base + 2).reshape(1, H, N, D).astype(np.float16)
    v = uniform(H * N * D, base + 3).reshape(1, H, N, D).astype(np.float16)
    return q, k, v


def f16_reference(case_index, N, D, H, mask):
    """fp64 from the f16 values."""
    q, k, v = (t.astype(np.float64) for t in inputs_f16(case_index, N, D, H))
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    return (p @ v) / p.sum(-1, keepdims=True)


def f16_attention(case_index, N, D, H, mask):
    """A framework's f16 attention (see the module's docstring): f16 values between the ops."""
    q, k, v = inputs_f16(case_index, N, D, H)
    f32 = np.float32
    s = (q.astype(f32) @ np.swapaxes(k, -1, -2).astype(f32)).astype(np.float16)  # matmul: f32 sums, f16 out
    s = (s / np.float16(np.sqrt(D))).astype(np.float16) + mask.astype(np.float16)
    s32 = s.astype(f32)
    e = np.exp(s32 - s32.max(-1, keepdims=True))
    p = (e / e.sum(-1, keepdims=True)).astype(np.float16)  # softmax: f32 inside, f16 out
    return (p.astype(f32) @ v.astype(f32)).astype(np.float16)


def mask_of(N, causal, pad):
    mask = np.zeros((N, N))
    if causal:
        mask[np.triu_indices(N, 1)] = -np.inf
    if pad:
        mask[:, N - pad:] = -np.inf
    return mask


def backward_errors():
    out = {}
    for i, (name, N, D, H, causal, pad) in enumerate(BACKWARD_CASES):
        q, k, v = inputs(50 + i, N, D, H)
        grad_out = torch.from_numpy(uniform(H * N * D, 20 * (50 + i + 1) + 4).reshape(1, H, N, D)).to(torch.bfloat16)
        mask = mask_of(N, causal, pad)
        q64, k64, v64, do64 = (t.to(torch.float64).numpy() for t in (q, k, v, grad_out))
        s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(D) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        o = p @ v64
        dv = np.swapaxes(p, -1, -2) @ do64
        ds = p * (do64 @ np.swapaxes(v64, -1, -2) - (do64 * o).sum(-1, keepdims=True))
        ref = {"dq": ds @ k64 / np.sqrt(D), "dk": np.swapaxes(ds, -1, -2) @ q64 / np.sqrt(D), "dv": dv}
        leaves = [t.clone().requires_grad_() for t in (q, k, v)]
        m = torch.from_numpy(mask).to(torch.bfloat16)
        y = torch.softmax(leaves[0] @ leaves[1].transpose(-1, -2) / (D ** 0.5) + m, -1) @ leaves[2]
        y.backward(grad_out)
        case = {"N": N, "D": D, "heads": H, "causal": causal, "pad": pad}
        for name_, leaf in zip(("dq", "dk", "dv"), leaves):
            case[f"torch_bf16_max_abs_error_{name_}"] = float(np.abs(leaf.grad.to(torch.float64).numpy() - ref[name_]).max())
            case[f"max_abs_{name_}"] = float(np.abs(ref[name_]).max())
        out[name] = case
        print(name, case)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bf16_attention", "torch_backward_errors.json")
    with open(path, "w") as f:
        json.dump({"generator": "tests/numerics/make_bf16_attention.py", "torch": torch.__version__, "cases": out},
                  f, indent=1)
        f.write("\n")


def main():
    torch.set_num_threads(2)
    backward_errors()
    out = {}
    for i, (name, N, D, H, causal, pad) in enumerate(CASES):
        q, k, v = inputs(i, N, D, H)
        mask = np.zeros((N, N))
        if causal:
            mask[np.triu_indices(N, 1)] = -np.inf
        if pad:
            mask[:, N - pad:] = -np.inf
        q64, k64, v64 = (t.to(torch.float64).numpy() for t in (q, k, v))
        s = q64 @ np.swapaxes(k64, -1, -2) / np.sqrt(D) + mask
        p = np.exp(s - s.max(-1, keepdims=True))
        ref = (p @ v64) / p.sum(-1, keepdims=True)
        m = torch.from_numpy(mask).to(torch.bfloat16)
        o = torch.softmax(q @ k.transpose(-1, -2) / (D ** 0.5) + m, -1) @ v
        err = float(np.abs(o.to(torch.float64).numpy() - ref).max())
        err16 = float(np.abs(f16_attention(i, N, D, H, mask).astype(np.float64) - f16_reference(i, N, D, H, mask)).max())
        out[name] = {"N": N, "D": D, "heads": H, "causal": causal, "pad": pad, "torch_bf16_max_abs_error": err,
                     "framework_f16_max_abs_error": err16, "max_abs_output": float(np.abs(ref).max())}
        print(name, err, err16)
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bf16_attention", "torch_errors.json")
    with open(path, "w") as f:
        json.dump({"generator": "tests/numerics/make_bf16_attention.py", "torch": torch.__version__, "cases": out},
                  f, indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
