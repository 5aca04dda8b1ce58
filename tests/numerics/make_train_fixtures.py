#!/usr/bin/python3
"""Training steps of a tiny Llama in PyTorch 1.13, for qkv's loss, gradients and optimizers
(tests/numerics/test_train.cpp).

    /usr/bin/python3 tests/numerics/make_train_fixtures.py [--check]

The model is make_llama_fixtures.py's Reference (transformers' LlamaForCausalLM written out: GQA,
RoPE, RMSNorm, SwiGLU, untied head) on random weights; the loss is
torch.nn.functional.cross_entropy(logits, targets, ignore_index=-100, label_smoothing=0.1) with
targets = the next token (the last position and two others set to -100); the optimizer
torch.optim.AdamW(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1) and, as a second case,
torch.optim.SGD(lr=0.05, momentum=0.9, weight_decay=0.01); the third, adamw_clip, is AdamW with
torch.nn.utils.clip_grad_norm_(max_norm=0.5) before every step, over 20 steps. Each runs `steps` steps
on the same batch, in fp64 and, from the same values, in fp32. Written to
tests/numerics/train_fixtures/<case>/:

  config.json, weights.safetensors   the model before training (as make_llama_fixtures writes them)
  tokens.npy, targets.npy            int64 [2, 7]
  losses.npy                         fp64 [steps]: the loss before each step
  grad_norms.npy                     fp64 [steps]: the gradients' global L2 norm at each step (before clipping)
  after/<name>.npy                   fp64: every weight after the last step
  case.json                          {"steps": n, "tol": {name: tolerance}, "loss_tol": tolerance}:
                                     max(4 * |fp32 - fp64|, 2e-6 * max(1, max|ref|)) per tensor
Deterministic: --check regenerates into a temporary directory and compares with the committed files.
"""

import os

import numpy as np
import torch

from make_llama_fixtures import run_generator, TOL_FACTOR, TOL_FLOOR, Reference, random_weights, write_json, write_safetensors

torch.set_num_threads(1)
HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "train_fixtures")

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 16, "intermediate_size": 24,
          "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 20,
          "max_position_embeddings": 32, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": False, "torch_dtype": "float32"}
CASES = {
    "adamw": dict(steps=3, make=lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                                                              weight_decay=0.1)),
    "sgd": dict(steps=3, make=lambda ps: torch.optim.SGD(ps, lr=0.05, momentum=0.9, weight_decay=0.01)),
    "adamw_clip": dict(steps=20, clip=0.5, make=lambda ps: torch.optim.AdamW(ps, lr=1e-2, betas=(0.9, 0.95), eps=1e-8,
                                                                             weight_decay=0.1)),
}


def train(w0, tokens, targets, dt, make, steps, clip):
    w = {k: v.detach().to(dt).clone().requires_grad_(True) for k, v in w0.items()}
    opt = make(list(w.values()))
    losses, norms = [], []
    for _ in range(steps):
        ref = Reference(CONFIG, {}, dt)
        ref.w = w  # the trainable tensors themselves
        logits = ref.forward(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, CONFIG["vocab_size"]), targets.reshape(-1),
                                                 ignore_index=-100, label_smoothing=0.1)
        losses.append(float(loss))
        opt.zero_grad()
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(list(w.values()), clip if clip else float("inf"))))
        opt.step()
    return {k: v.detach() for k, v in w.items()}, losses, norms


def make_case(root, name, spec):
    gen = torch.Generator().manual_seed(5000)
    w0 = random_weights(CONFIG, gen)
    tokens = torch.randint(0, CONFIG["vocab_size"], (2, 7), generator=gen)
    targets = torch.cat((tokens[:, 1:], torch.full((2, 1), -100)), dim=1)
    targets[0, 2] = -100
    targets[1, 4] = -100
    clip = spec.get("clip")
    w64, l64, n64 = train(w0, tokens, targets, torch.float64, spec["make"], spec["steps"], clip)
    w32, l32, n32 = train(w0, tokens, targets, torch.float32, spec["make"], spec["steps"], clip)

    def tol(a32, a64):
        return max(TOL_FACTOR * float((a32.double() - a64).abs().max()), TOL_FLOOR * max(1.0, float(a64.abs().max())))

    d = os.path.join(root, name)
    os.makedirs(os.path.join(d, "after"), exist_ok=True)
    write_json(os.path.join(d, "config.json"), CONFIG)
    write_safetensors(os.path.join(d, "weights.safetensors"), w0)
    np.save(os.path.join(d, "tokens.npy"), tokens.numpy().astype(np.int64), allow_pickle=False)
    np.save(os.path.join(d, "targets.npy"), targets.numpy().astype(np.int64), allow_pickle=False)
    np.save(os.path.join(d, "losses.npy"), np.array(l64), allow_pickle=False)
    np.save(os.path.join(d, "grad_norms.npy"), np.array(n64), allow_pickle=False)
    for k, v in w64.items():
        np.save(os.path.join(d, "after", k + ".npy"), v.numpy(), allow_pickle=False)
    tols = {k: tol(w32[k], w64[k]) for k in w64}
    loss_tol = tol(torch.tensor(l32, dtype=torch.float64), torch.tensor(l64, dtype=torch.float64))
    norm_tol = tol(torch.tensor(n32, dtype=torch.float64), torch.tensor(n64, dtype=torch.float64))
    write_json(os.path.join(d, "case.json"), {"steps": spec["steps"], "clip": clip or 0.0, "tol": tols,
                                              "loss_tol": loss_tol, "norm_tol": norm_tol})
    print(f"{name}: losses {[round(x, 5) for x in l64]}, largest weight tol {max(tols.values()):.3g}, "
          f"loss tol {loss_tol:.3g}")


def main():
    run_generator(DEFAULT_OUT, list(CASES), lambda root, name: make_case(root, name, CASES[name]), "training")


if __name__ == "__main__":
    main()
