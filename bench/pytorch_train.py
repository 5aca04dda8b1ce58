#!/usr/bin/python3
"""Training throughput of PyTorch 1.13 (eager, autograd, torch.optim.AdamW), beside `qkv train` on
the same model (docs/performance.md, "Training").

    /usr/bin/python3 bench/pytorch_train.py --make-config /tmp/gpt2-train/config.json   # the model
    /usr/bin/python3 bench/pytorch_train.py --config /tmp/gpt2-train/config.json --batch 8 --seq 256
    build/tools/qkv/qkv train --config /tmp/gpt2-train/config.json --data text.txt --batch 8 --seq 256 \\
        --steps 12 --val-fraction 0 --threads 2 --out /tmp/run

The model is tests/numerics/make_llama_fixtures.py's reference forward (Gpt2Reference or
Reference: transformers' GPT2LMHeadModel / LlamaForCausalLM written out op by op), its weights leaf
tensors with requires_grad, the loss torch.nn.functional.cross_entropy over the next token, then
clip_grad_norm_(1.0) and AdamW(lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1) — what `qkv train`
does by default — on random byte tokens, torch.set_num_threads(--threads). It prints one JSON
object: the median step time over --steps steps after --warmup, tokens/s, the model's parameter
count and GFLOP/s counted as 6 × parameters × tokens plus the attention's forward and backward
(3 × 4·B·L²·width per layer; causal masking not subtracted).
"""

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "numerics"))
import make_llama_fixtures as ref  # noqa: E402

# GPT-2 small scaled down to 2 cores (the model; 256 byte ids instead of 65 symbols).
GPT2_SMALL = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "n_embd": 384, "n_head": 6, "n_layer": 6,
              "n_positions": 256, "vocab_size": 256, "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5,
              "tie_word_embeddings": True}


def flops_per_step(c, params, batch, seq):
    if c["model_type"] == "gpt2":
        layers, width = c["n_layer"], c["n_embd"]
    else:
        layers, width = c["num_hidden_layers"], c["num_attention_heads"] * ref.head_dim(c)
    return 6 * params * batch * seq + 3 * 4 * batch * seq * seq * width * layers


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--make-config", help="write the GPT-2-small-shaped config.json here and exit")
    ap.add_argument("--config")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    if a.make_config:
        os.makedirs(os.path.dirname(os.path.abspath(a.make_config)), exist_ok=True)
        ref.write_json(a.make_config, GPT2_SMALL)
        return
    torch.set_num_threads(a.threads)
    with open(a.config) as f:
        c = json.load(f)
    gen = torch.Generator().manual_seed(0)
    gpt2 = c["model_type"] == "gpt2"
    w0 = ref.random_gpt2_weights(c, gen) if gpt2 else ref.random_weights(c, gen)
    w = {k: v.float().clone().requires_grad_(True) for k, v in w0.items()}
    model = (ref.Gpt2Reference if gpt2 else ref.Reference)(c, {}, torch.float32)
    model.w = w
    opt = torch.optim.AdamW(list(w.values()), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    params = sum(v.numel() for v in w.values())
    times, losses = [], []
    for step in range(a.warmup + a.steps):
        data = torch.randint(0, c["vocab_size"], (a.batch, a.seq + 1), generator=gen)
        t0 = time.perf_counter()
        logits = model.forward(data[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, c["vocab_size"]), data[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(w.values()), 1.0)
        opt.step()
        dt = time.perf_counter() - t0
        losses.append(float(loss))
        if step >= a.warmup:
            times.append(dt)
    med = sorted(times)[len(times) // 2]
    tokens = a.batch * a.seq
    print(json.dumps({"engine": "pytorch " + torch.__version__, "threads": a.threads, "parameters": params,
                      "batch": a.batch, "seq": a.seq, "median_step_s": med, "tokens_per_s": tokens / med,
                      "gflops": flops_per_step(c, params, a.batch, a.seq) / med / 1e9, "losses": losses}))


if __name__ == "__main__":
    main()
