#!/usr/bin/python3
"""Tiny Hugging Face decoder checkpoints (llama, qwen2, mistral, gpt2) and their reference logits, for
`qkv run causal-lm` and `qkv generate`.

    /usr/bin/python3 tests/numerics/make_llama_fixtures.py [--check]

PyTorch 1.13 has no Llama module and `transformers` cannot be installed here, so the forward pass
is written out below, line by line after transformers' modeling_llama.py / modeling_qwen2.py /
modeling_mistral.py (eval mode, no cache tricks):

  * RMSNorm: x * rsqrt(mean(x^2, -1) + eps), then weight * that          (LlamaRMSNorm)
  * RoPE: inv_freq = 1 / theta^(arange(0, D, 2) / D) in fp32, Llama 3 rescaling when
    rope_scaling says so (_compute_llama3_parameters); angles = inv_freq x positions; cos/sin of
    cat(angles, angles); q*cos + rotate_half(q)*sin, rotate_half(x) = cat(-x2, x1)
  * attention: q/k/v projections (+ biases: qwen2 q/k/v, llama attention_bias q/k/v/o), GQA by
    repeating each key/value head num_heads / num_kv_heads times (repeat_kv), scores * D^-0.5,
    causal mask, a sliding window W keeping keys i - W < j <= i (mistral: every layer; qwen2:
    layers >= max_window_layers when use_sliding_window), softmax, o_proj
  * MLP: down(silu(gate(x)) * up(x)); decoder layer: x + attn(norm1(x)), then h + mlp(norm2(h))
  * model: embed_tokens -> layers -> norm -> lm_head (embed_tokens.weight when tied)

GPT-2 (model_type gpt2), after modeling_gpt2.py's GPT2LMHeadModel (eval mode, fp32/fp64 eager path):

  * Conv1D: y = x @ W + b, W stored [in, out]
  * block: x + c_proj(attn(ln_1(x))), then h + mlp(ln_2(h)); mlp = c_proj(act(c_fc(x))) with act
    gelu_new 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), the erf gelu, or relu
  * attention: c_attn's output split into q, k, v (each n_embd wide), n_head heads, scores *
    head_dim^-0.5, causal, softmax, heads merged, c_proj
  * model: wte[ids] + wpe[positions] -> blocks -> ln_f -> logits through wte (tied) or lm_head
  * names: the Hub's files have none of save_pretrained's `transformer.` prefix and carry the
    causal-mask buffers h.{i}.attn.bias, which transformers ignores on load

Each case directory under tests/numerics/llama_fixtures/ is a model folder as Hugging Face
writes it (config.json, model.safetensors or shards with model.safetensors.index.json) plus:
  tokens.npy               int64 [1, P + N]: a random prompt of P ids, then N greedy ids
  expected_logits_f64.npy  the logits of the whole sequence [1, P + N, vocab], computed in fp64
  case.json                {"prompt_len": P, "new_tokens": N, "tol_logits": tolerance}
The greedy ids are made by an incremental decode with a KV cache (as generate() does) and
checked against the full forward; the seed of each case is one whose greedy choices have a margin
>= 1e-3 between the best two logits, in fp32 and fp64 alike, so they are robust to rounding.
Tolerance: max(4 * |fp32 - fp64|, 2e-6 * max(1, max|ref|)) over the logits (make_fixtures.py's).
Deterministic: --check regenerates into a temporary directory and compares with the committed files.
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

import numpy as np
import torch

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "llama_fixtures")
TOL_FACTOR, TOL_FLOOR = 4.0, 2e-6
PROMPT, NEW = 10, 16


def write_safetensors(path, tensors):
    """tensors: dict name -> fp32 tensor; the data sorted by name, as make_fixtures.py writes it."""
    header, blobs, offset = {}, [], 0
    for name in sorted(tensors):
        data = tensors[name].detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(tensors[name].shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * ((-len(raw)) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)) + raw + b"".join(blobs))


def write_json(path, obj):
    with open(path, "w", encoding="utf-8") as f:
        f.write(json.dumps(obj, indent=2) + "\n")


# --------------------------------------------------------------------------------------------
# the reference model


def normal_draws(gen):
    """r(*shape, scale): N(0, scale^2) values drawn in fp64 from `gen`, stored as fp32 (every
    generator's random weights)."""
    def r(*shape, scale):
        return torch.randn(*shape, generator=gen, dtype=torch.float64).float() * scale
    return r


def head_dim(c):
    return c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"]


def inv_freq(c):
    """LlamaRotaryEmbedding's inv_freq (fp32), with _compute_llama3_parameters' rescaling."""
    D = head_dim(c)
    inv = 1.0 / (c.get("rope_theta", 10000.0) ** (torch.arange(0, D, 2, dtype=torch.int64).float() / D))
    rs = c.get("rope_scaling")
    if rs and rs.get("rope_type", rs.get("type")) == "llama3":
        factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
        old = rs["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old / low, old / high
        wavelen = 2 * math.pi / inv
        inv_l = torch.where(wavelen > low_wavelen, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * inv_l / factor + smooth * inv_l
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        inv = torch.where(medium, smoothed, inv_l)
    return inv


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def windowed_layers(c):
    n = c["num_hidden_layers"]
    if c["model_type"] == "mistral" and c.get("sliding_window"):
        return [True] * n
    if c["model_type"] == "qwen2" and c.get("use_sliding_window") and c.get("sliding_window"):
        return [i >= c.get("max_window_layers", 28) for i in range(n)]
    return [False] * n


class Reference:
    """The forward pass of a Hugging Face *ForCausalLM in dtype `dt`, with an optional KV cache."""

    def __init__(self, c, w, dt):
        self.c, self.dt = c, dt
        self.w = {k: v.to(dt) for k, v in w.items()}
        self.inv = inv_freq(c)  # fp32, as HF keeps it
        self.windowed = windowed_layers(c)

    def norm(self, x, name):
        x32 = x  # HF upcasts to fp32; here x is already fp32 or fp64
        var = x32.pow(2).mean(-1, keepdim=True)
        return self.w[name] * (x32 * torch.rsqrt(var + self.c["rms_norm_eps"]))

    def linear(self, x, name, bias):
        y = x @ self.w[name + ".weight"].T
        return y + self.w[name + ".bias"] if bias else y

    def cos_sin(self, pos):
        freqs = (self.inv[None, :, None].float() @ pos[:, None, :].float()).transpose(1, 2)  # fp32, as HF
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos().to(self.dt), emb.sin().to(self.dt)

    def forward(self, tokens, start=0, cache=None):
        """tokens [B, L] at positions start .. start+L-1; cache: per-layer [k, v] lists, extended."""
        c = self.c
        B, L = tokens.shape
        H, Hkv, D = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), head_dim(c)
        qkv_bias = c["model_type"] == "qwen2" or (c["model_type"] == "llama" and c.get("attention_bias", False))
        o_bias = c["model_type"] == "llama" and c.get("attention_bias", False)
        pos = torch.arange(start, start + L)[None, :].expand(B, L)
        cos, sin = self.cos_sin(pos)
        cos, sin = cos[:, None], sin[:, None]
        x = self.w["model.embed_tokens.weight"][tokens]
        for i in range(c["num_hidden_layers"]):
            p = f"model.layers.{i}."
            h = self.norm(x, p + "input_layernorm.weight")
            q = self.linear(h, p + "self_attn.q_proj", qkv_bias).view(B, L, H, D).transpose(1, 2)
            k = self.linear(h, p + "self_attn.k_proj", qkv_bias).view(B, L, Hkv, D).transpose(1, 2)
            v = self.linear(h, p + "self_attn.v_proj", qkv_bias).view(B, L, Hkv, D).transpose(1, 2)
            q = q * cos + rotate_half(q) * sin
            k = k * cos + rotate_half(k) * sin
            if cache is not None:
                if len(cache) <= i:
                    cache.append([k[:, :, :0], v[:, :, :0]])
                cache[i][0] = torch.cat((cache[i][0], k), dim=2)
                cache[i][1] = torch.cat((cache[i][1], v), dim=2)
                k, v = cache[i]
            S = k.shape[2]
            k = k.repeat_interleave(H // Hkv, dim=1)  # repeat_kv
            v = v.repeat_interleave(H // Hkv, dim=1)
            s = (q @ k.transpose(-1, -2)) * D ** -0.5
            qi = torch.arange(S - L, S)[:, None]  # the queries are the last L positions of the keys
            kj = torch.arange(S)[None, :]
            keep = kj <= qi
            if self.windowed[i]:
                keep = keep & (kj > qi - c["sliding_window"])
            s = s.masked_fill(~keep, float("-inf"))
            a = torch.softmax(s, dim=-1) @ v
            a = a.transpose(1, 2).reshape(B, L, H * D)
            x = x + self.linear(a, p + "self_attn.o_proj", o_bias)
            h = self.norm(x, p + "post_attention_layernorm.weight")
            gate = self.linear(h, p + "mlp.gate_proj", False)
            up = self.linear(h, p + "mlp.up_proj", False)
            x = x + self.linear(torch.nn.functional.silu(gate) * up, p + "mlp.down_proj", False)
        x = self.norm(x, "model.norm.weight")
        head = "model.embed_tokens.weight" if c.get("tie_word_embeddings") else "lm_head.weight"
        return x @ self.w[head].T


def random_weights(c, gen):
    E, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]
    H, Hkv, D = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"]), head_dim(c)
    qkv_bias = c["model_type"] == "qwen2" or (c["model_type"] == "llama" and c.get("attention_bias", False))
    o_bias = c["model_type"] == "llama" and c.get("attention_bias", False)

    r = normal_draws(gen)

    w = {"model.embed_tokens.weight": r(V, E, scale=1.0), "model.norm.weight": 1 + r(E, scale=0.1)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = 1 + r(E, scale=0.1)
        w[p + "post_attention_layernorm.weight"] = 1 + r(E, scale=0.1)
        for name, out, inp in (("q_proj", H * D, E), ("k_proj", Hkv * D, E), ("v_proj", Hkv * D, E),
                               ("o_proj", E, H * D)):
            w[p + "self_attn." + name + ".weight"] = r(out, inp, scale=inp ** -0.5)
            if (qkv_bias and name != "o_proj") or (o_bias and name == "o_proj"):
                w[p + "self_attn." + name + ".bias"] = r(out, scale=0.1)
        w[p + "mlp.gate_proj.weight"] = r(I, E, scale=E ** -0.5)
        w[p + "mlp.up_proj.weight"] = r(I, E, scale=E ** -0.5)
        w[p + "mlp.down_proj.weight"] = r(E, I, scale=I ** -0.5)
    if not c.get("tie_word_embeddings"):
        w["lm_head.weight"] = r(V, E, scale=E ** -0.5)
    return w


class Gpt2Reference:
    """GPT2LMHeadModel's forward pass in dtype `dt`, with an optional KV cache (as Reference)."""

    def __init__(self, c, w, dt):
        self.c, self.dt = c, dt
        self.w = {k: v.to(dt) for k, v in w.items()}
        self.act = {"gelu_new": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3))),
                    "gelu": torch.nn.functional.gelu, "relu": torch.relu}[c.get("activation_function", "gelu_new")]

    def ln(self, x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"],
                                              self.c.get("layer_norm_epsilon", 1e-5))

    def conv1d(self, x, name):
        return x @ self.w[name + ".weight"] + self.w[name + ".bias"]

    def forward(self, tokens, start=0, cache=None):
        c = self.c
        B, L = tokens.shape
        E, H = c["n_embd"], c["n_head"]
        D = E // H
        pos = torch.arange(start, start + L)[None, :].expand(B, L)
        x = self.w["wte.weight"][tokens] + self.w["wpe.weight"][pos]
        for i in range(c["n_layer"]):
            p = f"h.{i}."
            q, k, v = self.conv1d(self.ln(x, p + "ln_1"), p + "attn.c_attn").split(E, dim=-1)
            q, k, v = (t.view(B, L, H, D).transpose(1, 2) for t in (q, k, v))
            if cache is not None:
                if len(cache) <= i:
                    cache.append([k[:, :, :0], v[:, :, :0]])
                cache[i][0] = torch.cat((cache[i][0], k), dim=2)
                cache[i][1] = torch.cat((cache[i][1], v), dim=2)
                k, v = cache[i]
            S = k.shape[2]
            s = (q @ k.transpose(-1, -2)) / (D ** 0.5)
            keep = torch.arange(S)[None, :] <= torch.arange(S - L, S)[:, None]
            s = s.masked_fill(~keep, float("-inf"))
            a = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, L, E)
            x = x + self.conv1d(a, p + "attn.c_proj")
            x = x + self.conv1d(self.act(self.conv1d(self.ln(x, p + "ln_2"), p + "mlp.c_fc")), p + "mlp.c_proj")
        x = self.ln(x, "ln_f")
        head = "wte.weight" if c.get("tie_word_embeddings", True) else "lm_head.weight"
        return x @ self.w[head].T


def random_gpt2_weights(c, gen):
    E, V, P = c["n_embd"], c["vocab_size"], c["n_positions"]
    I = c.get("n_inner") or 4 * E

    r = normal_draws(gen)

    w = {"wte.weight": r(V, E, scale=1.0), "wpe.weight": r(P, E, scale=0.5)}
    for name in ["ln_f"] + [f"h.{i}.ln_{k}" for i in range(c["n_layer"]) for k in (1, 2)]:
        w[name + ".weight"] = 1 + r(E, scale=0.1)
        w[name + ".bias"] = r(E, scale=0.1)
    for i in range(c["n_layer"]):
        p = f"h.{i}."
        for name, inp, out in (("attn.c_attn", E, 3 * E), ("attn.c_proj", E, E), ("mlp.c_fc", E, I),
                               ("mlp.c_proj", I, E)):
            w[p + name + ".weight"] = r(inp, out, scale=inp ** -0.5)
            w[p + name + ".bias"] = r(out, scale=0.1)
    if not c.get("tie_word_embeddings", True):
        w["lm_head.weight"] = r(V, E, scale=E ** -0.5)
    return w


def stored_gpt2(c, w, layout):
    """The names as a checkpoint holds them: the Hub's (causal-mask buffers beside) or
    save_pretrained's (`transformer.` before all but lm_head)."""
    if layout == "hub":
        out = dict(w)
        P = c["n_positions"]
        for i in range(c["n_layer"]):
            out[f"h.{i}.attn.bias"] = torch.tril(torch.ones(P, P)).view(1, 1, P, P)
        return out
    return {(k if k == "lm_head.weight" else "transformer." + k): v for k, v in w.items()}


def greedy(ref, prompt, new):
    """generate(): a prefill, then one token at a time against the cache; returns the ids and the
    smallest margin between the best two logits of every choice."""
    cache, ids, margin = [], prompt.clone(), float("inf")
    logits = ref.forward(prompt, 0, cache)[:, -1]
    for t in range(new):
        top = torch.topk(logits, 2, dim=-1).values
        margin = min(margin, float((top[:, 0] - top[:, 1]).min()))
        nxt = logits.argmax(-1, keepdim=True)
        ids = torch.cat((ids, nxt), dim=1)
        if t + 1 < new:
            logits = ref.forward(nxt, ids.shape[1] - 1, cache)[:, -1]
    return ids, margin


CASES = {
    # Llama 3 style: rope_scaling llama3 (with a small original context so every band is used),
    # attention_bias on q/k/v/o, GQA 4/2, untied lm_head, one file.
    "llama": dict(
        config={"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
                "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 2, "vocab_size": 128, "max_position_embeddings": 64,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "attention_bias": True, "hidden_act": "silu",
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                 "high_freq_factor": 4.0, "original_max_position_embeddings": 16},
                "tie_word_embeddings": False, "torch_dtype": "float32"},
        shards=1),
    # Qwen2: q/k/v biases, tied embeddings, a sliding window on the layers from max_window_layers
    # on, theta 1e6, GQA 6/2; two shards with an index.
    "qwen2": dict(
        config={"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_size": 48,
                "intermediate_size": 96, "num_hidden_layers": 3, "num_attention_heads": 6,
                "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 64,
                "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "use_sliding_window": True, "sliding_window": 5,
                "max_window_layers": 2, "hidden_act": "silu", "tie_word_embeddings": True,
                "torch_dtype": "float32"},
        shards=2),
    # Mistral: a sliding window on every layer, MQA (one key/value head), head_dim != hidden / heads.
    "mistral": dict(
        config={"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 32,
                "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                "num_key_value_heads": 1, "head_dim": 12, "vocab_size": 80, "max_position_embeddings": 64,
                "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "sliding_window": 6, "hidden_act": "silu",
                "tie_word_embeddings": False, "torch_dtype": "float32"},
        shards=1),
    # GPT-2 as the Hub stores it: no prefix, causal-mask buffers, n_inner null (4 x n_embd),
    # gelu_new, the head tied to wte.
    "gpt2": dict(
        config={"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 32, "n_layer": 2, "n_head": 4,
                "n_inner": None, "n_positions": 40, "vocab_size": 96, "activation_function": "gelu_new",
                "layer_norm_epsilon": 1e-5, "scale_attn_weights": True, "torch_dtype": "float32"},
        shards=1, layout="hub"),
    # GPT-2 as save_pretrained writes it: `transformer.` names in two shards, n_inner set, the
    # erf gelu, an untied lm_head, head_dim 12.
    "gpt2_saved": dict(
        config={"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 24, "n_layer": 3, "n_head": 2,
                "n_inner": 40, "n_positions": 32, "vocab_size": 70, "activation_function": "gelu",
                "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False, "torch_dtype": "float32"},
        shards=2, layout="saved"),
}


def make_case(root, name, spec):
    c = spec["config"]
    gpt2 = c["model_type"] == "gpt2"
    Reference_ = Gpt2Reference if gpt2 else Reference
    for seed in range(100):
        gen = torch.Generator().manual_seed(1000 + seed)
        w = random_gpt2_weights(c, gen) if gpt2 else random_weights(c, gen)
        prompt = torch.randint(0, c["vocab_size"], (1, PROMPT), generator=gen)
        ids64, m64 = greedy(Reference_(c, w, torch.float64), prompt, NEW)
        ids32, m32 = greedy(Reference_(c, w, torch.float32), prompt, NEW)
        if torch.equal(ids64, ids32) and min(m64, m32) >= 1e-3:
            break
    else:
        raise SystemExit(f"{name}: no seed with robust greedy choices")
    full64 = Reference_(c, w, torch.float64).forward(ids64)
    full32 = Reference_(c, w, torch.float32).forward(ids64)
    # The cache gives the full forward's logits (a self-check of the reference).
    cache, ref = [], Reference_(c, w, torch.float64)
    steps = [ref.forward(ids64[:, :PROMPT], 0, cache)]
    for t in range(PROMPT, ids64.shape[1]):
        steps.append(ref.forward(ids64[:, t:t + 1], t, cache))
    assert torch.allclose(torch.cat(steps, dim=1), full64, atol=1e-10), name
    err = float((full32.double() - full64).abs().max())
    tol = max(TOL_FACTOR * err, TOL_FLOOR * max(1.0, float(full64.abs().max())))

    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "config.json"), c)
    if gpt2:
        w = stored_gpt2(c, w, spec["layout"])
    names = sorted(w)
    if spec["shards"] == 1:
        write_safetensors(os.path.join(d, "model.safetensors"), w)
    else:
        n = spec["shards"]
        parts = [names[k::n] for k in range(n)]
        weight_map = {}
        for k, part in enumerate(parts):
            f = f"model-{k + 1:05d}-of-{n:05d}.safetensors"
            write_safetensors(os.path.join(d, f), {x: w[x] for x in part})
            weight_map.update({x: f for x in part})
        total = sum(w[x].numel() * 4 for x in names)
        write_json(os.path.join(d, "model.safetensors.index.json"),
                   {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))})
    np.save(os.path.join(d, "tokens.npy"), ids64.numpy().astype(np.int64), allow_pickle=False)
    np.save(os.path.join(d, "expected_logits_f64.npy"), full64.numpy(), allow_pickle=False)
    write_json(os.path.join(d, "case.json"), {"prompt_len": PROMPT, "new_tokens": NEW, "tol_logits": tol,
                                              "seed": 1000 + seed, "greedy_margin": min(m64, m32)})
    print(f"{name}: seed {1000 + seed}, fp32 error {err:.3g}, tol {tol:.3g}, margin {min(m64, m32):.3g}")


def differing_files(a, b):
    """Every file under a and b (recursively) that one lacks or whose bytes differ."""
    cmp = filecmp.dircmp(a, b)
    bad = cmp.left_only + cmp.right_only + cmp.diff_files
    bad += [f for f in cmp.common_files if not filecmp.cmp(os.path.join(a, f), os.path.join(b, f), shallow=False)]
    for sub in cmp.common_dirs:
        bad += [os.path.join(sub, f) for f in differing_files(os.path.join(a, sub), os.path.join(b, sub))]
    return sorted(set(bad))


def run_generator(default_out, names, make, what):
    """A fixture generator's command line: `make(root, name)` for each name into default_out, or
    with --check into a temporary directory, compared byte for byte with the committed files."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    out = tempfile.mkdtemp() if a.check else default_out
    for name in names:
        make(out, name)
    if a.check:
        bad = [f"{name}/{f}" for name in names
               for f in differing_files(os.path.join(out, name), os.path.join(default_out, name))]
        shutil.rmtree(out)
        if bad:
            print("differs:", ", ".join(bad))
            sys.exit(1)
        print(f"the committed {what} fixtures are reproduced")


def main():
    run_generator(DEFAULT_OUT, list(CASES), lambda root, name: make_case(root, name, CASES[name]), "llama")


if __name__ == "__main__":
    main()
