// A host emulation of the GPU for the executor (qkv::codegen::cuda::Machine): every kernel of
// qkv/codegen/nvptx.hpp implemented on the CPU from the header's contract (parameters in the
// documented order, the grid checked against its rule), so the whole GPU run path — plan, buffer
// lifetimes, launch parameters, the mods' tensor tables, the fallbacks — runs on machines without a
// GPU. The attention kernel is emulated by the CPU fused kernel (same semantics, attention.hpp).
//
// Memory is checked: fresh allocations are filled with 0xFF bytes (NaN floats) so a read of
// never-written memory shows, freed blocks are kept and poisoned, and a launch, upload or
// download that touches a block that is not live (or reaches past its end) fails the test.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <qkv/codegen/cuda/executor.hpp>

namespace qkv::test {

class HostMachine final : public codegen::cuda::Machine {
 public:
  explicit HostMachine(int max_shared_bytes = 227 * 1024) : max_shared_(max_shared_bytes) {}

  std::uint64_t alloc(std::size_t bytes) override;
  void free(std::uint64_t address) override;
  void upload(std::uint64_t address, const void* src, std::size_t n) override;
  void download(void* dst, std::uint64_t address, std::size_t n) override;
  void launch(const codegen::cuda::Launch& l, const std::vector<codegen::cuda::ParamValue>& params) override;
  [[nodiscard]] int max_shared_bytes() const override { return max_shared_; }

  /// Launches by kernel kind ("attention", "linear", "layer_norm", "elementwise", "copy").
  std::map<std::string, int> launches;
  std::size_t live_bytes = 0, peak_bytes = 0;
  /// Problems found (use of dead or foreign memory, out-of-range access, a grid off its rule).
  std::vector<std::string> errors;

 private:
  struct Block {
    std::unique_ptr<std::byte[]> data;
    std::size_t bytes = 0;
    bool live = true;
  };
  std::pair<const void* const*, const std::int64_t*> mod_tables(const codegen::cpu::AttentionSpec& s,
                                                                const std::vector<codegen::cuda::ParamValue>& p,
                                                                std::size_t at, const std::string& kind);
  void attention_backward(const codegen::nvptx::AttentionBackwardKernel& r,
                          const std::vector<codegen::cuda::ParamValue>& p);
  /// Checks that [address, address + bytes) lies in one live block.
  void check(std::uint64_t address, std::size_t bytes, const std::string& what);
  std::map<std::uint64_t, Block> blocks_;
  int max_shared_;
  codegen::nvptx::Dim3 l_grid_;  // the grid of the launch being emulated
};

}  // namespace qkv::test
