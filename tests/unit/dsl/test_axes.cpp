// The DSL's compile-time layer: axes, extents, names; and the graphs that ops record.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <qkv/qkv.hpp>

using ::testing::HasSubstr;

namespace {
QKV_AXIS(Batch);
QKV_AXIS(Seq);
QKV_AXIS(Key);
QKV_AXIS(Model);
QKV_AXIS(Heads);
QKV_AXIS(HeadDim);
}  // namespace

namespace qkv {
namespace {

static_assert(Model<512>::is_static && Model<512>::extent == 512);
static_assert(!Seq<dyn>::is_static && !Seq<>::is_static);
static_assert(same_name<Seq<4>, Seq<dyn>> && !same_name<Seq<4>, Key<4>>);
static_assert(has_family<axes<Batch<2>, Seq<4>>, Seq> && !has_family<axes<Batch<2>, Seq<4>>, Key>);
static_assert(index_of<axes<Batch<2>, Seq<4>, Model<8>>, Model<dyn>> == 2);
static_assert(std::is_same_v<without<axes<Batch<2>, Seq<4>, Model<8>>, axes<Seq<dyn>>>, axes<Batch<2>, Model<8>>>);
static_assert(number<512>().view() == "512" && number<-7>().view() == "-7" && number<0>().view() == "0");
static_assert(axes_fs<axes<Batch<2>, Seq<dyn>>>().view() == "[Batch=2, Seq=dyn]");
static_assert(AxisType<Heads<8>> && !AxisType<int>);

TEST(Dsl, InputRecordsANodeWithNamedAxes) {
  Graph g;
  auto x = input<Tensor<f32, Batch<>, Seq<>, Model<16>>>(g, "x");
  ASSERT_EQ(g.size(), 1u);
  const Node& n = x.node();
  EXPECT_EQ(n.op, Op::input);
  EXPECT_EQ(n.name, "x");
  ASSERT_EQ(n.axes.size(), 3u);
  EXPECT_EQ(n.axes[1].name, "Seq");
  EXPECT_EQ(n.axes[1].extent, Extent::dynamic("Seq"));
  EXPECT_EQ(n.axes[2].extent, Extent::fixed(16));
}

TEST(Dsl, SplitPermuteMergeRoundTripsTheAxes) {
  Graph g;
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<16>>>(g, "x");
  auto h = permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<8>>(x));
  Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>> typed = h;
  auto back = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(typed));
  Tensor<f32, Batch<2>, Seq<4>, Model<16>> same = back;
  EXPECT_EQ(same.node().axes, x.node().axes);
}

TEST(Dsl, DynamicSplitDefersDivisibilityToBindTime) {
  Graph g;
  auto x = input<Tensor<f32, Batch<>, Seq<>, Model<>>>(g, "x");
  auto h = split<Model, Heads<4>, HeadDim<dyn>>(x);
  EXPECT_EQ(h.node().axes[3].extent, Extent::dynamic("Model").divided(4));
  EXPECT_NO_THROW(g.check({{"Batch", 1}, {"Seq", 3}, {"Model", 64}}));
  try {
    g.check({{"Batch", 1}, {"Seq", 3}, {"Model", 66}});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("split: `Model` (66) is not a multiple of Heads (4) x HeadDim (dyn) = 4"));
  }
}

}  // namespace
}  // namespace qkv
