// qkv's command line (CLI11): flags into the commands' structs (commands.hpp), errors into one
// line and an exit code (docs/cli.md).
//
// Exit codes: 0 success; 2 usage errors (unknown command or flag, a malformed or out-of-range
// value, flags that contradict each other, an output path that cannot be written as asked);
// 1 everything about input files and their contents, and running out of memory.
// CLI11 is included here only, with cli_flags.hpp (it costs ~6 s per translation unit).
#include <exception>
#include <functional>
#include <iostream>
#include <limits>
#include <optional>
#include <string_view>

#include <CLI/CLI.hpp>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/ir/extent.hpp>
#include <qkv/runtime/io/files.hpp>

#include "cli_flags.hpp"
#include "commands.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"

namespace qkv::cli {

namespace {

using namespace flags;

// Every command has its own flag objects: an object shared by two commands would be bound to
// the second one's option only (encoder-layer's --causal was once ignored that way).

/// --window, --softcap, --prefix-len, --align (run sdpa, run mha and the shape commands).
struct ModFlagsOptions {
  double softcap = 0;
  std::int64_t prefix_len = 0;
  CLI::Option *softcap_opt = nullptr, *prefix_opt = nullptr, *window_opt = nullptr;
  void add(CLI::App* cmd, ModFlags& f) {
    window_opt =
        cmd->add_option("--window", f.window, "LEFT,RIGHT: keep keys i'-LEFT <= j <= i'+RIGHT (-1 = unbounded)");
    softcap_opt = cmd->add_option("--softcap", softcap, "C: scores become C*tanh(s/C)")->check(finite_number());
    prefix_opt =
        cmd->add_option("--prefix-len", prefix_len, "N: prefix-LM, keys j < N or j <= i'")->check(unsigned_integer());
    cmd->add_option("--align", f.align, "top-left | bottom-right: how query positions i' align with keys (L != S)")
        ->check(CLI::IsMember({"top-left", "bottom-right"}));
  }
  void get(ModFlags& f) const {
    // An empty --window '' is not "no window": say so rather than run the model unwindowed.
    if (window_opt->count() && f.window.empty()) throw UsageError("--window takes LEFT,RIGHT (integers), not ''");
    if (softcap_opt->count()) f.softcap = softcap;
    if (prefix_opt->count()) f.prefix_len = prefix_len;
  }
};

/// qkv grad's flags beside a run command's: --grad-output and --grads-out (required), --out
/// optional (the forward output, when given).
struct GradFlags {
  GradRequest r;
  void add(CLI::App* cmd) {
    cmd->add_option("--grad-output", r.grad_output, "dO, the output's gradient (its shape) .npy")->required();
    cmd->add_option("--grads-out", r.grads_out,
                    "Folder for the gradients: d<name>.npy per float input and weight (created if absent)")
        ->required();
  }
};

/// `--out` of a run command; required unless the command is qkv grad's.
inline void out_option(CLI::App* cmd, std::string& out, const std::string& what, bool grad) {
  auto* opt = cmd->add_option("--out,-o", out, grad ? what + " (optional: the forward output)" : what);
  if (!grad) opt->required();
}

struct RunMhaFlags {
  RunMha o;
  CausalFlag causal;
  BackendFlag backend;
  DTypeFlag dtype;
  CLI::App* cmd = nullptr;
  std::optional<GradFlags> grad;  // set before add(): qkv grad
  void add(CLI::App* run) {
    cmd = run->add_subcommand("mha", "nn.MultiheadAttention(batch_first=True), eval mode");
    cmd->footer(
        "Example: qkv run mha --weights mha.safetensors --query q.npy --heads 8 --key-padding-mask pad.npy "
        "--out out.npy --weights-out w.npy");
    cmd->add_option("--weights", o.weights, "state_dict() as safetensors")->required();
    cmd->add_option("--query", o.query, "[B, L, E] float")->required();
    cmd->add_option("--key", o.key, "[B, S, kdim] (default: the query)");
    cmd->add_option("--value", o.value, "[B, S, vdim] (default: the key)");
    cmd->add_option("--heads", o.heads, "num_heads")->required()->check(integer_in(1, kInt64Max));
    cmd->add_option("--key-padding-mask", o.key_padding_mask, "bool [B, S], true = ignore");
    cmd->add_option("--attn-mask", o.attn_mask, "bool [L, S] or [B*H, L, S] (true = not allowed), or float (added)");
    causal.add(cmd);
    cmd->add_flag("--add-zero-attn", o.add_zero_attn, "PyTorch's add_zero_attn=True");
    cmd->add_option("--static-k", o.static_k,
                    "[B*H, S, head_dim]: keys already projected (PyTorch's static_k; the key projection is skipped)");
    cmd->add_option(
        "--static-v", o.static_v,
        "[B*H, S, head_dim]: values already projected (PyTorch's static_v; the value projection is skipped)");
    cmd->add_flag("--need-weights", o.need_weights, "Write attention weights (averaged over heads)");
    cmd->add_flag("--per-head-weights", o.per_head_weights, "Write weights per head [B, H, L, S]");
    out_option(cmd, o.out, "Output [B, L, E] .npy", grad.has_value());
    if (grad) grad->add(cmd);
    cmd->add_option("--weights-out", o.weights_out, "Attention weights .npy (implies --need-weights)");
    mods.add(cmd, o.mods);
    cmd->add_option("--alibi-slopes", o.alibi_slopes, "f32 [H] or [B, H]: ALiBi, score - slope*|i' - j|");
    backend.add(cmd);
    dtype.add(cmd);
    cmd->add_flag("--stats", o.stats, "Print the LLVM modules compiled for the run and the compile time (stderr)");
  }
  ModFlagsOptions mods;
  RunMha get() {
    o.causal = causal.get();
    mods.get(o.mods);
    o.backend = backend.get();
    o.dtype = dtype.get();
    if (grad) o.grad = grad->r;
    return o;
  }
};

struct RunSdpaFlags {
  RunSdpa o;
  CausalFlag causal;
  BackendFlag backend;
  DTypeFlag dtype;
  double scale = 0;
  CLI::Option* scale_opt = nullptr;
  CLI::App* cmd = nullptr;
  std::optional<GradFlags> grad;  // set before add(): qkv grad
  void add(CLI::App* run) {
    cmd = run->add_subcommand("sdpa", "Scaled dot-product attention on [B, H, L, D] tensors");
    cmd->footer("Example: qkv run sdpa --query q.npy --key k.npy --value v.npy --causal --out o.npy");
    cmd->add_option("--query", o.query, "[B, H, L, D]")->required();
    cmd->add_option("--key", o.key, "[B, H, S, D]")->required();
    cmd->add_option("--value", o.value, "[B, H, S, Dv]")->required();
    cmd->add_option("--attn-bias", o.attn_bias, "float, broadcastable to [B, H, L, S], added (-inf allowed)");
    cmd->add_option("--attn-mask", o.attn_mask, "bool, broadcastable to [B, H, L, S], true = not allowed");
    cmd->add_option("--key-padding-mask", o.key_padding_mask, "bool [B, S], true = ignore");
    causal.add(cmd);
    scale_opt = cmd->add_option("--scale", scale, "Score scale (default 1/sqrt(D))")->check(finite_number());
    cmd->add_option("--dropout", o.dropout, "Dropout probability on the weights, in [0, 1)")->check(finite_number());
    cmd->add_option("--seed", o.seed, "Dropout seed (counter-based: same seed, same mask)")->check(unsigned_integer());
    out_option(cmd, o.out, "Output [B, H, L, Dv] .npy", grad.has_value());
    if (grad) grad->add(cmd);
    cmd->add_option("--weights-out", o.weights_out, "Attention weights [B, H, L, S] .npy");
    cmd->add_option("--lse-out", o.lse_out, "Log-sum-exp of each row's scores [B, H, L] .npy (-inf: no key)");
    mods.add(cmd, o.mods);
    cmd->add_option("--alibi-slopes", o.alibi_slopes, "f32 [H] or [B, H]: ALiBi, score - slope*|i' - j|");
    cmd->add_option("--q-doc-ids", o.q_doc_ids, "int [B, L]: document of each query (with --kv-doc-ids)");
    cmd->add_option("--kv-doc-ids", o.kv_doc_ids, "int [B, S]: document of each key; only equal ids attend");
    backend.add(cmd);
    dtype.add(cmd);
    cmd->add_flag("--stats", o.stats, "Print the LLVM modules compiled for the run and the compile time (stderr)");
  }
  ModFlagsOptions mods;
  RunSdpa get() {
    o.causal = causal.get();
    mods.get(o.mods);
    if (scale_opt->count()) o.scale = scale;
    o.backend = backend.get();
    o.dtype = dtype.get();
    if (grad) o.grad = grad->r;
    return o;
  }
};

struct RunEncoderFlags {
  RunEncoder o;
  CausalFlag causal;
  BackendFlag backend;
  DTypeFlag dtype;
  CLI::App* cmd = nullptr;
  std::optional<GradFlags> grad;  // set before add(): qkv grad
  void add(CLI::App* run, bool stack) {
    o.stack = stack;
    if (stack) {
      cmd = run->add_subcommand("encoder", "nn.TransformerEncoder: layers.N.* (and norm.*) in the state dict");
      cmd->footer(
          "Example: qkv run encoder --weights gpt.safetensors --src x.npy --heads 8 --causal --norm-first --out y.npy");
    } else {
      cmd = run->add_subcommand("encoder-layer", "nn.TransformerEncoderLayer(batch_first=True), eval mode");
      cmd->footer("Example: qkv run encoder-layer --weights layer.safetensors --src x.npy --heads 4 --out y.npy");
    }
    cmd->add_option("--weights", o.weights, "state_dict() as safetensors")->required();
    cmd->add_option("--src", o.src, "[B, L, d_model]")->required();
    cmd->add_option("--heads", o.heads, "nhead")->required()->check(integer_in(1, kInt64Max));
    cmd->add_option("--activation", o.activation, "relu | gelu")
        ->check(CLI::IsMember({"relu", "gelu"}))
        ->capture_default_str();
    cmd->add_flag("--norm-first", o.norm_first, "Pre-norm (norm_first=True)");
    cmd->add_option("--layer-norm-eps", o.eps, "layer_norm_eps")->check(finite_number())->capture_default_str();
    cmd->add_option("--src-key-padding-mask", o.src_key_padding_mask, "bool [B, L], true = ignore");
    cmd->add_option("--src-mask", o.src_mask, "bool [L, L] (true = not allowed) or float (added)");
    causal.add(cmd);
    out_option(cmd, o.out, "Output [B, L, d_model] .npy", grad.has_value());
    if (grad) grad->add(cmd);
    backend.add(cmd);
    dtype.add(cmd);
    cmd->add_flag("--stats", o.stats, "Print the LLVM modules compiled for the run and the compile time (stderr)");
  }
  RunEncoder get() {
    o.causal = causal.get();
    o.backend = backend.get();
    o.dtype = dtype.get();
    if (grad) o.grad = grad->r;
    return o;
  }
};

struct RunCausalLmFlags {
  RunCausalLm o;
  BackendFlag backend;
  DTypeFlag dtype;
  QuantizeFlag quantize;
  CLI::App* cmd = nullptr;
  void add(CLI::App* run) {
    cmd = run->add_subcommand("causal-lm", "A Hugging Face decoder (llama, qwen2, mistral, gpt2): one full forward");
    cmd->footer("Example: qkv run causal-lm --model tiny-llama/ --tokens ids.npy --logits-out logits.npy");
    cmd->add_option("--model", o.model, "Folder with config.json and model.safetensors (or shards + index)")
        ->required();
    cmd->add_option("--tokens", o.tokens, "int [B, L] or [L]: token ids (positions 0 .. L-1)")->required();
    cmd->add_option("--logits-out", o.logits_out, "Output [B, L, vocab] .npy")->required();
    backend.add(cmd);
    dtype.add(cmd);
    quantize.add(cmd);
    cmd->add_flag("--stats", o.stats, "Print the LLVM modules compiled for the run and the compile time (stderr)");
  }
  RunCausalLm get() {
    o.backend = backend.get();
    o.dtype = dtype.get();
    o.quant = quantize.get();
    return o;
  }
};

struct RunEncoderModelFlags {
  RunEncoderModel o;
  BackendFlag backend;
  DTypeFlag dtype;
  CLI::App* cmd = nullptr;
  void add(CLI::App* run) {
    cmd = run->add_subcommand("encoder-model", "A Hugging Face encoder (bert): hidden states and the pooled output");
    cmd->footer("Example: qkv run encoder-model --model tiny-bert/ --tokens ids.npy --out hidden.npy");
    cmd->add_option("--model", o.model, "Folder with config.json and model.safetensors (or shards + index)")
        ->required();
    cmd->add_option("--tokens", o.tokens, "int [B, L] or [L]: token ids (positions 0 .. L-1)")->required();
    cmd->add_option("--attention-mask", o.attention_mask,
                    "int or bool [B, L]: 1 for a real token, 0 for padding (keys with 0 are not attended to)");
    cmd->add_option("--token-type-ids", o.token_type_ids, "int [B, L]: segment ids (default all 0)");
    cmd->add_option("--out,-o", o.out, "Output: the last hidden state [B, L, hidden] .npy")->required();
    cmd->add_option("--pooled-out", o.pooled_out, "Output: the pooler's output [B, hidden] .npy");
    backend.add(cmd);
    dtype.add(cmd);
    cmd->add_flag("--stats", o.stats, "Print the LLVM modules compiled for the run and the compile time (stderr)");
  }
  RunEncoderModel get() {
    o.backend = backend.get();
    o.dtype = dtype.get();
    return o;
  }
};

struct GenerateFlags {
  Generate o;
  BackendFlag backend;
  DTypeFlag dtype;
  QuantizeFlag quantize;
  CLI::App* cmd = nullptr;
  bool json = false;
  /// bench: `qkv bench generate` (--out optional, --json).
  void add(CLI::App* app, bool bench = false) {
    cmd = app->add_subcommand("generate", bench ? "Time a Hugging Face decoder: prefill and decode tokens/s"
                                                : "A Hugging Face decoder continuing prompts, with a KV cache");
    cmd->footer(
        bench ? "Example: qkv bench generate --model tiny-llama/ --prompt-ids ids.npy --new-tokens 256 --json"
              : "Example: qkv generate --model tiny-llama/ --prompt-ids ids.npy --new-tokens 16 --out out_ids.npy");
    cmd->add_option("--model", o.model, "Folder with config.json and model.safetensors (or shards + index)")
        ->required();
    auto* ids = cmd->add_option("--prompt-ids", o.prompt_ids,
                                "int [B, L] or [L]: the prompts' token ids; a shorter prompt's row ends in -1s (one "
                                "batch of prompts of different lengths)");
    auto* text = cmd->add_option("--prompt", o.prompt,
                                 "The prompt as text, encoded by the model folder's SentencePiece tokenizer.model "
                                 "(the prompt and its continuation are printed on stdout)");
    ids->excludes(text);
    cmd->add_option("--new-tokens", o.new_tokens, "Tokens to generate")
        ->check(integer_in(1, kInt64Max))
        ->capture_default_str();
    auto* out =
        cmd->add_option("--out,-o", o.out,
                        "Output int64 [B, L + new] .npy: the prompts and their continuations (a shorter prompt's "
                        "row ends in -1s)");
    if (!bench) out->required();
    if (bench) {
      cmd->add_flag("--json", json, "One JSON object on stdout");
      cmd->add_option("--repeat", o.repeat, "Timed runs (prefill and decode each); their medians are reported")
          ->check(integer_in(1, 1000))
          ->capture_default_str();
    }
    cmd->add_option("--logits-out", o.logits_out, "Output [B, new, vocab] .npy: the logits each token was chosen from");
    cmd->add_option("--temperature", o.temperature, "0 (the default): greedy; > 0: sample softmax(logits / T)")
        ->check(finite_number());
    cmd->add_option("--top-k", o.top_k, "Sample among the k most likely tokens (with --temperature)")
        ->check(integer_in(0, kInt64Max));
    cmd->add_option("--seed", o.seed, "The sampler's seed")->check(unsigned_integer());
    cmd->add_option("--threads", o.threads, "CPU threads (0: one per hardware thread)")->check(integer_in(0, 4096));
    auto* repack = cmd->add_flag_callback(
        "--repack", [this] { o.repack = true; },
        "cpu backend: pack the linear layers' weights for the GEMM once and keep them (a second copy: faster "
        "repeated prefills; the default when the batch's decode steps run on the GEMM, more than " +
            std::to_string(codegen::cpu::gemv_max_rows()) + " rows)");
    auto* no_repack = cmd->add_flag_callback(
        "--no-repack", [this] { o.repack = false; },
        "cpu backend: keep no packed copy (each prefill packs them anew: peak memory about the weights' size; the "
        "default for a smaller batch, whose decode steps read the weights in place)");
    repack->excludes(no_repack);
    cmd->add_flag_callback(
        "--no-mmap", [this] { o.mmap = false; },
        "Copy the weights into memory of qkv's own instead of reading them where the checkpoint's files are mapped "
        "(the files may then change while it runs; more memory, a slower start)");
    backend.add(cmd);
    dtype.add(cmd);
    quantize.add(cmd);
  }
  Generate get() {
    o.backend = backend.get();
    o.dtype = dtype.get();
    o.quant = quantize.get();
    return o;
  }
};

/// A model by shape (shapes, bench, verify, emit).
struct ShapeFlags {
  ShapeModel m;
  CausalFlag causal;
  void add(CLI::App* app) {
    const auto positive = integer_in(1, kInt64Max), non_negative = integer_in(0, kInt64Max);
    app->add_option("model", m.kind, "sdpa | mha | encoder-layer")
        ->required()
        ->check(CLI::IsMember({"sdpa", "mha", "encoder-layer"}));
    app->add_option("--batch", m.batch, "Batch size")->check(positive)->capture_default_str();
    app->add_option("--heads", m.heads, "Attention heads")->required()->check(positive);
    app->add_option("--kv-heads", m.kv_heads, "Key/value heads (grouped-query attention)")->check(non_negative);
    app->add_option("--seq", m.seq, "Query length L")->required()->check(positive);
    app->add_option("--kv-seq", m.kv_seq, "Key length S (default: L)")->check(non_negative);
    auto* d = app->add_option("--head-dim", m.head_dim, "Per-head width D")->check(positive);
    auto* e = app->add_option("--embed-dim", m.embed_dim, "Model width E (= heads * D)")->check(positive);
    d->excludes(e);
    app->add_option("--ffn-dim", m.ffn_dim, "Feed-forward width (encoder-layer; default 4E)")->check(positive);
    causal.add(app);
    app->add_flag("--padding", m.padding, "Pad each sequence after a seeded length");
    app->add_option("--seed", m.seed, "Seed for weights and inputs")->check(unsigned_integer())->capture_default_str();
    mods.add(app, m.mods);
    app->add_flag("--alibi", m.alibi, "sdpa: ALiBi with the paper's slopes 2^(-8(h+1)/H)");
    app->add_option("--documents", m.documents, "sdpa: N packed documents of equal length (a document mask)")
        ->check(positive);
    dtype.add(app);
  }
  ModFlagsOptions mods;
  DTypeFlag dtype;
  ShapeModel get() {
    m.causal = causal.get();
    m.dtype = dtype.get();
    mods.get(m.mods);
    return m;
  }
};

/// qkv train.
struct TrainFlags {
  Train o;
  BackendFlag backend;
  CLI::App* cmd = nullptr;
  void add(CLI::App* app) {
    cmd = app->add_subcommand("train", "Train a Hugging Face decoder (llama, qwen2, mistral, gpt2) on a text file");
    cmd->footer(
        "Example: qkv train --config tiny/config.json --data corpus.txt --steps 200 --batch 8 --seq 64 --lr 1e-3 "
        "--out run/ --plot loss.png\n"
        "Tokens are the text's bytes (vocab_size >= 256). A resumed run (--resume DIR) keeps its settings and equals "
        "an uninterrupted one bit for bit; Ctrl-C saves a checkpoint and stops.");
    auto* config =
        cmd->add_option("--config", o.config, "config.json as Hugging Face writes it: random initial weights");
    auto* model = cmd->add_option("--model", o.model, "A checkpoint folder to start from (config.json + safetensors)");
    auto* resume = cmd->add_option("--resume", o.resume, "A qkv train checkpoint folder: continue that run");
    config->excludes(model)->excludes(resume);
    model->excludes(resume);
    cmd->add_option("--data", o.data, "The text to train on (its bytes are the tokens, unless --tokenizer)")
        ->required();
    cmd->add_option("--tokenizer", o.tokenizer,
                    "A SentencePiece tokenizer.model: the text's tokens are its pieces (BOS first), and every "
                    "checkpoint carries it (generate --prompt then works); a resumed run keeps its own");
    cmd->add_option("--out,-o", o.out, "Folder for checkpoints (created; may be the --resume folder)")->required();
    cmd->add_option("--steps", o.steps, "Steps in all, counting those of a resumed run (default 100)")
        ->check(integer_in(1, kInt64Max));
    cmd->add_option("--stop-at", o.stop_at,
                    "Stop after this step and save (the schedule still spans --steps: --resume goes on)")
        ->check(integer_in(1, kInt64Max));
    cmd->add_option("--batch", o.batch, "Sequences per step (default 8)")->check(integer_in(1, 1 << 20));
    cmd->add_option("--accumulate", o.accumulate,
                    "Gradient accumulation: each step sums the gradients of this many micro-batches of --batch "
                    "sequences, then updates once (as --batch times this many, in less memory; default 1)")
        ->check(integer_in(1, 1 << 20));
    cmd->add_option("--seq", o.seq, "Tokens per sequence (default 64)")->check(integer_in(1, 1 << 24));
    cmd->add_option("--optimizer", o.optimizer, "adamw (default) | sgd")->check(CLI::IsMember({"adamw", "sgd"}));
    cmd->add_option("--dtype", o.dtype,
                    "f32 (default) | bf16: the model computed in bf16 over f32 master weights (the loss, the "
                    "optimizer and the checkpoints f32)")
        ->check(CLI::IsMember({"f32", "bf16"}));
    cmd->add_option("--lr", o.lr, "Peak learning rate (default 1e-3)")->check(finite_number());
    cmd->add_option("--min-lr", o.min_lr, "Learning rate at the last step (cosine; default lr / 10)")
        ->check(finite_number());
    cmd->add_option("--warmup", o.warmup, "Steps of linear warmup (default 0)")->check(integer_in(0, kInt64Max));
    cmd->add_option("--schedule", o.schedule, "cosine (default) | constant, after the warmup")
        ->check(CLI::IsMember({"cosine", "constant"}));
    cmd->add_option("--weight-decay", o.weight_decay, "Decoupled (AdamW) or L2 (SGD) weight decay (default 0.1)")
        ->check(finite_number());
    cmd->add_option("--beta1", o.beta1, "AdamW's beta1 (default 0.9)")->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--beta2", o.beta2, "AdamW's beta2 (default 0.95)")->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--eps", o.eps, "AdamW's eps (default 1e-8)")->check(finite_number());
    cmd->add_option("--momentum", o.momentum, "SGD's momentum (default 0.9)")->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--max-grad-norm", o.max_grad_norm, "Clip the gradients' global L2 norm (0: off; default 1)")
        ->check(CLI::Range(0.0, 1e30));
    cmd->add_option("--label-smoothing", o.label_smoothing, "Cross-entropy label smoothing (default 0)")
        ->check(CLI::Range(0.0, 1.0));
    cmd->add_option("--val-fraction", o.val_fraction, "The end of the text held out for validation (default 0.1)")
        ->check(CLI::Range(0.0, 0.9));
    cmd->add_option("--seed", o.seed, "Initial weights and batches (default 0)")->check(unsigned_integer());
    cmd->add_option("--eval-every", o.eval_every, "Validation loss every N steps (default steps / 10)")
        ->check(integer_in(1, kInt64Max));
    cmd->add_option("--eval-batches", o.eval_batches, "Batches of validation windows (default 4)")
        ->check(integer_in(1, 1 << 20));
    cmd->add_option("--save-every", o.save_every, "Also checkpoint every N steps (default: at the end only)")
        ->check(integer_in(1, kInt64Max));
    cmd->add_option("--log-every", o.log_every, "A progress line every N steps (default steps / 50)")
        ->check(integer_in(1, kInt64Max));
    cmd->add_option("--log-json", o.log_json, "Write the loss history as JSON (with every checkpoint)");
    cmd->add_option("--plot", o.plot, "Write the loss curves as a PNG (with every checkpoint)");
    cmd->add_option("--threads", o.threads, "CPU threads (0: one per hardware thread)")->check(integer_in(0, 4096));
    backend.add(cmd, "cpu (compiled kernels) | reference (the interpreter)");
  }
  Train get() {
    o.backend = backend.get();
    return o;
  }
};

/// The first word on the command line that is not a command of its parent ("generate" in
/// `qkv generate --help`, which CLI11 would answer with the top-level help and exit 0).
std::optional<std::string> unknown_command(CLI::App& app, int argc, char** argv) {
  CLI::App* at = &app;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word.empty() || word[0] == '-') return std::nullopt;
    if (at->get_subcommands([](CLI::App*) { return true; }).empty()) return std::nullopt;  // a positional
    const auto match = at->get_subcommands([&](CLI::App* s) { return s->get_name() == word; });
    if (match.empty()) return word;
    at = match.front();
  }
  return std::nullopt;
}

/// `message` as one line: control characters (a newline in a file name, a compiler's report)
/// are written as escapes.
std::string one_line(const std::string& message) {
  std::string out;
  for (char c : message) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n')
      out += "\\n";
    else if (u < 0x20 || u == 0x7f)
      out += "\\x" + std::string(1, "0123456789abcdef"[u >> 4]) + "0123456789abcdef"[u & 15];
    else
      out += c;
  }
  return out;
}

int usage_error(const std::string& message) {
  std::cerr << "qkv: error: " << one_line(message) << "\nRun with --help for more information.\n";
  return 2;
}

}  // namespace

/// body(), with every error one line: a usage error (2) or a failure (1).
int guarded(const std::function<int()>& body) {
  try {
    return body();
  } catch (const UsageError& e) {
    return usage_error(e.what());
  } catch (const OutputRefused& e) {
    return usage_error(e.what());
  } catch (const std::exception& e) {
    const auto oom = describe_out_of_memory(e);
    std::cerr << "qkv: error: " << one_line(oom ? *oom : e.what()) << "\n";
    return 1;
  }
}

/// Parses the command line into `app`: nullopt to go on, else the exit code (help, version: 0;
/// a parse error, said in one line: 2).
std::optional<int> parse(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    app.exit(e);
    return 2;
  }
  return std::nullopt;
}

/// CLI11's own parse errors read like ours: "qkv: error: …" and a pointer to --help (exit 2).
void say_errors_our_way(CLI::App& app) {
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "qkv: error: " + one_line(e.what()) + "\nRun with --help for more information.\n";
  });
}

/// `qkv bench generate …`: its own parser (the other `bench` models are given by shape, with
/// required shape flags this one does not have).
int run_bench_generate(int argc, char** argv) {
  CLI::App app{"qkv bench"};
  say_errors_our_way(app);
  app.require_subcommand(1);
  GenerateFlags gen;
  gen.add(&app, /*bench=*/true);
  if (const auto code = parse(app, argc, argv)) return *code;
  return guarded([&] { return bench_generate(gen.get(), gen.json); });
}

/// `qkv emit train-step …`: its own parser (emit's other models are given by shape, with
/// required shape flags this one does not have).
int run_emit_train_step(int argc, char** argv) {
  CLI::App app{"qkv emit"};
  say_errors_our_way(app);
  app.require_subcommand(1);
  EmitTrainStep o;
  auto* cmd = app.add_subcommand(
      "train-step", "Compile one training step of a Hugging Face decoder (loss, gradients, optimizer) as a C function");
  cmd->footer(
      "Example: qkv emit train-step --config tiny-llama/config.json --batch 2 --seq 7 --optimizer adamw "
      "--out build/train/\n(the header documents the arguments; docs/aot.md, \"Training step\")");
  const auto positive = integer_in(1, kInt64Max);
  auto* config =
      cmd->add_option("--config", o.config, "The model's config.json (Hugging Face), or a folder holding it");
  auto* model = cmd->add_option("--model", o.config, "A model folder with config.json (the weights are not read)");
  config->excludes(model);
  cmd->add_option("--batch", o.batch, "Sequences per step")->check(positive)->capture_default_str();
  cmd->add_option("--seq", o.seq, "Tokens per sequence")->required()->check(positive);
  cmd->add_option("--optimizer", o.optimizer, "adamw | sgd")
      ->check(CLI::IsMember({"adamw", "sgd"}))
      ->capture_default_str();
  cmd->add_option("--weight-decay", o.weight_decay, "Decoupled (adamw; default 0.01) or L2 (sgd; default 0)")
      ->check(number_in(0, 1e30));
  cmd->add_option("--beta1", o.beta1, "adamw (default 0.9)")->check(number_in(0, 1, true));
  cmd->add_option("--beta2", o.beta2, "adamw (default 0.999)")->check(number_in(0, 1, true));
  cmd->add_option("--eps", o.eps, "adamw (default 1e-8)")->check(number_in(1e-300, 1e30));
  cmd->add_option("--momentum", o.momentum, "sgd (default 0: no state)")->check(number_in(0, 1e30));
  cmd->add_option("--max-grad-norm", o.max_grad_norm, "Clip the gradients to this global L2 norm (0: off)")
      ->check(number_in(0, 1e30))
      ->capture_default_str();
  cmd->add_option("--label-smoothing", o.label_smoothing, "The loss's label smoothing")
      ->check(number_in(0, 1))
      ->capture_default_str();
  cmd->add_option("--dtype", o.dtype,
                  "f32 | bf16: the model computed in bf16 over the f32 weights (loss and optimizer in f32)")
      ->check(CLI::IsMember({"f32", "bf16"}))
      ->capture_default_str();
  cmd->add_option("--ignore-index", o.ignore_index, "Targets equal to it count for nothing")
      ->check(integer_in(std::numeric_limits<std::int64_t>::min(), kInt64Max))
      ->capture_default_str();
  cmd->add_option("--target", o.target, "cpu (this host's architecture) | x86_64 | aarch64")
      ->check(CLI::IsMember({"cpu", "x86_64", "aarch64"}))
      ->capture_default_str();
  cmd->add_option("--cpu", o.cpu, "As qkv emit's --cpu (default native, or generic for another architecture)");
  cmd->add_option("--features", o.features, "Features added to or removed from the CPU's (LLVM's names)");
  cmd->add_option("--format", o.format, "so (default) | obj | ll | asm")
      ->check(CLI::IsMember({"so", "obj", "ll", "asm"}));
  cmd->add_option("--out,-o", o.out,
                  "Output file, or a directory for <function>.so/.o/.ll/.s (obj and so: the header goes beside it)")
      ->required();
  cmd->add_option("--function", o.function,
                  "C name of the generated function (default qkv_train; the wrapper is <function>_step)");
  if (const auto code = parse(app, argc, argv)) return *code;
  return guarded([&] { return emit_train_step(o); });
}

int run_cli(int argc, char** argv) {
  const Activity setup("reading the command line");
  if (argc >= 3 && std::string_view(argv[1]) == "bench" && std::string_view(argv[2]) == "generate")
    return run_bench_generate(argc - 1, argv + 1);
  if (argc >= 3 && std::string_view(argv[1]) == "emit" && std::string_view(argv[2]) == "train-step")
    return run_emit_train_step(argc - 1, argv + 1);
  CLI::App app{"qkv: attention models with shapes in the type system, compiled to fused kernels"};
  say_errors_our_way(app);
  app.set_version_flag("--version", std::string("qkv ") + QKV_VERSION);
  app.require_subcommand(1);
  app.footer("Run `qkv <command> --help` for the flags of a command.");

  // --- run
  auto* run = app.add_subcommand("run", "Run a PyTorch attention module on .npy inputs")->require_subcommand(1);
  RunMhaFlags mha;
  mha.add(run);
  RunSdpaFlags sdpa;
  sdpa.add(run);
  RunEncoderFlags layer, stack;
  layer.add(run, false);
  stack.add(run, true);
  // qkv grad: the same models and flags, differentiated.
  auto* grad_cmd = app.add_subcommand("grad", "Gradients of a PyTorch attention module (its backward, on .npy inputs)")
                       ->require_subcommand(1);
  grad_cmd->footer(
      "Example: qkv grad mha --weights mha.safetensors --query q.npy --heads 8 --grad-output do.npy --grads-out "
      "grads/");
  RunMhaFlags grad_mha;
  RunSdpaFlags grad_sdpa;
  RunEncoderFlags grad_layer, grad_stack;
  for (auto* f : {&grad_mha.grad, &grad_sdpa.grad, &grad_layer.grad, &grad_stack.grad}) f->emplace();
  grad_mha.add(grad_cmd);
  grad_sdpa.add(grad_cmd);
  grad_layer.add(grad_cmd, false);
  grad_stack.add(grad_cmd, true);
  RunCausalLmFlags causal_lm;
  causal_lm.add(run);
  RunEncoderModelFlags encoder_model;
  encoder_model.add(run);
  GenerateFlags gen;
  gen.add(&app);
  TrainFlags train_flags;
  train_flags.add(&app);
  QuantizeModel quantize_opts;
  auto* quantize_cmd = app.add_subcommand(
      "quantize",
      "Write a decoder checkpoint with its linear layers' weights stored q8 or q4 (8.5 or 4.5 bits a weight)");
  quantize_cmd->footer(
      "Example: qkv quantize --model tiny-llama/ --out tiny-llama-q4/ --type q4\nThe folder it writes runs in "
      "generate, bench generate and run causal-lm as it is (no --quantize needed).");
  quantize_cmd
      ->add_option_function<std::string>(
          "--type", [&](const std::string& v) { quantize_opts.format = *parse_quant(v); },
          "q8 | q4: 8-bit integers (llama.cpp's Q8_0 layout) or 4-bit ones (Q4_0's; q8 for a weight whose rows are "
          "not whole groups of 32), an f16 scale per 32")
      ->check(CLI::IsMember({"q8", "q4"}))
      ->default_str("q8");
  quantize_cmd->add_option("--model", quantize_opts.model, "Folder with config.json and model.safetensors (or shards)")
      ->required();
  quantize_cmd
      ->add_option("--out,-o", quantize_opts.out,
                   "Output folder: config.json, model.safetensors (and tokenizer.model when the model has one)")
      ->required();

  // --- models by shape
  ShapeFlags shape_flags;
  auto* shapes_cmd = app.add_subcommand("shapes", "Print a model's shape table (op, inputs, output axes and sizes)");
  shapes_cmd->footer("Example: qkv shapes mha --batch 2 --heads 2 --seq 4 --embed-dim 16");
  shape_flags.add(shapes_cmd);
  std::string dump_after;
  bool time_passes = false;
  shapes_cmd->add_option("--dump-after", dump_after,
                         "Also print the graph after a pass of the CPU pipeline (or 'all')");
  shapes_cmd->add_flag("--time-passes", time_passes, "Also time each pass of the CPU pipeline");

  Bench bench_opts;
  ShapeFlags bench_flags;
  BackendFlag bench_backend;
  auto* bench_cmd = app.add_subcommand("bench",
                                       "Time a model: median/min/max ms, GFLOP/s, peak memory (cpu: run as a loop runs "
                                       "it, weights packed once and buffers kept)");
  bench_cmd->footer("Example: qkv bench sdpa --batch 1 --heads 8 --seq 512 --head-dim 64 --causal --json");
  bench_flags.add(bench_cmd);
  bench_backend.add(bench_cmd);
  bench_cmd->add_option("--threads", bench_opts.threads, "Threads (cpu backend; 0: one per hardware thread)")
      ->check(integer_in(0, kIntMax));
  bench_cmd->add_option("--repeat", bench_opts.repeat, "Timed runs after one warm-up")
      ->check(integer_in(1, kIntMax))
      ->capture_default_str();
  bench_cmd->add_flag("--json", bench_opts.json, "One JSON object on stdout");

  Verify verify_opts;
  ShapeFlags verify_flags;
  BackendFlag verify_backend;
  auto* verify_cmd = app.add_subcommand("verify", "Run a backend and the reference interpreter on the same inputs");
  verify_cmd->footer("Example: qkv verify sdpa --batch 1 --heads 2 --seq 33 --head-dim 64 --backend cpu");
  verify_flags.add(verify_cmd);
  verify_backend.add(verify_cmd, "cpu | cuda");
  verify_cmd
      ->add_option("--tolerance", verify_opts.tolerance,
                   "Largest allowed max abs error (default: 1e-4 for f32, 1e-2 for f16, 5e-2 for bf16)")
      ->check(finite_number());

  Heatmap hm;
  std::int64_t head = 0;
  auto* heatmap_cmd = app.add_subcommand("heatmap", "Attention weights as a PNG heatmap");
  heatmap_cmd->footer("Example: qkv heatmap --weights w.npy --tokens \"the cat sat\" --all-heads --out heat.png");
  heatmap_cmd->add_option("--weights", hm.weights, "[B, L, S] or [B, H, L, S] .npy")->required();
  auto* tok = heatmap_cmd->add_option("--tokens", hm.tokens, "Tokens for both axes, space separated");
  auto* tokf = heatmap_cmd->add_option("--tokens-file", hm.tokens_file, "File of whitespace-separated tokens");
  tok->excludes(tokf);
  heatmap_cmd->add_option("--query-tokens", hm.query_tokens, "Row labels");
  heatmap_cmd->add_option("--key-tokens", hm.key_tokens, "Column labels");
  heatmap_cmd->add_option("--batch-index", hm.batch_index, "Which sequence of the batch")
      ->check(integer_in(0, kInt64Max))
      ->capture_default_str();
  auto* head_opt =
      heatmap_cmd->add_option("--head", head, "One head (default: mean over heads)")->check(integer_in(0, kInt64Max));
  auto* all_opt = heatmap_cmd->add_flag("--all-heads", hm.all_heads, "One panel per head");
  head_opt->excludes(all_opt);
  heatmap_cmd->add_option("--title", hm.title, "Title");
  heatmap_cmd->add_option("--out,-o", hm.out, "PNG file")->required();

  Emit emit_opts;
  ShapeFlags emit_flags;
  auto* emit_cmd = app.add_subcommand("emit", "Compile a model ahead of time (.ll/.s/.o/.so + C header, or .ptx)");
  emit_cmd->footer(
      "Example: qkv emit mha --batch 1 --heads 8 --seq 128 --embed-dim 512 --target cpu --cpu x86-64-v3 --format so "
      "-o mha.so\nA decoder's training step: qkv emit train-step --help");
  emit_flags.add(emit_cmd);
  QuantizeFlag emit_quantize;
  emit_quantize.add(emit_cmd);
  emit_cmd->add_option("--target", emit_opts.target, "cpu (this host's architecture) | x86_64 | aarch64 | nvptx")
      ->check(CLI::IsMember({"cpu", "x86_64", "aarch64", "nvptx"}))
      ->capture_default_str();
  emit_cmd->add_option("--cpu", emit_opts.cpu,
                       "native | x86-64 | x86-64-v2 | x86-64-v3 | x86-64-v4 | an LLVM CPU name (aarch64: generic | "
                       "neoverse-n1 | neoverse-v1 | …); default native, or generic for another architecture");
  emit_cmd->add_option("--features", emit_opts.features,
                       "Features added to or removed from the CPU's, e.g. -avx512f or +avx512bf16 (LLVM's names)");
  emit_cmd->add_option("--sm", emit_opts.sm, "80 | 86 | 87 | 89 | 90 (nvptx)")
      ->check(integer_in(0, kIntMax))
      ->capture_default_str();
  emit_cmd->add_option("--format", emit_opts.format, "ll | asm | obj | so (cpu; default so) | ptx (nvptx)")
      ->check(CLI::IsMember({"ll", "asm", "obj", "so", "ptx"}));
  emit_cmd
      ->add_option("--out,-o", emit_opts.out,
                   "Output file (obj/so: the C header goes beside it, .h; nvptx with several kernels: a "
                   "directory)")
      ->required();
  emit_cmd->add_option("--function", emit_opts.function,
                       "C name of the generated function (default qkv_<model>); not a keyword or a C library name");
  emit_cmd
      ->add_option("--dynamic", emit_opts.dynamic,
                   "Sizes the function takes at run time as int64_t arguments, e.g. Batch,Seq,Key (cpu; "
                   "default: every size fixed)")
      ->delimiter(',');
  emit_cmd->add_option("--example-dir", emit_opts.example_dir,
                       "Also write the seeded inputs and the reference outputs there, one .npy per argument");
  auto* host_cmd = app.add_subcommand("host", "Print the host CPU as the code generator sees it");

  if (const auto word = unknown_command(app, argc, argv)) return usage_error("unknown command '" + *word + "'");
  if (const auto code = parse(app, argc, argv)) return *code;

  return guarded([&]() -> int {
    if (*mha.cmd) return run_mha(mha.get());
    if (*grad_mha.cmd) return run_mha(grad_mha.get());
    if (*grad_sdpa.cmd) return run_sdpa(grad_sdpa.get());
    if (*grad_layer.cmd) return run_encoder(grad_layer.get());
    if (*grad_stack.cmd) return run_encoder(grad_stack.get());
    if (*sdpa.cmd) return run_sdpa(sdpa.get());
    if (*layer.cmd) return run_encoder(layer.get());
    if (*stack.cmd) return run_encoder(stack.get());
    if (*causal_lm.cmd) return run_causal_lm(causal_lm.get());
    if (*encoder_model.cmd) return run_encoder_model(encoder_model.get());
    if (*gen.cmd) return generate(gen.get());
    if (*train_flags.cmd) return train(train_flags.get());
    if (*quantize_cmd) return quantize_model(quantize_opts);
    if (*shapes_cmd) return shapes(shape_flags.get(), dump_after, time_passes);
    if (*bench_cmd) {
      bench_opts.model = bench_flags.get();
      bench_opts.backend = bench_backend.get();
      return bench(bench_opts);
    }
    if (*verify_cmd) {
      verify_opts.model = verify_flags.get();
      verify_opts.backend = verify_backend.get();
      return verify(verify_opts);
    }
    if (*heatmap_cmd) {
      if (head_opt->count()) hm.head = head;
      return heatmap(hm);
    }
    if (*emit_cmd) {
      emit_opts.model = emit_flags.get();
      emit_opts.quant = emit_quantize.get();
      return emit(emit_opts);
    }
    if (*host_cmd) return host();
    return 0;
  });
}

}  // namespace qkv::cli
