// qkv — the command-line tool: PyTorch's attention modules on .npy/safetensors files, models by
// shape for shape tables and benchmarks, attention heatmaps.
//
// Exit codes: 0 success; 2 usage errors (unknown or missing flag, malformed value, flags that
// contradict each other, an out-of-range --head); 1 everything about files and their contents.
// CLI11 is included here only (it costs ~6 s per translation unit).
#include <exception>
#include <iostream>
#include <optional>

#include <CLI/CLI.hpp>

#include <qkv/codegen/target.hpp>
#include <qkv/ir/extent.hpp>

#include "commands.hpp"

namespace {

using namespace qkv::cli;

/// --causal [top-left|bottom-right]: a flag with an optional value.
struct CausalFlag {
  std::string value;
  CLI::Option* opt = nullptr;
  void add(CLI::App* app) {
    opt = app->add_option("--causal", value,
                          "Causal mask; with L != S say top-left (PyTorch is_causal) or bottom-right (FlashAttention)")
              ->expected(0, 1);
  }
  [[nodiscard]] std::optional<std::string> get() const {
    if (!opt || opt->count() == 0) return std::nullopt;
    return value;
  }
};

struct BackendFlag {
  std::string value = "cpu";
  void add(CLI::App* app) {
    app->add_option("--backend", value, "cpu (compiled kernels) | reference (the interpreter) | cuda")
        ->check(CLI::IsMember({"reference", "cpu", "cuda"}))
        ->capture_default_str();
  }
};

struct ShapeFlags {
  ShapeModel m;
  CausalFlag causal;
  void add(CLI::App* app) {
    app->add_option("model", m.kind, "sdpa | mha | encoder-layer")
        ->required()
        ->check(CLI::IsMember({"sdpa", "mha", "encoder-layer"}));
    app->add_option("--batch", m.batch, "Batch size")->capture_default_str();
    app->add_option("--heads", m.heads, "Attention heads")->required();
    app->add_option("--kv-heads", m.kv_heads, "Key/value heads (grouped-query attention)");
    app->add_option("--seq", m.seq, "Query length L")->required();
    app->add_option("--kv-seq", m.kv_seq, "Key length S (default: L)");
    auto* d = app->add_option("--head-dim", m.head_dim, "Per-head width D");
    auto* e = app->add_option("--embed-dim", m.embed_dim, "Model width E (= heads * D)");
    d->excludes(e);
    app->add_option("--ffn-dim", m.ffn_dim, "Feed-forward width (encoder-layer; default 4E)");
    causal.add(app);
    app->add_flag("--padding", m.padding, "Pad each sequence after a seeded length");
    app->add_option("--seed", m.seed, "Seed for weights and inputs")->capture_default_str();
  }
  ShapeModel get() {
    m.causal = causal.get();
    return m;
  }
};

int host() {
  const auto t = qkv::codegen::host_target();
  std::cout << "triple:   " << t.triple << "\ncpu:      " << t.cpu << "\nvector:   " << t.vector_floats << " x f32"
            << (t.has_fma ? ", FMA" : ", no FMA") << "\nbackends:";
  for (const auto& b : qkv::codegen::available_backends()) std::cout << " " << b;
  std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"qkv: attention models with shapes in the type system, compiled to fused kernels"};
  // CLI11's own parse errors read like ours: "qkv: error: …" and a pointer to --help (exit 2).
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return "qkv: error: " + std::string(e.what()) + "\nRun with --help for more information.\n";
  });
  app.set_version_flag("--version", std::string("qkv ") + QKV_VERSION);
  app.require_subcommand(1);
  app.footer("Run `qkv <command> --help` for the flags of a command.");

  // --- run
  auto* run = app.add_subcommand("run", "Run a PyTorch attention module on .npy inputs")->require_subcommand(1);
  RunMha mha;
  CausalFlag mha_causal;
  BackendFlag mha_backend;
  auto* run_mha_cmd = run->add_subcommand("mha", "nn.MultiheadAttention(batch_first=True), eval mode");
  run_mha_cmd->footer(
      "Example: qkv run mha --weights mha.safetensors --query q.npy --heads 8 --key-padding-mask pad.npy "
      "--out out.npy --weights-out w.npy");
  run_mha_cmd->add_option("--weights", mha.weights, "state_dict() as safetensors")->required();
  run_mha_cmd->add_option("--query", mha.query, "[B, L, E] float")->required();
  run_mha_cmd->add_option("--key", mha.key, "[B, S, kdim] (default: the query)");
  run_mha_cmd->add_option("--value", mha.value, "[B, S, vdim] (default: the key)");
  run_mha_cmd->add_option("--heads", mha.heads, "num_heads")->required();
  run_mha_cmd->add_option("--key-padding-mask", mha.key_padding_mask, "bool [B, S], true = ignore");
  run_mha_cmd->add_option("--attn-mask", mha.attn_mask,
                          "bool [L, S] or [B*H, L, S] (true = not allowed), or float (added)");
  mha_causal.add(run_mha_cmd);
  run_mha_cmd->add_flag("--add-zero-attn", mha.add_zero_attn, "PyTorch's add_zero_attn=True");
  run_mha_cmd->add_flag("--need-weights", mha.need_weights, "Write attention weights (averaged over heads)");
  run_mha_cmd->add_flag("--per-head-weights", mha.per_head_weights, "Write weights per head [B, H, L, S]");
  run_mha_cmd->add_option("--out,-o", mha.out, "Output [B, L, E] .npy")->required();
  run_mha_cmd->add_option("--weights-out", mha.weights_out, "Attention weights .npy (implies --need-weights)");
  mha_backend.add(run_mha_cmd);

  RunSdpa sdpa;
  CausalFlag sdpa_causal;
  BackendFlag sdpa_backend;
  double sdpa_scale = 0;
  auto* run_sdpa_cmd = run->add_subcommand("sdpa", "Scaled dot-product attention on [B, H, L, D] tensors");
  run_sdpa_cmd->footer("Example: qkv run sdpa --query q.npy --key k.npy --value v.npy --causal --out o.npy");
  run_sdpa_cmd->add_option("--query", sdpa.query, "[B, H, L, D]")->required();
  run_sdpa_cmd->add_option("--key", sdpa.key, "[B, H, S, D]")->required();
  run_sdpa_cmd->add_option("--value", sdpa.value, "[B, H, S, Dv]")->required();
  run_sdpa_cmd->add_option("--attn-bias", sdpa.attn_bias, "float, broadcastable to [B, H, L, S], added (-inf allowed)");
  run_sdpa_cmd->add_option("--attn-mask", sdpa.attn_mask, "bool, broadcastable to [B, H, L, S], true = not allowed");
  run_sdpa_cmd->add_option("--key-padding-mask", sdpa.key_padding_mask, "bool [B, S], true = ignore");
  sdpa_causal.add(run_sdpa_cmd);
  auto* scale_opt = run_sdpa_cmd->add_option("--scale", sdpa_scale, "Score scale (default 1/sqrt(D))");
  run_sdpa_cmd->add_option("--dropout", sdpa.dropout, "Dropout probability on the weights");
  run_sdpa_cmd->add_option("--seed", sdpa.seed, "Dropout seed (counter-based: same seed, same mask)");
  run_sdpa_cmd->add_option("--out,-o", sdpa.out, "Output [B, H, L, Dv] .npy")->required();
  run_sdpa_cmd->add_option("--weights-out", sdpa.weights_out, "Attention weights [B, H, L, S] .npy");
  sdpa_backend.add(run_sdpa_cmd);

  RunEncoder enc;
  CausalFlag enc_causal;
  BackendFlag enc_backend;
  auto add_encoder_flags = [&](CLI::App* cmd) {
    cmd->add_option("--weights", enc.weights, "state_dict() as safetensors")->required();
    cmd->add_option("--src", enc.src, "[B, L, d_model]")->required();
    cmd->add_option("--heads", enc.heads, "nhead")->required();
    cmd->add_option("--activation", enc.activation, "relu | gelu")
        ->check(CLI::IsMember({"relu", "gelu"}))
        ->capture_default_str();
    cmd->add_flag("--norm-first", enc.norm_first, "Pre-norm (norm_first=True)");
    cmd->add_option("--layer-norm-eps", enc.eps, "layer_norm_eps")->capture_default_str();
    cmd->add_option("--src-key-padding-mask", enc.src_key_padding_mask, "bool [B, L], true = ignore");
    cmd->add_option("--src-mask", enc.src_mask, "bool [L, L] (true = not allowed) or float (added)");
    enc_causal.add(cmd);
    cmd->add_option("--out,-o", enc.out, "Output [B, L, d_model] .npy")->required();
    enc_backend.add(cmd);
  };
  auto* run_layer = run->add_subcommand("encoder-layer", "nn.TransformerEncoderLayer(batch_first=True), eval mode");
  run_layer->footer("Example: qkv run encoder-layer --weights layer.safetensors --src x.npy --heads 4 --out y.npy");
  add_encoder_flags(run_layer);
  auto* run_stack = run->add_subcommand("encoder", "nn.TransformerEncoder: layers.N.* (and norm.*) in the state dict");
  run_stack->footer(
      "Example: qkv run encoder --weights gpt.safetensors --src x.npy --heads 8 --causal --norm-first --out y.npy");
  add_encoder_flags(run_stack);

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
  auto* bench_cmd = app.add_subcommand("bench", "Time a model: median/min/max ms, GFLOP/s, peak memory");
  bench_cmd->footer("Example: qkv bench sdpa --batch 1 --heads 8 --seq 512 --head-dim 64 --causal --json");
  bench_flags.add(bench_cmd);
  bench_backend.add(bench_cmd);
  bench_cmd->add_option("--threads", bench_opts.threads, "Threads (cpu backend)");
  bench_cmd->add_option("--repeat", bench_opts.repeat, "Timed runs after one warm-up")->capture_default_str();
  bench_cmd->add_flag("--json", bench_opts.json, "One JSON object on stdout");

  Verify verify_opts;
  ShapeFlags verify_flags;
  std::string verify_backend = "cpu";
  auto* verify_cmd = app.add_subcommand("verify", "Run a backend and the reference interpreter on the same inputs");
  verify_cmd->footer("Example: qkv verify sdpa --batch 1 --heads 2 --seq 33 --head-dim 64 --backend cpu");
  verify_flags.add(verify_cmd);
  verify_cmd->add_option("--backend", verify_backend, "cpu | cuda")->check(CLI::IsMember({"reference", "cpu", "cuda"}));
  verify_cmd->add_option("--tolerance", verify_opts.tolerance, "Largest allowed max abs error")->capture_default_str();

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
  heatmap_cmd->add_option("--batch-index", hm.batch_index, "Which sequence of the batch")->capture_default_str();
  auto* head_opt = heatmap_cmd->add_option("--head", head, "One head (default: mean over heads)");
  auto* all_opt = heatmap_cmd->add_flag("--all-heads", hm.all_heads, "One panel per head");
  head_opt->excludes(all_opt);
  heatmap_cmd->add_option("--title", hm.title, "Title");
  heatmap_cmd->add_option("--out,-o", hm.out, "PNG file")->required();

  Emit emit_opts;
  ShapeFlags emit_flags;
  auto* emit_cmd = app.add_subcommand("emit", "Compile a model ahead of time (.ll/.s/.o/.so + C header, or .ptx)");
  emit_cmd->footer(
      "Example: qkv emit mha --batch 1 --heads 8 --seq 128 --embed-dim 512 --target cpu --cpu x86-64-v3 --format so "
      "-o mha.so");
  emit_flags.add(emit_cmd);
  emit_cmd->add_option("--target", emit_opts.target, "cpu | nvptx")
      ->check(CLI::IsMember({"cpu", "nvptx"}))
      ->capture_default_str();
  emit_cmd->add_option("--cpu", emit_opts.cpu, "native | x86-64 | x86-64-v2 | x86-64-v3 | x86-64-v4 | an LLVM CPU name")
      ->capture_default_str();
  emit_cmd->add_option("--sm", emit_opts.sm, "80 | 86 | 87 | 89 | 90 (nvptx)")->capture_default_str();
  emit_cmd->add_option("--format", emit_opts.format, "ll | asm | obj | so (cpu; default so) | ptx (nvptx)")
      ->check(CLI::IsMember({"ll", "asm", "obj", "so", "ptx"}));
  emit_cmd
      ->add_option("--out,-o", emit_opts.out,
                   "Output file (obj/so: the C header goes beside it, .h; nvptx with several kernels: a "
                   "directory)")
      ->required();
  emit_cmd->add_option("--function", emit_opts.function, "C name of the generated function (default qkv_<model>)");
  emit_cmd->add_option("--example-dir", emit_opts.example_dir,
                       "Also write the seeded inputs and the reference outputs there, one .npy per argument");
  auto* host_cmd = app.add_subcommand("host", "Print the host CPU as the code generator sees it");

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

  try {
    if (*run_mha_cmd) {
      mha.causal = mha_causal.get();
      mha.backend = parse_backend(mha_backend.value);
      return run_mha(mha);
    }
    if (*run_sdpa_cmd) {
      sdpa.causal = sdpa_causal.get();
      if (scale_opt->count()) sdpa.scale = sdpa_scale;
      sdpa.backend = parse_backend(sdpa_backend.value);
      return run_sdpa(sdpa);
    }
    if (*run_layer || *run_stack) {
      enc.causal = enc_causal.get();
      enc.stack = static_cast<bool>(*run_stack);
      enc.backend = parse_backend(enc_backend.value);
      return run_encoder(enc);
    }
    if (*shapes_cmd) return shapes(shape_flags.get(), dump_after, time_passes);
    if (*bench_cmd) {
      bench_opts.model = bench_flags.get();
      bench_opts.backend = parse_backend(bench_backend.value);
      return bench(bench_opts);
    }
    if (*verify_cmd) {
      verify_opts.model = verify_flags.get();
      verify_opts.backend = parse_backend(verify_backend);
      return verify(verify_opts);
    }
    if (*heatmap_cmd) {
      if (head_opt->count()) hm.head = head;
      return heatmap(hm);
    }
    if (*emit_cmd) {
      emit_opts.model = emit_flags.get();
      return emit(emit_opts);
    }
    if (*host_cmd) return host();
  } catch (const UsageError& e) {
    std::cerr << "qkv: error: " << e.what() << "\nRun with --help for more information.\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "qkv: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
