// The DSL's compile-time layer: axes, extents, names; and the graphs that ops record.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <tuple>

#include <qkv/qkv.hpp>

using ::testing::HasSubstr;

namespace {
QKV_AXIS(Batch);
QKV_AXIS(Seq);
QKV_AXIS(Key);
QKV_AXIS(Model);
QKV_AXIS(Heads);
QKV_AXIS(HeadDim);
QKV_AXIS(Mem);
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

// --- what a value means (traits.hpp) -------------------------------------------------------

using Raw = trait::raw_scores<HeadDim<8>, "Key">;
using ByKey = trait::key_claim<trait::claimant::key_padding_mask, "Key", "">;
static_assert(std::is_same_v<detail::rescaled_t<Raw>, trait::scores<"Key">>);  // a scale by hand counts
static_assert(std::is_same_v<detail::rescaled_t<trait::plain>, trait::plain>);
static_assert(std::is_same_v<detail::with_claim_t<Raw, ByKey>, trait::raw_scores<HeadDim<8>, "Key", ByKey>>);
static_assert(std::is_same_v<detail::with_claim_t<trait::plain, ByKey>, trait::plain>);  // plain claims nothing
static_assert(std::is_same_v<detail::renamed_t<trait::scores<"Key", ByKey>, "Key", "Src">,
                             trait::scores<"Src", trait::key_claim<trait::claimant::key_padding_mask, "Src", "">>>);
static_assert(
    std::is_same_v<detail::renamed_t<trait::weights<"Key", "Key">, "Key", "Src">, trait::weights<"Src", "Src">>);
// `s = masked(s, m)` stores masked scores in the unmasked scores' type: the claim is forgotten.
static_assert(detail::forgets_only<trait::scores<"Key">, trait::scores<"Key", ByKey>>);
static_assert(detail::forgets_only<trait::plain, Raw> && !detail::forgets_only<trait::scores<"Key">, Raw>);
static_assert(!detail::forgets_only<trait::scores<"Key", ByKey>, trait::scores<"Key">>);
static_assert(is_keep_mask<KeyPaddingMask<Batch<2>, Key<4>>> && !is_keep_mask<Tensor<boolean, Batch<2>, Key<4>>>);
static_assert(!is_keep_mask<poison> && TensorOrPoison<poison> && !TensorOrPoison<int>);

// --- poison is accepted by every op and gives poison back ------------------------------------

// Every op, given poison, returns poison (and so prints nothing more).
constexpr poison none{};
template <class T>
constexpr bool poisoned = is_poison<T>;
static_assert(poisoned<decltype(contract<HeadDim>(none, none))>);
static_assert(poisoned<decltype(add(none, none))>);
static_assert(poisoned<decltype(mul(none, none))>);
static_assert(poisoned<decltype(scale(none, 2.0))>);
static_assert(poisoned<decltype(scaled(none))>);
static_assert(poisoned<decltype(unscaled(none))>);
static_assert(poisoned<decltype(softmax<Key>(none))>);
static_assert(poisoned<decltype(masked(none, none))>);
static_assert(poisoned<decltype(biased(none, none))>);
static_assert(poisoned<decltype(causal<Seq, Key>(none, top_left))>);
static_assert(poisoned<decltype(dropout(none, 0.1, 1))>);
static_assert(poisoned<decltype(relu(none))>);
static_assert(poisoned<decltype(gelu(none))>);
static_assert(poisoned<decltype(split<Model, Heads<2>, HeadDim<8>>(none))>);
static_assert(poisoned<decltype(merge<Heads, HeadDim, Model>(none))>);
static_assert(poisoned<decltype(permute<Seq, Batch>(none))>);
static_assert(poisoned<decltype(transpose<Seq, Batch>(none))>);
static_assert(poisoned<decltype(rename<Seq, Key>(none))>);
static_assert(poisoned<decltype(view<Seq<4>>(none))>);
static_assert(poisoned<decltype(append<Key>(none, none))>);
static_assert(poisoned<decltype(pad<Key, 1>(none, 0.0))>);
static_assert(poisoned<decltype(concat<HeadDim, Model>(std::array<poison, 2>{}))>);
static_assert(poisoned<decltype(expect_axes<"block", Batch, Seq>(none))>);
static_assert(poisoned<decltype(none(1, 2))>);
static_assert(poisoned<decltype(none.cross(1))>);
static_assert(poisoned<decltype(none(1).first)>);
static_assert(poisoned<decltype(none.second)>);
static_assert(std::is_same_v<decltype(chunk<Model, 3, HeadDim>(none)), std::array<poison, 3>>);
static_assert(std::tuple_size_v<poison> == 2);  // auto [out, weights] = failed_block(x)

TEST(Dsl, PoisonFlowsThroughOutputInputsAndDeclaredTypes) {
  Graph g;
  output(poison{}, "nothing");
  auto in = input<poison>(g, "nothing");
  auto [out, weights] = poison{}(in);
  static_assert(poisoned<decltype(out)> && poisoned<decltype(weights)>);
  EXPECT_EQ(g.size(), 0u);
  EXPECT_TRUE(g.outputs().empty());
}

TEST(Dsl, KeyMajorScoresAreMaskedByName) {  // issue 12, item 6
  Graph g;
  auto q = input<Tensor<f32, Batch<2>, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Batch<2>, Key<5>, HeadDim<8>>>(g, "k");
  auto pad = input<KeyPaddingMask<Batch<2>, Key<5>>>(g, "pad");
  auto s = masked(scaled(contract<HeadDim>(k, q)), pad);  // [Batch, Key, Seq]
  auto p = softmax<Key>(s);
  EXPECT_EQ(s.node().op, Op::keep_mask);
  EXPECT_EQ(s.node().mask, MaskKind::key_padding);
  EXPECT_EQ(p.node().attr_axes, std::vector<std::string>{"Key"});
  const auto names = p.names();
  EXPECT_EQ(std::vector<std::string_view>(names.begin(), names.end()),
            (std::vector<std::string_view>{"Batch", "Key", "Seq"}));
}

TEST(Dsl, AScaleByHandCountsAsScaled) {  // issue 12, item 7
  Graph g;
  auto q = input<Tensor<f32, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Key<4>, HeadDim<8>>>(g, "k");
  auto s = scale(contract<HeadDim>(q, k), 1 / std::sqrt(8.0));
  static_assert(!is_raw_trait<decltype(s)::trait_type>::value);
  auto p = softmax<Key>(s);
  EXPECT_EQ(g.node(p.node().inputs[0]).op, Op::scale);
  EXPECT_DOUBLE_EQ(g.node(p.node().inputs[0]).scalar, 1 / std::sqrt(8.0));
}

TEST(Dsl, RenameKeepsWhatTheWeightsAreNormalisedOver) {
  Graph g;
  auto q = input<Tensor<f32, Seq<4>, HeadDim<8>>>(g, "q");
  auto k = input<Tensor<f32, Key<4>, HeadDim<8>>>(g, "k");
  auto v = input<Tensor<f32, Mem<4>, HeadDim<8>>>(g, "v");
  auto p = rename<Key, Mem>(softmax<Key>(causal<Seq, Key>(scaled(contract<HeadDim>(q, k)))));
  static_assert(std::is_same_v<decltype(p)::trait_type, trait::weights<"Mem", "Mem">>);
  auto o = contract<Mem>(p, v);  // normalised over Mem now, so the weighted sum over Mem is right
  EXPECT_EQ(o.node().op, Op::contract);
}

}  // namespace
}  // namespace qkv
