// Lesson 01 — single-head self-attention, step by step, with every shape in the type.
//
// The setting of the seeds' walk-through: a batch of 2 sentences, 4 tokens each (the first
// sentence really has 3 tokens and one pad), d_model = 16, one head. We build
//
//     softmax(mask(Q Kᵀ / sqrt(d_k))) V,   then W_o,
//
// print the shape table the tutorials draw by hand, then run the graph on seeded inputs with
// the reference interpreter and check what attention promises. Run it with
//
//     cmake --build build --target 01_self_attention && ./build/examples/01_self_attention
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>

#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;

// Axis names are types. Declaring one is one line; sizes come later (static or dynamic).
QKV_AXIS(Batch);  // sentences in the batch
QKV_AXIS(Seq);    // query positions
QKV_AXIS(Key);    // key positions: the same tokens, under their own name (see rename below)
QKV_AXIS(Model);  // d_model features
QKV_AXIS(Dk);     // the query/key width of the head
QKV_AXIS(Dv);     // the value width of the head

constexpr int kBatch = 2, kSeq = 4, kModel = 16, kDk = 16, kDv = 16;

int main() {
  Graph g;  // every op that type-checks appends one node here

  // Inputs. `KeyPaddingMask` is a keep-mask (true = a real token) over [Batch, Key]:
  // row 0 is {1, 1, 1, 0} (3 tokens + pad), row 1 is {1, 1, 1, 1}.
  auto x = input<Tensor<f32, Batch<kBatch>, Seq<kSeq>, Model<kModel>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<kBatch>, Key<kSeq>>>(g, "keep");

  // Weights, named as PyTorch names them. W_q, W_k: Model -> Dk; W_v: Model -> Dv; W_o: Dv -> Model.
  auto w_q = linear_params<Model<kModel>, Dk<kDk>>(g, "q_proj");
  auto w_k = linear_params<Model<kModel>, Dk<kDk>>(g, "k_proj");
  auto w_v = linear_params<Model<kModel>, Dv<kDv>>(g, "v_proj");
  auto w_o = linear_params<Dv<kDv>, Model<kModel>>(g, "out_proj");

  // Q, K, V are three projections of the same x. The key side gets the axis name `Key`, so
  // "which axis is the query, which the key" is never a matter of position.
  auto q = linear(x, w_q);                    // [Batch, Seq, Dk]
  auto k = rename<Seq, Key>(linear(x, w_k));  // [Batch, Key, Dk]
  auto v = rename<Seq, Key>(linear(x, w_v));  // [Batch, Key, Dv]

  // Scores: contract over Dk. The result is *raw* Q·Kᵀ; softmax would refuse it unscaled.
  auto scores = scaled(contract<Dk>(q, k));  // [Batch, Seq, Key] / sqrt(16)

  // Padding: the mask covers the key axis — a pad token is never *looked at*. (Covering `Seq`
  // instead is a compile error; see lesson 07.)
  auto weights = softmax<Key>(masked(scores, keep));  // each row sums to 1 over the real keys

  // Weighted sum of V over the same axis softmax normalised, then the output projection.
  auto attended = contract<Key>(weights, v);  // [Batch, Seq, Dv]
  Tensor<f32, Batch<kBatch>, Seq<kSeq>, Model<kModel>> out = linear(attended, w_o);
  output(out, "out");
  output(weights, "weights");

  std::cout << "Single-head self-attention, batch 2, seq 4, d_model 16:\n\n" << g.table();

  // The graph is plain data: the output node has the axes the type promised.
  const Node& o = g.node(out.id());
  bool ok = o.axes.size() == 3 && o.axes[0].name == "Batch" && o.axes[2].name == "Model" &&
            o.axes[2].extent == Extent::fixed(kModel) && g.node(weights.id()).op == Op::softmax;

  // Run it: seeded weights and inputs, the padding mask of lengths 3 and 4.
  Feeds feeds = random_feeds(g, {}, /*seed=*/2024);
  feeds["keep"] = keep_first({3, 4}, kSeq);
  const RunResult r = interpret(g, feeds);
  const auto w = r.outputs.at("weights").to_f32();  // [Batch, Seq, Key]

  std::printf("\nattention weights of sentence 0 (3 tokens + pad): rows = queries, columns = keys\n");
  for (int i = 0; i < kSeq; ++i) {
    double sum = 0;
    for (int j = 0; j < kSeq; ++j) {
      const float p = w[(0 * kSeq + i) * kSeq + j];
      std::printf(" %6.3f", p);
      sum += p;
    }
    std::printf("   (row sum %.6f)\n", sum);
  }
  // What attention promises: every row sums to 1, no weight is negative, the pad gets nothing.
  for (int b = 0; b < kBatch; ++b)
    for (int i = 0; i < kSeq; ++i) {
      double sum = 0;
      for (int j = 0; j < kSeq; ++j) {
        const float p = w[(b * kSeq + i) * kSeq + j];
        ok = ok && p >= 0.0f;
        sum += p;
      }
      ok = ok && std::abs(sum - 1.0) < 1e-6;
    }
  for (int i = 0; i < kSeq; ++i) ok = ok && w[(0 * kSeq + i) * kSeq + 3] == 0.0f;

  std::cout << "\nchecks (rows sum to 1, weights >= 0, the pad gets weight 0): " << (ok ? "ok" : "FAILED")
            << "  (graph hash " << std::hex << g.hash() << ")\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
