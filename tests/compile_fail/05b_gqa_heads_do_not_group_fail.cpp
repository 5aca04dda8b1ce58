// Catalogue 5 (GQA) - 8 query heads cannot share 3 key/value heads.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  // expected-error: grouped_query_attention: query heads (8) must be a multiple of key/value heads (3); fix: choose a number of key/value heads that divides the query heads
  auto gqa = GroupedQueryAttention<64, 8, 3>::make(g);
  (void)gqa;
}
