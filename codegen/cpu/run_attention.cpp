// run_attention: argument checks, the kernel cache (spec hash × target → JIT'd function), and the
// split of one call into (batch, head, query block) tasks on the thread pool.
#include <qkv/codegen/cpu/run_attention.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <utility>
#include <vector>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/raw_ostream.h>

#include <qkv/codegen/jit.hpp>

#include "cpu/kernels/attention_kernel.hpp"
#include "cpu/kernels/decode_kernel.hpp"
#include "cpu/schedule.hpp"
#include "cpu/thread_pool.hpp"

namespace qkv::codegen::cpu {

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

struct Kernel {
  AttentionSpec spec;
  bool decode = false;  // the split-KV decode kernel (decode_kernel.hpp) rather than the fused one
  KernelConfig config;
  std::string name;
  AttentionKernelFn* fn = nullptr;
  DecodeKernelFn* decode_fn = nullptr;
  DecodeMergeFn* merge_fn = nullptr;
};

/// Kernels by (spec hash, target key); the full spec is kept and compared, so a hash collision
/// costs a compile, never a wrong kernel.
struct KernelCache {
  std::mutex mutex;
  std::unique_ptr<Jit> jit;
  std::map<std::pair<std::uint64_t, std::string>, std::vector<std::unique_ptr<Kernel>>> kernels;
  std::uint64_t added = 0;  // makes symbol names unique within one JIT
};

KernelCache& cache() {
  static KernelCache c;
  return c;
}

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument("run_attention: " + what); }

void check_spec(const AttentionSpec& s) {
  // The kernel keeps a task's Qᵀ and Oᵀ on its stack (dk·rows and dv·rows floats).
  constexpr std::int64_t kMaxHeadDim = 4096;
  if (s.dk < 1 || s.dv < 1 || s.dk > kMaxHeadDim || s.dv > kMaxHeadDim)
    invalid("head widths must be in [1, " + std::to_string(kMaxHeadDim) + "] (dk = " + std::to_string(s.dk) +
            ", dv = " + std::to_string(s.dv) + ")");
  if (s.hq < 1 || s.hkv < 1 || s.hq % s.hkv != 0)
    invalid("query heads (" + std::to_string(s.hq) + ") must be a positive multiple of key/value heads (" +
            std::to_string(s.hkv) + ")");
  if (!(s.dropout_p >= 0.0 && s.dropout_p < 1.0))
    invalid("dropout_p must be in [0, 1), got " + std::to_string(s.dropout_p));
  if (!(s.effective_scale() == s.effective_scale())) invalid("scale is NaN");
  for (int t : {s.vector_floats, s.query_vectors, s.key_tile, s.qk_keys, s.pv_dims})
    if (t < 0 || t > 1024) invalid("tiling fields must be 0 (auto) or in [1, 1024]");
  if (s.decode_queries < -1 || s.decode_queries > 1024)
    invalid("decode_queries must be -1 (never), 0 (auto) or in [1, 1024]");
  if (s.decode_chunk < 0) invalid("decode_chunk must be 0 (auto) or positive");
  if (s.storage != DType::f32 && s.storage != DType::bf16 && s.storage != DType::f16)
    invalid("q, k, v and out are stored as f32, bf16 or f16");
}

void check_args(const AttentionSpec& s, const AttentionArgs& a) {
  constexpr std::int64_t kMaxLen =
      std::numeric_limits<std::int32_t>::max();  // dropout counters and lane math are 32-bit
  if (a.batch < 0 || a.len_q < 0 || a.len_k < 0) invalid("batch, len_q and len_k must not be negative");
  if (a.len_q > kMaxLen || a.len_k > kMaxLen) invalid("len_q and len_k must be below 2^31");
  const bool empty = a.batch == 0 || a.len_q == 0;
  if (empty) return;
  if (!a.q || !a.out) invalid("q and out must not be null");
  if (a.len_k > 0 && (!a.k || !a.v)) invalid("k and v must not be null");
  if (s.write_weights && a.len_k > 0 && !a.weights) invalid("the spec writes weights but args.weights is null");
  if (s.write_lse && !a.lse) invalid("the spec writes the log-sum-exp but args.lse is null");
  if (s.key_padding && a.len_k > 0 && !a.key_keep) invalid("the spec has a key-padding mask but args.key_keep is null");
  if (s.bias && a.len_k > 0 && !a.bias) invalid("the spec has a bias but args.bias is null");
}

std::string hex(std::uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

/// The JIT, created on first use. Caller holds the cache mutex.
Jit& jit_locked(KernelCache& c, KernelInfo* info) {
  if (!c.jit) {
    const auto t0 = Clock::now();
    std::string error;
    c.jit = Jit::create(&error);
    if (!c.jit) throw std::runtime_error("run_attention: " + error);
    if (info) info->jit_create_ms = ms_since(t0);
  }
  return *c.jit;
}

/// The blocking of `spec` on this host (no compile).
KernelConfig host_config(const AttentionSpec& spec) {
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  return choose_kernel_config(spec, jit_locked(c, nullptr).target());
}

/// The fused kernel of `spec`, or (decode) its split-KV decode kernel and merge, compiled on
/// first use.
const Kernel& get_kernel(const AttentionSpec& spec, KernelInfo* info, bool decode = false) {
  check_spec(spec);
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Jit& jit = jit_locked(c, info);
  auto& bucket = c.kernels[{spec.hash(), jit.target_key()}];
  for (const auto& k : bucket) {
    if (k->spec == spec && k->decode == decode) {
      if (info) {
        info->name = k->name;
        info->cached = true;
      }
      return *k;
    }
  }

  auto kernel = std::make_unique<Kernel>();
  kernel->spec = spec;
  kernel->decode = decode;
  kernel->config = choose_kernel_config(spec, jit.target());
  kernel->name =
      std::string(decode ? "qkv_decode_" : "qkv_attention_") + hex(spec.hash()) + "_" + std::to_string(c.added++);
  auto t0 = Clock::now();
  auto context = std::make_unique<llvm::LLVMContext>();
  std::unique_ptr<llvm::Module> module;
  if (decode) {
    module = std::make_unique<llvm::Module>(kernel->name, *context);
    emit_decode_kernels(*module, spec, kernel->config, kernel->name);
  } else {
    module = build_attention_module(*context, spec, kernel->config, kernel->name);
  }
  const double build_ms = ms_since(t0);
  t0 = Clock::now();
  std::string error;
  if (!jit.add(std::move(module), std::move(context), &error)) throw std::runtime_error("run_attention: " + error);
  if (decode) {
    kernel->decode_fn = jit.lookup<DecodeKernelFn>(kernel->name, &error);
    kernel->merge_fn = kernel->decode_fn ? jit.lookup<DecodeMergeFn>(kernel->name + "_merge", &error) : nullptr;
    if (!kernel->merge_fn) throw std::runtime_error("run_attention: " + error);
  } else {
    kernel->fn = jit.lookup<AttentionKernelFn>(kernel->name, &error);
    if (!kernel->fn) throw std::runtime_error("run_attention: " + error);
  }
  if (info) {
    info->name = kernel->name;
    info->build_ms = build_ms;
    info->compile_ms = ms_since(t0);
  }
  bucket.push_back(std::move(kernel));
  return *bucket.back();
}

}  // namespace

KernelInfo prepare_attention(const AttentionSpec& spec) {
  KernelInfo info;
  const Kernel& k = get_kernel(spec, &info);
  info.vector_floats = k.config.lanes;
  info.query_rows = k.config.query_rows();
  info.key_tile = k.config.key_tile;
  info.dpbf16 = k.config.dpbf16;
  return info;
}

void clear_attention_cache() {
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  c.kernels.clear();
  c.jit.reset();
}

/// The split-KV decode kernel's tasks (unit, chunk), then the merge of each unit's chunks.
void run_decode(const Kernel& kernel, const AttentionArgs& args, int threads) {
  const AttentionSpec& spec = kernel.spec;
  const DecodeConfig d = choose_decode_config(spec, kernel.config);
  const std::int64_t units = args.batch * spec.hkv * d.nblocks * args.len_q;
  const SplitKv<std::int64_t> split = split_kv<std::int64_t>(units, args.len_k, d.key_tile, spec.decode_chunk);
  std::vector<float> partials(
      static_cast<std::size_t>(split_kv_floats<std::int64_t>(units, d.rows, split.chunks, decode_record_floats(spec))));
  float* work = partials.empty() ? nullptr : partials.data();
  DecodeKernelFn* fn = kernel.decode_fn;
  ThreadPool::shared().run(units * split.chunks, threads, [&](std::int64_t t) {
    fn(&args, t / split.chunks, t % split.chunks, split.chunk_len, split.chunks, work);
  });
  if (!work) return;
  DecodeMergeFn* merge = kernel.merge_fn;
  ThreadPool::shared().run(units, threads, [&](std::int64_t u) { merge(&args, u, split.chunks, work); });
}

void run_attention(const AttentionSpec& spec, const AttentionArgs& args, int threads) {
  check_spec(spec);
  check_args(spec, args);
  if (args.batch == 0 || args.len_q == 0) return;
  if (args.len_q <= decode_max_queries(spec, host_config(spec))) {
    run_decode(get_kernel(spec, nullptr, /*decode=*/true), args, threads);
    return;
  }
  const Kernel& kernel = get_kernel(spec, nullptr);

  // Tasks (batch, head, block of query rows) in schedule.hpp's order, as the generated code runs
  // them.
  const std::int64_t rows = kernel.config.query_rows(), blocks = (args.len_q + rows - 1) / rows;
  const std::int64_t bh = args.batch * spec.hq;
  AttentionKernelFn* fn = kernel.fn;
  ThreadPool::shared().run(bh * blocks, threads, [&](std::int64_t t) {
    const AttentionTask<std::int64_t> task = attention_task(t, blocks, spec.hq, spec.hkv, spec.causal);
    fn(&args, task.batch, task.head, task.row_block * rows);
  });
}

std::string attention_kernel_ir(const AttentionSpec& spec, bool optimized) {
  check_spec(spec);
  KernelCache& c = cache();
  std::lock_guard<std::mutex> lock(c.mutex);
  Jit& jit = jit_locked(c, nullptr);
  llvm::LLVMContext context;
  const KernelConfig config = choose_kernel_config(spec, jit.target());
  auto module = build_attention_module(context, spec, config, "qkv_attention_" + hex(spec.hash()));
  std::string error;
  if (optimized && !jit.optimize(*module, &error)) throw std::runtime_error("attention_kernel_ir: " + error);
  std::string text;
  llvm::raw_string_ostream os(text);
  module->print(os, nullptr);
  os.flush();
  return text;
}

}  // namespace qkv::codegen::cpu
