// codegen/nvptx/kernel_builder.hpp — what every NVPTX kernel generator needs: the kernel
// declaration (ptx_kernel calling convention + nvvm.annotations), special registers, barriers,
// warp shuffles, ex2 / lg2, shared-memory arrays and counted loops of any integer type. Private.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/nvptx.hpp>

namespace qkv::codegen::nvptx::detail {

/// What a generator reports besides the IR (PtxKernel without the PTX).
struct KernelInfo {
  std::string name;
  std::string signature;
  std::string grid_rule;
  int block_x = 1, block_y = 1, block_z = 1;
  int shared_bytes = 0;         // dynamic
  int static_shared_bytes = 0;  // declared in the module
};

/// Shared-memory address space of NVPTX.
inline constexpr unsigned kShared = 3;

/// Host emulation (tests only): the same generators, but the NVPTX-specific operations become
/// calls to these host functions (by absolute address) and shared memory is a host buffer, so the
/// kernel can be JIT-compiled for the CPU and run with one host thread per GPU thread. Everything
/// else — indexing, tiling, masks, softmax, dropout — is the very IR the PTX is made from.
struct HostEmulation {
  std::int32_t (*sreg)(std::int32_t which) = nullptr;  // which: 0 tid.x, 1 ntid.x, 2..4 ctaid.x/y/z, 5 nctaid.x
  void (*barrier)() = nullptr;                         // bar.sync 0 across the block
  void (*warp_sync)() = nullptr;                       // bar.warp.sync -1
  float (*shfl_xor)(float x, std::int32_t lane_xor) = nullptr;
  float (*ex2)(float x) = nullptr;  // ex2.approx.ftz.f32
  float (*lg2)(float x) = nullptr;  // lg2.approx.ftz.f32
  float* shared = nullptr;          // the block's shared memory (16-byte aligned, large enough)
  /// Warp-collective (every lane of the warp calls them, as the instructions require):
  /// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 — `row` is this lane's row address (lanes
  /// 8m..8m+7 give matrix m's rows), out[m] this lane's register of matrix m;
  void (*ldmatrix_x4)(const void* row, std::int32_t trans, std::int32_t* out) = nullptr;
  /// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 — a[4], b[2]: this lane's A and B
  /// fragment registers (bf16 pairs, the lower index in the low half), c[4]: its C fragment in,
  /// D out.
  void (*mma_bf16)(const std::int32_t* a, const std::int32_t* b, float* c) = nullptr;
};

/// Counted loop body: the induction variable and the carried values in, the next carried values out.
using LoopBody = std::function<std::vector<llvm::Value*>(llvm::Value* i, const std::vector<llvm::Value*>& carried)>;

class KernelBuilder {
 public:
  /// emulation: null for NVPTX; otherwise the host hooks (see HostEmulation).
  explicit KernelBuilder(llvm::Module& module, const HostEmulation* emulation = nullptr);

  /// A kernel `name` returning void with the given parameters (named), in the ptx_kernel calling
  /// convention, annotated as a kernel with at most `max_threads` threads per block (.maxntid)
  /// and, when min_blocks > 0, .minnctapersm min_blocks (ptxas then budgets registers for that
  /// many resident blocks per SM instead of its own occupancy guess).
  llvm::Function* declare_kernel(const std::string& name, const std::vector<llvm::Type*>& params,
                                 const std::vector<std::string>& names, int max_threads, int min_blocks = 0);

  llvm::IRBuilder<>& b() { return b_; }
  llvm::LLVMContext& ctx() { return ctx_; }
  llvm::Module& module() { return module_; }
  llvm::Function* fn() { return fn_; }

  // --- types and constants
  llvm::Type* f32() { return b_.getFloatTy(); }
  llvm::Type* i8() { return b_.getInt8Ty(); }
  llvm::Type* i32() { return b_.getInt32Ty(); }
  llvm::Type* i64() { return b_.getInt64Ty(); }
  llvm::Type* ptr() { return b_.getPtrTy(); }
  llvm::Value* c32(std::int64_t v) { return b_.getInt32(static_cast<std::uint32_t>(v)); }
  llvm::Value* c64(std::int64_t v) { return b_.getInt64(static_cast<std::uint64_t>(v)); }
  llvm::Value* cf(double v) { return llvm::ConstantFP::get(f32(), v); }

  // --- special registers (i32)
  llvm::Value* tid_x();
  llvm::Value* ntid_x();
  llvm::Value* ctaid_x();
  llvm::Value* ctaid_y();
  llvm::Value* ctaid_z();
  llvm::Value* nctaid_x();

  /// __syncthreads() (bar.sync 0): every thread of the block must reach it.
  void barrier();
  /// __syncwarp() over the full warp (bar.warp.sync -1): orders shared memory within a warp.
  void warp_sync();
  /// shfl.sync.bfly.b32 of an f32 across the full warp with lane mask `lane_xor`.
  llvm::Value* shfl_xor(llvm::Value* x, int lane_xor);
  /// Σ or max of an f32 over groups of `width` adjacent lanes (a power of two <= 32), by
  /// butterfly shuffles: every lane of the group gets the result.
  llvm::Value* group_sum(llvm::Value* x, int width);
  llvm::Value* group_max(llvm::Value* x, int width);
  /// 2^x by ex2.approx.ftz.f32 (−inf → +0; results below 2^-126 flush to 0).
  llvm::Value* ex2(llvm::Value* x);
  /// log2 x by lg2.approx.ftz.f32 (subnormal inputs flush to 0: −inf; x < 0: NaN).
  llvm::Value* lg2(llvm::Value* x);
  /// fma.rn.f32
  llvm::Value* fma(llvm::Value* a, llvm::Value* x, llvm::Value* c);
  llvm::Value* smin(llvm::Value* a, llvm::Value* x);
  llvm::Value* smax(llvm::Value* a, llvm::Value* x);

  // --- tensor cores (sm_80+), warp-collective: every lane of the warp must execute them together
  /// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16 from this lane's row address `row` (a
  /// shared-memory pointer, 16-byte aligned): four i32, register m from matrix m (lanes 8m..8m+7
  /// address its rows).
  std::vector<llvm::Value*> ldmatrix_x4(llvm::Value* row, bool trans);
  /// mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32: D = A·B + C on this lane's fragments
  /// (a: 4 i32, b: 2 i32, c: 4 f32) → d: 4 f32.
  std::vector<llvm::Value*> mma_bf16(const std::vector<llvm::Value*>& a, const std::vector<llvm::Value*>& b,
                                     const std::vector<llvm::Value*>& c);
  /// Two f32 rounded to bf16 (nearest, ties to even) packed in an i32: `lo` in bits 0..15.
  llvm::Value* pack_bf16x2(llvm::Value* lo, llvm::Value* hi);

  // --- tensor-core tiles: bf16 rows in shared memory, `stride` elements a row, 16-byte aligned
  /// This lane's ldmatrix.x4 row address for the 16 × 16 block at row `row0` (i32), column 0 of
  /// `tile`. rows_first: matrices 0, 1 are rows 0–7, 8–15 of columns 0–7 and matrices 2, 3 the
  /// same of columns 8–15 — an A fragment, or (read .trans) the B fragments of two n8 tiles of a
  /// tile stored k-major ([k][n]). Else matrices 0, 1 are columns 0–7, 8–15 of rows 0–7 and 2, 3
  /// of rows 8–15 — the B fragments of two n8 tiles of a tile stored n-major ([n][k]).
  llvm::Value* mma_lane_row(llvm::Value* tile, int stride, llvm::Value* row0, bool rows_first);
  /// The A fragments of `slices` k16 slices at a rows_first lane address (slice s: columns 16s..).
  std::vector<std::vector<llvm::Value*>> mma_a_fragments(llvm::Value* a, int slices);
  /// c (the C fragments of n n8 tiles, 4 f32 each: n = c.size() / 4, even) += A·Bᵀ: A the
  /// fragments of its k16 slices, B the n-major tile of 8n rows × 16·|a| at the lane address `b`
  /// (rows_first = false).
  std::vector<llvm::Value*> mma_a_bt(std::vector<llvm::Value*> c, const std::vector<std::vector<llvm::Value*>>& a,
                                     llvm::Value* b, int b_stride);
  /// c (n n8 tiles) += P·B: P the C fragments of 16 rows × 8m columns (m = p.size() / 4, even),
  /// rounded to bf16 and re-packed in registers as the A fragments of m / 2 k16 slices (the C
  /// layout of two adjacent n8 tiles is the A layout of one k16 slice: FlashAttention-2's trick),
  /// B the k-major tile of 8m rows × 8n columns at the lane address `b` (rows_first, read .trans).
  std::vector<llvm::Value*> mma_c_b(std::vector<llvm::Value*> c, const std::vector<llvm::Value*>& p, llvm::Value* b,
                                    int b_stride);
  /// The block's threads (`tid` of `threads`) copy `rows` rows of `width` bf16 (a multiple of 8)
  /// from `src` (rows before `valid`, an i64, else zeros) to `tile`, 16 bytes a thread and step.
  void stage_bf16_rows(llvm::Value* tid, int threads, llvm::Value* src, llvm::Value* valid, int rows,
                       std::int64_t width, llvm::Value* tile, int stride, const std::string& name);

  /// The module's extern dynamic shared-memory array (`extern __shared__ float4 smem[]`).
  llvm::Value* dynamic_shared(const std::string& name);
  /// A static shared array of `floats` f32, 16-byte aligned.
  llvm::Value* static_shared(const std::string& name, std::int64_t floats);

  /// for (i = begin; i < end; i += step): signed compare in the type of `begin` (end and step are
  /// converted to it), guarded and rotated like codegen/llvm/ir_util.hpp's emit_loop. Returns
  /// the carried values after the loop; the builder is left in the exit block. `unroll` false
  /// attaches llvm.loop.unroll.disable.
  std::vector<llvm::Value*> loop(llvm::Value* begin, llvm::Value* end, std::int64_t step,
                                 std::vector<llvm::Value*> init, const LoopBody& body, const std::string& name,
                                 bool unroll = true);
  void loop(llvm::Value* begin, llvm::Value* end, std::int64_t step, const std::function<void(llvm::Value* i)>& body,
            const std::string& name, bool unroll = true);
  /// The same with a run-time step (a grid-stride loop), no carried values.
  void loop(llvm::Value* begin, llvm::Value* end, llvm::Value* step, const std::function<void(llvm::Value* i)>& body,
            const std::string& name);

  // --- shared-memory tiles (the fp32 attention kernels, forward and backward)
  /// `width` f32 from shared memory: one scalar load, or (width 4) one ld.shared.v4.f32 at a
  /// 16-byte aligned address.
  std::vector<llvm::Value*> load_shared_f32(llvm::Value* ptr, int width);
  /// The block's threads (thread `tid` of `threads`) copy `rows` rows of `width` floats to a shared
  /// tile whose rows are `stride` floats apart: tile[r][c] = src[r·width + c] · factor where
  /// r·width + c < valid_floats, else 0. Consecutive threads take consecutive floats (coalesced);
  /// the floats past valid_floats read src[0] (in bounds whenever a row is valid).
  void stage_rows(llvm::Value* tid, int threads, llvm::Value* src, llvm::Value* valid_floats, int rows,
                  std::int64_t width, int stride, llvm::Value* tile, double factor, const std::string& name);
  /// acc[i·|b_rows| + j] = Σ_{d < len} A[i][d] · B[j][d] over shared rows (pointers), one fma per d in
  /// increasing d, `w` floats a load.
  std::vector<llvm::Value*> dot_tile(const std::vector<llvm::Value*>& a_rows, const std::vector<llvm::Value*>& b_rows,
                                     std::int64_t len, int w);
  /// acc[(i·tc + t)·w + e] += Σ_{c < n} A[i][c] · B[c][t·8·w + e] in increasing c: A's shared rows
  /// read 4 at a time (n a multiple of 4, rows 16-byte aligned), B's rows (b_lane: this lane's first
  /// column, rows b_stride floats apart) `w` floats at a time.
  std::vector<llvm::Value*> rows_times_tile(std::vector<llvm::Value*> acc, const std::vector<llvm::Value*>& a_rows,
                                            int n, llvm::Value* b_lane, int b_stride, int tc, int w);

  /// Carried values through a step that `never` (block-uniform) rules out: it passes them on
  /// unchanged, else visit(carried); the builder is left after the join.
  std::vector<llvm::Value*> visit_unless(
      llvm::Value* never, const std::vector<llvm::Value*>& carried,
      const std::function<std::vector<llvm::Value*>(const std::vector<llvm::Value*>&)>& visit, const std::string& name);
  /// if (cond) { then(); } — the builder is left after the join.
  void if_then(llvm::Value* cond, const std::function<void()>& then, const std::string& name);
  /// cond ? load(type, ptr) : fallback, the load only executed when cond holds.
  llvm::Value* guarded_load(llvm::Value* cond, llvm::Type* type, llvm::Value* ptr, llvm::Value* fallback,
                            const std::string& name);

 private:
  llvm::Value* sreg(llvm::Intrinsic::ID id, int which);
  /// A call of a host function by address (emulation).
  llvm::Value* host_call(const void* fn, llvm::Type* ret, llvm::ArrayRef<llvm::Value*> args);
  /// An array of n `type` in the entry block (emulation: the hooks' in/out registers).
  llvm::Value* entry_alloca(llvm::Type* type, int n);
  std::vector<llvm::Value*> loop_impl(llvm::Value* begin, llvm::Value* end, llvm::Value* step,
                                      std::vector<llvm::Value*> init, const LoopBody& body, const std::string& name,
                                      bool unroll);

  llvm::Module& module_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const HostEmulation* emu_ = nullptr;
  llvm::Function* fn_ = nullptr;
};

// --- the generators (each fills `module` with one kernel and says how to launch it; with
// `emulation`, the host-emulation variant of the same kernel)
KernelInfo build_attention(llvm::Module& module, const AttentionKernel& request,
                           const HostEmulation* emulation = nullptr);
/// spec.storage == bf16: the tensor-core kernel (attention_mma_ptx.cpp); build_attention
/// dispatches to it.
KernelInfo build_attention_mma(llvm::Module& module, const AttentionKernel& request,
                               const HostEmulation* emulation = nullptr);
KernelInfo build_attention_backward(llvm::Module& module, const AttentionBackwardKernel& request,
                                    const HostEmulation* emulation = nullptr);
/// spec.storage == bf16: the tensor-core kernels (attention_backward_mma_ptx.cpp);
/// build_attention_backward dispatches to them.
KernelInfo build_attention_backward_mma(llvm::Module& module, const AttentionBackwardKernel& request,
                                        const HostEmulation* emulation = nullptr);
KernelInfo build_linear(llvm::Module& module, const LinearKernel& request, const HostEmulation* emulation = nullptr);
/// storage == bf16: the tensor-core GEMM (linear_mma_ptx.cpp); build_linear dispatches to it.
KernelInfo build_linear_mma(llvm::Module& module, const LinearKernel& request,
                            const HostEmulation* emulation = nullptr);
/// Why build_linear_mma cannot generate `request` (empty: it can).
std::string linear_mma_unsupported(const LinearKernel& request);
KernelInfo build_decode_attention(llvm::Module& module, const DecodeAttentionKernel& request,
                                  const HostEmulation* emulation = nullptr);
KernelInfo build_decode_merge(llvm::Module& module, const DecodeMergeKernel& request,
                              const HostEmulation* emulation = nullptr);
KernelInfo build_layer_norm(llvm::Module& module, const LayerNormKernel& request,
                            const HostEmulation* emulation = nullptr);
KernelInfo build_elementwise(llvm::Module& module, const ElementwiseKernel& request,
                             const HostEmulation* emulation = nullptr);
KernelInfo build_strided_copy(llvm::Module& module, const StridedCopyKernel& request,
                              const HostEmulation* emulation = nullptr);

/// Any request's host-emulation kernel (build_* with `emulation`), for tests.
KernelInfo build_emulation(llvm::Module& module, const KernelRequest& request, const HostEmulation& emulation);

}  // namespace qkv::codegen::nvptx::detail
