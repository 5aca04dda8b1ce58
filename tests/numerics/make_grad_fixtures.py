#!/usr/bin/python3
"""PyTorch 1.13 autograd gradients of the attention fixtures, for `qkv grad` (tests/e2e).

    /usr/bin/python3 tests/numerics/make_grad_fixtures.py [--check]

For each case below the module of tests/numerics/fixtures/<case> (its committed state dict and
inputs) runs forward in fp32 and, from the same values, in fp64; with a random output gradient
dO (seeded), torch.autograd.grad gives the gradients of L = sum(out * dO) by every float input and
parameter. Written to tests/numerics/grad_fixtures/<case>/:

  grad_output.npy      dO, the output's shape (f32)
  d<name>.npy          the fp64 gradient of each float input (query, key, value, src, attn_bias,
                       alibi_slopes) and parameter (the state dict's names), as `qkv grad` names them
  case.json            {"tol": {name: tolerance}}: max(4 * |fp32 - fp64|, 2e-6 * max(1, max|ref|)),
                       the rule of make_fixtures.py, per tensor

Cases: key_padding and causal (self-attention), cross_kdim_vdim (separate projections, kdim/vdim),
add_bias_kv (its bias_k / bias_v rows), encoder_relu_post_padding and encoder_gelu_pre
(nn.TransformerEncoderLayer), and sdpa_bias_alibi: scaled dot-product attention [2, 2, 4, 8] x
[2, 2, 6, 8] with a float bias [L, S] and ALiBi slopes [H] (score − slope·|i − j|), whose gradients
(of the bias and of the slopes) are the captured tensors' — written in PyTorch by hand.
Deterministic: --check regenerates into a temporary directory and compares with the committed files.
"""

import json
import os

import numpy as np
import torch

from make_llama_fixtures import run_generator, TOL_FACTOR, TOL_FLOOR, write_json

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURES = os.path.join(HERE, "fixtures")
DEFAULT_OUT = os.path.join(HERE, "grad_fixtures")


def read_safetensors(path):
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
        data = f.read()
    out = {}
    for name, h in header.items():
        if name == "__metadata__":
            continue
        a, b = h["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(data[a:b], dtype="<f4").copy().reshape(h["shape"]))
    return out


def load(case, name):
    return torch.from_numpy(np.load(os.path.join(FIXTURES, case, name + ".npy")))


def gradients(build, floats, others, d_out_shape_of, gen):
    """build(dtype) -> (module or None, call(tensors) -> out); floats: {name: tensor} to
    differentiate; returns dO and {name: (g32, g64)} over the floats and the module's parameters."""
    runs = {}
    for dt in (torch.float32, torch.float64):
        module, call = build(dt)
        xs = {k: v.detach().to(dt).clone().requires_grad_(True) for k, v in floats.items()}
        params = dict(module.named_parameters()) if module is not None else {}
        runs[dt] = (call(xs, others), xs, params)
    d_out = torch.randn(d_out_shape_of(runs[torch.float32][0]), generator=gen)
    grads = {}
    for dt, (out, xs, params) in runs.items():
        names = list(xs) + list(params)
        values = list(xs.values()) + list(params.values())
        for name, g in zip(names, torch.autograd.grad((out * d_out.to(dt)).sum(), values)):
            grads.setdefault(name, {})[dt] = g.detach()
    return d_out, {k: (v[torch.float32], v[torch.float64]) for k, v in grads.items()}


def mha_case(case):
    c = json.load(open(os.path.join(FIXTURES, case, "config.json")))
    state = read_safetensors(os.path.join(FIXTURES, case, "weights.safetensors"))
    q = load(case, "query")
    k = q if c["self_attention"] else load(case, "key")
    v = q if c["self_attention"] else load(case, "value")
    kpm = load(case, "key_padding_mask") if "key_padding_mask" in c["inputs"] else None
    am = load(case, "attn_mask") if "attn_mask" in c["inputs"] else None

    def build(dt):
        m = torch.nn.MultiheadAttention(c["embed_dim"], c["num_heads"], bias=c["bias"], add_bias_kv=c["add_bias_kv"],
                                        add_zero_attn=c["add_zero_attn"], kdim=c["kdim"], vdim=c["vdim"],
                                        batch_first=True)
        m.load_state_dict(state)
        m = m.to(dt).eval()

        def call(xs, _):
            key = xs["query"] if c["self_attention"] else xs["key"]
            value = xs["query"] if c["self_attention"] else xs["value"]
            return m(xs["query"], key, value, key_padding_mask=kpm, attn_mask=am, need_weights=False)[0]
        return m, call

    floats = {"query": q} if c["self_attention"] else {"query": q, "key": k, "value": v}
    return build, floats


def encoder_case(case):
    c = json.load(open(os.path.join(FIXTURES, case, "config.json")))
    state = read_safetensors(os.path.join(FIXTURES, case, "weights.safetensors"))
    kpm = load(case, "src_key_padding_mask") if "src_key_padding_mask" in c["inputs"] else None

    def build(dt):
        m = torch.nn.TransformerEncoderLayer(c["embed_dim"], c["num_heads"], c["dim_feedforward"], dropout=0.0,
                                             activation=c["activation"], layer_norm_eps=c["layer_norm_eps"],
                                             batch_first=True, norm_first=c["norm_first"])
        m.load_state_dict(state)
        m = m.to(dt).eval()
        return m, lambda xs, _: m(xs["src"], src_key_padding_mask=kpm)
    return build, {"src": load(case, "src")}


def sdpa_case(gen):
    B, H, L, S, D = 2, 2, 4, 6, 8
    q, k, v = (torch.randn(B, H, n, D, generator=gen) for n in (L, S, S))
    bias = torch.randn(L, S, generator=gen) * 0.5
    slopes = torch.rand(H, generator=gen) * 0.5 + 0.1

    def build(dt):
        def call(xs, _):
            i = torch.arange(L, dtype=dt)[:, None]
            j = torch.arange(S, dtype=dt)[None, :]
            s = xs["query"] @ xs["key"].transpose(-1, -2) / D ** 0.5
            s = s - xs["alibi_slopes"][None, :, None, None] * (i - j).abs() + xs["attn_bias"]
            return torch.softmax(s, dim=-1) @ xs["value"]
        return None, call
    return build, {"query": q, "key": k, "value": v, "attn_bias": bias, "alibi_slopes": slopes}


CASES = ["key_padding", "causal", "cross_kdim_vdim", "add_bias_kv", "encoder_relu_post_padding", "encoder_gelu_pre",
         "sdpa_bias_alibi"]


def make(root, case, k):
    gen = torch.Generator().manual_seed(4000 + k)
    if case == "sdpa_bias_alibi":
        build, floats = sdpa_case(gen)
    elif case.startswith("encoder"):
        build, floats = encoder_case(case)
    else:
        build, floats = mha_case(case)
    d_out, grads = gradients(build, floats, None, lambda out: out.shape, gen)
    d = os.path.join(root, case)
    os.makedirs(d, exist_ok=True)
    np.save(os.path.join(d, "grad_output.npy"), d_out.numpy(), allow_pickle=False)
    if case == "sdpa_bias_alibi":
        for name, x in floats.items():
            np.save(os.path.join(d, name + ".npy"), x.numpy(), allow_pickle=False)
    tol = {}
    for name, (g32, g64) in grads.items():
        if name in ("bias_k", "bias_v"):  # qkv's rows are [1, E], PyTorch's [1, 1, E]
            g32, g64 = g32.reshape(1, -1), g64.reshape(1, -1)
        np.save(os.path.join(d, "d" + name + ".npy"), g64.numpy(), allow_pickle=False)
        tol[name] = max(TOL_FACTOR * float((g32.double() - g64).abs().max()), TOL_FLOOR * max(1.0, float(g64.abs().max())))
    write_json(os.path.join(d, "case.json"), {"tol": tol})
    print(f"{case}: {len(grads)} gradients, largest tol {max(tol.values()):.3g}")


def main():
    run_generator(DEFAULT_OUT, CASES, lambda root, case: make(root, case, CASES.index(case)), "gradient")


if __name__ == "__main__":
    main()
