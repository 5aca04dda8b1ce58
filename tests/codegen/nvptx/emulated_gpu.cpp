// The emulated GPU of the host-emulation tests (emulated_gpu.hpp): one host thread per GPU thread,
// barriers, warp shuffles and the approximate ex2 / lg2 as host functions the kernels call.
#include "emulated_gpu.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/runtime/io/array.hpp>

#include "nvptx/kernel_builder.hpp"

namespace qkv::emulation {

using namespace codegen::nvptx;

namespace {

// ------------------------------------------------------------------------------------------------
// the emulated GPU

class Barrier {
 public:
  explicit Barrier(int n) : n_(n) {}
  void wait() {
    std::unique_lock<std::mutex> lock(m_);
    const std::uint64_t gen = gen_;
    if (++count_ == n_) {
      count_ = 0;
      ++gen_;
      cv_.notify_all();
      return;
    }
    if (!cv_.wait_for(lock, std::chrono::seconds(60), [&] { return gen_ != gen; })) {
      std::fprintf(stderr, "emulated GPU: a barrier waited 60 s (%d of %d threads arrived): deadlock\n", count_, n_);
      std::abort();
    }
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  int n_, count_ = 0;
  std::uint64_t gen_ = 0;
};

struct Warp {
  Barrier barrier{32};
  float slots[32] = {};
  // the warp-collective tensor-core operations: each lane's operands
  const unsigned char* rows[32] = {};
  std::int32_t a[32][4] = {}, b[32][2] = {};
};

struct Block {
  explicit Block(int threads) : barrier(threads) {
    for (int w = 0; w < threads / 32; ++w) warps.push_back(std::make_unique<Warp>());
  }
  Barrier barrier;
  std::vector<std::unique_ptr<Warp>> warps;
};

thread_local int t_tid = 0;
thread_local int t_ntid = 0;
thread_local Dim3 t_ctaid;
thread_local Dim3 t_grid;
thread_local Block* t_block = nullptr;

std::int32_t emu_sreg(std::int32_t which) {
  switch (which) {
    case 0:
      return t_tid;
    case 1:
      return t_ntid;
    case 2:
      return static_cast<std::int32_t>(t_ctaid.x);
    case 3:
      return static_cast<std::int32_t>(t_ctaid.y);
    case 4:
      return static_cast<std::int32_t>(t_ctaid.z);
    default:
      return static_cast<std::int32_t>(t_grid.x);
  }
}
void emu_barrier() { t_block->barrier.wait(); }
void emu_warp_sync() { t_block->warps[static_cast<std::size_t>(t_tid / 32)]->barrier.wait(); }
float emu_shfl_xor(float x, std::int32_t lane_xor) {
  Warp& w = *t_block->warps[static_cast<std::size_t>(t_tid / 32)];
  const int lane = t_tid % 32;
  w.slots[lane] = x;
  w.barrier.wait();
  const float y = w.slots[lane ^ lane_xor];
  w.barrier.wait();
  return y;
}
float emu_ex2(float x) {  // ex2.approx.ftz.f32: subnormal results flush to +0
  const float r = std::exp2(x);
  return r < std::numeric_limits<float>::min() ? 0.0f : r;
}
float emu_lg2(float x) {  // lg2.approx.ftz.f32: subnormal inputs flush to 0 (→ −inf)
  return std::log2(std::fabs(x) < std::numeric_limits<float>::min() ? 0.0f : x);
}

// --- tensor cores (warp-collective: every lane deposits its operands, the warp meets, each lane
// computes its own result registers from all 32 lanes' operands, the warp meets again before the
// slots are reused). Layouts from the PTX ISA: "Warp-level matrix load instruction: ldmatrix"
// (lane 8m + r gives row r of matrix m; lane l receives (row l/4, columns 2(l%4), 2(l%4) + 1),
// or with .trans (rows 2(l%4), 2(l%4) + 1, column l/4)) and "Matrix Fragments for mma.m16n8k16
// with floating point type" (groupID = lane >> 2, threadID_in_group = lane % 4; see
// codegen/nvptx/attention_mma_ptx.cpp).

Warp& my_warp() { return *t_block->warps[static_cast<std::size_t>(t_tid / 32)]; }

std::uint16_t bits16(const unsigned char* p) {
  std::uint16_t x;
  std::memcpy(&x, p, 2);
  return x;
}

void emu_ldmatrix_x4(const void* row, std::int32_t trans, std::int32_t* out) {
  Warp& w = my_warp();
  const int lane = t_tid % 32;
  w.rows[lane] = static_cast<const unsigned char*>(row);
  w.barrier.wait();
  for (int m = 0; m < 4; ++m) {
    std::uint16_t lo, hi;
    if (!trans) {  // row lane/4, columns 2(lane%4) + {0,1}
      const unsigned char* r = w.rows[8 * m + lane / 4];
      lo = bits16(r + 4 * (lane % 4));
      hi = bits16(r + 4 * (lane % 4) + 2);
    } else {  // rows 2(lane%4) + {0,1}, column lane/4
      lo = bits16(w.rows[8 * m + 2 * (lane % 4)] + 2 * (lane / 4));
      hi = bits16(w.rows[8 * m + 2 * (lane % 4) + 1] + 2 * (lane / 4));
    }
    out[m] = static_cast<std::int32_t>(static_cast<std::uint32_t>(lo) | (static_cast<std::uint32_t>(hi) << 16));
  }
  w.barrier.wait();
}

double bf16_half(std::int32_t reg, int half) {
  const auto bits = static_cast<std::uint32_t>(reg) >> (16 * half) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

void emu_mma_bf16(const std::int32_t* a, const std::int32_t* b, float* c) {
  Warp& w = my_warp();
  const int lane = t_tid % 32;
  std::memcpy(w.a[lane], a, sizeof w.a[lane]);
  std::memcpy(w.b[lane], b, sizeof w.b[lane]);
  w.barrier.wait();
  // A[row][k]: lane (row % 8)·4 + (k % 8)/2, register (row >= 8) + 2·(k >= 8), half k % 2.
  auto A = [&](int row, int k) {
    return bf16_half(w.a[(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)], k % 2);
  };
  // B[k][col]: lane col·4 + (k % 8)/2, register k >= 8, half k % 2.
  auto B = [&](int k, int col) { return bf16_half(w.b[col * 4 + (k % 8) / 2][k >= 8], k % 2); };
  const int g = lane >> 2, t = lane % 4;
  for (int e = 0; e < 4; ++e) {  // c0, c1: (g, 2t + {0,1}); c2, c3: (g + 8, 2t + {0,1})
    const int row = g + 8 * (e / 2), col = 2 * t + e % 2;
    double sum = 0.0;  // bf16 products are exact; the sum in double, rounded once to f32
    for (int k = 0; k < 16; ++k) sum += A(row, k) * B(k, col);
    c[e] = static_cast<float>(sum + static_cast<double>(c[e]));
  }
  w.barrier.wait();
}

}  // namespace

void Emulated::launch(Dim3 grid, const std::function<void()>& call) {
  for (std::int64_t z = 0; z < grid.z; ++z)
    for (std::int64_t y = 0; y < grid.y; ++y)
      for (std::int64_t x = 0; x < grid.x; ++x) {
        std::fill(shared.begin(), shared.end(), std::numeric_limits<float>::quiet_NaN());
        Block block(threads);
        std::vector<std::thread> pool;
        pool.reserve(static_cast<std::size_t>(threads));
        for (int t = 0; t < threads; ++t)
          pool.emplace_back([&, t] {
            t_tid = t;
            t_ntid = threads;
            t_ctaid = {x, y, z};
            t_grid = grid;
            t_block = &block;
            call();
          });
        for (auto& th : pool) th.join();
      }
}

Emulated emulate(const KernelRequest& request) {
  Emulated e;
  const PtxKernel real = emit_ptx(request, 80);  // launch geometry, and proof the request is valid
  e.threads = real.block_x;
  e.shared.assign(static_cast<std::size_t>(real.shared_bytes + real.static_shared_bytes) / 4 + 16, 0.0f);
  codegen::nvptx::detail::HostEmulation hooks;
  hooks.sreg = emu_sreg;
  hooks.barrier = emu_barrier;
  hooks.warp_sync = emu_warp_sync;
  hooks.shfl_xor = emu_shfl_xor;
  hooks.ex2 = emu_ex2;
  hooks.lg2 = emu_lg2;
  hooks.ldmatrix_x4 = emu_ldmatrix_x4;
  hooks.mma_bf16 = emu_mma_bf16;
  hooks.shared = e.shared.data();
  std::string error;
  e.jit = codegen::Jit::create(&error);
  if (!e.jit) throw std::runtime_error(error);
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>("emulation", *context);
  const auto info = codegen::nvptx::detail::build_emulation(*module, request, hooks);
  if (!e.jit->add(std::move(module), std::move(context), &error)) throw std::runtime_error(error);
  e.entry = e.jit->lookup_address(info.name, &error);
  if (!e.entry) throw std::runtime_error(error);
  return e;
}

std::vector<float> random_vec(std::size_t n, std::mt19937& gen, float lo, float hi) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = got[i], w = want[i];
    if (!(g == w || std::fabs(g - w) <= tol * (1.0 + std::fabs(w)))) {  // == : the same infinity
      if (++bad <= 5) ADD_FAILURE() << what << "[" << i << "]: got " << g << ", want " << w;
    }
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " differ";
}

std::vector<std::uint16_t> to_bf16(const std::vector<float>& x) {
  std::vector<std::uint16_t> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}

std::vector<float> from_bf16(const std::vector<std::uint16_t>& x) {
  std::vector<float> y(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - b[i]);
    if (!(d <= m)) m = d;  // NaN propagates
  }
  return m;
}

double mean_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double sum = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i) sum += std::fabs(static_cast<double>(a[i]) - b[i]);
  return a.empty() ? 0.0 : sum / static_cast<double>(a.size());
}

FlagMasks flag_masks(const codegen::cpu::AttentionSpec& spec, std::int64_t B, std::int64_t L, std::int64_t S,
                     std::mt19937& gen) {
  FlagMasks m;
  if (spec.bias) {
    m.bias = random_vec(static_cast<std::size_t>(L * S), gen, -2.0f, 2.0f);
    for (std::int64_t j = 0; j < S; ++j) m.bias[static_cast<std::size_t>(3 * S + j)] = -INFINITY;  // row 3: no key
  }
  if (spec.key_padding) m.keep = key_padding(B, S, gen);
  return m;
}

std::vector<std::uint8_t> key_padding(std::int64_t B, std::int64_t S, std::mt19937& gen) {
  std::vector<std::uint8_t> keep(static_cast<std::size_t>(B * S), 1);
  std::bernoulli_distribution drop(0.25);
  for (auto& x : keep) x = drop(gen) ? 0 : 1;
  if (B > 1)
    for (std::int64_t j = 0; j < S; ++j) keep[static_cast<std::size_t>(S + j)] = 0;  // batch 1: every key padded
  return keep;
}

}  // namespace qkv::emulation
