#!/usr/bin/python3
"""Decode throughput of the PyTorch reference decoder, beside `qkv bench generate` on the same
checkpoint (docs/performance.md, "Decoding").

    # a random Llama checkpoint: 4 layers, hidden 1024, GQA 16/4, intermediate 2816, vocab 32000
    /usr/bin/python3 bench/pytorch_generate.py --make /tmp/llama-bench
    # the PyTorch reference with its own KV cache, 2 threads; writes the prompt for qkv
    /usr/bin/python3 bench/pytorch_generate.py --model /tmp/llama-bench --prompt-len 16 --new-tokens 256 \\
        --prompt-out /tmp/prompt.npy
    build/tools/qkv/qkv bench generate --model /tmp/llama-bench --prompt-ids /tmp/prompt.npy \\
        --new-tokens 256 --threads 2 --json

The reference is tests/numerics/make_llama_fixtures.py's (the Hugging Face forward written out
line by line, fp32, the cache extended with torch.cat and GQA by repeat_interleave as
transformers' eager attention does), run under torch.no_grad() with torch.set_num_threads(2).
It prints one JSON object: prefill and decode tokens/s, and the greedy ids' agreement with qkv's
when --compare names qkv's --out file.
"""

import argparse
import json
import os
import struct
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "numerics"))
import make_llama_fixtures as ref  # noqa: E402

CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
          "intermediate_size": 2816, "num_hidden_layers": 4, "num_attention_heads": 16,
          "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 4096,
          "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
          "tie_word_embeddings": False, "torch_dtype": "float32"}


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        if t["dtype"] != "F32":
            raise SystemExit(f"{path}: {name} is {t['dtype']}; this script reads F32 checkpoints")
        a, b = t["data_offsets"]
        out[name] = torch.from_numpy(np.frombuffer(raw, dtype="<f4", count=(b - a) // 4, offset=8 + n + a)
                                     .reshape(t["shape"]).copy())
    return out


def make(folder):
    os.makedirs(folder, exist_ok=True)
    gen = torch.Generator().manual_seed(1234)
    w = ref.random_weights(CONFIG, gen)
    ref.write_json(os.path.join(folder, "config.json"), CONFIG)
    ref.write_safetensors(os.path.join(folder, "model.safetensors"), w)
    print(f"wrote {folder}: {sum(v.numel() for v in w.values()) / 1e6:.1f} M parameters")


def run(args):
    torch.set_num_threads(args.threads)
    with open(os.path.join(args.model, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    model = ref.Reference(c, read_safetensors(os.path.join(args.model, "model.safetensors")), torch.float32)
    gen = torch.Generator().manual_seed(args.seed)
    prompt = torch.randint(0, c["vocab_size"], (1, args.prompt_len), generator=gen)
    if args.prompt_out:
        np.save(args.prompt_out, prompt.numpy().astype(np.int64))
    with torch.no_grad():
        cache, ids = [], prompt.clone()
        t0 = time.perf_counter()
        logits = model.forward(prompt, 0, cache)[:, -1]
        prefill = time.perf_counter() - t0
        decode = 0.0
        for t in range(args.new_tokens):
            nxt = logits.argmax(-1, keepdim=True)
            ids = torch.cat((ids, nxt), dim=1)
            if t + 1 == args.new_tokens:
                break
            t0 = time.perf_counter()
            logits = model.forward(nxt, ids.shape[1] - 1, cache)[:, -1]
            decode += time.perf_counter() - t0
    steps = args.new_tokens - 1
    result = {"torch": torch.__version__, "threads": args.threads, "prompt_tokens": args.prompt_len,
              "decode_steps": steps, "prefill_ms": prefill * 1e3, "prefill_tokens_per_s": args.prompt_len / prefill,
              "decode_ms": decode * 1e3, "decode_tokens_per_s": steps / decode if decode > 0 else 0.0}
    if args.compare:
        theirs = np.load(args.compare)
        mine = ids.numpy()
        same = theirs.shape == mine.shape and bool((theirs == mine).all())
        result["ids_equal_to"] = {args.compare: same}
    print(json.dumps(result))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--make", metavar="DIR", help="write the random benchmark checkpoint there and stop")
    p.add_argument("--model", metavar="DIR")
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=256)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt-out", help="write the prompt ids (int64 [1, P]) there, for qkv --prompt-ids")
    p.add_argument("--compare", help="qkv's --out ids (.npy) to compare the greedy ids with")
    args = p.parse_args()
    if args.make:
        make(args.make)
    elif args.model:
        run(args)
    else:
        p.error("give --make DIR or --model DIR")


if __name__ == "__main__":
    main()
