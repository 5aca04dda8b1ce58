// Token ids index the embedding table: a float tensor is not ids (an f32 id could not even hold
// every id of a large vocabulary exactly).
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto table = embedding_params<Vocab<1000>, Model<64>>(g, "model.embed_tokens");
  auto ids = input<Tensor<f32, Batch<2>, Seq<8>>>(g, "tokens");
  // clang-format off
  // expected-error: embedding: ids [Batch=2, Seq=8] are f32, not token ids; fix: declare them i32 or i64
  auto x = embedding(table, ids);
  // clang-format on
  (void)x;
}
