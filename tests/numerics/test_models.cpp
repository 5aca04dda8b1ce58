// Whole small models written with qkv::nn's blocks and the DSL's structure ops against PyTorch
// 1.13 (tests/numerics/make_model_fixtures.py): nn.TransformerDecoderLayer both ways, an
// encoder–decoder whose source and target have different lengths, and a ViT block (a CLS token
// prepended over the batch, learned positions, the CLS row selected). Each runs on the reference
// interpreter and on the CPU backend; the tolerance is the fixture's (4 × PyTorch's own fp32
// error, at least 2e-6 relative).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include <qkv/codegen/cpu/executor.hpp>
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

void expect_matches(const std::string& name, const Graph& g, const Feeds& feeds) {
  std::ifstream in(kDir / name / "case.json");
  const double tol = nlohmann::json::parse(in).at("tol").get<double>();
  const NdArray expected = read_npy(kDir / name / "expected_out_f64.npy");
  for (const bool compiled : {false, true}) {
    const RunResult r = compiled ? codegen::cpu::run(g, feeds) : interpret(g, feeds);
    const NdArray& out = r.outputs.at("out");
    ASSERT_EQ(out.shape, expected.shape) << name;
    const auto got = out.to_f32();
    const auto want = expected.as<double>();
    double err = 0;
    for (std::size_t i = 0; i < got.size(); ++i) err = std::max(err, std::abs(got[i] - want[i]));
    EXPECT_LE(err, tol) << name << (compiled ? " on the cpu backend" : " on the interpreter");
  }
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
