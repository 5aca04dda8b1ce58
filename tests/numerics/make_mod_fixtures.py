#!/usr/bin/python3
"""Reference outputs for qkv's score and mask modifications (`qkv run sdpa --window / --softcap /
--alibi-slopes / --q-doc-ids / --kv-doc-ids / --prefix-len / --align`), computed by PyTorch from
explicit [B, H, L, S] biases and masks (PyTorch 1.13 has no FlexAttention).

    /usr/bin/python3 tests/numerics/make_mod_fixtures.py [--check]

Also `qkv run mha --window / --alibi-slopes` cases ("command": "mha" in config.json): an
nn.MultiheadAttention given the same modifications as an explicit float attn_mask [B*H, L, S].

Writes tests/numerics/mod_fixtures/<case>/: the inputs (.npy), expected_out_f64.npy,
expected_weights_f64.npy, expected_lse_f64.npy (torch.logsumexp of the modified scores: -inf for
a row no key survives) and config.json {"args": the qkv flags, "tol_out", "tol_weights", "tol_lse"}.
The tolerance rule is make_fixtures.py's: max(4 * |torch fp32 - torch fp64|, 2e-6 * max(1, max|ref|)).
Deterministic: fixed seeds, one thread. --check regenerates into a temporary directory and
compares with the committed files.
"""

import argparse
import filecmp
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_fixtures import write_safetensors  # noqa: E402  (the dependency-free writer)

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "mod_fixtures")
TOL_FACTOR, TOL_FLOOR = 4.0, 2e-6


def reference(q, k, v, dt, *, softcap=None, slopes=None, bias=None, window=None, q_doc=None, kv_doc=None,
              prefix_len=None, key_keep=None, causal=False, bottom_right=False):
    """The pinned semantics (docs/semantics.md, "Score and mask modifications"), written out:
    scale -> softcap -> ALiBi -> bias -> masks -> softmax (empty rows give 0) -> P @ V; also the
    rows' log-sum-exp of the modified scores."""
    q, k, v = (x.to(dt) for x in (q, k, v))
    B, H, L, D = q.shape
    S = k.shape[2]
    g = H // k.shape[1]  # GQA: query head h reads key/value head h // g
    k = k.repeat_interleave(g, dim=1)
    v = v.repeat_interleave(g, dim=1)
    s = (q @ k.transpose(-1, -2)) * D ** -0.5
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    i = torch.arange(L, dtype=dt)[:, None] + (S - L if bottom_right else 0)  # aligned query position
    j = torch.arange(S, dtype=dt)[None, :]
    if slopes is not None:
        sl = slopes.to(dt)
        sl = sl[None, :, None, None] if sl.dim() == 1 else sl[:, :, None, None]
        s = s - sl * (i - j).abs()
    if bias is not None:
        s = s + bias.to(dt)
    keep = torch.ones(B, H, L, S, dtype=torch.bool)
    if window is not None:
        left, right = window
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
    if q_doc is not None:
        keep &= (q_doc[:, None, :, None] == kv_doc[:, None, None, :])
    if prefix_len is not None:
        keep &= (j < prefix_len) | (j <= i)
    if key_keep is not None:
        keep &= key_keep[:, None, None, :]
    if causal:
        keep &= j <= i
    s = s.masked_fill(~keep, float("-inf"))
    m = s.amax(-1, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    e = torch.exp(s - m)
    tot = e.sum(-1, keepdim=True)
    p = torch.where(tot > 0, e / tot, torch.zeros_like(e))
    return p @ v, p, torch.logsumexp(s, -1)


CASES = {
    # name: (B, H, Hkv, L, S, D, options)
    "window_gqa_bottom_right": (2, 4, 2, 37, 53, 32, dict(window=(9, 3), bottom_right=True)),
    "alibi_per_batch_causal": (2, 3, 3, 29, 29, 64, dict(slopes="bh", causal=True)),
    "softcap_key_padding": (2, 2, 2, 33, 33, 80, dict(softcap=5.0, key_keep=True)),
    "documents_and_window": (2, 2, 1, 45, 45, 32, dict(docs=True, window=(16, -1))),
    "prefix_lm": (1, 2, 2, 31, 31, 128, dict(prefix_len=7)),
    "everything_gqa_top_left": (2, 4, 2, 40, 57, 64,
                                dict(window=(20, 5), softcap=3.0, slopes="h", docs=True, bias=True)),
}


def make_case(out_dir, name, B, H, Hkv, L, S, D, o):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    rnd = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float32)
    q, k, v = rnd(B, H, L, D), rnd(B, Hkv, S, D), rnd(B, Hkv, S, D)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    save = lambda f, x: np.save(os.path.join(d, f), x.numpy() if torch.is_tensor(x) else x)
    save("q.npy", q), save("k.npy", k), save("v.npy", v)
    args = ["--query", "q.npy", "--key", "k.npy", "--value", "v.npy"]
    kw = {}
    bottom_right = o.get("bottom_right", False)
    if L != S or "window" in o or "slopes" in o or "prefix_len" in o:
        args += ["--align", "bottom-right" if bottom_right else "top-left"]
        kw["bottom_right"] = bottom_right
    if "window" in o:
        kw["window"] = o["window"]
        args += ["--window", "%d,%d" % o["window"]]
    if "softcap" in o:
        kw["softcap"] = o["softcap"]
        args += ["--softcap", repr(o["softcap"])]
    if "slopes" in o:
        shape = (H,) if o["slopes"] == "h" else (B, H)
        slopes = (2.0 ** -(1 + torch.rand(*shape, generator=gen) * 7)).to(torch.float32)
        kw["slopes"] = slopes
        save("slopes.npy", slopes)
        args += ["--alibi-slopes", "slopes.npy"]
    if o.get("bias"):
        bias = rnd(B, H, L, S)
        kw["bias"] = bias
        save("bias.npy", bias)
        args += ["--attn-bias", "bias.npy"]
    if o.get("docs"):
        q_doc = torch.sort(torch.randint(0, 4, (B, L), generator=gen), dim=1).values
        kv_doc = torch.sort(torch.randint(0, 4, (B, S), generator=gen), dim=1).values
        kw["q_doc"], kw["kv_doc"] = q_doc, kv_doc
        save("q_doc.npy", q_doc.to(torch.int32)), save("kv_doc.npy", kv_doc.to(torch.int64))
        args += ["--q-doc-ids", "q_doc.npy", "--kv-doc-ids", "kv_doc.npy"]
    if "prefix_len" in o:
        kw["prefix_len"] = o["prefix_len"]
        args += ["--prefix-len", str(o["prefix_len"])]
    if o.get("key_keep"):
        keep = torch.ones(B, S, dtype=torch.bool)
        keep[0, S // 2:] = False  # batch 0 keeps the first half of its keys
        kw["key_keep"] = keep
        save("key_padding_mask.npy", (~keep).numpy())  # PyTorch's convention: true = ignore
        args += ["--key-padding-mask", "key_padding_mask.npy"]
    if o.get("causal"):
        kw["causal"] = True
        args += ["--causal"]
    out64, w64, lse64 = reference(q, k, v, torch.float64, **kw)
    out32, w32, lse32 = reference(q, k, v, torch.float32, **kw)

    def tol(ref, f32):
        finite = torch.isfinite(ref)  # -inf rows must match exactly (the test checks that)
        assert torch.equal(finite, torch.isfinite(f32))
        diff = (f32.double() - ref)[finite].abs().max().item() if finite.any() else 0.0
        big = ref[finite].abs().max().item() if finite.any() else 0.0
        return max(TOL_FACTOR * diff, TOL_FLOOR * max(1.0, big))

    save("expected_out_f64.npy", out64), save("expected_weights_f64.npy", w64), save("expected_lse_f64.npy", lse64)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"args": args, "tol_out": tol(out64, out32), "tol_weights": tol(w64, w32),
                   "tol_lse": tol(lse64, lse32)}, f, indent=1)
        f.write("\n")


MHA_CASES = {
    # name: (E, H, B, L, S, window, slopes "h" | "bh", bottom_right); windows keep the diagonal
    # (PyTorch gives NaN for a row no key survives)
    "mha_window_alibi_self": (32, 4, 2, 23, 23, (5, 0), "h", False),
    "mha_window_alibi_cross_bottom_right": (24, 3, 2, 17, 29, (6, 2), "bh", True),
}


def make_mha_case(out_dir, name, E, H, B, L, S, window, slopes_kind, bottom_right):
    gen = torch.Generator().manual_seed(sum(map(ord, name)))
    torch.manual_seed(sum(map(ord, name)))
    mha = torch.nn.MultiheadAttention(E, H, batch_first=True).eval()
    with torch.no_grad():
        for p in mha.parameters():  # non-zero biases, so every parameter matters
            p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
    x = torch.randn(B, L, E, generator=gen)
    mem = x if L == S else torch.randn(B, S, E, generator=gen)
    shape = (H,) if slopes_kind == "h" else (B, H)
    slopes = (2.0 ** -(1 + torch.rand(*shape, generator=gen) * 7)).to(torch.float32)
    d = os.path.join(out_dir, name)
    os.makedirs(d, exist_ok=True)
    save = lambda f, a: np.save(os.path.join(d, f), a.numpy() if torch.is_tensor(a) else a)
    write_safetensors(os.path.join(d, "weights.safetensors"), list(mha.state_dict().items()))
    save("query.npy", x), save("slopes.npy", slopes)
    args = ["--weights", "weights.safetensors", "--query", "query.npy", "--heads", str(H),
            "--window", "%d,%d" % window, "--alibi-slopes", "slopes.npy"]
    if L != S:
        save("memory.npy", mem)
        args += ["--key", "memory.npy", "--value", "memory.npy"]
    if L != S or bottom_right:
        args += ["--align", "bottom-right" if bottom_right else "top-left"]

    def run(dt):
        m = torch.nn.MultiheadAttention(E, H, batch_first=True).eval().to(dt)
        m.load_state_dict({k: v.to(dt) for k, v in mha.state_dict().items()})
        i = torch.arange(L, dtype=dt)[:, None] + (S - L if bottom_right else 0)
        j = torch.arange(S, dtype=dt)[None, :]
        sl = slopes.to(dt)
        sl = sl[None, :, None, None] if sl.dim() == 1 else sl[:, :, None, None]
        bias = (-sl * (i - j).abs()).expand(B, H, L, S).clone()
        left, right = window
        keep = torch.ones(L, S, dtype=torch.bool)
        if left >= 0:
            keep &= j >= i - left
        if right >= 0:
            keep &= j <= i + right
        bias = bias.masked_fill(~keep, float("-inf")).reshape(B * H, L, S)
        with torch.no_grad():
            out, _ = m(x.to(dt), mem.to(dt), mem.to(dt), attn_mask=bias, need_weights=True)
        return out

    out64, out32 = run(torch.float64), run(torch.float32)
    tol = max(TOL_FACTOR * (out32.double() - out64).abs().max().item(),
              TOL_FLOOR * max(1.0, out64.abs().max().item()))
    save("expected_out_f64.npy", out64)
    with open(os.path.join(d, "config.json"), "w") as f:
        json.dump({"command": "mha", "args": args, "tol_out": tol}, f, indent=1)
        f.write("\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    out = tempfile.mkdtemp() if a.check else DEFAULT_OUT
    for name, (B, H, Hkv, L, S, D, o) in CASES.items():
        make_case(out, name, B, H, Hkv, L, S, D, o)
    for name, c in MHA_CASES.items():
        make_mha_case(out, name, *c)
    if a.check:
        cmp = filecmp.dircmp(out, DEFAULT_OUT)
        bad = [(n, c.diff_files + c.left_only + c.right_only) for n, c in cmp.subdirs.items()
               if c.diff_files or c.left_only or c.right_only]
        shutil.rmtree(out)
        if bad or cmp.left_only or cmp.right_only:
            print("differs:", bad, cmp.left_only, cmp.right_only)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
