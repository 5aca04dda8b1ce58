// Compile-time benchmark: a BERT encoder as a user writes it (scripts/compile-time times this TU).
//
// Hugging Face's BertModel (qkv::nn::BertModel: embeddings, two layers, the pooler) and one
// BertLayer on its own, both run on random weights by the reference interpreter and the CPU
// backend. The program is small on purpose: what it costs to compile is the headers and the
// DSL's type checks, not its own code. Built by the bench target (so it keeps compiling) and
// runnable:
//
//     ./build/release/bench/compile_time_bert_layer
#include <cmath>
#include <cstdlib>
#include <iostream>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

namespace {
double worst_difference(const NdArray& a, const NdArray& b) {
  const auto x = a.to_f32(), y = b.to_f32();
  double worst = 0;
  for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double{x[i]} - y[i]));
  return worst;
}
}  // namespace

int main() {
  constexpr int E = 32;
  const BertConfig cfg{.layers = 2, .heads = 4, .head_dim = E / 4};

  // The model: token ids, token types and a key-padding mask in; hidden states and pooled out.
  Graph model;
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(model, "input_ids");
  auto types = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(model, "token_type_ids");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(model, "keep");
  const auto bert = BertModel<E>::make(model, cfg, /*pooler=*/true);
  auto hidden = bert(ids, types, keep);
  output(hidden, "last_hidden_state");
  output(bert.pooled(hidden), "pooler_output");

  // One layer over hidden states.
  Graph layer;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<E>>>(layer, "x");
  auto layer_keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(layer, "keep");
  output(BertLayer<E>::make(layer, "encoder.layer.0.", cfg)(x, layer_keep), "out");

  const Bindings sizes{{"Batch", 2},     {"Seq", 5},       {"Key", 5},   {"Vocab", 50},
                       {"Position", 16}, {"TokenType", 2}, {"QProj", E}, {"Hidden", 4 * E}};
  double worst = 0;
  for (const Graph* g : {&model, &layer}) {
    Feeds feeds = random_feeds(*g, sizes, /*seed=*/11, 0.5f);
    feeds["keep"] = keep_first({5, 3}, 5);  // the second sequence is padded
    if (g == &model) {
      NdArray tokens = NdArray::zeros(DType::i64, {2, 5}), segments = NdArray::zeros(DType::i64, {2, 5});
      for (std::int64_t i = 0; i < 10; ++i) {
        tokens.as<std::int64_t>()[i] = (7 * i) % 50;
        segments.as<std::int64_t>()[i] = i % 5 < 3 ? 0 : 1;
      }
      feeds["input_ids"] = tokens;
      feeds["token_type_ids"] = segments;
    }
    for (const auto& [name, want] : interpret(*g, feeds).outputs)
      worst = std::max(worst, worst_difference(codegen::cpu::run(*g, feeds).outputs.at(name), want));
  }
  std::cout << "bert: max |cpu - interpreter| = " << worst << "\n";
  return worst < 1e-3 ? EXIT_SUCCESS : EXIT_FAILURE;
}
