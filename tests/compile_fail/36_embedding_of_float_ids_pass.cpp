// Positive twin of 36_embedding_of_float_ids_fail.cpp: int64 ids give [Batch, Seq, Model].
#include <qkv/qkv.hpp>

#include <type_traits>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto table = embedding_params<Vocab<1000>, Model<64>>(g, "model.embed_tokens");
  auto ids = input<Tensor<i64, Batch<2>, Seq<8>>>(g, "tokens");
  auto x = embedding(table, ids);
  static_assert(std::is_same_v<typename decltype(x)::axis_list, axes<Batch<2>, Seq<8>, Model<64>>>);
}
