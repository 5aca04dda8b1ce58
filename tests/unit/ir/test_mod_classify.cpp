// Block classification of mask expressions (mod_classify / mod_bounds in qkv/ir/mod_expr.hpp):
// over a grid of tiles of a [Seq, Key] score matrix, every tile's class must be the one found by
// evaluating the mask at each of its entries (mod_eval). Interval arithmetic may only ever say
// "partial" where the truth is empty or full; for the masks below (one comparison of positions,
// or an and of two) it is exact, so the counts must agree exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include <qkv/ir/mod_expr.hpp>

namespace qkv {
namespace {

struct Grid {
  std::int64_t L, S;
};

/// One tile: queries [i0, i1), keys [j0, j1).
struct TileEnv {
  Grid g;
  std::int64_t i0, i1, j0, j1;
  [[nodiscard]] ModInterval index(const std::string& axis) const {
    return axis == "Seq" ? ModInterval{double(i0), double(i1 - 1)} : ModInterval{double(j0), double(j1 - 1)};
  }
  [[nodiscard]] double length(const std::string& axis) const { return double(axis == "Seq" ? g.L : g.S); }
  [[nodiscard]] ModInterval load(int, const ModNode&, const std::vector<ModInterval>&) const { return {}; }
};

/// One entry.
struct EntryEnv {
  Grid g;
  std::int64_t i, j;
  [[nodiscard]] double index(const std::string& axis) const { return double(axis == "Seq" ? i : j); }
  [[nodiscard]] double length(const std::string& axis) const { return double(axis == "Seq" ? g.L : g.S); }
  [[nodiscard]] double load(int, const std::vector<double>&) const { return 0.0; }
  [[nodiscard]] std::int64_t extent(int, std::size_t) const { return 1; }
};

struct Counts {
  int empty = 0, full = 0, partial = 0;
  friend bool operator==(const Counts&, const Counts&) = default;
};

/// The classes mod_classify gives, and the classes brute force finds; checks soundness per tile.
std::pair<Counts, Counts> classify_grid(const ModExpr& e, Grid g, std::int64_t tq, std::int64_t tk) {
  Counts got, truth;
  std::vector<double> v;
  for (std::int64_t i0 = 0; i0 < g.L; i0 += tq)
    for (std::int64_t j0 = 0; j0 < g.S; j0 += tk) {
      const TileEnv t{g, i0, std::min(i0 + tq, g.L), j0, std::min(j0 + tk, g.S)};
      int kept = 0, n = 0;
      for (std::int64_t i = t.i0; i < t.i1; ++i)
        for (std::int64_t j = t.j0; j < t.j1; ++j, ++n) {
          mod_eval(e, 0.0, EntryEnv{g, i, j}, v);
          kept += e.keep < 0 || v[static_cast<std::size_t>(e.keep)] != 0.0;
        }
      const BlockClass want = kept == 0 ? BlockClass::empty : kept == n ? BlockClass::full : BlockClass::partial;
      const BlockClass c = mod_classify(e, t);
      EXPECT_TRUE(c == want || c == BlockClass::partial) << "unsound at tile (" << i0 << ", " << j0 << ")";
      for (auto [cls, counts] : {std::pair{c, &got}, std::pair{want, &truth}})
        (cls == BlockClass::empty ? counts->empty : cls == BlockClass::full ? counts->full : counts->partial)++;
    }
  return {got, truth};
}

int leaf(ModExpr& e, ModOp op, std::string axis = "", double value = 0.0) {
  ModNode n;
  n.op = op;
  n.axis = std::move(axis);
  n.value = value;
  return e.add(n);
}
int bin(ModExpr& e, ModOp op, int a, int b) {
  ModNode n;
  n.op = op;
  n.a = a;
  n.b = b;
  return e.add(n);
}

ModExpr base(CausalAlign align) {
  ModExpr e;
  e.query = "Seq";
  e.key = "Key";
  e.align = align;
  return e;
}

/// keep = k <= q'
ModExpr causal(CausalAlign align) {
  ModExpr e = base(align);
  e.keep = bin(e, ModOp::le, leaf(e, ModOp::index, "Key"), leaf(e, ModOp::position, "Seq"));
  return e;
}

/// keep = q' - left <= k && k <= q' + right
ModExpr window(CausalAlign align, double left, double right) {
  ModExpr e = base(align);
  const int q = leaf(e, ModOp::position, "Seq"), k = leaf(e, ModOp::index, "Key");
  const int lo = bin(e, ModOp::le, bin(e, ModOp::sub, q, leaf(e, ModOp::constant, "", left)), k);
  const int hi = bin(e, ModOp::le, k, bin(e, ModOp::add, q, leaf(e, ModOp::constant, "", right)));
  e.keep = bin(e, ModOp::logical_and, lo, hi);
  return e;
}

/// keep = abs(q' - k) <= w
ModExpr abs_window(CausalAlign align, double w) {
  ModExpr e = base(align);
  ModNode a;
  a.op = ModOp::abs;
  a.a = bin(e, ModOp::sub, leaf(e, ModOp::position, "Seq"), leaf(e, ModOp::index, "Key"));
  e.keep = bin(e, ModOp::le, e.add(a), leaf(e, ModOp::constant, "", w));
  return e;
}

TEST(ModClassify, AllEmptyAndAllFull) {
  const Grid g{37, 53};
  ModExpr none = base(CausalAlign::top_left);
  none.keep = bin(none, ModOp::lt, leaf(none, ModOp::index, "Key"), leaf(none, ModOp::constant, "", 0));
  ModExpr all = base(CausalAlign::top_left);
  all.keep = bin(all, ModOp::lt, leaf(all, ModOp::index, "Key"), leaf(all, ModOp::length, "Key"));
  ModExpr unmasked = base(CausalAlign::top_left);  // no keep predicate at all
  // 37 x 53 in 8 x 16 tiles: 5 x 4 = 20 tiles (the last row and column of tiles are ragged).
  EXPECT_EQ(classify_grid(none, g, 8, 16).first, (Counts{20, 0, 0}));
  EXPECT_EQ(classify_grid(all, g, 8, 16).first, (Counts{0, 20, 0}));
  EXPECT_EQ(classify_grid(unmasked, g, 8, 16).first, (Counts{0, 20, 0}));
}

TEST(ModClassify, CausalByHand) {
  // 64 x 64 in 16 x 16 tiles: a 4 x 4 grid. The diagonal tiles hold both kept and dropped
  // entries (4 partial); the 6 tiles below the diagonal are entirely kept, the 6 above empty.
  EXPECT_EQ(classify_grid(causal(CausalAlign::top_left), {64, 64}, 16, 16).first, (Counts{6, 6, 4}));
  // L = 32 queries, S = 64 keys, bottom-right: query i sees keys j <= i + 32. Tiles 16 x 16 give a
  // 2 x 4 grid; key tiles 0 and 1 are entirely visible to both query tiles (4 full), key tile 2
  // is the diagonal for query tile 0 (partial) and fully visible to query tile 1 (j <= 47 <= 16 + 32),
  // key tile 3 is empty for query tile 0 and the diagonal for query tile 1: 5 full, 2 partial, 1 empty.
  EXPECT_EQ(classify_grid(causal(CausalAlign::bottom_right), {32, 64}, 16, 16).first, (Counts{1, 5, 2}));
}

TEST(ModClassify, BandsMatchBruteForceExactly) {
  for (const Grid g : {Grid{37, 53}, Grid{53, 37}, Grid{64, 64}, Grid{1, 29}})
    for (auto align : {CausalAlign::top_left, CausalAlign::bottom_right})
      for (auto [tq, tk] : {std::pair<std::int64_t, std::int64_t>{8, 16}, {16, 16}, {5, 7}, {1, 32}}) {
        SCOPED_TRACE(testing::Message() << g.L << "x" << g.S << " tiles " << tq << "x" << tk);
        for (const ModExpr& e :
             {causal(align), window(align, 6, 0), window(align, 3, 9), window(align, 0, 0), abs_window(align, 4)}) {
          const auto [got, truth] = classify_grid(e, g, tq, tk);
          EXPECT_EQ(got, truth);
        }
      }
}

TEST(ModClassify, WindowByHand) {
  // A sliding window of 16 keys (q - 15 <= k <= q) over 64 x 64 in 16 x 16 tiles: the diagonal
  // tiles (4) and the tiles just left of them (3) are partial, everything else is empty — no tile
  // is fully visible (a tile spans 16 rows, and the window moves by one key per row).
  EXPECT_EQ(classify_grid(window(CausalAlign::top_left, 15, 0), {64, 64}, 16, 16).first, (Counts{9, 0, 7}));
}

}  // namespace
}  // namespace qkv
