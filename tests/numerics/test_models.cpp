// Whole small models written with qkv::nn's blocks and the DSL's structure ops against PyTorch
// 1.13 (tests/numerics/make_model_fixtures.py): nn.TransformerDecoderLayer both ways, an
// encoder–decoder whose source and target have different lengths, and a ViT block (a CLS token
// prepended over the batch, learned positions, the CLS row selected). Each runs on the reference
// interpreter and on the CPU backend — the output, and the gradients of Σ out ⊙ probe by every
// parameter and input (reverse mode over the graph) against PyTorch autograd's; the tolerance is
// the fixture's (4 × PyTorch's own fp32 error, at least 2e-6 relative), per tensor.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/safetensors.hpp>

namespace qkv::nn {
namespace {

namespace fs = std::filesystem;
const fs::path kDir = fs::path(QKV_FIXTURES_DIR).parent_path() / "model_fixtures";

QKV_AXIS(Patch);
QKV_AXIS(Classes);

/// The case's weights and its inputs: float arrays by their names; PyTorch's padding masks
/// (true = padding) as qkv's keep-masks `<name>_keep` (true = may attend).
Feeds feeds_of(const std::string& name, std::initializer_list<const char*> inputs) {
  Feeds f;
  const SafetensorsFile w = SafetensorsFile::open(kDir / name / "weights.safetensors");
  for (const auto& n : w.names()) f[n] = w.load(n);
  for (const std::string in : inputs) {
    NdArray a = read_npy(kDir / name / (in + ".npy"));
    if (a.dtype == DType::boolean) {
      for (bool& x : a.as<bool>()) x = !x;
      f[in.substr(0, in.find("_key_padding_mask")) + "_keep"] = std::move(a);
    } else {
      f[in] = std::move(a);
    }
  }
  return f;
}

/// max |got − want| over the entries (want: an fp64 fixture).
double max_error(const NdArray& got, const NdArray& want) {
  EXPECT_EQ(got.shape, want.shape);
  const auto g = got.to_f32();
  const auto w = want.as<double>();
  double err = 0;
  for (std::size_t i = 0; i < g.size() && i < w.size(); ++i) err = std::max(err, std::abs(g[i] - w[i]));
  return err;
}

int leaf_named(const Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    if (is_array_leaf(g.node(static_cast<int>(i))) && g.node(static_cast<int>(i)).name == name)
      return static_cast<int>(i);
  ADD_FAILURE() << "no input or parameter " << name;
  return 0;
}

/// The output "out" against the fixture; then the gradients of L = Σ out ⊙ probe by every
/// parameter and float input (reverse mode, qkv/ir/grad.hpp) against PyTorch autograd's.
void expect_matches(const std::string& name, Graph g, Feeds feeds) {
  std::ifstream in(kDir / name / "case.json");
  const auto c = nlohmann::json::parse(in);
  const NdArray expected = read_npy(kDir / name / "expected_out_f64.npy");
  const Graph forward = g;
  int out = -1;
  for (const auto& o : g.outputs())
    if (o.name == "out") out = o.node;
  // The loss and the gradients join the same graph.
  Node probe;
  probe.op = Op::input;
  probe.name = "probe";
  probe.axes = g.node(out).axes;
  const int r = g.add(std::move(probe));
  feeds["probe"] = read_npy(kDir / name / "probe.npy");
  grad_detail::Builder b(g);
  std::vector<std::string> axes, wrt;
  for (const auto& a : g.node(out).axes) axes.push_back(a.name);
  std::vector<int> ids;
  for (const auto& [w, tol] : c.at("grad_tol").items()) {
    wrt.push_back(w);
    ids.push_back(leaf_named(g, w));
  }
  const std::vector<int> grads = append_gradients(g, b.sum_over(b.binary(Op::mul, out, r), axes), ids);
  for (std::size_t k = 0; k < grads.size(); ++k) g.mark_output(grads[k], "d" + wrt[k]);

  // The forward on both backends; the gradients on the interpreter (the reference: the CPU
  // backend's gradients are checked against it on smaller graphs, test_grad.cpp — compiling a
  // whole backward graph costs tens of seconds here).
  EXPECT_LE(max_error(codegen::cpu::run(forward, feeds).outputs.at("out"), expected), c.at("tol").get<double>())
      << name << " on the cpu backend";
  const RunResult run = interpret(g, feeds);
  EXPECT_LE(max_error(run.outputs.at("out"), expected), c.at("tol").get<double>()) << name << " on the interpreter";
  for (const auto& w : wrt)
    EXPECT_LE(max_error(run.outputs.at("d" + w), read_npy(kDir / name / ("grad_" + w + ".npy"))),
              c.at("grad_tol").at(w).get<double>())
        << name << ": d" << w << " on the interpreter";
}

using Target = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>;
using Memory = Tensor<f32, Batch<dyn>, Mem<dyn>, Model<32>>;
using KeyKeep = KeyPaddingMask<Batch<dyn>, Key<dyn>>;

TEST(Models, TransformerDecoderLayerPostNormWithACausalTargetAndPaddedMemory) {
  Graph g;
  auto layer = DecoderLayer<32, 4, 64>::make(g, "", NormPlacement::post);
  auto out = layer(input<Target>(g, "tgt"), input<Memory>(g, "memory"), std::tuple{causal_mask},
                   std::tuple{input<KeyKeep>(g, "memory_keep")});
  output(out, "out");
  expect_matches("decoder_post", g, feeds_of("decoder_post", {"tgt", "memory", "memory_key_padding_mask"}));
}

TEST(Models, TransformerDecoderLayerPreNormWithAPaddedTarget) {
  Graph g;
  auto layer = DecoderLayer<32, 4, 64, Activation::gelu>::make(g, "", NormPlacement::pre);
  auto out = layer(input<Target>(g, "tgt"), input<Memory>(g, "memory"),
                   std::tuple{causal_mask, input<KeyKeep>(g, "tgt_keep")}, std::tuple{});
  output(out, "out");
  expect_matches("decoder_pre", g, feeds_of("decoder_pre", {"tgt", "memory", "tgt_key_padding_mask"}));
}

TEST(Models, EncoderDecoderWithSourceAndTargetOfDifferentLengths) {
  // The source is declared over its own axis (Mem), so its length and the target's are two
  // sizes; the encoder sees it as Seq, and its output becomes the decoder's memory again.
  Graph g;
  auto src = input<Memory>(g, "src");
  auto keep = input<KeyKeep>(g, "src_keep");
  auto encoder = EncoderLayer<32, 4, 64>::make(g, "encoder.", NormPlacement::post);
  auto decoder = DecoderLayer<32, 4, 64>::make(g, "decoder.", NormPlacement::post);
  auto memory = rename<Seq, Mem>(encoder(rename<Mem, Seq>(src), keep));
  output(decoder(input<Target>(g, "tgt"), memory, std::tuple{causal_mask}, std::tuple{keep}), "out");
  expect_matches("encoder_decoder", g, feeds_of("encoder_decoder", {"src", "tgt", "src_key_padding_mask"}));
}

TEST(Models, VitBlockPrependsALearnedClsTokenOverTheBatch) {
  Graph g;
  auto patches = input<Tensor<f32, Batch<dyn>, Seq<6>, Patch<12>>>(g, "patches");
  auto cls = param<Tensor<f32, Seq<1>, Model<32>>>(g, "cls_token");
  auto positions = param<Tensor<f32, Seq<7>, Model<32>>>(g, "pos_embed");
  auto x = add(prepend<Seq>(linear(patches, linear_params<Patch<12>, Model<32>>(g, "patch_embed")), cls), positions);
  auto block = EncoderLayer<32, 4, 64, Activation::gelu>::make(g, "block.", NormPlacement::pre);
  auto h = layer_norm(block(x), layer_norm_params<Model<32>>(g, "norm"));
  output(linear(select<Seq, 0>(h), linear_params<Model<32>, Classes<10>>(g, "head")), "out");
  expect_matches("vit", g, feeds_of("vit", {"patches"}));
}

}  // namespace
}  // namespace qkv::nn
