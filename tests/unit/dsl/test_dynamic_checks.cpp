// With dynamic extents, the catalogue's size checks run when the graph is bound to sizes and
// throw qkv::ShapeError with the compile-time message (sizes filled in).
#include <gtest/gtest.h>

#include <qkv/qkv.hpp>

namespace qkv::nn {
namespace {

std::string bind_error(const Graph& g, const Bindings& b) {
  try {
    g.check(b);
  } catch (const ShapeError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(DynamicChecks, ContractionSizeMismatch) {  // catalogue 4
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, Seq<dyn>, HeadDim<64>>>(g, "q");
  auto k = rename<Mem, Key>(input<Tensor<f32, Batch<dyn>, Mem<dyn>, HeadDim<dyn>>>(g, "k"));
  auto s = contract<HeadDim>(q, k);
  (void)s;
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Mem", 5}, {"HeadDim", 64}}), "(no error)");
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Mem", 5}, {"HeadDim", 32}}),
            "contract: `HeadDim` of lhs (64) must equal `HeadDim` of rhs (32); fix: contracted axes must have one size "
            "(Q*K^T: the same d_k; P*V: keys and values from one sequence)");
}

TEST(DynamicChecks, HeadsMustDivideModel) {  // catalogue 5
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "x");
  auto h = split<Model, Heads<6>, HeadDim<dyn>>(x);
  (void)h;
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Model", 516}}), "(no error)");
  EXPECT_EQ(
      bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Model", 512}}),
      "split: `Model` (512) is not a multiple of Heads (6) x HeadDim (dyn) = 6; fix: choose factors that divide Model");
}

TEST(DynamicChecks, ProjectionWidth) {  // catalogue 8
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "x");
  auto y = linear(x, linear_params<Model<32>, Model<32>>(g, "out_proj"));
  (void)y;
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Model", 32}}), "(no error)");
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Model", 16}}),
            "linear: `Model` of x (16) must equal the input width of the projection (32); fix: the features entering a "
            "projection must match its weight");
}

TEST(DynamicChecks, ResidualWidth) {  // catalogue 8, residual form
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>>>(g, "x");
  auto branch = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "branch");
  auto y = add(x, branch);
  (void)y;
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 3}, {"Model", 8}}),
            "add: `Model` of lhs (16) must equal `Model` of rhs (8); fix: both operands need the same size on shared "
            "axes (a residual branch must return d_model features)");
}

TEST(DynamicChecks, CausalWithoutAlignment) {  // catalogue 12
  Graph g;
  auto q = input<Tensor<f32, Seq<dyn>, HeadDim<8>>>(g, "q");
  auto k = rename<Mem, Key>(input<Tensor<f32, Mem<dyn>, HeadDim<8>>>(g, "k"));
  auto s = causal<Seq, Key>(scaled(contract<HeadDim>(q, k)));
  (void)s;
  EXPECT_EQ(bind_error(g, {{"Seq", 4}, {"Mem", 4}}), "(no error)");
  EXPECT_EQ(
      bind_error(g, {{"Seq", 4}, {"Mem", 6}}),
      "causal: `Seq` (4) != `Key` (6), so the alignment of the mask matters; fix: causal<Seq, Key>(s, top_left) as "
      "in PyTorch is_causal, or bottom_right as in FlashAttention");
}

TEST(DynamicChecks, BlockCausalWithoutAlignment) {  // issue 12, item 3: the fix speaks to the block's caller
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>>>(g, "x");
  auto memory = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Model<16>>>(g, "memory");
  output(MultiHeadAttention<16, 2>::make(g).cross(x, memory, causal_mask).first, "out");
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 4}, {"Mem", 4}}), "(no error)");
  EXPECT_EQ(bind_error(g, {{"Batch", 1}, {"Seq", 4}, {"Mem", 6}}),
            "causal: `Seq` (4) != `Key` (6), so the alignment of the mask matters; fix: pass causal_top_left (as "
            "PyTorch is_causal) or causal_bottom_right (as FlashAttention) instead of causal_mask");
}

TEST(DynamicChecks, BatchAxisOfAContraction) {  // issue 12, item 8: a batch axis is not contracted
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Seq<dyn>, HeadDim<8>>>(g, "q");
  auto k = rename<Mem, Key>(input<Tensor<f32, Batch<dyn>, Mem<dyn>, HeadDim<8>>>(g, "k"));
  auto s = contract<HeadDim>(q, k);
  (void)s;
  EXPECT_EQ(bind_error(g, {{"Batch", 2}, {"Seq", 3}, {"Mem", 5}}), "(no error)");
  EXPECT_EQ(bind_error(g, {{"Batch", 3}, {"Seq", 3}, {"Mem", 5}}),
            "contract: `Batch` of lhs (2) must equal `Batch` of rhs (3); fix: `Batch` is kept by both operands, so it "
            "is a batch axis and must have one size (the same batch, the same heads)");
}

TEST(DynamicChecks, AlignedCausalNeedsNoEqualLengths) {
  Graph g;
  auto q = input<Tensor<f32, Seq<dyn>, HeadDim<8>>>(g, "q");
  auto k = rename<Mem, Key>(input<Tensor<f32, Mem<dyn>, HeadDim<8>>>(g, "k"));
  auto s = causal<Seq, Key>(scaled(contract<HeadDim>(q, k)), bottom_right);
  (void)s;
  EXPECT_EQ(bind_error(g, {{"Seq", 4}, {"Mem", 6}}), "(no error)");
}

TEST(DynamicChecks, DeclaredSizeOfADynamicValue) {  // catalogue 6/11 conversions, size part
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<dyn>>>(g, "x");
  Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>> typed = x;
  (void)typed;
  EXPECT_EQ(bind_error(g, {{"Batch", 2}, {"Seq", 3}, {"Model", 12}}),
            "convert: `Model` is 12 but the declared type wants 16; fix: declare the size the value has");
}

TEST(DynamicChecks, SelfAttentionKeysFollowQueriesSoNoCheckIsNeeded) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>>>(g, "x");
  auto mha = MultiHeadAttention<16, 2>::make(g);
  output(mha(x, causal_mask).first, "out");
  EXPECT_EQ(bind_error(g, {{"Batch", 3}, {"Seq", 17}}), "(no error)");
}

}  // namespace
}  // namespace qkv::nn
