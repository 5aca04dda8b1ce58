// The Graph IR as plain data: table, hash, equality, deferred checks.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <qkv/ir/graph.hpp>

using ::testing::HasSubstr;

namespace qkv {
namespace {

Graph two_node_graph(std::int64_t model) {
  Graph g;
  Node x;
  x.op = Op::input;
  x.name = "x";
  x.axes = {{"Batch", Extent::dynamic("Batch")}, {"Model", Extent::fixed(model)}};
  int id = g.add(x);
  Node r;
  r.op = Op::relu;
  r.inputs = {id};
  r.axes = x.axes;
  g.mark_output(g.add(r), "out");
  return g;
}

TEST(Extent, StaticAndDynamicPrintDifferently) {
  EXPECT_EQ(Extent::fixed(16).str(), "16");
  EXPECT_EQ(Extent::dynamic("Seq").str(), "Seq?");
  EXPECT_EQ(Extent::dynamic("Seq").divided(4).str(), "Seq?/4");
  EXPECT_EQ(Extent::dynamic("Seq").times(3).str(), "Seq?*3");
}

TEST(Extent, ResolvesUnderBindings) {
  Bindings b{{"Seq", 12}};
  EXPECT_EQ(Extent::dynamic("Seq").divided(4).resolve(b), 3);
  EXPECT_EQ(Extent::dynamic("Seq").times(2).resolve(b), 24);
  EXPECT_EQ(Extent::fixed(7).resolve(b), 7);
  EXPECT_FALSE(Extent::dynamic("Other").resolve(b).has_value());
}

TEST(Graph, TableHasOneLinePerNodeWithSizes) {
  const std::string t = two_node_graph(16).table();
  EXPECT_THAT(t, HasSubstr("input x"));
  EXPECT_THAT(t, HasSubstr("[Batch?, Model=16] f32"));
  EXPECT_THAT(t, HasSubstr("relu"));
  EXPECT_THAT(t, HasSubstr("output out = %1"));
}

TEST(Graph, EqualGraphsHashEqualAndDifferentOnesDoNot) {
  EXPECT_EQ(two_node_graph(16), two_node_graph(16));
  EXPECT_EQ(two_node_graph(16).hash(), two_node_graph(16).hash());
  EXPECT_NE(two_node_graph(16), two_node_graph(32));
  EXPECT_NE(two_node_graph(16).hash(), two_node_graph(32).hash());
}

TEST(Graph, DeferredEqualityThrowsShapeErrorWithSizesFilledIn) {
  Graph g;
  g.require({Constraint::Kind::equal, Extent::dynamic("Seq"), Extent::fixed(8), "op: `Seq` is {a} but must be {b}"});
  EXPECT_NO_THROW(g.check({{"Seq", 8}}));
  try {
    g.check({{"Seq", 5}});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_STREQ(e.what(), "op: `Seq` is 5 but must be 8");
  }
}

TEST(Graph, DeferredDivisibility) {
  Graph g;
  g.require({Constraint::Kind::divisible, Extent::dynamic("Model"), Extent::fixed(8), "split: {a} by {b}"});
  EXPECT_NO_THROW(g.check({{"Model", 64}}));
  EXPECT_THROW(g.check({{"Model", 60}}), ShapeError);
}

TEST(Graph, UnboundSymbolIsAShapeErrorNamingIt) {
  Graph g;
  g.require({Constraint::Kind::equal, Extent::dynamic("Seq"), Extent::dynamic("Key"), "m"});
  try {
    g.check({{"Seq", 3}});
    FAIL() << "expected ShapeError";
  } catch (const ShapeError& e) {
    EXPECT_THAT(e.what(), HasSubstr("'Key'"));
  }
}

TEST(Graph, IdenticalConstraintsAreRecordedOnce) {
  Graph g;
  Constraint c{Constraint::Kind::equal, Extent::dynamic("Seq"), Extent::fixed(8), "m"};
  g.require(c);
  g.require(c);
  EXPECT_EQ(g.constraints().size(), 1u);
}

}  // namespace
}  // namespace qkv
