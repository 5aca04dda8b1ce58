#!/usr/bin/python3
"""Whole small models in PyTorch 1.13 and their outputs, for the qkv::nn blocks that mirror them
(tests/numerics/test_models.cpp).

    /usr/bin/python3 tests/numerics/make_model_fixtures.py [--check]

Cases (each a folder under tests/numerics/model_fixtures/ with weights.safetensors — the state
dict's names and shapes, except where said —, one .npy per input, expected_<output>_f64.npy and
case.json {"tol": ...}):

  decoder_post      nn.TransformerDecoderLayer(32, 4, 64, relu, norm_first=False): target [2, 5, 32]
                    with a causal tgt_mask, memory [2, 7, 32] with memory_key_padding_mask lengths 7, 4
  decoder_pre       the same with gelu and norm_first=True; tgt_key_padding_mask lengths 5, 3 beside the
                    causal mask; no memory mask; memory [2, 3, 32]
  encoder_decoder   an nn.TransformerEncoderLayer (`encoder.`) over a source [2, 7, 32] with
                    src_key_padding_mask lengths 7, 5, its output the memory of an
                    nn.TransformerDecoderLayer (`decoder.`) over a target [2, 4, 32] (causal, the
                    same padding as memory_key_padding_mask): source and target of different lengths
  vit               a ViT block: patches [2, 6, 12] -> Linear(12, 32) (`patch_embed`), a learned CLS
                    token prepended (`cls_token`, stored [1, 32]: PyTorch's [1, 1, 32] squeezed),
                    learned positions added (`pos_embed`, stored [7, 32]), a pre-norm gelu
                    nn.TransformerEncoderLayer (`block.`), LayerNorm (`norm`), Linear(32, 10) on the
                    CLS row (`head`) -> logits [2, 10]

The modules run on PyTorch's regular path (grad mode on: the fused fast paths are not taken),
in fp32 and, from the same weights, in fp64. Tolerance: max(4 * |fp32 - fp64|, 2e-6 * max(1,
max|ref|)), the rule of make_fixtures.py. Padding masks are bool, True = padding (PyTorch's).
Deterministic: --check regenerates into a temporary directory and compares with the committed files.
"""

import copy
import os

import numpy as np
import torch

from make_llama_fixtures import run_generator, TOL_FACTOR, TOL_FLOOR, write_json, write_safetensors

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "model_fixtures")
E, H, FF = 32, 4, 64


def padding(lengths, n):
    return torch.arange(n)[None, :] >= torch.tensor(lengths)[:, None]


def causal(n):
    return torch.triu(torch.ones(n, n), diagonal=1).bool()


def perturb(module, gen):
    """Biases and LayerNorms start at 0 / 1 in PyTorch; random values test that they are read."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name.endswith("bias") or "norm" in name:
                p.add_(torch.randn(p.shape, generator=gen) * 0.2)


def decoder_layer(activation, norm_first):
    return torch.nn.TransformerDecoderLayer(E, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                            norm_first=norm_first)


def encoder_layer(activation, norm_first):
    return torch.nn.TransformerEncoderLayer(E, H, FF, dropout=0.0, activation=activation, batch_first=True,
                                            norm_first=norm_first)


class EncoderDecoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = encoder_layer("relu", False)
        self.decoder = decoder_layer("relu", False)

    def forward(self, src, tgt, src_kpm):
        memory = self.encoder(src, src_key_padding_mask=src_kpm)
        return self.decoder(tgt, memory, tgt_mask=causal(tgt.shape[1]), memory_key_padding_mask=src_kpm)


class Vit(torch.nn.Module):
    def __init__(self, patch=12, patches=6, classes=10):
        super().__init__()
        self.patch_embed = torch.nn.Linear(patch, E)
        self.cls_token = torch.nn.Parameter(torch.zeros(1, 1, E))
        self.pos_embed = torch.nn.Parameter(torch.zeros(1, patches + 1, E))
        self.block = encoder_layer("gelu", True)
        self.norm = torch.nn.LayerNorm(E)
        self.head = torch.nn.Linear(E, classes)

    def forward(self, patches):
        x = self.patch_embed(patches)
        x = torch.cat((self.cls_token.expand(x.shape[0], -1, -1), x), dim=1) + self.pos_embed
        return self.head(self.norm(self.block(x))[:, 0])


def run_case(module, inputs, call, gen, names):
    """The output in fp32 and fp64, and the gradients of L = sum(out * probe) (the probe drawn
    after everything else) by every parameter and every float input (`names` name the inputs),
    in both precisions: (out32, out64, probe, {name: (grad32, grad64)})."""
    perturb(module, gen)
    module.eval()
    with torch.no_grad():
        for name, p in module.named_parameters():
            if name in ("cls_token", "pos_embed"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.5)
    runs = {}
    for dt, m in ((torch.float32, module), (torch.float64, copy.deepcopy(module).double())):
        xs = [x.detach().to(dt).clone().requires_grad_(True) if x.is_floating_point() else x for x in inputs]
        runs[dt] = (call(m, *xs), xs, [p for _, p in m.named_parameters()])
    out32, out64 = runs[torch.float32][0], runs[torch.float64][0]
    probe = torch.randn(out32.shape, generator=gen)
    grads = {}
    for dt, (out, xs, params) in runs.items():
        wrt = [x for x in xs if x.is_floating_point()] + params
        labels = [n for n, x in zip(names, xs) if x.is_floating_point()] + [n for n, _ in module.named_parameters()]
        for label, g in zip(labels, torch.autograd.grad((out * probe.to(dt)).sum(), wrt)):
            grads.setdefault(label, {})[dt] = g.detach()
    return out32.detach(), out64.detach(), probe, {k: (v[torch.float32], v[torch.float64]) for k, v in grads.items()}


def make(name, gen):
    if name == "decoder_post":
        m = decoder_layer("relu", False)
        tgt, mem = torch.randn(2, 5, E, generator=gen), torch.randn(2, 7, E, generator=gen)
        mem_kpm = padding([7, 4], 7)
        o32, o64, probe, grads = run_case(
            m, [tgt, mem], lambda m, t, s: m(t, s, tgt_mask=causal(5), memory_key_padding_mask=mem_kpm), gen,
            ["tgt", "memory"])
        inputs = {"tgt": tgt, "memory": mem, "memory_key_padding_mask": mem_kpm}
    elif name == "decoder_pre":
        m = decoder_layer("gelu", True)
        tgt, mem = torch.randn(2, 5, E, generator=gen), torch.randn(2, 3, E, generator=gen)
        tgt_kpm = padding([5, 3], 5)
        o32, o64, probe, grads = run_case(
            m, [tgt, mem], lambda m, t, s: m(t, s, tgt_mask=causal(5), tgt_key_padding_mask=tgt_kpm), gen,
            ["tgt", "memory"])
        inputs = {"tgt": tgt, "memory": mem, "tgt_key_padding_mask": tgt_kpm}
    elif name == "encoder_decoder":
        m = EncoderDecoder()
        src, tgt = torch.randn(2, 7, E, generator=gen), torch.randn(2, 4, E, generator=gen)
        kpm = padding([7, 5], 7)
        o32, o64, probe, grads = run_case(m, [src, tgt], lambda m, s, t: m(s, t, kpm), gen, ["src", "tgt"])
        inputs = {"src": src, "tgt": tgt, "src_key_padding_mask": kpm}
    else:
        m = Vit()
        patches = torch.randn(2, 6, 12, generator=gen)
        o32, o64, probe, grads = run_case(m, [patches], lambda m, p: m(p), gen, ["patches"])
        inputs = {"patches": patches}
    state = {k: v.detach().float() for k, v in m.state_dict().items()}
    if name == "vit":
        state["cls_token"] = state["cls_token"].reshape(1, E)
        state["pos_embed"] = state["pos_embed"].reshape(-1, E)
        for k in ("cls_token", "pos_embed"):
            grads[k] = tuple(g.reshape(state[k].shape) for g in grads[k])

    def tol_of(a32, a64):
        return max(TOL_FACTOR * float((a32.double() - a64).abs().max()), TOL_FLOOR * max(1.0, float(a64.abs().max())))

    err = float((o32.double() - o64).abs().max())
    return state, inputs, o64, err, tol_of(o32, o64), probe, grads, {k: tol_of(*v) for k, v in grads.items()}


NAMES = ["decoder_post", "decoder_pre", "encoder_decoder", "vit"]


def make_case(root, name):
    k = NAMES.index(name)
    gen = torch.Generator().manual_seed(3000 + k)
    torch.manual_seed(3000 + k)  # the modules' own initialisation
    state, inputs, out64, err, tol, probe, grads, grad_tol = make(name, gen)
    d = os.path.join(root, name)
    os.makedirs(d, exist_ok=True)
    write_safetensors(os.path.join(d, "weights.safetensors"), state)
    for n, x in inputs.items():
        np.save(os.path.join(d, n + ".npy"), x.numpy(), allow_pickle=False)
    np.save(os.path.join(d, "expected_out_f64.npy"), out64.numpy(), allow_pickle=False)
    np.save(os.path.join(d, "probe.npy"), probe.numpy(), allow_pickle=False)
    for n, (_, g64) in grads.items():
        np.save(os.path.join(d, "grad_" + n + ".npy"), g64.numpy(), allow_pickle=False)
    write_json(os.path.join(d, "case.json"), {"tol": tol, "torch_fp32_err": err, "grad_tol": grad_tol})
    print(f"{name}: out {tuple(out64.shape)}, PyTorch fp32 error {err:.3g}, tol {tol:.3g}; "
          f"{len(grads)} gradients, largest tol {max(grad_tol.values()):.3g}")


def main():
    run_generator(DEFAULT_OUT, NAMES, make_case, "model")


if __name__ == "__main__":
    main()
