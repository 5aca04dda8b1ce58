// Positive twin of 05b_gqa_heads_do_not_group_fail.cpp: the correct program compiles.
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto gqa = GroupedQueryAttention<64, 8, 2>::make(g);
  (void)gqa;
}
