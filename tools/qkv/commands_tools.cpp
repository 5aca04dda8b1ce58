// qkv shapes | bench | verify | heatmap | host, and models given by shape alone.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <span>
#include <sstream>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/random_feeds.hpp>
#include <qkv/runtime/rng.hpp>

#include "commands.hpp"
#include "heatmap.hpp"
#include "memory.hpp"
#include "out_of_memory.hpp"
#include "run_common.hpp"

namespace qkv::cli {

namespace {

/// Entries the masks keep, for the FLOP count: per query row the kept keys form one interval
/// (window ∩ causal ∩ its document ∩ the prefix rule), counted row by row. Padding is ignored.
double kept_entries(const Mods& m, Causal causal, std::int64_t documents, std::int64_t L, std::int64_t S) {
  const std::int64_t off = m.align == CausalAlign::bottom_right ? S - L : 0;
  const std::int64_t causal_off = causal == Causal::bottom_right ? S - L : 0;
  double kept = 0;
  for (std::int64_t i = 0; i < L; ++i) {
    const std::int64_t pos = i + off;
    std::int64_t lo = 0, hi = S - 1;
    if (m.window) {
      if (m.window->first >= 0) lo = std::max(lo, pos - m.window->first);
      if (m.window->second >= 0) hi = std::min(hi, pos + m.window->second);
    }
    if (causal != Causal::none) hi = std::min(hi, i + causal_off);
    if (documents > 0) {  // ids i·N/L and j·N/S: the keys whose id equals the query's
      const std::int64_t d = i * documents / L;
      lo = std::max(lo, (d * S + documents - 1) / documents);
      hi = std::min(hi, ((d + 1) * S + documents - 1) / documents - 1);
    }
    if (m.prefix_len) hi = std::min(hi, std::max(*m.prefix_len - 1, pos));
    kept += static_cast<double>(std::max<std::int64_t>(0, hi - lo + 1));
  }
  return kept;
}

}  // namespace

Instance instantiate(const ShapeModel& s) {
  if (s.batch <= 0 || s.heads <= 0 || s.seq <= 0) throw UsageError("--batch, --heads and --seq must be positive");
  if (s.kv_heads < 0 || s.kv_seq < 0 || s.head_dim < 0 || s.embed_dim < 0 || s.ffn_dim < 0)
    throw UsageError("--kv-heads, --kv-seq, --head-dim, --embed-dim and --ffn-dim must not be negative");
  const std::int64_t kv_heads = s.kv_heads > 0 ? s.kv_heads : s.heads;
  if (s.heads % kv_heads != 0)
    throw UsageError("--kv-heads " + std::to_string(s.kv_heads) + " must divide --heads " + std::to_string(s.heads));
  if (kv_heads != s.heads && s.kind != "sdpa")
    throw UsageError(
        "--kv-heads: grouped-query attention is the sdpa model's (nn.MultiheadAttention and "
        "nn.TransformerEncoderLayer have no grouped form)");
  const std::int64_t S = s.kv_seq > 0 ? s.kv_seq : s.seq;
  std::int64_t E = s.embed_dim, D = s.head_dim;
  if (E == 0 && D == 0) throw UsageError("give --head-dim or --embed-dim");
  if (E == 0) E = checked_mul(D, s.heads, "--head-dim x --heads");
  if (D == 0) {
    if (E % s.heads != 0)
      throw UsageError("--embed-dim " + std::to_string(E) + " is not divisible by --heads " + std::to_string(s.heads));
    D = E / s.heads;
  }
  Instance in;
  const Causal causal = parse_causal(s.causal, s.seq, S);
  Masks masks;
  masks.causal = causal;
  masks.key_padding = s.padding;
  in.flops = 4.0 * static_cast<double>(s.batch) * static_cast<double>(s.heads) * static_cast<double>(s.seq) *
             static_cast<double>(S) * static_cast<double>(D) * (causal == Causal::none ? 1.0 : 0.5);
  in.sizes = {{"Batch", s.batch},
              {"Seq", s.seq},
              {"Key", S},
              {"Mem", S},
              {"Heads", s.heads},
              {"HeadDim", D},
              {"ValueDim", D},
              {"Model", E},
              {"Proj", checked_mul(3, E, "3 x the model width")},
              {"Hidden", s.ffn_dim > 0 ? s.ffn_dim : checked_mul(4, E, "4 x the model width")},
              {"KvHeads", kv_heads},
              {"Group", s.heads / kv_heads}};
  const bool modded = s.alibi || s.documents > 0 || !s.mods.window.empty() || s.mods.softcap || s.mods.prefix_len;
  if (modded && s.kind != "sdpa")
    throw UsageError("--window, --softcap, --alibi, --documents and --prefix-len are the sdpa model's");
  if (s.kind == "sdpa") {
    SdpaModel m;
    m.weights = false;
    m.masks = masks;
    m.mods = parse_mod_flags(s.mods, s.alibi, s.seq, S);
    m.mods.alibi_rank = s.alibi ? 1 : 0;
    m.mods.documents = s.documents > 0;
    if (modded)  // the FLOPs of the kept entries only
      in.flops = 4.0 * static_cast<double>(s.batch) * static_cast<double>(s.heads) *
                 kept_entries(m.mods, causal, s.documents, s.seq, S) * static_cast<double>(D);
    m.heads = s.heads;
    m.kv_heads = kv_heads;
    in.graph = build_sdpa(m);
  } else if (s.kind == "mha") {
    MhaModel m;
    m.weights = false;
    m.heads = s.heads;
    m.cross = S != s.seq;
    m.masks = masks;
    in.graph = build_mha(m);
  } else if (s.kind == "encoder-layer") {
    if (S != s.seq) throw UsageError("encoder-layer is self-attention: --kv-seq must equal --seq");
    EncoderModel m;
    m.heads = s.heads;
    m.masks = masks;
    in.graph = build_encoder(m);
  } else {
    throw UsageError("unknown model '" + s.kind + "' (sdpa, mha, encoder-layer)");
  }
  in.graph = with_float_dtype(in.graph, s.dtype);
  (void)value_bytes(in.graph, in.sizes);  // UsageError when a value's size overflows
  return in;
}

Feeds seeded_feeds(const Instance& in, const ShapeModel& s) {
  const Activity drawing("drawing the seeded inputs");
  Feeds feeds = random_feeds(in.graph, in.sizes, s.seed, 0.5f);
  if (s.padding) {  // keys after a seeded length per sequence are padding
    const std::int64_t S = in.sizes.at("Key");
    std::vector<std::int64_t> lengths;
    for (std::int64_t b = 0; b < s.batch; ++b)
      lengths.push_back(1 +
                        static_cast<std::int64_t>(dropout_uniform(s.seed, 0xFFFF, 0, 0, static_cast<std::uint32_t>(b)) *
                                                  static_cast<double>(S)));
    feeds["key_keep"] = keep_first(lengths, S);
  }
  if (s.alibi) {  // the ALiBi paper's geometric slopes
    NdArray slopes = NdArray::zeros(DType::f32, {s.heads});
    auto v = slopes.as<float>();
    for (std::int64_t h = 0; h < s.heads; ++h)
      v[static_cast<std::size_t>(h)] = std::exp2(-8.0f * static_cast<float>(h + 1) / static_cast<float>(s.heads));
    feeds["alibi_slopes"] = std::move(slopes);
  }
  if (s.documents > 0) {  // equal-length packed documents: position i of n is in document i·N/n
    auto ids = [&](std::int64_t n) {
      NdArray a = NdArray::zeros(DType::i64, {s.batch, n});
      auto v = a.as<std::int64_t>();
      for (std::int64_t b = 0; b < s.batch; ++b)
        for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(b * n + i)] = i * s.documents / n;
      return a;
    };
    feeds["q_doc_ids"] = ids(in.sizes.at("Seq"));
    feeds["kv_doc_ids"] = ids(in.sizes.at("Key"));
  }
  convert_feeds(in.graph, feeds);  // drawn as f32: stored as the model's dtype (--dtype)
  return feeds;
}

namespace {

/// The graph with every extent replaced by its bound size.
Graph with_sizes(const Graph& g, const Bindings& b) {
  Graph out;
  for (Node n : g.nodes()) {
    for (auto& a : n.axes)
      if (auto v = a.extent.resolve(b)) a.extent = Extent::fixed(*v);
    out.add(std::move(n));
  }
  for (const auto& o : g.outputs()) out.mark_output(o.node, o.name);
  return out;
}

}  // namespace

int shapes(const ShapeModel& m, const std::string& dump_after, bool time_passes) {
  const Instance in = instantiate(m);  // the graph and its sizes: nothing is allocated for them
  std::cout << m.kind << " with batch " << m.batch << ", " << m.heads << " heads, L " << m.seq << ", S "
            << (m.kv_seq > 0 ? m.kv_seq : m.seq) << ":\n\n"
            << with_sizes(in.graph, in.sizes).table();
  if (!dump_after.empty() || time_passes) {
    const auto& names = codegen::kPassNames;
    if (!dump_after.empty() && dump_after != "all" &&
        std::find(std::begin(names), std::end(names), dump_after) == std::end(names))
      throw UsageError("--dump-after: no pass '" + dump_after +
                       "' (verify, canonicalize, fuse-attention, layout, cleanup, all)");
    codegen::PipelineOptions o;
    o.dump_after = dump_after;
    o.time_passes = time_passes;
    o.verify_each = true;
    o.log = &std::cout;
    std::cout << "\n";
    codegen::lower(in.graph, o);
  }
  return 0;
}

int bench(const Bench& b) {
  if (b.repeat <= 0) throw UsageError("--repeat must be positive");
  const Instance in = instantiate(b.model);
  require_memory(feed_bytes(in.graph, in.sizes) + run_bytes(in.graph, in.sizes, b.backend));
  const Feeds feeds = seeded_feeds(in, b.model);
  const Activity running("running the model");
  const bool bar = !b.json && isatty(STDOUT_FILENO);
  const double rss_before = peak_rss_mib();
  const codegen::JitStats before = codegen::jit_stats();
  // The CPU backend runs the model as a caller running it repeatedly does (BoundRunner): its
  // weights packed once, its arena kept between runs.
  const codegen::cpu::BoundRunner bound(b.threads);
  auto once = [&] {
    if (b.backend == Backend::cpu)
      bound(in.graph, feeds);
    else
      run_graph(in.graph, feeds, b.backend, b.threads);
  };
  once();  // warm-up (JIT compile, weights packed), not counted
  const codegen::JitStats warm = codegen::jit_stats();
  std::vector<double> ms;
  for (int i = 0; i < b.repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    once();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    if (bar) {
      const int done = (i + 1) * 30 / b.repeat;
      std::printf("\r[%s%s] %d/%d", std::string(static_cast<std::size_t>(done), '#').c_str(),
                  std::string(static_cast<std::size_t>(30 - done), ' ').c_str(), i + 1, b.repeat);
      std::fflush(stdout);
    }
  }
  if (bar) std::printf("\n");
  const double median_ms = median(ms);
  const auto [fastest, slowest] = std::minmax_element(ms.begin(), ms.end());
  const double gflops = in.flops / (median_ms * 1e-3) / 1e9;
  const double peak = peak_rss_mib();
  const codegen::JitStats after = codegen::jit_stats();
  // Modules compiled by the warm-up, and by the timed runs (0: one compilation per shape class).
  const long long modules = after.modules - before.modules, modules_timed = after.modules - warm.modules;
  const double compile_ms = after.compile_ms - before.compile_ms;
  const auto& s = b.model;
  if (b.json) {
    std::printf(
        "{\"model\": \"%s\", \"batch\": %lld, \"heads\": %lld, \"seq\": %lld, \"kv_seq\": %lld, \"head_dim\": %lld, "
        "\"causal\": %s, \"dtype\": \"%s\", \"backend\": \"%s\", \"repeat\": %d, \"median_ms\": %.6g, \"min_ms\": "
        "%.6g, \"max_ms\": %.6g, "
        "\"gflops\": %.6g, \"peak_mem_mib\": %.6g, \"modules_compiled\": %lld, \"modules_compiled_timed\": %lld, "
        "\"compile_ms\": %.6g}\n",
        s.kind.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.heads), static_cast<long long>(s.seq),
        static_cast<long long>(in.sizes.at("Key")), static_cast<long long>(in.sizes.at("HeadDim")),
        s.causal ? "true" : "false", std::string(dtype_name(s.dtype)).c_str(),
        b.backend == Backend::reference ? "reference" : (b.backend == Backend::cuda ? "cuda" : "cpu"), b.repeat,
        median_ms, *fastest, *slowest, gflops, peak, modules, modules_timed, compile_ms);
  } else {
    std::printf(
        "%s (%s): median %.3f ms (min %.3f, max %.3f over %d runs), %.3f GFLOP/s, peak memory %.1f MiB (+%.1f); "
        "%lld LLVM module(s) compiled in %.1f ms\n",
        s.kind.c_str(), std::string(dtype_name(s.dtype)).c_str(), median_ms, *fastest, *slowest, b.repeat, gflops, peak,
        peak - rss_before, modules, compile_ms);
  }
  return 0;
}

double default_tolerance(DType dtype) {
  switch (dtype) {
    case DType::bf16:
      return 5e-2;  // 8 significant bits: an ulp of a value near 1 is 2^-7
    case DType::f16:
      return 1e-2;  // 11 significant bits: 2^-10
    default:
      return 1e-4;
  }
}

/// qkv host: the target, the kernels' tuning and what code built for this host requires.
int host() {
  const auto t = qkv::codegen::host_target();
  std::cout << "triple:   " << t.triple << "\ncpu:      " << t.cpu << "\nvector:   " << t.vector_floats << " x f32"
            << (t.has_fma ? ", FMA" : ", no FMA") << "\nbackends:";
  for (const auto& b : qkv::codegen::available_backends()) std::cout << " " << b;
  const auto k = host_tuning();
  std::cout << "\ntuning:   " << k.name << " (" << k.why << "): attention f32 " << k.query_vectors << "x"
            << t.vector_floats << " queries x " << k.qk_keys << " keys, tiles of " << k.key_tile << "; bf16 "
            << k.bf16_query_vectors << "x" << t.vector_floats << " x " << k.bf16_qk_keys << ", tiles of "
            << k.bf16_key_tile << "; GEMM " << k.gemm_rows << " x " << k.gemm_col_vectors * t.vector_floats
            << ", K blocks " << k.gemm_k_block << " (bf16 " << k.gemm_k_block_bf16 << ")\nbf16:     "
            << (qkv::codegen::cpu::bf16_dot_products(t, t.vector_floats) ? "vdpbf16ps (AVX512-BF16)"
                                                                         : "widened to f32 as loaded (no AVX512-BF16)")
            << "\n";
  std::string needs;
  for (const auto& f : qkv::codegen::required_features(t)) needs += (needs.empty() ? "" : " ") + f;
  std::cout
      << "requires: " << needs
      << "\n          (what code built for this host, --cpu native, needs: every emitted library checks it)\n"
      << "targets:  qkv emit --target x86_64 --cpu native | x86-64 | x86-64-v2 | x86-64-v3 | x86-64-v4 | <LLVM CPU>\n"
      << "          qkv emit --target aarch64 --cpu generic | neoverse-n1 | neoverse-v1 | <LLVM CPU> (NEON, 4 x f32)\n"
      << "          qkv emit --target nvptx --sm 80 | 86 | 87 | 89 | 90 (PTX)\n";
  return 0;
}

int verify(const Verify& v) {
  if (v.backend == Backend::reference)
    throw UsageError("verify compares a backend with the reference interpreter: give --backend cpu or cuda");
  const double tolerance = v.tolerance.value_or(default_tolerance(v.model.dtype));
  if (!(std::isfinite(tolerance) && tolerance >= 0))
    throw UsageError("--tolerance must be a non-negative finite number");
  const Instance in = instantiate(v.model);
  require_memory(feed_bytes(in.graph, in.sizes) + run_bytes(in.graph, in.sizes, Backend::reference) +
                 run_bytes(in.graph, in.sizes, v.backend));
  const Feeds feeds = seeded_feeds(in, v.model);
  const Activity running("running the model");
  const RunResult want = interpret(in.graph, feeds);
  const RunResult got = run_graph(in.graph, feeds, v.backend);
  double abs_err = 0, rel_err = 0;
  for (const auto& [name, w] : want.outputs) {
    const auto a = got.outputs.at(name).to_f32(), e = w.to_f32();
    for (std::size_t i = 0; i < e.size(); ++i) {
      const double d = std::abs(static_cast<double>(a[i]) - e[i]);
      abs_err = std::max(abs_err, d);
      rel_err = std::max(rel_err, d / std::max(1e-6, std::abs(static_cast<double>(e[i]))));
    }
  }
  std::printf("max abs error %.3g, max rel error %.3g (tolerance %.3g, %s)\n", abs_err, rel_err, tolerance,
              std::string(dtype_name(v.model.dtype)).c_str());
  return abs_err <= tolerance ? 0 : 1;
}

namespace {
std::vector<std::string> words(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> out;
  for (std::string w; in >> w;) out.push_back(w);
  return out;
}
}  // namespace

int heatmap(const Heatmap& h) {
  OutputGroup outputs;
  protect_inputs(outputs, {{h.weights, "--weights"}, {h.tokens_file, "--tokens-file"}});
  const std::size_t png_file = outputs.add_file(h.out, "--out");
  const Activity reading("reading the inputs");
  NdArray w = load_npy(h.weights, "--weights");
  if (w.shape.size() != 3 && w.shape.size() != 4)
    throw IoError("--weights: shape " + shape_to_string(w.shape) + " must be [B, L, S] or [B, H, L, S]");
  const std::int64_t B = w.shape[0], H = w.shape.size() == 4 ? w.shape[1] : 1, L = w.shape[w.shape.size() - 2],
                     S = w.shape.back();
  if (h.batch_index < 0 || h.batch_index >= B)
    throw UsageError("--batch-index " + std::to_string(h.batch_index) + " is out of range: the weights have batch " +
                     std::to_string(B));
  if (h.head && (*h.head < 0 || *h.head >= H))
    throw UsageError("--head " + std::to_string(*h.head) + " is out of range: the weights have " + std::to_string(H) +
                     " heads");
  if ((h.head || h.all_heads) && w.shape.size() == 3)
    throw UsageError("--head/--all-heads need per-head weights [B, H, L, S]; these are averaged [B, L, S]");

  std::vector<std::string> rows, cols;
  if (!h.tokens_file.empty()) {
    constexpr std::uint64_t kMaxTokensFile = 16u << 20;
    std::vector<std::byte> bytes;
    try {
      bytes = InputFile::open(h.tokens_file).read_all(kMaxTokensFile, "tokens file");
    } catch (const IoError& e) {
      throw IoError(std::string("--tokens-file: ") + e.what());
    }
    rows = cols = words(std::string(reinterpret_cast<const char*>(bytes.data()), bytes.size()));
  } else if (!h.tokens.empty()) {
    rows = cols = words(h.tokens);
  }
  const auto v = w.to_f32();
  auto panel = [&](std::int64_t head) {
    heatmap::Panel p{"head " + std::to_string(head), L, S, {}};
    const std::size_t off = static_cast<std::size_t>(((h.batch_index * H) + head) * L * S);
    p.values.assign(v.begin() + static_cast<std::ptrdiff_t>(off), v.begin() + static_cast<std::ptrdiff_t>(off + L * S));
    return p;
  };
  std::vector<heatmap::Panel> panels;
  std::string what;
  if (h.all_heads) {
    for (std::int64_t i = 0; i < H; ++i) panels.push_back(panel(i));
    what = "all " + std::to_string(H) + " heads";
  } else if (h.head) {
    panels.push_back(panel(*h.head));
    what = "head " + std::to_string(*h.head);
  } else {
    heatmap::Panel mean{H > 1 ? "mean of " + std::to_string(H) + " heads" : "weights", L, S,
                        std::vector<float>(static_cast<std::size_t>(L * S), 0.0f)};
    for (std::int64_t i = 0; i < H; ++i) {
      const auto p = panel(i);
      for (std::size_t k = 0; k < mean.values.size(); ++k) mean.values[k] += p.values[k] / static_cast<float>(H);
    }
    panels.push_back(std::move(mean));
    what = H > 1 ? "averaged over " + std::to_string(H) + " heads" : "";
  }
  heatmap::Options opt;
  opt.title = !h.title.empty()
                  ? h.title
                  : "attention weights, batch " + std::to_string(h.batch_index) + (what.empty() ? "" : ", " + what);
  opt.row_labels = rows;
  opt.col_labels = cols;
  const std::vector<std::uint8_t> png = heatmap::encode_png(h.out, heatmap::render(panels, opt));
  const Activity writing("writing the outputs");
  outputs.write(png_file, {std::as_bytes(std::span(png))});
  outputs.commit();
  return 0;
}

}  // namespace qkv::cli
