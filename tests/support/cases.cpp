#include "cases.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <map>
#include <stdexcept>

#include <nlohmann/json.hpp>

#include <qkv/qkv.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/random_feeds.hpp>
#include <qkv/runtime/torch_import.hpp>

#include "models.hpp"

namespace qkv::test {

using namespace qkv::nn;
namespace fs = std::filesystem;

// --- fixtures --------------------------------------------------------------------------------

namespace {

/// PyTorch's masks say true = ignore; qkv's keep-masks say true = may attend.
NdArray inverted(NdArray m) {
  for (bool& b : m.as<bool>()) b = !b;
  return m;
}

Feeds load_fixture(const std::string& name, nlohmann::json& cfg) {
  const fs::path dir = fixture_dir(name);
  std::ifstream in(dir / "config.json");
  cfg = nlohmann::json::parse(in);
  const auto sd = SafetensorsFile::open(dir / "weights.safetensors");
  const std::int64_t heads = cfg.at("num_heads");
  Feeds feeds = cfg.at("module") == "mha" ? import_mha(sd, infer_mha_config(sd, heads))
                                          : import_encoder_layer(sd, infer_encoder_layer_config(sd, heads));
  for (const std::string input : cfg.at("inputs")) {
    NdArray a = read_npy(dir / (input + ".npy"));
    if (input == "key_padding_mask" || input == "src_key_padding_mask") {
      feeds["keep"] = inverted(std::move(a));
    } else if (input == "attn_mask" && a.dtype == DType::boolean) {
      if (a.shape.size() == 3) a.shape = {a.shape[0] / heads, heads, a.shape[1], a.shape[2]};  // [B*H, L, S]
      feeds["attn_keep"] = inverted(std::move(a));
    } else if (input == "attn_mask") {
      feeds["attn_bias"] = std::move(a);
    } else {
      feeds[input] = std::move(a);
    }
  }
  return feeds;
}

template <int E>
auto query(Graph& g) {
  return input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>>(g, "query");
}

template <class R>
void mark(const R& r) {
  output(r.first, "out");
  output(r.second, "weights");
}

template <Activation Act>
void encoder(Graph& g, const nlohmann::json& cfg, NormPlacement placement, bool padding) {
  auto src = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "src");
  auto layer = EncoderLayer<32, 4, 64, Act>::make(g, "", placement, cfg.at("layer_norm_eps").get<double>());
  if (padding)
    output(layer(src, input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep")), "out");
  else
    output(layer(src), "out");
}

using Builder = std::function<void(Graph&, const nlohmann::json&, Feeds&)>;

const std::map<std::string, Builder>& builders() {
  static const std::map<std::string, Builder> b{
      {"seed_tutorial",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
         mark(MultiHeadAttention<16, 1>::make(g)(query<16>(g), keep));
       }},
      {"e512_h8",
       [](Graph& g, const nlohmann::json&, Feeds&) { mark(MultiHeadAttention<512, 8>::make(g)(query<512>(g))); }},
      {"causal",
       [](Graph& g, const nlohmann::json&, Feeds& f) {
         f.erase("attn_keep");  // qkv's own causal op stands in for the explicit triangle
         mark(MultiHeadAttention<32, 4>::make(g)(query<32>(g), causal_mask));
       }},
      {"key_padding",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
         mark(MultiHeadAttention<32, 4>::make(g)(query<32>(g), keep));
       }},
      {"float_mask",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto bias = input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "attn_bias");
         mark(MultiHeadAttention<32, 4>::make(g)(query<32>(g), bias));
       }},
      {"mask_3d",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto keep = input<KeepMask<Batch<dyn>, Heads<4>, Seq<dyn>, Key<dyn>>>(g, "attn_keep");
         mark(MultiHeadAttention<32, 4>::make(g)(query<32>(g), keep));
       }},
      {"cross_kdim_vdim",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto key = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Hidden<20>>>(g, "key");
         auto value = input<Tensor<f32, Batch<dyn>, Mem<dyn>, ValueDim<12>>>(g, "value");
         auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
         mark(CrossAttention<32, 4, 20, 12>::make(g)(query<32>(g), key, value, keep));
       }},
      {"cross_bias_kv_zero_attn",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto key = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Hidden<20>>>(g, "key");
         auto value = input<Tensor<f32, Batch<dyn>, Mem<dyn>, ValueDim<12>>>(g, "value");
         auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
         constexpr MhaOptions both{.add_bias_kv = true, .add_zero_attn = true};
         mark(CrossAttention<32, 4, 20, 12, both>::make(g)(query<32>(g), key, value, keep));
       }},
      {"no_bias", [](Graph& g, const nlohmann::json&,
                     Feeds&) { mark(MultiHeadAttention<32, 4>::make(g, "", /*bias=*/false)(query<32>(g))); }},
      {"add_bias_kv",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
         mark(MultiHeadAttention<32, 4, MhaOptions{.add_bias_kv = true}>::make(g)(query<32>(g), keep));
       }},
      {"add_zero_attn",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
         mark(MultiHeadAttention<32, 4, MhaOptions{.add_zero_attn = true}>::make(g)(query<32>(g), keep));
       }},
      {"fully_masked_rows",
       [](Graph& g, const nlohmann::json&, Feeds&) {
         auto keep = input<AttnMask<Seq<dyn>, Key<dyn>>>(g, "attn_keep");
         mark(MultiHeadAttention<32, 4>::make(g)(query<32>(g), keep));
       }},
      {"encoder_relu_post",
       [](Graph& g, const nlohmann::json& c, Feeds&) { encoder<Activation::relu>(g, c, NormPlacement::post, false); }},
      {"encoder_gelu_pre",
       [](Graph& g, const nlohmann::json& c, Feeds&) { encoder<Activation::gelu>(g, c, NormPlacement::pre, false); }},
      {"encoder_relu_post_padding",
       [](Graph& g, const nlohmann::json& c, Feeds&) { encoder<Activation::relu>(g, c, NormPlacement::post, true); }},
  };
  return b;
}

}  // namespace

namespace {
/// The build's path, unless $QKV_FIXTURES_DIR names another (test binaries run on a machine
/// where the repository sits elsewhere).
fs::path fixtures_root() {
  const char* env = std::getenv("QKV_FIXTURES_DIR");
  return env && *env ? fs::path(env) : fs::path(QKV_FIXTURES_DIR);
}
}  // namespace

std::string fixture_dir(const std::string& name) { return (fixtures_root() / name).string(); }

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  std::error_code ec;  // a missing folder gives no names (FixtureSet.HasEveryKind then fails)
  for (const auto& e : fs::directory_iterator(fixtures_root(), ec))
    if (e.is_directory() && fs::exists(e.path() / "config.json")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names;
}

Case fixture_case(const std::string& name) {
  const auto it = builders().find(name);
  if (it == builders().end())
    throw std::runtime_error("fixture `" + name + "` has no graph in tests/support/cases.cpp: add one");
  Case c;
  c.name = name;
  nlohmann::json cfg;
  c.feeds = load_fixture(name, cfg);
  it->second(c.graph, cfg, c.feeds);
  c.sizes = bind_extents(c.graph, c.feeds);
  return c;
}

// --- the sweep ------------------------------------------------------------------------------

std::vector<SweepShape> sweep_shapes() {
  using C = SweepShape::Causal;
  constexpr C none = C::none, tl = C::top_left, br = C::bottom_right;
  std::vector<SweepShape> v;
  // B, H, Hkv, L, S, dk, dv, causal, padding, bias, dropout, weights
  auto add = [&](std::int64_t b, std::int64_t h, std::int64_t hkv, std::int64_t l, std::int64_t s, std::int64_t dk,
                 std::int64_t dv, C causal, bool padding, bool bias, double dropout,
                 bool weights) { v.push_back({b, h, hkv, l, s, dk, dv, causal, padding, bias, dropout, weights}); };
  // Odd lengths 1, 7, 33, 257; L != S both ways; head widths 64 / 80 / 128; dv != dk.
  add(2, 3, 3, 1, 1, 64, 64, none, false, false, 0, false);
  add(1, 2, 2, 7, 7, 80, 80, none, false, false, 0, true);
  add(2, 2, 2, 33, 257, 128, 128, none, false, false, 0, false);
  add(1, 2, 2, 257, 33, 64, 128, none, false, false, 0, true);
  add(2, 2, 2, 257, 257, 128, 64, none, false, false, 0, false);
  add(1, 1, 1, 33, 7, 80, 64, none, false, false, 0, false);
  // Causal, both alignments, square and not (bottom-right with L > S: the first L − S rows see
  // no key and are zeros).
  add(2, 2, 2, 257, 257, 64, 64, tl, false, false, 0, false);
  add(1, 2, 2, 33, 257, 80, 80, tl, false, false, 0, true);
  add(1, 2, 2, 33, 257, 64, 64, br, false, false, 0, false);
  add(2, 1, 1, 257, 33, 128, 128, br, false, false, 0, true);
  add(1, 2, 2, 7, 1, 64, 64, tl, false, false, 0, false);
  // Key padding (batch 3 of 4 pads every key: its rows are zeros), with a bias, causal.
  add(4, 2, 2, 33, 33, 64, 64, none, true, false, 0, true);
  add(4, 2, 2, 7, 257, 128, 80, br, true, true, 0, false);
  add(2, 2, 2, 33, 7, 80, 80, none, false, true, 0, true);
  // Decode-shaped (L <= 4): the GPU's split-KV kernel, its keys in chunks merged by their
  // log-sum-exp (GQA 32/8 at D = 128 against 700 keys; key padding with a fully padded batch).
  add(1, 32, 8, 1, 700, 128, 128, br, false, false, 0, false);
  add(4, 4, 2, 3, 257, 64, 64, br, true, true, 0, false);
  // GQA and MQA.
  add(2, 8, 2, 33, 257, 64, 64, none, false, false, 0, false);
  add(1, 6, 1, 257, 33, 128, 128, br, true, false, 0, false);
  add(2, 4, 2, 7, 7, 80, 64, tl, false, true, 0, false);
  // Dropout: the same Philox mask as the interpreter's, so the results agree element-wise. (Not
  // with the weights as an output: those are the probabilities before dropout, which the pipeline
  // does not fuse; nor GQA with weights, whose merge the fuse pass does not look through.)
  add(2, 2, 2, 33, 33, 64, 64, none, false, false, 0.25, false);
  add(1, 4, 2, 257, 7, 128, 80, br, true, false, 0.5, false);
  return v;
}

std::string sweep_name(const SweepShape& s) {
  std::string n = "B" + std::to_string(s.batch) + "_H" + std::to_string(s.heads);
  if (s.kv_heads != s.heads) n += "_Hkv" + std::to_string(s.kv_heads);
  n += "_L" + std::to_string(s.len_q) + "_S" + std::to_string(s.len_k) + "_dk" + std::to_string(s.dk);
  if (s.dv != s.dk) n += "_dv" + std::to_string(s.dv);
  if (s.causal == SweepShape::Causal::top_left) n += "_causal_tl";
  if (s.causal == SweepShape::Causal::bottom_right) n += "_causal_br";
  if (s.padding) n += "_padding";
  if (s.bias) n += "_bias";
  if (s.dropout > 0) n += "_dropout" + std::to_string(static_cast<int>(s.dropout * 100));
  if (s.weights) n += "_weights";
  return n;
}

namespace {
/// Calls f with the masks `s` asks for, as DSL arguments (declaring their inputs).
template <class F>
int with_masks(Graph& g, const SweepShape& s, F&& f) {
  auto with_causal = [&](auto... masks) {
    switch (s.causal) {
      case SweepShape::Causal::top_left:
        return f(masks..., causal_top_left);
      case SweepShape::Causal::bottom_right:
        return f(masks..., causal_bottom_right);
      case SweepShape::Causal::none:
        break;
    }
    return f(masks...);
  };
  auto with_bias = [&](auto... masks) {
    if (s.bias) return with_causal(masks..., input<Tensor<f32, Seq<dyn>, Key<dyn>>>(g, "attn_bias"));
    return with_causal(masks...);
  };
  if (s.padding) return with_bias(input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "key_keep"));
  return with_bias();
}
}  // namespace

Case sweep_case(const SweepShape& s) {
  Case c;
  c.name = sweep_name(s);
  Graph& g = c.graph;
  if (s.kv_heads == s.heads) {  // as the CLI's sdpa builds it
    auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
    auto k = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
    auto v = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
    with_masks(g, s, [&](auto... masks) {
      auto p = softmax<Key>(nn::detail::apply_masks(scaled(contract<HeadDim>(q, k)), masks...));
      if (s.weights) output(p, "weights");
      output(s.dropout > 0.0 ? contract<Key>(dropout(p, s.dropout, 1234), v) : contract<Key>(p, v), "out");
      return 0;
    });
  } else {  // grouped-query attention as the CLI's sdpa builds it: q [B, H, L, D] viewed as
            // [B, KvHeads, Group, L, D] against k/v [B, KvHeads, S, D]
    auto q = input<Tensor<f32, Batch<dyn>, Heads<dyn>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
    auto k = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, HeadDim<dyn>>>(g, "k");
    auto v = input<Tensor<f32, Batch<dyn>, KvHeads<dyn>, Key<dyn>, ValueDim<dyn>>>(g, "v");
    auto qg = split<Heads, KvHeads<dyn>, Group<dyn>>(q, {s.kv_heads, s.heads / s.kv_heads});
    with_masks(g, s, [&](auto... masks) {
      auto p = softmax<Key>(nn::detail::apply_masks(scaled(contract<HeadDim>(qg, k)), masks...));
      if (s.weights) output(merge<KvHeads, Group, Heads>(p), "weights");
      auto o = s.dropout > 0.0 ? contract<Key>(dropout(p, s.dropout, 1234), v) : contract<Key>(p, v);
      output(merge<KvHeads, Group, Heads>(o), "out");
      return 0;
    });
  }
  c.sizes = {{"Batch", s.batch}, {"Heads", s.heads}, {"KvHeads", s.kv_heads}, {"Group", s.heads / s.kv_heads},
             {"Seq", s.len_q},   {"Key", s.len_k},   {"HeadDim", s.dk},       {"ValueDim", s.dv}};
  c.feeds = random_feeds(g, c.sizes, 17 + static_cast<std::uint64_t>(s.len_q * 31 + s.len_k), 1.0f);
  if (s.padding) {
    std::vector<std::int64_t> lengths;
    for (std::int64_t b = 0; b < s.batch; ++b) lengths.push_back(s.len_k * (3 - b % 4) / 3);
    c.feeds["key_keep"] = keep_first(lengths, s.len_k);
  }
  return c;
}

// --- the CLI's models -----------------------------------------------------------------------

std::vector<Case> cli_model_cases() {
  struct Shape {
    std::int64_t batch, heads, seq, kv_seq, head_dim;
  };
  auto sizes = [](const Shape& s) {
    const std::int64_t E = s.heads * s.head_dim;
    return Bindings{{"Batch", s.batch}, {"Seq", s.seq},          {"Key", s.kv_seq},        {"Mem", s.kv_seq},
                    {"Heads", s.heads}, {"HeadDim", s.head_dim}, {"ValueDim", s.head_dim}, {"Model", E},
                    {"Proj", 3 * E},    {"Hidden", 4 * E}};
  };
  std::vector<Case> cases;
  auto add = [&](std::string name, Graph g, const Shape& shape, bool padding) {
    Case c;
    c.name = std::move(name);
    c.graph = std::move(g);
    c.sizes = sizes(shape);
    c.feeds = random_feeds(c.graph, c.sizes, 5, 0.5f);
    if (padding) {
      std::vector<std::int64_t> lengths;
      for (std::int64_t b = 0; b < shape.batch; ++b) lengths.push_back(1 + (shape.kv_seq - 1) * (b + 1) / shape.batch);
      c.feeds["key_keep"] = keep_first(lengths, shape.kv_seq);
    }
    cases.push_back(std::move(c));
  };
  using cli::Causal;
  using cli::Masks;
  for (const bool padding : {false, true})
    for (const Causal causal : {Causal::none, Causal::top_left, Causal::bottom_right}) {
      Masks masks;
      masks.key_padding = padding;
      masks.causal = causal;
      const std::string suffix =
          std::string(padding ? "_padding" : "") + (causal == Causal::top_left       ? "_causal_tl"
                                                    : causal == Causal::bottom_right ? "_causal_br"
                                                                                     : "");
      const bool square = causal == Causal::top_left;  // as `qkv bench` without an alignment
      cli::SdpaModel sdpa;
      sdpa.masks = masks;
      sdpa.weights = padding;
      add("sdpa" + suffix, cli::build_sdpa(sdpa), {2, 3, 33, square ? 33 : 20, 64}, padding);
      cli::MhaModel mha;
      mha.heads = 4;
      mha.masks = masks;
      mha.weights = !padding;
      mha.cross = !square;
      add("mha" + suffix, cli::build_mha(mha), {2, 4, 17, square ? 17 : 9, 16}, padding);
      if (square || causal == Causal::none) {
        cli::EncoderModel enc;
        enc.heads = 2;
        enc.masks = masks;
        enc.gelu = padding;
        enc.norm_first = causal == Causal::top_left;
        enc.masks.causal = causal;
        add("encoder_layer" + suffix, cli::build_encoder(enc), {2, 2, 9, 9, 16}, padding);
      }
    }
  Masks bias;
  bias.bias = Masks::Bias::query_key;
  cli::SdpaModel sdpa;
  sdpa.masks = bias;
  add("sdpa_attn_bias", cli::build_sdpa(sdpa), {1, 2, 7, 33, 80}, false);
  cli::MhaModel mha;
  mha.heads = 2;
  mha.masks = bias;
  add("mha_attn_bias", cli::build_mha(mha), {2, 2, 5, 5, 8}, false);
  return cases;
}

Error relative_error(const NdArray& got, const NdArray& want) {
  if (got.shape != want.shape) return {std::numeric_limits<double>::infinity(), 0};
  const auto a = got.to_f32(), e = want.to_f32();
  Error err;
  for (std::size_t i = 0; i < e.size(); ++i) {
    double d = std::abs(static_cast<double>(a[i]) - e[i]) / std::max(1.0, std::abs(static_cast<double>(e[i])));
    if (std::isnan(a[i]) != std::isnan(e[i]) || std::isnan(d)) d = std::numeric_limits<double>::infinity();
    if ((std::isnan(a[i]) && std::isnan(e[i])) || a[i] == e[i]) d = 0;  // == : the same infinity
    if (d > err.worst) err = {d, i};
  }
  return err;
}

Graph cached_attention_layer() {
  using namespace qkv::nn;
  Graph g;
  const auto attn = LlamaAttention<32>::make(g, "a.", {.heads = 4, .kv_heads = 2, .head_dim = 8});
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "x");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "positions");
  auto ck = input<KvCache>(g, "cache_k");
  auto cv = input<KvCache>(g, "cache_v");
  auto [out, k2, v2] = attn.cached(x, positions, ck, cv, size_input<Past>(g, "past_length"));
  output(out, "out");
  output(k2, "present_k");
  output(v2, "present_v");
  return g;
}

}  // namespace qkv::test
