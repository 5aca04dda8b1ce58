// The building blocks in qkv::nn record the graphs the tutorials draw: checked through the
// shape table (one line per op with output axes and sizes) and the parameter names.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <qkv/qkv.hpp>

using ::testing::HasSubstr;

namespace qkv::nn {
namespace {

std::vector<std::string> param_names(const Graph& g) {
  std::vector<std::string> names;
  for (const auto& n : g.nodes())
    if (n.op == Op::param) names.push_back(n.name);
  return names;
}

/// The output column of the table line for node `id`.
std::string line_of(const Graph& g, int id) {
  std::istringstream in(g.table());
  std::string line;
  const std::string tag = "%" + std::to_string(id) + " ";
  while (std::getline(in, line))
    if (line.rfind(tag, 0) == 0) return line;
  return {};
}

int find_op(const Graph& g, Op op, int nth = 0) {
  for (int i = 0; i < static_cast<int>(g.size()); ++i)
    if (g.node(i).op == op && nth-- == 0) return i;
  return -1;
}

TEST(Blocks, MultiHeadAttentionRecordsTheTutorialsShapeTable) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "keep");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  auto [out, weights] = mha(x, keep);
  output(out, "out");

  EXPECT_EQ(param_names(g),
            (std::vector<std::string>{"in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"}));
  EXPECT_THAT(line_of(g, find_op(g, Op::split, 0)), HasSubstr("[Batch=2, Seq=4, Heads=2, HeadDim=8]"));
  EXPECT_THAT(line_of(g, find_op(g, Op::permute, 0)), HasSubstr("[Batch=2, Heads=2, Seq=4, HeadDim=8]"));
  EXPECT_THAT(line_of(g, find_op(g, Op::contract, 0)), HasSubstr("contract<HeadDim>"));
  EXPECT_THAT(line_of(g, find_op(g, Op::contract, 0)), HasSubstr("[Batch=2, Heads=2, Seq=4, Key=4]"));
  EXPECT_THAT(line_of(g, find_op(g, Op::softmax)), HasSubstr("softmax<Key>"));
  EXPECT_THAT(line_of(g, find_op(g, Op::contract, 1)), HasSubstr("[Batch=2, Heads=2, Seq=4, HeadDim=8]"));
  EXPECT_THAT(line_of(g, find_op(g, Op::merge)), HasSubstr("[Batch=2, Seq=4, Model=16]"));
  EXPECT_EQ(out.node().op, Op::linear);
  EXPECT_EQ(weights.node().op, Op::softmax);
  // The fused in-projection is cut in three equal row blocks.
  EXPECT_THAT(line_of(g, find_op(g, Op::slice, 0)), HasSubstr("[out=16, in=16]"));
  const double scale = g.node(find_op(g, Op::scale)).scalar;
  EXPECT_DOUBLE_EQ(scale, 1.0 / std::sqrt(8.0));  // 1/sqrt(d_k), d_k = 16 / 2
}

TEST(Blocks, SelfAttentionHasPyTorchNamesAndConfigurableWidths) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>>>(g, "x");
  auto sa = SelfAttention<16, 8, 4>::make(g, "", /*bias=*/false);
  auto [out, weights] = sa(x);
  Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>> typed = out;
  Tensor<f32, Batch<dyn>, Seq<dyn>, Key<dyn>> w = weights;
  EXPECT_EQ(param_names(g),
            (std::vector<std::string>{"q_proj.weight", "k_proj.weight", "v_proj.weight", "out_proj.weight"}));
  EXPECT_THAT(line_of(g, find_op(g, Op::linear, 2)), HasSubstr("[Batch?, Seq?, ValueDim=4]"));
  EXPECT_EQ(typed.node().axes.back().extent, Extent::fixed(16));
  EXPECT_EQ(w.node().axes.back().extent, Extent::dynamic("Seq"));  // keys are the same tokens as queries
}

TEST(Blocks, HeadsAsModulesConcatenatesHeadOutputs) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto m = HeadsAsModules<16, 4>::make(g);
  Tensor<f32, Batch<2>, Seq<4>, Model<16>> out = m(x);
  EXPECT_THAT(line_of(g, find_op(g, Op::concat)), HasSubstr("concat<ValueDim,Model>"));
  EXPECT_THAT(line_of(g, find_op(g, Op::concat)), HasSubstr("[Batch=2, Seq=4, Model=16]"));
  EXPECT_EQ(g.node(find_op(g, Op::concat)).inputs.size(), 4u);
  EXPECT_EQ(param_names(g).front(), "heads.0.q_proj.weight");
  (void)out;
}

TEST(Blocks, CrossAttentionTakesKeysFromAnotherSequence) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<16>>>(g, "x");
  auto key = input<Tensor<f32, Batch<2>, Mem<7>, Hidden<8>>>(g, "key");
  auto value = input<Tensor<f32, Batch<2>, Mem<7>, ValueDim<12>>>(g, "value");
  auto ca = CrossAttention<16, 2, 8, 12>::make(g);
  auto [out, weights] = ca(x, key, value);
  Tensor<f32, Batch<2>, Seq<3>, Model<16>> o = out;
  Tensor<f32, Batch<2>, Heads<2>, Seq<3>, Key<7>> w = weights;
  EXPECT_EQ(param_names(g), (std::vector<std::string>{"q_proj_weight", "k_proj_weight", "v_proj_weight",
                                                      "out_proj.weight", "out_proj.bias", "in_proj_bias"}));
  (void)o;
  (void)w;
}

TEST(Blocks, CrossWithAMemoryAndMasksIsTheKeyValueCallWithOneTensor) {  // issue 12, item 3
  auto build = [](bool one_tensor) {
    Graph g;
    auto x = input<Tensor<f32, Batch<2>, Seq<5>, Model<16>>>(g, "x");
    auto memory = input<Tensor<f32, Batch<2>, Mem<7>, Model<16>>>(g, "memory");
    auto keep = input<KeyPaddingMask<Batch<2>, Key<7>>>(g, "keep");
    auto bias = input<Tensor<f32, Seq<5>, Key<7>>>(g, "bias");
    auto mha = MultiHeadAttention<16, 2>::make(g);
    output((one_tensor ? mha.cross(x, memory, keep, bias) : mha.cross(x, memory, memory, keep, bias)).first, "out");
    return g;
  };
  const Graph a = build(true), b = build(false);
  EXPECT_EQ(a.size() + 1, b.size());  // the memory renamed Mem -> Key once, not once for keys and once for values
  EXPECT_EQ(a.node(a.outputs()[0].node).axes, b.node(b.outputs()[0].node).axes);
  const int masked = find_op(a, Op::keep_mask);
  ASSERT_NE(masked, -1);
  EXPECT_EQ(a.node(a.node(masked).inputs[1]).name, "keep");  // the mask is a mask, not the values
  EXPECT_NE(find_op(a, Op::bias), -1);
}

TEST(Blocks, GroupedQueryAttentionSharesKeyValueHeads) {
  Graph g;
  auto x = input<Tensor<f32, Batch<1>, Seq<5>, Model<32>>>(g, "x");
  auto gqa = GroupedQueryAttention<32, 4, 2>::make(g);
  auto [out, weights] = gqa(x);
  Tensor<f32, Batch<1>, Seq<5>, Model<32>> o = out;
  Tensor<f32, Batch<1>, KvHeads<2>, Group<2>, Seq<5>, Key<5>> w = weights;
  EXPECT_THAT(line_of(g, find_op(g, Op::linear, 1)), HasSubstr("[Batch=1, Seq=5, Proj=16]"));  // Hkv * d = 2 * 8
  (void)o;
  (void)w;
}

TEST(Blocks, EncoderLayerPostAndPreNormDiffer) {
  auto build = [](NormPlacement placement) {
    Graph g;
    auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
    auto layer = EncoderLayer<16, 2, 32, Activation::gelu>::make(g, "", placement);
    output(layer(x), "out");
    return g;
  };
  const Graph post = build(NormPlacement::post), pre = build(NormPlacement::pre);
  EXPECT_NE(post.hash(), pre.hash());
  EXPECT_EQ(post.node(post.outputs()[0].node).op, Op::layer_norm);  // post-norm ends in norm2
  EXPECT_EQ(pre.node(pre.outputs()[0].node).op, Op::add);           // pre-norm ends in the residual
  EXPECT_NE(find_op(post, Op::gelu), -1);
  auto names = param_names(post);
  EXPECT_NE(std::find(names.begin(), names.end(), "self_attn.in_proj_weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "linear1.weight"), names.end());
  EXPECT_NE(std::find(names.begin(), names.end(), "norm2.bias"), names.end());
}

TEST(Blocks, CausalDecoderBlockMasksTheFuture) {
  Graph g;
  auto x = input<Tensor<f32, Batch<1>, Seq<6>, Model<16>>>(g, "x");
  auto block = CausalDecoderBlock<16, 2, 64>::make(g);
  output(block(x), "out");
  const int c = find_op(g, Op::causal);
  ASSERT_NE(c, -1);
  EXPECT_EQ(g.node(c).attr_axes, (std::vector<std::string>{"Seq", "Key"}));
  EXPECT_EQ(g.node(c).align, CausalAlign::top_left);
}

TEST(Blocks, GraphsOfTheSameModelAreEqualAndHashEqual) {
  auto build = [] {
    Graph g;
    auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(g, "x");
    output(MultiHeadAttention<64, 4>::make(g)(x).first, "out");
    return g;
  };
  EXPECT_EQ(build(), build());
  EXPECT_EQ(build().hash(), build().hash());
}

}  // namespace
}  // namespace qkv::nn
