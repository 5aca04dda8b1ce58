// Lesson 13, the model: a function that builds a qkv::Graph, and QKV_AOT_MAIN, which turns this
// file into a generator — a program the build runs to compile the graph into a C function
// (qkv_add_library in CMakeLists.txt). Nothing here runs when the C program does.
#include <qkv/codegen/aot_main.hpp>
#include <qkv/qkv.hpp>

QKV_AXIS(Batch);
QKV_AXIS(Seq);
QKV_AXIS(Key);
QKV_AXIS(Vocab);
QKV_AXIS(Model);

// A one-layer toy language model: token ids -> embeddings -> causal self-attention (the
// embeddings are queries, keys and values) -> logits through the same table (tied weights).
qkv::Graph tiny_lm() {
  using namespace qkv;
  Graph g;
  auto table = embedding_params<Vocab<16>, Model<8>>(g, "embed");  // the parameter embed.weight
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "ids");   // dyn: sizes left open
  auto x = embedding(table, ids);                                  // [Batch, Seq, Model]
  auto keys = rename<Seq, Key>(x);                                 // [Batch, Key, Model]
  auto p = softmax<Key>(causal<Seq, Key>(scaled(contract<Model>(x, keys))));
  auto h = contract<Key>(p, keys);                  // [Batch, Seq, Model]
  output(linear(h, tied_linear(table)), "logits");  // [Batch, Seq, Vocab]
  return g;
}

QKV_AOT_MAIN(tiny_lm)
