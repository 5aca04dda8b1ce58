// The qkv subcommands, free of CLI11: cli.cpp parses flags into these structs and calls the
// functions. Errors: UsageError and OutputRefused (exit 2) for flags that make no sense together
// and for outputs that cannot be written as asked; anything about input files and their contents,
// and running out of memory, throws another std::exception (exit 1).
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <qkv/runtime/quantize.hpp>

#include "models.hpp"

namespace qkv::cli {

/// The whole command line: parses argv (CLI11), runs the command, prints any error as one line
/// on stderr and returns the exit code (0, 1 or 2; docs/cli.md). main.cpp adds the
/// out-of-memory handlers (out_of_memory.hpp) around it.
int run_cli(int argc, char** argv);

class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

enum class Backend { reference, cpu, cuda };
Backend parse_backend(const std::string& s);
/// --dtype: f32 | bf16 | f16, how the model stores its floats (qkv/ir/float_dtype.hpp).
DType parse_dtype(const std::string& s);
/// Parses an optional --causal value ("" = given without alignment).
Causal parse_causal(const std::optional<std::string>& flag, std::int64_t len_q, std::int64_t len_k);

/// The score / mask modification flags `run sdpa`, `run mha` and the shape commands share.
struct ModFlags {
  std::string window, align;  // "LEFT,RIGHT"; "top-left" | "bottom-right"
  std::optional<double> softcap;
  std::optional<std::int64_t> prefix_len;
};

/// qkv grad: a run command's model differentiated — the gradients of L = Σ out ⊙ dO (dO: the
/// output's gradient, as PyTorch's out.backward(dO)) by every float input and weight, written
/// to a folder as d<name>.npy (commands_run.cpp, run_gradients).
struct GradRequest {
  std::string grad_output;  // dO [the output's shape] .npy
  std::string grads_out;    // the folder (created when it does not exist)
};

struct RunMha {
  std::string weights, query, key, value, key_padding_mask, attn_mask, out, weights_out;
  std::string static_k, static_v;   // PyTorch's static_k / static_v: [B*H, S, head_dim]
  std::optional<GradRequest> grad;  // qkv grad mha
  std::int64_t heads = 0;
  std::optional<std::string> causal;
  ModFlags mods;
  std::string alibi_slopes;  // f32 [H] or [B, H]
  bool add_zero_attn = false, need_weights = false, per_head_weights = false;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  bool stats = false;  // print what was compiled, and the time, to stderr
};
/// The flags as Mods (without ALiBi and documents, whose inputs each command makes), or
/// UsageError. `positional`: ALiBi is on too (so an alignment is needed when L != S).
Mods parse_mod_flags(const ModFlags& f, bool alibi, std::int64_t len_q, std::int64_t len_k);

struct RunSdpa {
  std::string query, key, value, attn_bias, attn_mask, key_padding_mask, out, weights_out, lse_out;
  std::optional<GradRequest> grad;  // qkv grad sdpa
  std::optional<std::string> causal;
  ModFlags mods;
  std::string alibi_slopes, q_doc_ids, kv_doc_ids;
  std::optional<double> scale;
  double dropout = 0.0;
  std::uint64_t seed = 0;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  bool stats = false;
};
struct RunEncoder {
  std::string weights, src, src_key_padding_mask, src_mask, out;
  std::optional<GradRequest> grad;  // qkv grad encoder-layer / encoder
  std::int64_t heads = 0;
  std::string activation = "relu";
  bool norm_first = false, stack = false;
  double eps = 1e-5;
  std::optional<std::string> causal;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  bool stats = false;
};
/// qkv run causal-lm: one full forward of a Hugging Face decoder (commands_decoder.cpp).
struct RunCausalLm {
  std::string model, tokens, logits_out;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  std::optional<Quant> quant;  // --quantize q8 | q4: the linear layers' weights as integers (qkv/runtime/quantize.hpp)
  bool stats = false;
};
int run_causal_lm(const RunCausalLm& o);

/// qkv run encoder-model: a Hugging Face encoder (bert) on token ids (commands_decoder.cpp).
struct RunEncoderModel {
  std::string model, tokens, attention_mask, token_type_ids, out, pooled_out;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  bool stats = false;
};
int run_encoder_model(const RunEncoderModel& o);

/// qkv generate: a prefill of the prompt, then one token at a time against the KV cache.
struct Generate {
  std::string model, prompt_ids, out, logits_out;
  std::string prompt;  // text, through the model folder's tokenizer.model (instead of prompt_ids)
  std::int64_t new_tokens = 16;
  double temperature = 0.0;  // 0: greedy
  std::int64_t top_k = 0;    // 0: every token
  std::uint64_t seed = 0;
  Backend backend = Backend::cpu;
  DType dtype = DType::f32;
  std::optional<Quant> quant;  // --quantize q8 | q4
  int threads = 0;
  std::int64_t repeat = 1;  // bench generate: timed runs, their medians reported
  /// cpu: the linear layers' weights packed once and kept (--repack), or packed by each step that
  /// multiplies them on the GEMM (--no-repack); unset: kept only when the decode steps run on the
  /// GEMM (a batch past codegen::cpu::gemv_max_rows), whose steps would otherwise pack every time.
  std::optional<bool> repack;
  bool mmap = true;  // the weights read where the checkpoint's files are mapped (--no-mmap: copied)
};
int generate(const Generate& o);
/// qkv quantize: a decoder checkpoint with its linear layers' weights stored q8 or q4 (commands_decoder.cpp).
struct QuantizeModel {
  std::string model, out;
  Quant format = Quant::q8;
};
int quantize_model(const QuantizeModel& o);
/// qkv train: a decoder trained on a text file (commands_train.cpp). The optional settings, when
/// given, override the defaults of a fresh run and must equal those of a resumed one.
struct Train {
  std::string config, model, resume;  // config.json (random weights), a checkpoint, or a run to continue
  std::string data, out, log_json, plot;
  std::string tokenizer;  // a SentencePiece tokenizer.model; empty: byte tokens
  std::optional<std::int64_t> steps, batch, seq, warmup, eval_every, eval_batches, save_every, log_every;
  std::optional<std::int64_t> accumulate;
  std::optional<std::int64_t> stop_at;  // stop (and save) after this step; the schedule still spans --steps
  std::optional<std::string> optimizer, schedule;
  std::optional<std::string> dtype;  // f32 | bf16: the compute dtype over f32 master weights
  std::optional<double> lr, min_lr, weight_decay, beta1, beta2, eps, momentum, max_grad_norm, label_smoothing,
      val_fraction;
  std::optional<std::uint64_t> seed;
  Backend backend = Backend::cpu;
  int threads = 0;
};
/// Exit 0 when the last step is done, 130 when a signal stopped the run (after saving).
int train(const Train& t);

/// qkv bench generate: the same run, timed (prefill and decode tokens/s, the decode attention's
/// GB/s at the model's shape, modules compiled and memory after the first step); --out optional.
int bench_generate(const Generate& o, bool json);

int run_mha(const RunMha& o);
int run_sdpa(const RunSdpa& o);
int run_encoder(const RunEncoder& o);

/// A model given by shape alone (for shapes, bench, verify): weights and inputs are drawn
/// from a seeded generator.
struct ShapeModel {
  std::string kind;  // sdpa | mha | encoder-layer
  std::int64_t batch = 1, heads = 1, kv_heads = 0, seq = 0, kv_seq = 0, head_dim = 0, embed_dim = 0, ffn_dim = 0;
  std::optional<std::string> causal;
  bool padding = false;
  std::uint64_t seed = 0;
  ModFlags mods;               // sdpa only
  bool alibi = false;          // slopes 2^(-8(h+1)/H), as in the ALiBi paper
  std::int64_t documents = 0;  // that many equal-length packed documents (ids i·N/L, j·N/S)
  DType dtype = DType::f32;    // how the model stores its floats (--dtype)
};
/// Prints the shape table; with `dump_after` (a pass name or "all") or `time_passes`, also runs
/// the CPU backend's pass pipeline and prints the graph after that pass / each pass's time.
int shapes(const ShapeModel& m, const std::string& dump_after = "", bool time_passes = false);
struct Bench {
  ShapeModel model;
  Backend backend = Backend::cpu;
  int threads = 0, repeat = 5;
  bool json = false;
};
int bench(const Bench& b);
struct Verify {
  ShapeModel model;
  Backend backend = Backend::cpu;
  std::optional<double> tolerance;  // default: default_tolerance(the model's dtype)
};
/// verify's default tolerance on the max abs error: 1e-4 for f32; for f16 / bf16 a few units in
/// the last place of values near 1, since the interpreter rounds each op's value to the dtype while
/// the fused kernels keep scores and sums in f32 (docs/cli.md).
double default_tolerance(DType dtype);
int verify(const Verify& v);
/// qkv host: the target, the kernels' tuning and what code built for this host requires.
int host();

struct Heatmap {
  std::string weights, tokens, tokens_file, query_tokens, key_tokens, out, title;
  std::int64_t batch_index = 0;
  std::optional<std::int64_t> head;
  bool all_heads = false;
};
int heatmap(const Heatmap& h);

/// qkv emit: a model by shape compiled ahead of time. cpu: the whole model as one C function
/// (ll | asm | obj | so; obj and so also write a C header beside the file); nvptx: the GPU
/// kernels the model launches as PTX (one: the file; several: a directory of .ptx files and
/// launches.txt). `example_dir`: also write the seeded inputs and the reference
/// interpreter's outputs there as .npy, one file per argument of the generated function.
struct Emit {
  ShapeModel model;
  std::string target = "cpu";  // cpu (the host's architecture) | x86_64 | aarch64 | nvptx
  std::string cpu;             // empty: native, or generic for another architecture
  std::string features;        // LLVM's -mattr syntax: -avx512f,+fma
  int sm = 80;
  std::string format;  // ll | asm | obj | so | ptx (default: so for cpu, ptx for nvptx)
  std::string out, function, example_dir;
  std::vector<std::string> dynamic;  // sizes left as run-time arguments of the generated function
  std::optional<Quant> quant;        // --quantize: the linear weights taken as q and scales
};
int emit(const Emit& e);

/// qkv emit train-step: one training step of a Hugging Face decoder (build_training_step) for a
/// fixed batch and length, compiled ahead of time as one C function; the header also gets the
/// weights' and the optimizer state's names and a wrapper <function>_step taking them as arrays
/// (docs/aot.md, "Training step").
struct EmitTrainStep {
  std::string config;  // config.json, or a model folder holding one
  std::int64_t batch = 1, seq = 0;
  std::string optimizer = "adamw";  // adamw | sgd
  std::optional<double> weight_decay, beta1, beta2, eps, momentum;
  double max_grad_norm = 0.0, label_smoothing = 0.0;
  std::int64_t ignore_index = -100;
  std::string dtype = "f32";  // f32 | bf16: the compute dtype over f32 weights (TrainSpec::compute)
  std::string target = "cpu", cpu, features, format;
  std::string out;  // a file, or a directory (existing, or ending in '/'): <function>.<so|o|ll|s> in it
  std::string function;
};
int emit_train_step(const EmitTrainStep& e);

}  // namespace qkv::cli
