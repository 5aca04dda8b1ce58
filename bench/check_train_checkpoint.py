#!/usr/bin/python3
"""A `qkv train` checkpoint read by PyTorch: the folder's config.json and model.safetensors loaded
into make_llama_fixtures.py's reference model (transformers' LlamaForCausalLM / GPT2LMHeadModel
written out op by op, fp64), its logits on the given tokens compared with `qkv run causal-lm`'s.

    qkv train --config tiny/config.json --data text.txt --steps 50 --out run/
    qkv run causal-lm --model run/ --tokens ids.npy --logits-out qkv_logits.npy
    /usr/bin/python3 bench/check_train_checkpoint.py --model run/ --tokens ids.npy --logits qkv_logits.npy

Prints one JSON object (the largest |difference| and the largest |logit|) and exits 1 when the
difference exceeds --tol (default 1e-4 · max(1, max |logit|)).
"""

import argparse
import json
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "tests", "numerics"))
import make_llama_fixtures as ref  # noqa: E402
from pytorch_generate import read_safetensors  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", required=True)
    ap.add_argument("--logits", required=True)
    ap.add_argument("--tol", type=float)
    a = ap.parse_args()
    with open(os.path.join(a.model, "config.json"), encoding="utf-8") as f:
        c = json.load(f)
    w = read_safetensors(os.path.join(a.model, "model.safetensors"))
    model = (ref.Gpt2Reference if c["model_type"] == "gpt2" else ref.Reference)(c, w, torch.float64)
    tokens = torch.from_numpy(np.load(a.tokens).astype(np.int64))
    with torch.no_grad():
        want = model.forward(tokens).numpy()
    got = np.load(a.logits)
    err = float(np.abs(got.astype(np.float64) - want).max())
    scale = float(np.abs(want).max())
    tol = a.tol if a.tol is not None else 1e-4 * max(1.0, scale)
    print(json.dumps({"max_abs_error": err, "max_abs_logit": scale, "tol": tol, "ok": err <= tol}))
    sys.exit(0 if err <= tol else 1)


if __name__ == "__main__":
    main()
