#!/usr/bin/python3
"""PyTorch CPU baselines for bench/bench_attention.cpp, same shapes, 2 threads.

Run with Debian's interpreter (it has python3-torch): /usr/bin/python3 bench/pytorch_attention.py
(`... pytorch_attention.py mods`: the score / mask modifications of BM_Mod, dense masks;
`... pytorch_attention.py bf16`: bf16 attention beside BM_FusedBf16 and the linear layer of bench_gemm;
`... pytorch_attention.py backward [N ...]`: forward + backward by autograd, fp32 and bf16, beside
bench_attention_backward's BM_FusedForwardBackward, counting 3.5 × the forward's FLOPs).
Prints one line per shape: median milliseconds and GFLOP/s (4*B*H*N^2*D, half for causal),
for PyTorch's matmul-softmax-matmul attention, and nn.MultiheadAttention at E=512, H=8.
"""
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(2)
torch.manual_seed(0)


def median_ms(fn, repeat):
    fn()  # warm-up
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def attention(q, k, v, causal):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    if causal:
        n = s.shape[-1]
        s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def modded_attention(q, k, v, case):
    """The mods of bench_attention's BM_Mod, as PyTorch users write them: dense [L, S] biases
    and masks around matmul-softmax-matmul."""
    n, h = q.shape[-2], q.shape[1]
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    if case == "alibi":
        slopes = torch.exp2(-8.0 * torch.arange(1, h + 1) / h)
        s = s - slopes[:, None, None] * (i - j).abs()
    elif case == "softcap":
        s = 30.0 * torch.tanh(s / 30.0)
    elif case == "window256":
        s = s.masked_fill(~((j <= i) & (j >= i - 256)), float("-inf"))
    elif case == "docs8":
        d = torch.arange(n) * 8 // n
        s = s.masked_fill(d[:, None] != d[None, :], float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def mods():
    b, h, d = 1, 8, 64
    with torch.no_grad():
        for n, case in [(4096, "plain"), (4096, "alibi"), (4096, "softcap"), (4096, "window256"), (8192, "window256"),
                        (8192, "docs8")]:
            q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
            ms = median_ms(lambda: modded_attention(q, k, v, case), 1)
            print(f"pytorch_mods N={n} {case}: {ms:.1f} ms")


def bf16():
    """PyTorch's own bf16 CPU attention (matmul-softmax-matmul in bf16, no upcast) beside BM_FusedBf16,
    and its bf16 / fp32 linear layer at bench_gemm's M = 2048, N = K = 4096."""
    b, h, d = 1, 8, 64
    with torch.no_grad():
        for n in (1024, 2048, 4096):
            q, k, v = (torch.randn(b, h, n, d).to(torch.bfloat16) for _ in range(3))
            for causal in (False, True):
                ms = median_ms(lambda: attention(q, k, v, causal), 3 if n <= 2048 else 1)
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                print(f"pytorch_attention_bf16 N={n} causal={int(causal)}: {ms:.2f} ms, {flops / ms / 1e6:.1f} GFLOP/s")
        m, nn_, kk = 2048, 4096, 4096
        for dtype in (torch.float32, torch.bfloat16):
            x, w, bias = torch.randn(m, kk).to(dtype), torch.randn(nn_, kk).to(dtype), torch.randn(nn_).to(dtype)
            ms = median_ms(lambda: torch.nn.functional.linear(x, w, bias), 3)
            print(f"pytorch_linear {dtype} M={m} N={nn_} K={kk}: {ms:.2f} ms, {2 * m * nn_ * kk / ms / 1e6:.1f} GFLOP/s")


def backward(sizes):
    """PyTorch 1.13's autograd of matmul-softmax-matmul: the forward, then the gradients of q, k and v
    for a given dO (the [B, H, N, N] scores and probabilities kept for the backward, as autograd keeps
    them). FlashAttention's convention: the backward counts 2.5 × the forward's 4·B·H·N²·D, forward +
    backward 3.5 ×, half for causal."""
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        # glibc hands autograd's [B, H, N, N] buffers back to the kernel after each step and faults them
        # in again on the next (on a VM, a trap per page): 3 × slower at N = 1024. PyTorch's best
        # figure keeps them, so the process restarts once with glibc told to keep freed memory.
        env = dict(os.environ, MALLOC_TRIM_THRESHOLD_=str(1 << 40), MALLOC_MMAP_MAX_="0",
                   MALLOC_TOP_PAD_=str(1 << 30))
        os.execve(sys.executable, [sys.executable] + sys.argv, env)
    b, h, d = 1, 8, 64
    for dtype in (torch.float32, torch.bfloat16):
        for n in sizes:
            q, k, v = (torch.randn(b, h, n, d).to(dtype).requires_grad_() for _ in range(3))
            grad_out = torch.randn(b, h, n, d).to(dtype)
            for causal in (False, True):
                def step():
                    q.grad = k.grad = v.grad = None
                    attention(q, k, v, causal).backward(grad_out)
                ms = median_ms(step, 3 if n <= 2048 else 1)
                flops = 3.5 * 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                name = "fp32" if dtype == torch.float32 else "bf16"
                print(f"pytorch_attention_fwd_bwd {name} N={n} causal={int(causal)}: {ms:.1f} ms, "
                      f"{flops / ms / 1e6:.1f} GFLOP/s", flush=True)


def main():
    if sys.argv[1:2] == ["backward"]:
        return backward([int(x) for x in sys.argv[2:]] or [1024, 2048, 4096])
    if sys.argv[1:] == ["mods"]:
        return mods()
    if sys.argv[1:] == ["bf16"]:
        return bf16()
    sizes = [int(x) for x in sys.argv[1:]] or [512, 1024, 2048, 4096]
    b, h, d = 1, 8, 64
    with torch.no_grad():
        for n in sizes:
            q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
            for causal in (False, True):
                ms = median_ms(lambda: attention(q, k, v, causal), 3 if n <= 2048 else 1)
                flops = 4 * b * h * n * n * d * (0.5 if causal else 1.0)
                print(f"pytorch_attention N={n} causal={int(causal)}: {ms:.2f} ms, {flops / ms / 1e6:.1f} GFLOP/s")
        mha = torch.nn.MultiheadAttention(512, 8, batch_first=True).eval()
        x = torch.randn(1, 2048, 512)
        ms = median_ms(lambda: mha(x, x, x, need_weights=False), 3)
        print(f"pytorch_mha E=512 H=8 N=2048: {ms:.2f} ms")


if __name__ == "__main__":
    main()
