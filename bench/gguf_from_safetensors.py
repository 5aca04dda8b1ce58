#!/usr/bin/env python3
"""Convert a Hugging Face Llama folder (config.json + model.safetensors) to a GGUF v3 file that
llama.cpp loads, for benchmarking qkv against llama.cpp (bench/llamacpp_generate.mjs).

    /usr/bin/python3 bench/gguf_from_safetensors.py --model /tmp/llm --out /tmp/llm-f32.gguf --type f32
    /usr/bin/python3 bench/gguf_from_safetensors.py --model /tmp/llm --out /tmp/llm-q8_0.gguf --type q8_0
    /usr/bin/python3 bench/gguf_from_safetensors.py --model /tmp/llm --out /tmp/llm-q4_0.gguf --type q4_0

numpy only (no `gguf` package, no `safetensors` package): the safetensors file is read by hand
(an 8-byte little-endian header length, a JSON header, the raw data; F32, F16 and BF16 tensors),
and the GGUF file is written by hand, following llama.cpp's convert_hf_to_gguf.py for Llama:

* tensor names token_embd, blk.{i}.attn_norm / attn_q / attn_k / attn_v / attn_output /
  ffn_norm / ffn_gate / ffn_up / ffn_down, output_norm, output (".weight");
* the Q and K projections permuted from Hugging Face's rotate_half layout to the interleaved
  pairs llama.cpp's RoPE wants (n_head = num_attention_heads for Q, num_key_value_heads for K);
* GGUF lists the dims innermost first (ne[0] = the contiguous row length), data 32-byte aligned;
* --type q8_0: every 2-D tensor whose rows are a multiple of 32 long (token_embd and output
  included, as `convert_hf_to_gguf.py --outtype q8_0` does; --token-embd-f32 keeps token_embd
  in f32, like `qkv --quantize q8`, which quantizes the linear layers only) in Q8_0 blocks of 32 values
  (an f16 scale d = max|x| / 127, then 32 int8 q = round-half-away(x / d): 34 bytes a block);
  norms and anything else stay f32.
* --type f16: every 2-D tensor in IEEE f16 (numpy's rounding: nearest, ties to even, as qkv's
  --dtype f16), norms in f32 (as convert_hf_to_gguf.py --outtype f16 does);
* --type bf16: every 2-D tensor in bf16 (rounded to nearest, ties to even, as qkv's --dtype bf16
  rounds), norms in f32 (as convert_hf_to_gguf.py --outtype bf16 does);
* --type q4_0: the same tensors in Q4_0 blocks of 32 (an f16 scale d = m / -8, m the entry of
  largest magnitude, then 16 bytes: byte j holds min(15, trunc(x_j / d + 8.5)) in its low four bits
  and the same of x_{j+16} in its high four; 18 bytes a block), as llama.cpp's quantize_row_q4_0_ref.

The checkpoint has no tokenizer, so the file carries a placeholder SentencePiece ("llama")
vocabulary of vocab_size pieces: <unk>, <s>, </s>, the 256 byte tokens <0x00>..<0xFF>, then
t{i}; bos / eos / unk ids 1 / 2 / 0. Only token ids are ever fed to the model, never text.
"""

import argparse
import json
import os
import struct
import sys

import numpy as np

# GGUF metadata value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# ggml tensor types
GGML_F32, GGML_F16, GGML_Q4_0, GGML_Q8_0, GGML_BF16 = 0, 1, 2, 8, 30
# llama_ftype
FTYPE_ALL_F32, FTYPE_MOSTLY_F16, FTYPE_MOSTLY_Q4_0, FTYPE_MOSTLY_Q8_0, FTYPE_MOSTLY_BF16 = 0, 1, 2, 7, 32
FILE_TYPES = {"q8_0": FTYPE_MOSTLY_Q8_0, "q4_0": FTYPE_MOSTLY_Q4_0, "bf16": FTYPE_MOSTLY_BF16, "f16": FTYPE_MOSTLY_F16}
ALIGN = 32
QK8_0 = 32


# ---- safetensors -------------------------------------------------------------------------------


def read_safetensors(path):
    """{name: numpy array (a read-only memmap view for F32)}; BF16 and F16 come back as float32."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    base = 8 + n
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        buf = raw[base + begin : base + end]
        shape = tuple(info["shape"])
        dt = info["dtype"]
        if dt == "F32":
            a = buf.view("<f4")
        elif dt == "F16":
            a = buf.view("<f2").astype(np.float32)
        elif dt == "BF16":
            a = (buf.view("<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            sys.exit(f"{path}: tensor {name} has dtype {dt}; only F32, F16 and BF16 are supported")
        out[name] = a.reshape(shape)
    return out


def read_checkpoint(folder):
    single = os.path.join(folder, "model.safetensors")
    if os.path.exists(single):
        return read_safetensors(single)
    index = os.path.join(folder, "model.safetensors.index.json")
    if not os.path.exists(index):
        sys.exit(f"{folder}: no model.safetensors (nor model.safetensors.index.json)")
    with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    out = {}
    for name in files:
        out.update(read_safetensors(os.path.join(folder, name)))
    return out


# ---- the Llama mapping -------------------------------------------------------------------------


def permute(w, n_head):
    """convert_hf_to_gguf.py's LlamaModel.permute: HF's rotate_half rows -> interleaved pairs."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def gguf_tensors(cfg, st):
    """[(gguf name, float32 array in HF's (out, in) layout)], in convert_hf_to_gguf.py's order."""
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    names = {
        "input_layernorm": "attn_norm",
        "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k",
        "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output",
        "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate",
        "mlp.up_proj": "ffn_up",
        "mlp.down_proj": "ffn_down",
    }

    def get(name):
        if name not in st:
            sys.exit(f"the checkpoint has no tensor {name}")
        return st[name]

    out = [("token_embd.weight", get("model.embed_tokens.weight"))]
    for i in range(cfg["num_hidden_layers"]):
        for hf, gg in names.items():
            w = get(f"model.layers.{i}.{hf}.weight")
            if gg == "attn_q":
                w = permute(w, n_head)
            elif gg == "attn_k":
                w = permute(w, n_kv)
            out.append((f"blk.{i}.{gg}.weight", w))
    out.append(("output_norm.weight", get("model.norm.weight")))
    if "lm_head.weight" in st and not cfg.get("tie_word_embeddings", False):
        out.append(("output.weight", st["lm_head.weight"]))  # tied: llama.cpp reuses token_embd
    unused = set(st) - {"lm_head.weight", "model.embed_tokens.weight", "model.norm.weight"}
    unused -= {f"model.layers.{i}.{hf}.weight" for i in range(cfg["num_hidden_layers"]) for hf in names}
    unused = {n for n in unused if not n.endswith("rotary_emb.inv_freq")}
    if unused:
        sys.exit(f"tensors this converter does not map: {sorted(unused)[:8]}")
    return out


# ---- Q8_0 --------------------------------------------------------------------------------------


def to_bf16(w):
    """The bf16 bits of f32 w: round to nearest, ties to even (a NaN stays a quiet NaN)."""
    u = np.ascontiguousarray(w, dtype="<f4").view("<u4").astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2")
    nan = np.isnan(np.asarray(w, dtype=np.float32))
    r[nan] = ((u[nan] >> 16) | 0x40).astype("<u2")
    return r


def quantize_q8_0(w):
    """llama.cpp's Q8_0 (gguf-py's quants.Q8_0): per block of 32, d = max|x| / 127 stored as f16,
    q = round-half-away-from-zero(x / d) as int8; 34 bytes a block, rows of blocks back to back."""
    blocks = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, QK8_0)
    d = np.abs(blocks).max(axis=1, keepdims=True) / 127
    with np.errstate(divide="ignore", invalid="ignore"):
        x = blocks / d
    a = np.abs(x)
    fl = np.floor(a)
    q = np.sign(x) * (fl + np.floor(2 * (a - fl)))  # gguf-py's np_roundf: round half away from zero
    q[np.broadcast_to(d == 0, q.shape)] = 0
    out = np.empty((blocks.shape[0], 2 + QK8_0), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = q.astype(np.int8).view(np.uint8)
    return out


def quantize_q4_0(w):
    """llama.cpp's Q4_0 (quantize_row_q4_0_ref): per block of 32, d = m / -8 (m the entry of largest
    magnitude, with its sign) stored as f16, then byte j = q_j | q_{j+16} << 4 with q = min(15,
    trunc(x / d + 8.5)); 18 bytes a block, rows of blocks back to back."""
    blocks = np.ascontiguousarray(w, dtype=np.float32).reshape(-1, QK8_0)
    m = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=1)[:, None], axis=1)
    d = m / -8
    with np.errstate(divide="ignore", invalid="ignore"):
        idn = np.where(d == 0, 0, 1 / d)
    q = np.minimum(15, np.trunc(blocks * idn + 8.5)).astype(np.uint8)
    out = np.empty((blocks.shape[0], 2 + QK8_0 // 2), dtype=np.uint8)
    out[:, :2] = d.astype("<f2").view(np.uint8)
    out[:, 2:] = q[:, : QK8_0 // 2] | (q[:, QK8_0 // 2 :] << 4)
    return out


# ---- GGUF writing ------------------------------------------------------------------------------


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


SCALAR = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?", U64: "<Q", I64: "<q", F64: "<d"}
NUMPY = {U32: "<u4", I32: "<i4", F32: "<f4", U64: "<u8", I64: "<i8", F64: "<f8", U8: "u1", I8: "i1"}


def kv(key, vtype, value, elem=None):
    out = gstr(key) + struct.pack("<I", vtype)
    if vtype == STRING:
        return out + gstr(value)
    if vtype == ARRAY:
        out += struct.pack("<IQ", elem, len(value))
        if elem == STRING:
            return out + b"".join(gstr(v) for v in value)
        return out + np.asarray(value, dtype=NUMPY[elem]).tobytes()
    return out + struct.pack(SCALAR[vtype], value)


def pad(n):
    return (ALIGN - n % ALIGN) % ALIGN


def vocabulary(n):
    if n < 3:
        sys.exit(f"vocab_size {n}: need at least 3 (<unk>, <s>, </s>)")
    tokens = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]  # UNKNOWN, CONTROL, CONTROL
    for b in range(min(256, n - 3)):
        tokens.append(f"<0x{b:02X}>")
        types.append(6)  # BYTE
    for i in range(len(tokens), n):
        tokens.append(f"t{i}")
        types.append(1)  # NORMAL
    scores = [0.0] * 3 + [-float(i) for i in range(3, n)]
    return tokens, scores, types


def convert(model, out_path, qtype, name=None, embd_f32=False):
    with open(os.path.join(model, "config.json")) as f:
        cfg = json.load(f)
    mt = cfg.get("model_type", "llama")
    if mt not in ("llama",):
        print(f"warning: model_type {mt!r}; writing it as a llama model", file=sys.stderr)
    if cfg.get("rope_scaling"):
        sys.exit(f"rope_scaling {cfg['rope_scaling']} is not supported by this converter")
    hidden = cfg["hidden_size"]
    n_head = cfg["num_attention_heads"]
    n_kv = cfg.get("num_key_value_heads", n_head)
    head_dim = cfg.get("head_dim") or hidden // n_head
    vocab = cfg["vocab_size"]

    st = read_checkpoint(model)
    tensors = gguf_tensors(cfg, st)

    # tensor infos: (name, ggml dims innermost first, ggml type, bytes)
    infos = []
    for tname, w in tensors:
        keep = embd_f32 and tname == "token_embd.weight"
        if w.ndim == 2 and qtype in ("q8_0", "q4_0") and w.shape[1] % QK8_0 == 0 and not keep:
            t = GGML_Q8_0 if qtype == "q8_0" else GGML_Q4_0
            block = 2 + (QK8_0 if qtype == "q8_0" else QK8_0 // 2)
            nbytes = w.shape[0] * (w.shape[1] // QK8_0) * block
        elif w.ndim == 2 and qtype == "bf16":
            t, nbytes = GGML_BF16, w.size * 2
        elif w.ndim == 2 and qtype == "f16":
            t, nbytes = GGML_F16, w.size * 2
        else:
            t, nbytes = GGML_F32, w.size * 4
        infos.append((tname, list(reversed(w.shape)), t, nbytes))

    tokens, scores, types = vocabulary(vocab)
    meta = [
        kv("general.architecture", STRING, "llama"),
        kv("general.name", STRING, name or os.path.basename(os.path.normpath(model))),
        kv("general.alignment", U32, ALIGN),
        kv("llama.vocab_size", U32, vocab),
        kv("llama.context_length", U32, cfg.get("max_position_embeddings", 2048)),
        kv("llama.embedding_length", U32, hidden),
        kv("llama.block_count", U32, cfg["num_hidden_layers"]),
        kv("llama.feed_forward_length", U32, cfg["intermediate_size"]),
        kv("llama.attention.head_count", U32, n_head),
        kv("llama.attention.head_count_kv", U32, n_kv),
        kv("llama.rope.freq_base", F32, float(cfg.get("rope_theta", 10000.0))),
        kv("llama.rope.dimension_count", U32, head_dim),
        kv("llama.attention.key_length", U32, head_dim),
        kv("llama.attention.value_length", U32, head_dim),
        kv("llama.attention.layer_norm_rms_epsilon", F32, float(cfg.get("rms_norm_eps", 1e-6))),
        kv("general.file_type", U32, FILE_TYPES.get(qtype, FTYPE_ALL_F32)),
        kv("tokenizer.ggml.model", STRING, "llama"),
        kv("tokenizer.ggml.tokens", ARRAY, tokens, STRING),
        kv("tokenizer.ggml.scores", ARRAY, scores, F32),
        kv("tokenizer.ggml.token_type", ARRAY, types, I32),
        kv("tokenizer.ggml.unknown_token_id", U32, 0),
        kv("tokenizer.ggml.bos_token_id", U32, 1),
        kv("tokenizer.ggml.eos_token_id", U32, 2),
        kv("tokenizer.ggml.add_bos_token", BOOL, False),
        kv("tokenizer.ggml.add_eos_token", BOOL, False),
    ]

    head = b"GGUF" + struct.pack("<IQQ", 3, len(infos), len(meta)) + b"".join(meta)
    offset = 0
    for tname, dims, t, nbytes in infos:
        head += gstr(tname) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        head += struct.pack("<IQ", t, offset)
        offset += nbytes + pad(nbytes)
    head += b"\0" * pad(len(head))

    tmp = out_path + ".part"
    with open(tmp, "wb") as f:
        f.write(head)
        for (tname, w), (_, _, t, nbytes) in zip(tensors, infos):
            if t == GGML_Q8_0:
                data = quantize_q8_0(w).tobytes()
            elif t == GGML_Q4_0:
                data = quantize_q4_0(w).tobytes()
            elif t == GGML_BF16:
                data = to_bf16(w).tobytes()
            elif t == GGML_F16:
                data = np.asarray(w, dtype="<f2").tobytes()  # nearest, ties to even: as qkv's --dtype f16
            else:
                data = np.ascontiguousarray(w, dtype="<f4").tobytes()
            assert len(data) == nbytes, tname
            f.write(data)
            f.write(b"\0" * pad(nbytes))
    os.replace(tmp, out_path)
    n_q = sum(1 for i in infos if i[2] in (GGML_Q8_0, GGML_Q4_0, GGML_BF16, GGML_F16))
    print(
        f"wrote {out_path}: {len(infos)} tensors ({n_q} {qtype}, {len(infos) - n_q} f32), "
        f"{os.path.getsize(out_path) / 2**20:.1f} MiB",
        file=sys.stderr,
    )


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, metavar="DIR", help="Hugging Face Llama folder")
    p.add_argument("--out", required=True, metavar="FILE", help="the .gguf to write")
    p.add_argument("--type", choices=["f32", "f16", "bf16", "q8_0", "q4_0"], default="f32", help="weight type (default f32)")
    p.add_argument("--name", help="general.name (default: the folder's name)")
    p.add_argument(
        "--token-embd-f32",
        action="store_true",
        help="with --type q8_0 / q4_0, keep token_embd in f32 (as qkv --quantize q8 / q4 does) instead of "
        "quantizing it (as convert_hf_to_gguf.py --outtype q8_0 does)",
    )
    a = p.parse_args()
    convert(a.model, a.out, a.type, a.name, a.token_embd_f32)


if __name__ == "__main__":
    main()
