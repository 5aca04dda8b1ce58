// Lesson 11 — score and mask modifications written in C++, compiled into the fused kernel.
//
// FlexAttention's idea, with types: a score_mod(s, b, h, q, k) changes a score, a
// mask_mod(b, h, q, k) says which keys a query may see. They are C++ lambdas over index
// variables that carry their axis: `slopes[h]` reads the ALiBi slope of the entry's head, and
// `slopes[q]` would not compile (part 3). modded() traces them once into a small expression;
// the compiler's fuse pass folds it — with every masked / biased / causal of the chain — into
// the fused attention node, and the kernel evaluates it inline, entry by entry.
//
// Here: ALiBi, a sliding window of 160 keys and three packed documents of unequal length in one
// model, 512 queries and keys, checked against the reference interpreter. Part 2 prints how the
// kernel sees the keep predicate on its tiles of 64 queries × 64 keys: the bounds of the
// expression over a tile (interval arithmetic; document ids bounded by scanning the tile's ids)
// say whether no entry is kept (`.`: the tile is skipped), every entry is (`#`: no per-entry
// mask) or some are (`/`).
//
//     ./build/examples/11_score_mods
#include <cmath>
#include <cstdio>
#include <vector>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/lowering/attention_call.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

namespace {

constexpr std::int64_t kLen = 512, kHeads = 4, kTile = 64;

struct Mistake {
  const char* test;   // tests/compile_fail/<test>_fail.cpp
  const char* what;   // the mistake
  const char* code;   // the offending line
  const char* error;  // qkv's diagnostic
};

// clang-format off
constexpr Mistake kMistakes[] = {
    {"28_mod_slopes_by_query",
     "ALiBi slopes [Heads] read with the query index: every query row would take another head's slope.",
     "score_mod([&](auto x, auto, auto, auto q, auto k) { return x - slopes[q] * abs(q - k); }, bottom_right)",
     "load: `Heads` of [Heads=2] is an axis of the scores, indexed here by the query index q (`Seq`); fix: index `Heads` by the head index h"},
    {"29_mod_key_ids_by_query",
     "Document ids of the keys read with the query index: each query would compare its id with itself.",
     "mask_mod([&](auto b, auto, auto q, auto) { return q_doc[b][q] == kv_doc[b][q]; })",
     "load: `Key` of [Batch=2, Key=7] is an axis of the scores, indexed here by the query index q (`Seq`); fix: index `Key` by the key index k"},
};
// clang-format on

}  // namespace

int main() {
  // 1. One model: ALiBi (a score mod), a window and documents (mask mods, and-ed).
  Graph g;
  auto q = input<Tensor<f32, Batch<1>, Heads<kHeads>, Seq<kLen>, HeadDim<32>>>(g, "q");
  auto k = input<Tensor<f32, Batch<1>, Heads<kHeads>, Key<kLen>, HeadDim<32>>>(g, "k");
  auto v = input<Tensor<f32, Batch<1>, Heads<kHeads>, Key<kLen>, HeadDim<32>>>(g, "v");
  auto slopes = input<Tensor<f32, Heads<kHeads>>>(g, "slopes");
  auto q_doc = input<Tensor<f32, Batch<1>, Seq<kLen>>>(g, "q_doc");
  auto kv_doc = input<Tensor<f32, Batch<1>, Key<kLen>>>(g, "kv_doc");

  auto alibi = score_mod([&](auto s, auto, auto h, auto qi, auto kj) { return s - slopes[h] * abs(qi - kj); });
  auto window = mask_mod([](auto, auto, auto qi, auto kj) { return kj <= qi && qi - kj < 160; });
  auto docs = mask_mod([&](auto b, auto, auto qi, auto kj) { return q_doc[b][qi] == kv_doc[b][kj]; });
  auto s = modded(scaled(contract<HeadDim>(q, k)), alibi, window && docs);
  output(contract<Key>(softmax<Key>(s), v), "out");
  // The statistic softmax normalises by (FlashAttention's `lse`): beside the softmax, the fused
  // kernel writes it from the running max and sum it keeps anyway, with no second pass.
  output(logsumexp<Key>(s), "lse");

  Feeds feeds = random_feeds(g, {}, 11);
  std::vector<float> slope, ids;
  for (std::int64_t h = 0; h < kHeads; ++h) slope.push_back(std::exp2(-8.0f * float(h + 1) / kHeads));
  for (std::int64_t i = 0; i < kLen; ++i) ids.push_back(i < 200 ? 0.0f : i < 300 ? 1.0f : 2.0f);  // 200, 100, 212
  feeds["slopes"] = NdArray::from_f32(slope, {kHeads});
  feeds["q_doc"] = feeds["kv_doc"] = NdArray::from_f32(ids, {1, kLen});

  const Graph lowered = codegen::lower(g);
  int fused = -1;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    if (lowered.node(id).op == Op::fused_attention) fused = id;
  std::printf("the mods fused into one attention node: %s (its expression has %zu nodes)\n", fused >= 0 ? "yes" : "no",
              fused >= 0 ? lowered.node(fused).attention->mod.nodes.size() : 0);

  // 2. The tiles of head 0 under the keep predicate, as the kernel classifies them.
  std::vector<const NdArray*> in;
  for (int x : lowered.node(fused).inputs) in.push_back(&feeds.at(lowered.node(x).name));
  const auto tiles = codegen::classify_tiles(lowered, fused, in, {}, 0, 0, kTile, kTile);
  const std::int64_t per_row = (kLen + kTile - 1) / kTile;
  int skipped = 0, full = 0, partial = 0;
  std::printf("\ntiles of %lld queries (rows) x %lld keys (columns): . skipped, # no mask, / masked per entry\n",
              static_cast<long long>(kTile), static_cast<long long>(kTile));
  for (std::size_t t = 0; t < tiles.size(); ++t) {
    const BlockClass c = tiles[t];
    std::putchar(c == BlockClass::empty ? '.' : c == BlockClass::full ? '#' : '/');
    if (t % static_cast<std::size_t>(per_row) == static_cast<std::size_t>(per_row) - 1) std::putchar('\n');
    (c == BlockClass::empty ? skipped : c == BlockClass::full ? full : partial)++;
  }
  std::printf("%d tiles: %d skipped, %d without a mask, %d masked per entry\n", static_cast<int>(tiles.size()), skipped,
              full, partial);

  // The compiled kernel against the interpreter (the reference semantics).
  const RunResult want = interpret(g, feeds), got = codegen::cpu::run(g, feeds, 2);
  double err = 0;
  for (const char* name : {"out", "lse"}) {
    const auto a = got.outputs.at(name).to_f32(), b = want.outputs.at(name).to_f32();
    double e = 0;
    for (std::size_t i = 0; i < a.size(); ++i) e = std::max(e, std::abs(double(a[i]) - b[i]));
    std::printf("cpu backend vs interpreter, %s: max |error| %.2e\n", name, e);
    err = std::max(err, e);
  }
  std::printf("log-sum-exp of query 0, head 0 (it sees key 0 only): %.4f\n", got.outputs.at("lse").to_f32()[0]);

  // 3. Two mistakes the compiler rejects (each a compile-fail test; the quotes are checked).
  std::printf("\nmistakes qkv rejects at compile time:\n");
  for (const Mistake& m : kMistakes)
    std::printf("  %s\n    you write:  %s\n    qkv says:   %s\n    (tests/compile_fail/%s_fail.cpp)\n", m.what, m.code,
                m.error, m.test);
  return fused >= 0 && skipped > 0 && err < 1e-5 ? 0 : 1;
}
