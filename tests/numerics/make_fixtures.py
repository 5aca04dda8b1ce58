#!/usr/bin/python3
"""Generate the PyTorch conformance fixtures for qkv's reference interpreter.

    /usr/bin/python3 tests/numerics/make_fixtures.py [--out DIR] [--check]

Needs torch (Debian's python3-torch 1.13 is what the committed fixtures were made with) and
numpy; nothing else (safetensors files are written by hand). Writes one directory per case under
tests/numerics/fixtures/<case>/ (see tests/numerics/README.md for the layout and the tolerance
rule). The output is deterministic: fixed seeds, one torch thread, and files whose bytes depend
only on the computed values, so re-running reproduces the committed files byte for byte.

--check  generate into a temporary directory and compare with the committed fixtures (exit 1 on
         any difference) instead of overwriting them.
"""

import argparse
import filecmp
import json
import math
import os
import shutil
import struct
import sys
import tempfile
from contextlib import contextmanager

import numpy as np
import torch
import torch.nn.functional as F

torch.set_num_threads(1)
torch.set_num_interop_threads(1)

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "fixtures")

# Tolerance rule (also written into every config.json as tol_out / tol_weights):
#   tol = max(TOL_FACTOR * torch_fp32_err, TOL_FLOOR * max(1, max|expected_f64|))
# where torch_fp32_err = max |torch fp32 - torch fp64| over the same tensor.
TOL_FACTOR = 4.0
TOL_FLOOR = 2e-6


# --------------------------------------------------------------------------------------------
# file writers


def write_safetensors(path, tensors, metadata=None):
    """tensors: list of (name, torch.Tensor fp32). Data laid out sorted by name (all F32)."""
    items = sorted(((n, t.detach().to(torch.float32).contiguous().cpu().numpy()) for n, t in tensors),
                   key=lambda x: x[0])
    header = {}
    blobs = []
    offset = 0
    for name, arr in items:
        data = arr.astype("<f4", copy=False).tobytes(order="C")
        header[name] = {"dtype": "F32", "shape": list(arr.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    hjson = json.dumps(header, separators=(",", ":")).encode("utf-8")
    hjson += b" " * ((-len(hjson)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(hjson)))
        f.write(hjson)
        for b in blobs:
            f.write(b)


def read_safetensors(path):
    """Minimal reader used to self-check what write_safetensors produced."""
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    assert n % 8 == 0
    header = json.loads(raw[8:8 + n].decode("utf-8"))
    data = raw[8 + n:]
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32"
        b, en = e["data_offsets"]
        out[name] = np.frombuffer(data[b:en], dtype="<f4").reshape(e["shape"])
    return out


def save_npy(path, arr):
    arr = np.ascontiguousarray(arr)
    assert arr.dtype in (np.float32, np.float64, np.bool_), arr.dtype
    np.save(path, arr, allow_pickle=False)


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2, allow_nan=False) + "\n")


# --------------------------------------------------------------------------------------------
# helpers


@contextmanager
def forbid_fast_paths():
    """Make sure neither nn.MultiheadAttention's nor nn.TransformerEncoderLayer's fused "fast
    path" runs: calling one raises. (The modules look these up on `torch` at call time.)"""
    names = ["_native_multi_head_attention", "_transformer_encoder_layer_fwd"]
    saved = {n: getattr(torch, n) for n in names}

    def boom(*args, **kwargs):
        raise RuntimeError("a PyTorch fast path was taken while generating fixtures")

    try:
        for n in names:
            setattr(torch, n, boom)
        yield
    finally:
        for n, f in saved.items():
            setattr(torch, n, f)


def regular_path(fn):
    """Run fn on PyTorch's regular (non-fused) path.

    In torch 1.13 both nn.MultiheadAttention (even with need_weights=True) and
    nn.TransformerEncoderLayer take a fused fast path in eval mode when autograd is off. Running
    with grad enabled (the parameters require grad) disqualifies both; forbid_fast_paths()
    asserts it. Results are detached; eval mode + dropout 0 make this a pure inference pass."""
    with torch.enable_grad(), forbid_fast_paths():
        res = fn()
    if isinstance(res, tuple):
        return tuple(r.detach() if r is not None else None for r in res)
    return res.detach()


def maxabs(a, b):
    a = a.detach().double() if isinstance(a, torch.Tensor) else torch.as_tensor(a, dtype=torch.float64)
    b = b.detach().double() if isinstance(b, torch.Tensor) else torch.as_tensor(b, dtype=torch.float64)
    if a.numel() == 0:
        return 0.0
    return float((a - b).abs().max())


def tol_for(err32, ref64):
    ref_mag = float(ref64.abs().max()) if ref64.numel() else 0.0
    return max(TOL_FACTOR * err32, TOL_FLOOR * max(1.0, ref_mag))


def perturb_constant_init(module, scale=0.2):
    """PyTorch initialises in_proj_bias, out_proj.bias to 0 and LayerNorm weight/bias to 1/0.
    Constant parameters would let bias or gamma/beta mix-ups pass unnoticed, so every parameter
    that is constant after init gets a random offset: p += scale * randn (in state_dict order,
    from the case's global torch seed). Returns the names of the parameters changed."""
    changed = []
    with torch.no_grad():
        for n, p in module.named_parameters():
            if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
                p.add_(scale * torch.randn_like(p))
                changed.append(n)
    return changed


def lengths_to_kpm(lengths, S):
    """key_padding_mask [B, S], True = padding (ignored key), PyTorch's convention."""
    idx = torch.arange(S)
    return torch.stack([idx >= n for n in lengths])


def to64(x):
    if x is None:
        return None
    return x.double() if x.is_floating_point() else x


def as_np(x):
    x = x.detach().cpu()
    if x.dtype == torch.bool:
        return x.numpy().astype(np.bool_)
    return x.numpy()


def hand_mha(mha, q_in, k_in, v_in, kpm=None, attn_mask=None, zero_masked_rows=True):
    """Multi-head attention by hand (batch_first, no bias_k / zero_attn), following the order of
    torch's F.multi_head_attention_forward: project, scale q by 1/sqrt(d), q@k^T (+ mask),
    softmax, @v, merge heads, out_proj. With zero_masked_rows, a query row that has no visible
    key gets all-zero weights (hence a zero attention output before out_proj) instead of NaN.
    Returns (out [B, L, E], weights [B, H, L, S])."""
    E, H = mha.embed_dim, mha.num_heads
    d = E // H
    if mha._qkv_same_embed_dim:
        wq, wk, wv = mha.in_proj_weight.chunk(3)
    else:
        wq, wk, wv = mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight
    if mha.in_proj_bias is not None:
        bq, bk, bv = mha.in_proj_bias.chunk(3)
    else:
        bq = bk = bv = None
    B, L, _ = q_in.shape
    S = k_in.shape[1]
    q = F.linear(q_in, wq, bq).view(B, L, H, d).transpose(1, 2)  # [B, H, L, d]
    k = F.linear(k_in, wk, bk).view(B, S, H, d).transpose(1, 2)  # [B, H, S, d]
    v = F.linear(v_in, wv, bv).view(B, S, H, d).transpose(1, 2)
    scores = (q / math.sqrt(d)) @ k.transpose(-2, -1)  # [B, H, L, S]
    blocked = torch.zeros(B, H, L, S, dtype=torch.bool)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            am = attn_mask if attn_mask.dim() == 2 else attn_mask.view(B, H, L, S)
            blocked = blocked | am
        else:
            am = attn_mask if attn_mask.dim() == 2 else attn_mask.view(B, H, L, S)
            scores = scores + am
    if kpm is not None:
        blocked = blocked | kpm.view(B, 1, 1, S)
    scores = scores.masked_fill(blocked, float("-inf"))
    w = torch.softmax(scores, dim=-1)
    if zero_masked_rows:
        dead = torch.isneginf(scores).all(dim=-1, keepdim=True)
        w = torch.where(dead, torch.zeros_like(w), w)
    o = (w @ v).transpose(1, 2).reshape(B, L, E)
    out = F.linear(o, mha.out_proj.weight, mha.out_proj.bias)
    return out, w


# --------------------------------------------------------------------------------------------
# cases


def base_config(name, module, description, seed):
    return {
        "name": name,
        "module": module,
        "description": description,
        "seed": seed,
        "torch_version": torch.__version__,
    }


def mha_case(name, description, seed, *, E, H, B, L, S, kdim=None, vdim=None, bias=True,
             add_bias_kv=False, add_zero_attn=False, self_attention=True, kpm_lengths=None,
             attn_mask_fn=None, causal=False, in_proj_scale=1.0, tutorial_check=False,
             fully_masked_semantics=False):
    torch.manual_seed(seed)
    kdim = E if kdim is None else kdim
    vdim = E if vdim is None else vdim
    mha = nn_mha = torch.nn.MultiheadAttention(
        E, H, dropout=0.0, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
        kdim=kdim, vdim=vdim, batch_first=True)
    mha.eval()
    perturbed = perturb_constant_init(mha)
    if in_proj_scale != 1.0:
        with torch.no_grad():
            if mha._qkv_same_embed_dim:
                mha.in_proj_weight.mul_(in_proj_scale)
            else:
                for p in (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight):
                    p.mul_(in_proj_scale)

    query = torch.randn(B, L, E)
    if self_attention:
        assert kdim == E and vdim == E and S == L
        key = value = query
    else:
        key = torch.randn(B, S, kdim)
        value = torch.randn(B, S, vdim)
    kpm = lengths_to_kpm(kpm_lengths, S) if kpm_lengths is not None else None
    attn_mask = attn_mask_fn(B, H, L, S) if attn_mask_fn is not None else None

    extra = int(add_bias_kv) + int(add_zero_attn)
    S_total = S + extra

    def run(m, q, k, v, km, am):
        return regular_path(lambda: m(q, k, v, key_padding_mask=km, need_weights=True,
                                      attn_mask=am, average_attn_weights=False))

    mha64 = torch.nn.MultiheadAttention(
        E, H, dropout=0.0, bias=bias, add_bias_kv=add_bias_kv, add_zero_attn=add_zero_attn,
        kdim=kdim, vdim=vdim, batch_first=True)
    mha64.load_state_dict(mha.state_dict())
    mha64 = mha64.double().eval()
    q64 = query.double()
    k64 = q64 if self_attention else key.double()
    v64 = q64 if self_attention else value.double()
    am64 = to64(attn_mask)

    out32, w32 = run(mha, query, key, value, kpm, attn_mask)
    out64, w64 = run(mha64, q64, k64, v64, kpm, am64)
    assert out32.shape == (B, L, E) and w32.shape == (B, H, L, S_total), (out32.shape, w32.shape)
    assert out32.dtype == torch.float32 and out64.dtype == torch.float64

    cfg = base_config(name, "mha", description, seed)
    cfg.update({
        "embed_dim": E, "num_heads": H, "head_dim": E // H, "kdim": kdim, "vdim": vdim,
        "bias": bias, "add_bias_kv": add_bias_kv, "add_zero_attn": add_zero_attn,
        "batch_first": True, "batch": B, "L": L, "S": S, "S_weights": S_total,
        "self_attention": self_attention, "causal": causal,
        "in_proj_weight_scale": in_proj_scale, "perturbed_constant_init_params": perturbed,
    })

    with torch.no_grad():
        if not (add_bias_kv or add_zero_attn or fully_masked_semantics):
            # Cross-check the documented conventions (mask layouts, head order) by hand.
            h32, hw32 = hand_mha(mha, query, key, value, kpm, attn_mask, zero_masked_rows=False)
            assert maxabs(h32, out32) < 1e-5 and maxabs(hw32, w32) < 1e-5, name
        if fully_masked_semantics:
            # PyTorch gives NaN for a query row whose keys are all masked; qkv pins zeros.
            h32, hw32 = hand_mha(mha, query, key, value, kpm, attn_mask)
            h64, hw64 = hand_mha(mha64, q64, k64, v64, kpm, am64)
            dead = torch.isnan(w32).all(dim=-1)  # [B, H, L] rows torch could not normalise
            dead_rows = dead.any(dim=1)  # [B, L]
            assert dead_rows.any(), "the case should contain a fully masked row"
            live = ~dead_rows
            cfg["max_abs_diff_hand_vs_torch"] = maxabs(h32[live], out32[live])
            cfg["max_abs_diff_hand_vs_torch_weights"] = maxabs(hw32[~dead], w32[~dead])
            assert cfg["max_abs_diff_hand_vs_torch"] < 1e-5, cfg["max_abs_diff_hand_vs_torch"]
            assert cfg["max_abs_diff_hand_vs_torch_weights"] < 1e-5
            # pinned: dead rows have zero weights and out = out_proj.bias
            assert bool((hw32[dead] == 0).all()) and bool((hw64[dead] == 0).all())
            bias_row = mha.out_proj.bias if mha.out_proj.bias is not None else torch.zeros(E)
            assert bool((h32[dead_rows] == bias_row).all())
            cfg["pinned_semantics"] = "fully masked rows -> 0"
            cfg["fully_masked_query_rows"] = [[b, l] for b, l in dead_rows.nonzero().tolist()]
            cfg["torch_nan_rows_replaced"] = True
            out32, w32, out64, w64 = h32, hw32, h64, hw64
        if tutorial_check:
            # The tutorials' single-head attention written out by hand, same weights.
            assert H == 1
            Wq, Wk, Wv = mha.in_proj_weight.chunk(3)
            bq, bk, bv = mha.in_proj_bias.chunk(3)
            Q = query @ Wq.T + bq
            K = key @ Wk.T + bk
            V = value @ Wv.T + bv
            d_k = Q.shape[-1]
            scores = Q @ K.transpose(-2, -1) / math.sqrt(d_k)  # [B, L, S]
            if kpm is not None:
                scores = scores.masked_fill(kpm[:, None, :], float("-inf"))
            P = torch.softmax(scores, dim=-1)
            hand = (P @ V) @ mha.out_proj.weight.T + mha.out_proj.bias
            cfg["max_abs_diff_hand_vs_torch"] = maxabs(hand, out32)
            cfg["max_abs_diff_hand_vs_torch_weights"] = maxabs(P, w32[:, 0])
            assert cfg["max_abs_diff_hand_vs_torch"] < 1e-5

    for t in (out32, out64, w32, w64):
        assert not torch.isnan(t).any(), f"{name}: NaN in expected output"

    err_out = maxabs(out32, out64)
    err_w = maxabs(w32, w64)
    cfg["torch_fp32_err_out"] = err_out
    cfg["torch_fp32_err_weights"] = err_w
    cfg["tol_out"] = tol_for(err_out, out64)
    cfg["tol_weights"] = tol_for(err_w, w64)

    # Informational: what the fused fast path (taken by plain eval + no_grad calls) gives.
    cfg["torch_fastpath_vs_regular_out"] = None
    if not fully_masked_semantics:
        with torch.no_grad():
            try:
                with forbid_fast_paths():
                    mha(query, key, value, key_padding_mask=kpm, need_weights=True,
                        attn_mask=attn_mask, average_attn_weights=False)
            except RuntimeError:  # the fast path would be taken: measure the difference
                try:
                    fo, _ = mha(query, key, value, key_padding_mask=kpm, need_weights=True,
                                attn_mask=attn_mask, average_attn_weights=False)
                    cfg["torch_fastpath_vs_regular_out"] = maxabs(fo, out32)
                except (TypeError, RuntimeError) as e:  # torch 1.13: bias=False crashes there
                    cfg["torch_fastpath_error"] = f"{type(e).__name__}: {e}"

    inputs = {"query": query}
    if not self_attention:
        inputs["key"] = key
        inputs["value"] = value
    else:
        inputs["key"] = query
        inputs["value"] = query
    if kpm is not None:
        inputs["key_padding_mask"] = kpm
    if attn_mask is not None:
        inputs["attn_mask"] = attn_mask
    cfg["inputs"] = list(inputs)
    cfg["key_padding_lengths"] = list(kpm_lengths) if kpm_lengths is not None else None
    if attn_mask is not None:
        cfg["attn_mask_dtype"] = "bool" if attn_mask.dtype == torch.bool else "float32"
        cfg["attn_mask_shape"] = list(attn_mask.shape)
    else:
        cfg["attn_mask_dtype"] = None
        cfg["attn_mask_shape"] = None
    state = list(nn_mha.state_dict().items())
    cfg["state_dict_keys"] = [k for k, _ in state]
    cfg["outputs"] = ["expected_out_f32", "expected_out_f64", "expected_weights_f32", "expected_weights_f64"]
    arrays = dict(inputs)
    arrays.update({"expected_out_f32": out32, "expected_out_f64": out64,
                   "expected_weights_f32": w32, "expected_weights_f64": w64})
    return cfg, state, arrays


def encoder_case(name, description, seed, *, activation, norm_first, kpm_lengths=None,
                 E=32, H=4, FF=64, B=2, L=5, eps=1e-5):
    torch.manual_seed(seed)
    layer = torch.nn.TransformerEncoderLayer(
        d_model=E, nhead=H, dim_feedforward=FF, dropout=0.0, activation=activation,
        layer_norm_eps=eps, batch_first=True, norm_first=norm_first)
    layer.eval()
    perturbed = perturb_constant_init(layer)
    src = torch.randn(B, L, E)
    kpm = lengths_to_kpm(kpm_lengths, L) if kpm_lengths is not None else None

    layer64 = torch.nn.TransformerEncoderLayer(
        d_model=E, nhead=H, dim_feedforward=FF, dropout=0.0, activation=activation,
        layer_norm_eps=eps, batch_first=True, norm_first=norm_first)
    layer64.load_state_dict(layer.state_dict())
    layer64 = layer64.double().eval()

    out32 = regular_path(lambda: layer(src, src_mask=None, src_key_padding_mask=kpm))
    out64 = regular_path(lambda: layer64(src.double(), src_mask=None, src_key_padding_mask=kpm))
    assert out32.shape == (B, L, E)

    # Cross-check the regular path against forward()'s own composition of the blocks.
    with torch.no_grad(), forbid_fast_paths():
        def by_blocks(m, x):
            # _sa_block calls self_attn(need_weights=False), which would itself take the MHA fast
            # path under no_grad; use grad mode for it as well.
            def sa(y):
                return regular_path(lambda: m._sa_block(y, None, kpm))
            if norm_first:
                x = x + sa(m.norm1(x))
                x = x + m._ff_block(m.norm2(x))
            else:
                x = m.norm1(x + sa(x))
                x = m.norm2(x + m._ff_block(x))
            return x
        blocks32 = by_blocks(layer, src)
    assert maxabs(blocks32, out32) == 0.0, maxabs(blocks32, out32)

    for t in (out32, out64):
        assert not torch.isnan(t).any()

    cfg = base_config(name, "encoder_layer", description, seed)
    err_out = maxabs(out32, out64)
    cfg.update({
        "embed_dim": E, "num_heads": H, "head_dim": E // H, "kdim": E, "vdim": E,
        "bias": True, "add_bias_kv": False, "add_zero_attn": False, "batch_first": True,
        "batch": B, "L": L, "S": L, "causal": False,
        "activation": activation, "norm_first": norm_first, "dim_feedforward": FF,
        "layer_norm_eps": eps, "dropout": 0.0, "in_proj_weight_scale": 1.0,
        "perturbed_constant_init_params": perturbed,
        "torch_fp32_err_out": err_out, "torch_fp32_err_weights": None,
        "tol_out": tol_for(err_out, out64), "tol_weights": None,
    })
    with torch.no_grad():
        fo = layer(src, src_key_padding_mask=kpm)  # fast path (eligible for all three cases)
    cfg["torch_fastpath_vs_regular_out"] = maxabs(fo, out32)
    if kpm is not None:
        padded = kpm
        cfg["torch_fastpath_padded_rows_all_zero"] = bool((fo[padded] == 0).all())
    inputs = {"src": src}
    if kpm is not None:
        inputs["src_key_padding_mask"] = kpm
    cfg["inputs"] = list(inputs)
    cfg["key_padding_lengths"] = list(kpm_lengths) if kpm_lengths is not None else None
    cfg["attn_mask_dtype"] = None
    cfg["attn_mask_shape"] = None
    state = list(layer.state_dict().items())
    cfg["state_dict_keys"] = [k for k, _ in state]
    cfg["outputs"] = ["expected_out_f32", "expected_out_f64"]
    arrays = dict(inputs)
    arrays.update({"expected_out_f32": out32, "expected_out_f64": out64})
    return cfg, state, arrays


# masks -----------------------------------------------------------------------------------------


def causal_mask(B, H, L, S):
    return torch.triu(torch.ones(L, S), diagonal=1).bool()


def float_mask(B, H, L, S):
    g = torch.Generator().manual_seed(505)
    m = torch.rand(L, S, generator=g) * 4.0 - 2.0
    # a few -inf, never a whole row
    for i, j in [(0, 4), (1, 0), (1, 2), (3, 3), (4, 1)]:
        m[i, j] = float("-inf")
    assert not torch.isneginf(m).all(dim=-1).any()
    return m


def mask_3d(B, H, L, S):
    g = torch.Generator().manual_seed(606)
    m = torch.rand(B * H, L, S, generator=g) < 0.4  # True = not allowed
    for n in range(B * H):
        for i in range(L):
            if bool(m[n, i].all()):
                m[n, i, int(torch.randint(S, (1,), generator=g))] = False
    assert not m.all(dim=-1).any()
    return m


def fully_masked_mask(B, H, L, S):
    m = torch.zeros(L, S, dtype=torch.bool)
    m[0, 3] = True          # row 0: last key hidden
    m[1, :] = True          # row 1: every key hidden
    m[2, 0] = True          # row 2: first key hidden
    m[2, 2] = True
    return m                # row 3: everything visible


CASES = [
    lambda: mha_case(
        "seed_tutorial",
        "Single-head self-attention as in the attention tutorials: E=16, 1 head, batch 2, L=S=4, "
        "key_padding_mask lengths 3 and 4 (row 0 ignores its last key). Also stores the max abs "
        "difference between the tutorial's by-hand formula and nn.MultiheadAttention.",
        101, E=16, H=1, B=2, L=4, S=4, kpm_lengths=[3, 4], tutorial_check=True),
    lambda: mha_case(
        "e512_h8",
        "Self-attention E=512, 8 heads (head_dim 64), batch 1, L=S=6, no mask.",
        102, E=512, H=8, B=1, L=6, S=6),
    lambda: mha_case(
        "causal",
        "Self-attention E=32, 4 heads, batch 2, L=S=5, bool attn_mask [L, S] = "
        "torch.triu(ones, 1) (True above the diagonal = not allowed). in_proj_weight scaled by 2.",
        103, E=32, H=4, B=2, L=5, S=5, attn_mask_fn=causal_mask, causal=True, in_proj_scale=2.0),
    lambda: mha_case(
        "key_padding",
        "Self-attention E=32, 4 heads, batch 3, L=S=6, key_padding_mask lengths 6, 4, 1. "
        "in_proj_weight scaled by 2.",
        104, E=32, H=4, B=3, L=6, S=6, kpm_lengths=[6, 4, 1], in_proj_scale=2.0),
    lambda: mha_case(
        "float_mask",
        "Self-attention E=32, 4 heads, batch 2, L=S=5, float32 attn_mask [L, S] added to the "
        "scores: uniform in [-2, 2] with five -inf entries (no row fully -inf).",
        105, E=32, H=4, B=2, L=5, S=5, attn_mask_fn=float_mask),
    lambda: mha_case(
        "mask_3d",
        "Self-attention E=32, 4 heads, batch 2, L=S=5, random bool attn_mask [B*H, L, S] "
        "(index b*H + h; True = not allowed; every row keeps at least one key).",
        106, E=32, H=4, B=2, L=5, S=5, attn_mask_fn=mask_3d),
    lambda: mha_case(
        "cross_kdim_vdim",
        "Cross-attention E=32, 4 heads, batch 2, L=3, S=7, kdim=20, vdim=12 (separate "
        "q_proj_weight / k_proj_weight / v_proj_weight), key_padding_mask lengths 7 and 5.",
        107, E=32, H=4, B=2, L=3, S=7, kdim=20, vdim=12, self_attention=False, kpm_lengths=[7, 5]),
    lambda: mha_case(
        "no_bias",
        "Self-attention E=32, 4 heads, bias=False (no in_proj_bias, no out_proj.bias), "
        "batch 2, L=S=5, no mask.",
        108, E=32, H=4, B=2, L=5, S=5, bias=False),
    lambda: mha_case(
        "add_bias_kv",
        "Self-attention E=32, 4 heads, add_bias_kv=True (bias_k / bias_v appended as one extra "
        "key/value after projection, so S' = S+1), batch 2, L=S=5, key_padding_mask lengths 5 and 3 "
        "given at [B, S]; PyTorch pads it with a False (visible) column for the extra key.",
        109, E=32, H=4, B=2, L=5, S=5, add_bias_kv=True, kpm_lengths=[5, 3]),
    lambda: mha_case(
        "add_zero_attn",
        "Self-attention E=32, 4 heads, add_zero_attn=True (a zero key/value appended after "
        "projection, S' = S+1), batch 2, L=S=5, key_padding_mask lengths 5 and 3 given at [B, S]; "
        "PyTorch pads it with a False (visible) column for the zero key.",
        110, E=32, H=4, B=2, L=5, S=5, add_zero_attn=True, kpm_lengths=[5, 3]),
    lambda: mha_case(
        "cross_bias_kv_zero_attn",
        "Cross-attention E=32, 4 heads, batch 2, L=3, S=6, kdim=20, vdim=12 (separate projection "
        "weights) with add_bias_kv=True and add_zero_attn=True (two keys/values appended after the "
        "projections, S' = S+2), key_padding_mask lengths 6 and 4 given at [B, S].",
        112, E=32, H=4, B=2, L=3, S=6, kdim=20, vdim=12, self_attention=False, add_bias_kv=True,
        add_zero_attn=True, kpm_lengths=[6, 4]),
    lambda: mha_case(
        "fully_masked_rows",
        "Self-attention E=32, 4 heads, batch 2, L=S=4, bool attn_mask [L, S] where query row 1 "
        "sees no key. Expected values follow qkv's pinned semantics (a row with no visible key has "
        "zero weights and zero attention output, so its output row equals out_proj.bias), computed "
        "by hand in torch; PyTorch 1.13 itself gives NaN there. The other rows match "
        "nn.MultiheadAttention.",
        111, E=32, H=4, B=2, L=4, S=4, attn_mask_fn=fully_masked_mask, fully_masked_semantics=True),
    lambda: encoder_case(
        "encoder_relu_post",
        "nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0, relu, "
        "post-norm), batch 2, L=5, no mask. Regular (non-fused) path.",
        201, activation="relu", norm_first=False),
    lambda: encoder_case(
        "encoder_gelu_pre",
        "nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0, gelu "
        "(exact erf), pre-norm), batch 2, L=5, no mask. Regular (non-fused) path.",
        202, activation="gelu", norm_first=True),
    lambda: encoder_case(
        "encoder_relu_post_padding",
        "nn.TransformerEncoderLayer(d_model=32, nhead=4, dim_feedforward=64, dropout=0, relu, "
        "post-norm), batch 2, L=5, src_key_padding_mask lengths 5 and 3. Regular (non-fused) path: "
        "padded positions hold real values (they attend to the unpadded keys), not zeros.",
        203, activation="relu", norm_first=False, kpm_lengths=[5, 3]),
]


# --------------------------------------------------------------------------------------------


def write_case(root, cfg, state, arrays):
    d = os.path.join(root, cfg["name"])
    if os.path.isdir(d):
        shutil.rmtree(d)
    os.makedirs(d)
    write_safetensors(os.path.join(d, "weights.safetensors"), state,
                      {"format": "pt", "case": cfg["name"], "torch_version": torch.__version__})
    back = read_safetensors(os.path.join(d, "weights.safetensors"))
    assert list(back) == sorted(k for k, _ in state)
    for k, t in state:
        assert np.array_equal(back[k], t.detach().float().numpy()), k
    for n, t in arrays.items():
        save_npy(os.path.join(d, n + ".npy"), as_np(t))
    write_json(os.path.join(d, "config.json"), cfg)


def fmt_shape(t):
    return "x".join(str(s) for s in t.shape)


def fmt_err(x):
    return "-" if x is None else f"{x:.2e}"


def generate(root):
    os.makedirs(root, exist_ok=True)
    rows = []
    for make in CASES:
        cfg, state, arrays = make()
        write_case(root, cfg, state, arrays)
        if cfg["module"] == "mha":
            shapes = (f"q {fmt_shape(arrays['query'])} k {fmt_shape(arrays['key'])} "
                      f"v {fmt_shape(arrays['value'])} -> out {fmt_shape(arrays['expected_out_f32'])} "
                      f"w {fmt_shape(arrays['expected_weights_f32'])}")
        else:
            shapes = f"src {fmt_shape(arrays['src'])} -> out {fmt_shape(arrays['expected_out_f32'])}"
        rows.append((cfg["name"], shapes, fmt_err(cfg["torch_fp32_err_out"]),
                     fmt_err(cfg["torch_fp32_err_weights"]), fmt_err(cfg["tol_out"]),
                     fmt_err(cfg["tol_weights"])))
    head = ("case", "shapes", "fp32 err out", "fp32 err w", "tol out", "tol w")
    widths = [max(len(r[i]) for r in rows + [head]) for i in range(len(head))]
    line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
    print(line(head))
    print(line(tuple("-" * w for w in widths)))
    for r in rows:
        print(line(r))


def compare_trees(a, b):
    diffs = []
    for dirpath, _, files in os.walk(a):
        rel = os.path.relpath(dirpath, a)
        for f in files:
            pa, pb = os.path.join(dirpath, f), os.path.join(b, rel, f)
            if not os.path.exists(pb) or not filecmp.cmp(pa, pb, shallow=False):
                diffs.append(os.path.join(rel, f))
    for dirpath, _, files in os.walk(b):
        rel = os.path.relpath(dirpath, b)
        for f in files:
            if not os.path.exists(os.path.join(a, rel, f)):
                diffs.append(os.path.join(rel, f) + " (stale)")
    return diffs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=DEFAULT_OUT, help="output directory (default: %(default)s)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temp dir and compare with --out byte for byte")
    args = ap.parse_args()
    if args.check:
        with tempfile.TemporaryDirectory() as tmp:
            generate(tmp)
            diffs = compare_trees(tmp, args.out)
        if diffs:
            print("fixtures differ from a fresh generation:", *diffs, sep="\n  ")
            return 1
        print(f"fixtures in {args.out} are up to date")
        return 0
    generate(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
