// Slot assignment of the memory planners (codegen/lowering/lifetimes.hpp): blocks that share a
// slot are never alive together, and a block takes the smallest free slot that holds it, so that
// small long-lived values do not occupy the slots of large short-lived blocks.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include <qkv/codegen/lowering/lifetimes.hpp>

namespace qkv {
namespace {

using codegen::Lifetime;

/// Σ over slots of the largest block in each: what an arena of these slots takes.
std::int64_t arena_bytes(const std::vector<Lifetime>& blocks, const std::vector<int>& slot) {
  std::vector<std::int64_t> size;
  for (std::size_t k = 0; k < blocks.size(); ++k) {
    const auto s = static_cast<std::size_t>(slot[k]);
    if (s >= size.size()) size.resize(s + 1, 0);
    size[s] = std::max(size[s], blocks[k].bytes);
  }
  std::int64_t total = 0;
  for (std::int64_t s : size) total += s;
  return total;
}

TEST(Lifetimes, BlocksInOneSlotAreNeverAliveTogether) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<int> start(0, 60), length(0, 12);
  std::uniform_int_distribution<std::int64_t> bytes(1, 1 << 20);
  std::vector<Lifetime> blocks;
  for (int k = 0; k < 300; ++k) {
    const int s = start(gen);
    blocks.push_back({s, s + length(gen), bytes(gen)});
  }
  const std::vector<int> slot = codegen::assign_slots(blocks);
  ASSERT_EQ(slot.size(), blocks.size());
  for (std::size_t a = 0; a < blocks.size(); ++a)
    for (std::size_t b = a + 1; b < blocks.size(); ++b)
      if (slot[a] == slot[b]) {
        ASSERT_TRUE(blocks[a].end < blocks[b].start || blocks[b].end < blocks[a].start) << a << " and " << b;
      }
}

TEST(Lifetimes, ASmallValueTakesASmallFreeSlotNotTheLargest) {
  // A weight's packing space (large, one node) and a small value die at node 0; a small value
  // alive from 1 to 5 must not take the large slot, or the next packing space (node 2) needs a
  // second large slot.
  const std::vector<Lifetime> blocks = {{0, 0, 1000}, {0, 0, 10}, {1, 5, 10}, {2, 2, 1000}, {3, 3, 1000}};
  const std::vector<int> slot = codegen::assign_slots(blocks);
  EXPECT_EQ(slot[2], slot[1]);
  EXPECT_EQ(slot[3], slot[0]);
  EXPECT_EQ(slot[4], slot[0]);
  EXPECT_EQ(arena_bytes(blocks, slot), 1010);
}

TEST(Lifetimes, ABlockThatFitsNowhereGrowsTheLargestFreeSlot) {
  const std::vector<Lifetime> blocks = {{0, 0, 100}, {0, 0, 300}, {1, 1, 500}};
  const std::vector<int> slot = codegen::assign_slots(blocks);
  EXPECT_EQ(slot[2], slot[1]);
  EXPECT_EQ(arena_bytes(blocks, slot), 600);
}

}  // namespace
}  // namespace qkv
