// PyTorch state-dict import: hyper-parameters inferred from shapes as PyTorch's constructors
// would; every missing or mis-shaped key is an error that names it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>

#include <qkv/runtime/io/safetensors.hpp>
#include <qkv/runtime/torch_import.hpp>

using ::testing::HasSubstr;

namespace qkv {
namespace {

namespace fs = std::filesystem;

SafetensorsFile fixture(const std::string& name) {
  return SafetensorsFile::open(fs::path(QKV_FIXTURES_DIR) / name / "weights.safetensors");
}

/// The fixture's state dict with `edit` applied, as a new in-memory file.
template <class Edit>
SafetensorsFile edited(const std::string& name, Edit edit) {
  const SafetensorsFile sd = fixture(name);
  std::map<std::string, NdArray> tensors;
  for (const auto& k : sd.names()) tensors[k] = sd.load(k);
  edit(tensors);
  return SafetensorsFile::from_bytes(serialize_safetensors(tensors), "edited " + name);
}

std::string import_error(const SafetensorsFile& sd, std::int64_t heads) {
  try {
    import_mha(sd, infer_mha_config(sd, heads));
  } catch (const StateDictError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(TorchImport, InfersFusedSelfAttention) {
  const MhaConfig c = infer_mha_config(fixture("key_padding"), 4);
  EXPECT_EQ(c.embed_dim, 32);
  EXPECT_EQ(c.head_dim(), 8);
  EXPECT_EQ(c.kdim, 32);
  EXPECT_TRUE(c.bias);
  EXPECT_FALSE(c.add_bias_kv);
  EXPECT_FALSE(c.separate_qkv);
}

TEST(TorchImport, InfersKdimVdimFromSeparateProjections) {
  const MhaConfig c = infer_mha_config(fixture("cross_kdim_vdim"), 4);
  EXPECT_TRUE(c.separate_qkv);
  EXPECT_EQ(c.kdim, 20);
  EXPECT_EQ(c.vdim, 12);
}

TEST(TorchImport, InfersBiasAndBiasKV) {
  EXPECT_FALSE(infer_mha_config(fixture("no_bias"), 4).bias);
  const MhaConfig c = infer_mha_config(fixture("add_bias_kv"), 4);
  EXPECT_TRUE(c.add_bias_kv);
  const Feeds f = import_mha(fixture("add_bias_kv"), c);
  EXPECT_EQ(f.at("bias_k").shape, (std::vector<std::int64_t>{1, 32}));  // [1, 1, E] -> qkv's [Key=1, Model]
}

TEST(TorchImport, EncoderLayerConfig) {
  const EncoderLayerConfig c = infer_encoder_layer_config(fixture("encoder_gelu_pre"), 4);
  EXPECT_EQ(c.self_attn.embed_dim, 32);
  EXPECT_EQ(c.dim_feedforward, 64);
  const Feeds f = import_encoder_layer(fixture("encoder_gelu_pre"), c);
  EXPECT_TRUE(f.contains("self_attn.in_proj_weight"));
  EXPECT_TRUE(f.contains("norm2.bias"));
}

TEST(TorchImport, HeadsMustDivideEmbedDim) {
  EXPECT_THAT(import_error(fixture("key_padding"), 5), HasSubstr("embed_dim 32"));
  EXPECT_THAT(import_error(fixture("key_padding"), 5), HasSubstr("not divisible by num_heads 5"));
}

TEST(TorchImport, MissingKeyIsNamed) {
  auto sd = edited("key_padding", [](auto& t) { t.erase("out_proj.bias"); });
  EXPECT_THAT(import_error(sd, 4), HasSubstr("missing key 'out_proj.bias'"));
  auto no_proj = edited("key_padding", [](auto& t) { t.erase("in_proj_weight"); });
  EXPECT_THAT(import_error(no_proj, 4), HasSubstr("missing key 'in_proj_weight'"));
  auto no_out = edited("key_padding", [](auto& t) { t.erase("out_proj.weight"); });
  EXPECT_THAT(import_error(no_out, 4), HasSubstr("missing key 'out_proj.weight'"));
}

TEST(TorchImport, MisShapedKeyIsNamedWithBothShapes) {
  auto sd = edited("key_padding", [](auto& t) { t["in_proj_weight"] = NdArray::zeros(DType::f32, {96, 31}); });
  const std::string e = import_error(sd, 4);
  EXPECT_THAT(e, HasSubstr("'in_proj_weight' has shape (96, 31), expected (96, 32)"));
  auto bias = edited("key_padding", [](auto& t) { t["in_proj_bias"] = NdArray::zeros(DType::f32, {32}); });
  EXPECT_THAT(import_error(bias, 4), HasSubstr("'in_proj_bias' has shape (32,), expected (96,)"));
}

TEST(TorchImport, EncoderLayerMissingNormIsNamed) {
  auto sd = edited("encoder_relu_post", [](auto& t) { t.erase("norm2.weight"); });
  try {
    import_encoder_layer(sd, infer_encoder_layer_config(sd, 4));
    FAIL() << "expected StateDictError";
  } catch (const StateDictError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing key 'norm2.weight'"));
  }
}

}  // namespace
}  // namespace qkv
