#!/usr/bin/python3
"""Tiny Hugging Face BERT checkpoints and their reference outputs, for `qkv run encoder-model`.

    /usr/bin/python3 tests/numerics/make_bert_fixtures.py [--check]

`transformers` cannot be installed here, so BertModel's forward pass (eval mode: no dropout) is
written out below after transformers' modeling_bert.py:

  * embeddings: LayerNorm(word[ids] + token_type[types] + position[0 .. L-1])
  * self-attention: query/key/value Linear layers, heads of hidden / heads, scores / sqrt(head_dim)
    plus the extended attention mask ((1 - mask) * the dtype's min), softmax, context
  * layer (post-norm): a = LayerNorm(x + dense(context)); out = LayerNorm(a + dense(act(intermediate(a))))
    with act hidden_act: gelu (erf), gelu_new (tanh form) or relu
  * pooler: tanh(dense(hidden[:, 0]))

Each case directory under tests/numerics/bert_fixtures/ is a model folder (config.json,
model.safetensors) plus:
  tokens.npy                 int64 [B, L]
  attention_mask.npy         int64 [B, L] (when the case pads)
  token_type_ids.npy         int64 [B, L] (when the case has segments)
  expected_hidden_f64.npy    the last hidden state [B, L, hidden], computed in fp64
  expected_pooled_f64.npy    the pooled output [B, hidden] (when the checkpoint has a pooler)
  case.json                  {"tol": tolerance}
Tolerance: max(4 * |fp32 - fp64|, 2e-6 * max(1, max|ref|)) over both outputs (as the decoders').
Cases: `bert` as BertModel.save_pretrained writes it (no prefix, a pooler, two sequences, the
second padded, two segments); `bert_mlm` as BertForMaskedLM's (`bert.` names, the legacy LayerNorm
gamma/beta names, the cls.predictions head beside, no pooler, gelu_new).
Deterministic: --check regenerates into a temporary directory and compares with the committed files.
"""

import math
import os

import numpy as np
import torch

from make_llama_fixtures import normal_draws, run_generator, TOL_FACTOR, TOL_FLOOR, write_json, write_safetensors

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "bert_fixtures")


class Reference:
    """BertModel's forward pass in dtype `dt`."""

    def __init__(self, c, w, dt):
        self.c, self.dt = c, dt
        self.w = {k: v.to(dt) for k, v in w.items()}
        self.act = {"gelu": torch.nn.functional.gelu, "relu": torch.relu,
                    "gelu_new": lambda x: 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
                    }[c.get("hidden_act", "gelu")]

    def ln(self, x, name):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], self.w[name + ".weight"], self.w[name + ".bias"],
                                              self.c.get("layer_norm_eps", 1e-12))

    def linear(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def forward(self, ids, mask, types):
        c = self.c
        B, L = ids.shape
        E, H = c["hidden_size"], c["num_attention_heads"]
        D = E // H
        x = self.w["embeddings.word_embeddings.weight"][ids] + self.w["embeddings.token_type_embeddings.weight"][types]
        x = x + self.w["embeddings.position_embeddings.weight"][torch.arange(L)][None]
        x = self.ln(x, "embeddings.LayerNorm")
        extended = (1.0 - mask[:, None, None, :].to(self.dt)) * torch.finfo(self.dt).min
        for i in range(c["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            q, k, v = (self.linear(x, p + "attention.self." + n).view(B, L, H, D).transpose(1, 2)
                       for n in ("query", "key", "value"))
            s = q @ k.transpose(-1, -2) / math.sqrt(D) + extended
            ctx = (torch.softmax(s, dim=-1) @ v).transpose(1, 2).reshape(B, L, E)
            a = self.ln(x + self.linear(ctx, p + "attention.output.dense"), p + "attention.output.LayerNorm")
            h = self.act(self.linear(a, p + "intermediate.dense"))
            x = self.ln(a + self.linear(h, p + "output.dense"), p + "output.LayerNorm")
        pooled = torch.tanh(self.linear(x[:, 0], "pooler.dense")) if "pooler.dense.weight" in self.w else None
        return x, pooled


def random_weights(c, gen, pooler):
    E, I, V = c["hidden_size"], c["intermediate_size"], c["vocab_size"]

    r = normal_draws(gen)

    w = {"embeddings.word_embeddings.weight": r(V, E, scale=1.0),
         "embeddings.position_embeddings.weight": r(c["max_position_embeddings"], E, scale=0.5),
         "embeddings.token_type_embeddings.weight": r(c["type_vocab_size"], E, scale=0.5)}

    def layer_norm(name):
        w[name + ".weight"] = 1 + r(E, scale=0.1)
        w[name + ".bias"] = r(E, scale=0.1)

    def linear(name, inp, out):
        w[name + ".weight"] = r(out, inp, scale=inp ** -0.5)
        w[name + ".bias"] = r(out, scale=0.1)

    layer_norm("embeddings.LayerNorm")
    for i in range(c["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        for n in ("query", "key", "value"):
            linear(p + "attention.self." + n, E, E)
        linear(p + "attention.output.dense", E, E)
        layer_norm(p + "attention.output.LayerNorm")
        linear(p + "intermediate.dense", E, I)
        linear(p + "output.dense", I, E)
        layer_norm(p + "output.LayerNorm")
    if pooler:
        linear("pooler.dense", E, E)
    return w


CASES = {
    "bert": dict(
        config={"architectures": ["BertModel"], "model_type": "bert", "hidden_size": 32, "num_hidden_layers": 2,
                "num_attention_heads": 4, "intermediate_size": 48, "vocab_size": 50, "max_position_embeddings": 24,
                "type_vocab_size": 2, "hidden_act": "gelu", "layer_norm_eps": 1e-12,
                "position_embedding_type": "absolute", "torch_dtype": "float32"},
        batch=2, length=9, pad=3, segments=True, layout="model"),
    "bert_mlm": dict(
        config={"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 24, "num_hidden_layers": 3,
                "num_attention_heads": 2, "intermediate_size": 40, "vocab_size": 40, "max_position_embeddings": 16,
                "type_vocab_size": 2, "hidden_act": "gelu_new", "layer_norm_eps": 1e-5, "torch_dtype": "float32"},
        batch=1, length=7, pad=0, segments=False, layout="mlm"),
}


def stored(c, w, layout, gen):
    """The names as the checkpoint holds them (see the module's docstring)."""
    if layout == "model":
        return dict(w)
    out = {}
    for k, v in w.items():
        if ".LayerNorm." in k:
            k = k.replace(".weight", ".gamma").replace(".bias", ".beta")
        out["bert." + k] = v
    E, V = c["hidden_size"], c["vocab_size"]
    out["cls.predictions.bias"] = torch.zeros(V)
    out["cls.predictions.transform.dense.weight"] = torch.randn(E, E, generator=gen)
    out["cls.predictions.transform.dense.bias"] = torch.zeros(E)
    out["cls.predictions.transform.LayerNorm.gamma"] = torch.ones(E)
    out["cls.predictions.transform.LayerNorm.beta"] = torch.zeros(E)
    return out


def make_case(root, name, spec):
    c = spec["config"]
    gen = torch.Generator().manual_seed(2000)
    w = random_weights(c, gen, pooler=spec["layout"] == "model")
    B, L = spec["batch"], spec["length"]
    ids = torch.randint(0, c["vocab_size"], (B, L), generator=gen)
    mask = torch.ones(B, L, dtype=torch.int64)
    if spec["pad"]:
        mask[-1, L - spec["pad"]:] = 0
    types = torch.zeros(B, L, dtype=torch.int64)
    if spec["segments"]:
        types[:, L // 2:] = 1
    h64, p64 = Reference(c, w, torch.float64).forward(ids, mask, types)
    h32, p32 = Reference(c, w, torch.float32).forward(ids, mask, types)
    err = float((h32.double() - h64).abs().max())
    peak = float(h64.abs().max())
    if p64 is not None:
        err = max(err, float((p32.double() - p64).abs().max()))
        peak = max(peak, float(p64.abs().max()))
    tol = max(TOL_FACTOR * err, TOL_FLOOR * max(1.0, peak))

    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    write_json(os.path.join(d, "config.json"), c)
    write_safetensors(os.path.join(d, "model.safetensors"), stored(c, w, spec["layout"], gen))
    np.save(os.path.join(d, "tokens.npy"), ids.numpy().astype(np.int64), allow_pickle=False)
    if spec["pad"]:
        np.save(os.path.join(d, "attention_mask.npy"), mask.numpy(), allow_pickle=False)
    if spec["segments"]:
        np.save(os.path.join(d, "token_type_ids.npy"), types.numpy(), allow_pickle=False)
    np.save(os.path.join(d, "expected_hidden_f64.npy"), h64.numpy(), allow_pickle=False)
    if p64 is not None:
        np.save(os.path.join(d, "expected_pooled_f64.npy"), p64.numpy(), allow_pickle=False)
    write_json(os.path.join(d, "case.json"), {"tol": tol})
    print(f"{name}: fp32 error {err:.3g}, tol {tol:.3g}")


def main():
    run_generator(DEFAULT_OUT, list(CASES), lambda root, name: make_case(root, name, CASES[name]), "bert")


if __name__ == "__main__":
    main()
