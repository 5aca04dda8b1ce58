// run_attention_backward: what the backward kernel covers, its cache (spec × target → JIT'd
// function), D = rowsum(dO ∘ O), the tasks (batch, kv head, chunk) and the fixed-order sum of
// the chunks' dQ partials.
#include <qkv/codegen/cpu/run_attention_backward.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include <qkv/codegen/jit.hpp>
#include <qkv/runtime/io/array.hpp>

#include "cpu/kernels/attention_backward.hpp"
#include "cpu/schedule.hpp"
#include "cpu/thread_pool.hpp"

namespace qkv::codegen::cpu {

namespace {

struct BackwardKernel {
  AttentionSpec spec;
  BackwardConfig config;
  AttentionBackwardFn* fn = nullptr;
};

struct BackwardCache {
  std::mutex mutex;
  std::unique_ptr<Jit> jit;
  std::map<std::uint64_t, std::vector<std::unique_ptr<BackwardKernel>>> kernels;
  std::uint64_t added = 0;
};

BackwardCache& cache() {
  static BackwardCache c;
  return c;
}

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("run_attention_backward: " + what); }

Jit& jit_locked(BackwardCache& c) {
  if (!c.jit) {
    std::string error;
    c.jit = Jit::create(&error);
    if (!c.jit) throw std::runtime_error("run_attention_backward: " + error);
  }
  return *c.jit;
}

/// The spec as the kernel sees it: the tiling fields of the forward do not matter.
AttentionSpec normalized(AttentionSpec s) {
  s.write_lse = false;
  s.write_weights = false;
  s.query_vectors = s.key_tile = s.qk_keys = s.pv_dims = 0;
  s.decode_queries = s.decode_chunk = 0;
  return s;
}

const BackwardKernel& get_kernel(const AttentionSpec& spec) {
  BackwardCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Jit& jit = jit_locked(c);
  auto& bucket = c.kernels[spec.hash()];
  for (const auto& k : bucket)
    if (k->spec == spec) return *k;
  auto kernel = std::make_unique<BackwardKernel>();
  kernel->spec = spec;
  kernel->config = choose_backward_config(spec, jit.target());
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(spec.hash()));
  const std::string name = std::string("qkv_attention_backward_") + hex + "_" + std::to_string(c.added++);
  auto context = std::make_unique<llvm::LLVMContext>();
  auto module = std::make_unique<llvm::Module>(name, *context);
  emit_attention_backward(*module, spec, kernel->config, name);
  std::string error;
  if (!jit.add(std::move(module), std::move(context), &error))
    throw std::runtime_error("run_attention_backward: " + error);
  kernel->fn = jit.lookup<AttentionBackwardFn>(name, &error);
  if (!kernel->fn) throw std::runtime_error("run_attention_backward: " + error);
  bucket.push_back(std::move(kernel));
  return *bucket.back();
}

}  // namespace

std::string backward_unsupported(const AttentionSpec& spec) {
  if (spec.storage != DType::f32 && spec.storage != DType::bf16) return "q, k, v are stored as neither f32 nor bf16";
  if (spec.dk < 1 || spec.dv < 1 || spec.dk > 256 || spec.dv > 256) return "head widths outside [1, 256]";
  if (spec.hq < 1 || spec.hkv < 1 || spec.hq % spec.hkv != 0) return "query heads not a multiple of key/value heads";
  if (!(spec.effective_scale() == spec.effective_scale())) return "a NaN scale";
  return {};
}

double attention_backward_flops(const AttentionSpec& spec, std::int64_t batch, std::int64_t len_q, std::int64_t len_k) {
  return 2.5 * attention_flops(spec, batch, len_q, len_k);
}

void run_attention_backward(const AttentionSpec& spec_in, const AttentionBackwardArgs& args_in, int threads) {
  if (const std::string why = backward_unsupported(spec_in); !why.empty()) invalid("not covered: " + why);
  const AttentionSpec spec = normalized(spec_in);
  const AttentionArgs& f = args_in.forward;
  if (f.batch < 0 || f.len_q < 0 || f.len_k < 0) invalid("batch, len_q and len_k must not be negative");
  if (f.len_q >= (std::int64_t{1} << 31) || f.len_k >= (std::int64_t{1} << 31)) invalid("L and S must be below 2^31");
  if (f.kv_rows != 0 && f.kv_rows != f.len_k) invalid("K and V must be dense (kv_rows = 0)");
  const std::int64_t B = f.batch, L = f.len_q, S = f.len_k, hq = spec.hq, hkv = spec.hkv;
  const auto nq = static_cast<std::size_t>(B * hq * L), nk = static_cast<std::size_t>(B * hkv * S);
  if (nq && !args_in.dq) invalid("dq must not be null");
  if (nk && (!args_in.dk || !args_in.dv)) invalid("dk and dv must not be null");
  if (!spec.tensor_grads.empty() && (!args_in.dtensors || !f.tensors || !f.extents))
    invalid("the spec has tensor gradients but dtensors, tensors or extents is null");
  for (const auto& t : spec.tensor_grads)
    if (t.tensor < 0 || static_cast<std::size_t>(t.tensor) >= spec.tensors.size() ||
        spec.tensors[static_cast<std::size_t>(t.tensor)].dtype != DType::f32)
      invalid("a tensor gradient names no f32 tensor of the spec");
  std::vector<std::int64_t> numel;  // entries of each tensor with a gradient
  for (const auto& t : spec.tensor_grads) {
    std::int64_t first = 0, count = 1;
    for (int k = 0; k < t.tensor; ++k) first += spec.tensors[static_cast<std::size_t>(k)].rank;
    for (int d = 0; d < spec.tensors[static_cast<std::size_t>(t.tensor)].rank; ++d) count *= f.extents[first + d];
    numel.push_back(count);
  }
  for (std::size_t t = 0; t < numel.size(); ++t)
    if (numel[t]) std::memset(args_in.dtensors[t], 0, static_cast<std::size_t>(numel[t]) * 4);
  if (nq == 0 || nk == 0) {                                         // no query or no key: every gradient is zero
    const std::size_t bytes = spec.storage == DType::bf16 ? 2 : 4;  // +0.0 is all zero bits in both
    if (nq) std::memset(args_in.dq, 0, nq * static_cast<std::size_t>(spec.dk) * bytes);
    if (nk) {
      std::memset(args_in.dk, 0, nk * static_cast<std::size_t>(spec.dk) * bytes);
      std::memset(args_in.dv, 0, nk * static_cast<std::size_t>(spec.dv) * bytes);
    }
    return;
  }
  if (!f.q || !f.k || !f.v || !f.out || !f.lse || !args_in.d_out)
    invalid("q, k, v, out, lse and d_out must not be null");
  if (spec.key_padding && !f.key_keep) invalid("the spec has a key-padding mask but key_keep is null");

  const BackwardKernel& kernel = get_kernel(spec);
  const BackwardConfig& cfg = kernel.config;
  AttentionBackwardArgs a = args_in;

  // q, k, v, out, d_out and the gradients as the spec stores them: f32, or bf16 bits.
  const bool half = spec.storage == DType::bf16;
  auto read = [half](const void* p, std::int64_t i) {
    return half ? bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]) : static_cast<const float*>(p)[i];
  };
  // D = rowsum(dO ∘ O), one row at a time in a fixed order.
  std::vector<float> delta(nq);
  const void *o = f.out, *dout = args_in.d_out;
  const std::int64_t dv = spec.dv, dk = spec.dk;
  ThreadPool::shared().run(B * hq, threads, [&](std::int64_t bh) {
    for (std::int64_t i = 0; i < L; ++i) {
      const std::int64_t row = bh * L + i;
      double s = 0;
      for (std::int64_t d = 0; d < dv; ++d)
        s += static_cast<double>(read(o, row * dv + d)) * static_cast<double>(read(dout, row * dv + d));
      delta[static_cast<std::size_t>(row)] = static_cast<float>(s);
    }
  });

  // Chunks of key blocks: from the shape alone (never the thread count), enough tasks to share.
  const auto [chunk_blocks, chunks] = backward_chunks(B * hkv, ceil_div(S, std::int64_t{cfg.keys}));
  const std::int64_t padded_rows = (L + cfg.rows - 1) / cfg.rows * cfg.rows;
  // Kept by the calling thread between calls (chunks × B·H·L·dk floats: 32 MiB at N = 4096, whose
  // pages a fresh allocation faulted in on every call — in a VM, a trap each).
  // (A reference: the pool's tasks below must see this thread's buffer, not their own.)
  thread_local std::vector<float> kept;
  std::vector<float>& partial = kept;
  partial.assign(static_cast<std::size_t>(chunks * B * hq * padded_rows * cfg.dkp), 0.0f);
  a.delta = delta.data();
  a.dq_partial = partial.data();
  a.chunk_blocks = chunk_blocks;
  a.padded_rows = padded_rows;
  a.chunks = chunks;
  // The tensor gradients' partial sums: per tensor, its slots one after another.
  std::vector<std::vector<float>> partials;
  partials.reserve(numel.size());
  std::vector<float*> partial_ptrs;
  for (std::size_t t = 0; t < spec.tensor_grads.size(); ++t) {
    const std::int64_t slots = tensor_grad_slots(spec.tensor_grads[t], B, hkv, std::int64_t{chunks});
    partials.emplace_back(static_cast<std::size_t>(slots * numel[t]), 0.0f);
    partial_ptrs.push_back(partials.back().data());
  }
  a.tensor_partials = partial_ptrs.data();

  AttentionBackwardFn* fn = kernel.fn;
  ThreadPool::shared().run(B * hkv * chunks, threads, [&](std::int64_t t) {
    const std::int64_t chunk = t % chunks, bk = t / chunks;
    fn(&a, bk / hkv, bk % hkv, chunk);
  });

  // dQ = scale · Σ_chunk partial, in chunk order.
  const auto scale = static_cast<float>(spec.effective_scale());
  const std::int64_t per_chunk = B * hq * padded_rows * cfg.dkp;
  ThreadPool::shared().run(B * hq, threads, [&](std::int64_t bh) {
    for (std::int64_t i = 0; i < L; ++i)
      for (std::int64_t d = 0; d < dk; ++d) {
        const std::int64_t at = (bh * padded_rows + i) * cfg.dkp + d;
        float s = 0;
        for (std::int64_t c = 0; c < chunks; ++c) s += partial[static_cast<std::size_t>(c * per_chunk + at)];
        const std::int64_t to = (bh * L + i) * dk + d;
        if (half)
          static_cast<std::uint16_t*>(args_in.dq)[to] = f32_to_bf16(scale * s);
        else
          static_cast<float*>(args_in.dq)[to] = scale * s;
      }
  });
  // Each tensor gradient: its slots added in order.
  for (std::size_t t = 0; t < spec.tensor_grads.size(); ++t) {
    const std::int64_t slots = tensor_grad_slots(spec.tensor_grads[t], B, hkv, std::int64_t{chunks}), n = numel[t];
    const std::vector<float>& p = partials[t];
    for (std::int64_t e = 0; e < n; ++e) {
      float s = 0;
      for (std::int64_t k = 0; k < slots; ++k) s += p[static_cast<std::size_t>(k * n + e)];
      args_in.dtensors[t][e] = s;
    }
  }
}

std::string attention_backward_kernel_ir(const AttentionSpec& spec_in, bool optimized) {
  if (const std::string why = backward_unsupported(spec_in); !why.empty()) invalid("not covered: " + why);
  const AttentionSpec spec = normalized(spec_in);
  BackwardCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Jit& jit = jit_locked(c);
  llvm::LLVMContext context;
  llvm::Module module("qkv_attention_backward", context);
  emit_attention_backward(module, spec, choose_backward_config(spec, jit.target()), "qkv_attention_backward");
  std::string error;
  if (optimized && !jit.optimize(module, &error)) throw std::runtime_error("attention_backward_kernel_ir: " + error);
  std::string text;
  llvm::raw_string_ostream os(text);
  module.print(os, nullptr);
  os.flush();
  return text;
}

}  // namespace qkv::codegen::cpu
