// The launch side of the NVPTX kernels: tiling resolution and validation, grids, names,
// signatures (no LLVM here).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <qkv/ir/hash.hpp>

#include "nvptx/geometry.hpp"

namespace qkv::codegen::nvptx {

namespace detail {

namespace {
[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("nvptx: " + message); }

/// The largest number of live accumulators (S and O micro-tiles) we let one thread carry: above
/// this ptxas spills heavily; a smaller block_q (fewer rows per thread) is the remedy.
constexpr int kMaxAccumulators = 160;
}  // namespace

void check_sm(int sm) {
  if (sm != 80 && sm != 86 && sm != 87 && sm != 89 && sm != 90)
    fail("sm_" + std::to_string(sm) + " is not supported (80, 86, 87, 89 or 90)");
}

int max_shared_bytes(int sm) {
  switch (sm) {
    case 80:
    case 87:
      return 163 * 1024;
    case 86:
    case 89:
      return 99 * 1024;
    default:
      return 227 * 1024;
  }
}

void check_threads(int threads, int limit, const char* what) {
  if (threads < 32 || threads > limit || threads % 32 != 0)
    fail(std::string(what) + ": threads = " + std::to_string(threads) + " must be a multiple of 32 in [32, " +
         std::to_string(limit) + "]");
}

namespace {
/// What the kernel cannot evaluate in a mod expression: refused up front (std::runtime_error), so a
/// planner can fall back before emitting anything.
void check_mod(const cpu::AttentionSpec& s) {
  const cpu::EffectiveMod m = cpu::effective_mod(s);
  const ModExpr& e = m.expr;
  if (e.keep >= 0) {
    const auto used = mod_reachable(e, e.keep);
    for (std::size_t i = 0; i < e.nodes.size(); ++i)
      if (used[i] && e.nodes[i].op == ModOp::score)
        fail("attention: a mask modification may not read the score (use a score modification)");
  }
  for (const cpu::ModTensor& t : m.tensors)
    if (t.dtype != DType::f32 && t.dtype != DType::f64 && t.dtype != DType::boolean && t.dtype != DType::i32 &&
        t.dtype != DType::i64)
      fail("attention: a mod loads a tensor of dtype " + std::string(dtype_name(t.dtype)) +
           " (f32, f64, bool, i32 or i64)");
  auto known_axis = [&](const std::string& axis) {
    if (axis == m.axes.query || axis == m.axes.key || axis == m.axes.batch) return true;
    for (const auto& h : m.axes.heads)
      if (h.name == axis) return true;
    return false;
  };
  for (const ModNode& n : e.nodes) {
    if ((n.op == ModOp::index || n.op == ModOp::position || n.op == ModOp::length) && !known_axis(n.axis))
      fail("attention: a mod names the axis `" + n.axis + "`, which the scores do not have");
    if (n.op == ModOp::load && (n.input < 0 || static_cast<std::size_t>(n.input) >= m.tensors.size() ||
                                static_cast<int>(n.at.size()) != m.tensors[static_cast<std::size_t>(n.input)].rank))
      fail("attention: a mod loads tensor " + std::to_string(n.input) + " with indices that do not match its rank");
  }
}

/// What both fused attention kernels (forward and backward) check of a spec: head widths in [1,
/// max_width], query heads a multiple of the kv heads within the grid's y extent, dropout in [0,
/// 1), a scale that is a number, `threads` per block and the mod (check_mod).
void check_attention_spec(const cpu::AttentionSpec& s, int threads, std::int64_t max_width, const std::string& what) {
  if (s.dk < 1 || s.dv < 1 || s.dk > max_width || s.dv > max_width)
    fail(what + ": dk = " + std::to_string(s.dk) + ", dv = " + std::to_string(s.dv) + " must be in [1, " +
         std::to_string(max_width) + "]");
  if (s.hq < 1 || s.hkv < 1 || s.hq % s.hkv != 0)
    fail(what + ": hq = " + std::to_string(s.hq) + " must be a positive multiple of hkv = " + std::to_string(s.hkv));
  if (s.hq > 65535) fail(what + ": hq = " + std::to_string(s.hq) + " exceeds the grid's y extent (65535)");
  if (!(s.dropout_p >= 0.0 && s.dropout_p < 1.0))
    fail(what + ": dropout_p = " + std::to_string(s.dropout_p) + " must be in [0, 1)");
  if (!(s.effective_scale() == s.effective_scale())) fail(what + ": the scale is NaN");
  check_threads(threads, 512, what.c_str());
  check_mod(s);
}
}  // namespace

std::string decode_unsupported(const cpu::AttentionSpec& s) {
  if (s.dk < 1 || s.dv < 1 || s.dk > 4096 || s.dv > 4096) return "head widths outside [1, 4096]";
  if (s.hq < 1 || s.hkv < 1 || s.hq % s.hkv != 0) return "query heads that are not a multiple of the kv heads";
  if (s.write_weights) return "it writes the attention weights";
  if (s.dropout_p != 0.0) return "it has dropout";
  if (s.storage != DType::f32) return "q, k, v and out are not f32";
  if (!(s.effective_scale() == s.effective_scale())) return "the scale is NaN";
  const std::int64_t group = s.hq / s.hkv;
  if (group > 32) return "more than 32 query heads per kv head";
  // Per lane: the group's queries and outputs, dk / 32 and dv / 32 registers each.
  if (group * ((s.dk + 31) / 32 + (s.dv + 31) / 32) > 96) return "the group's queries and outputs exceed the registers";
  if (16 * group * cpu::decode_record_floats(s) * 4 > 48 * 1024)
    return "the warps' partial outputs exceed 48 KiB of shared memory";
  try {
    check_mod(s);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return {};
}

namespace {
/// What every tensor-core attention kernel (forward and backward) needs: bf16 storage, head widths
/// that are whole k16 slices up to 128, at most 8 warps. Empty: met.
std::string mma_limits_unmet(const cpu::AttentionSpec& s, int threads) {
  if (s.storage != DType::bf16) return "q, k, v and out are not bf16";
  if (s.dk % 16 != 0 || s.dv % 16 != 0 || s.dk < 16 || s.dv < 16 || s.dk > 128 || s.dv > 128)
    return "head widths dk = " + std::to_string(s.dk) + ", dv = " + std::to_string(s.dv) +
           " are not multiples of 16 in [16, 128]";
  if (threads % 32 != 0 || threads < 32 || threads > 256)
    return "threads = " + std::to_string(threads) + " is not a multiple of 32 in [32, 256]";
  return {};
}
}  // namespace

std::string mma_attention_unsupported(const AttentionKernel& request) {
  const cpu::AttentionSpec& s = request.spec;
  if (std::string why = mma_limits_unmet(s, request.threads); !why.empty()) return why;
  if (s.write_weights) return "it writes the attention weights";
  if (s.dropout_p != 0.0) return "it has dropout";
  if (request.block_q != 0 && request.block_q != 16 * (request.threads / 32))
    return "block_q = " + std::to_string(request.block_q) + " is not 16 rows per warp";
  if (request.block_k != 0 && (request.block_k % 16 != 0 || request.block_k > 128))
    return "block_k = " + std::to_string(request.block_k) + " is not a multiple of 16 in [16, 128]";
  return {};
}

namespace {
AttentionGeometry mma_geometry(const AttentionKernel& request) {
  if (const std::string why = mma_attention_unsupported(request); !why.empty())
    fail("attention (bf16, tensor cores): " + why);
  const cpu::AttentionSpec& s = request.spec;
  AttentionGeometry g;
  g.mma = true;
  g.threads = request.threads;
  g.warps = request.threads / 32;
  g.block_q = 16 * g.warps;
  g.block_k = request.block_k > 0 ? request.block_k : 64;
  g.rows_per_thread = 2;              // rows g and g + 8 of the warp's 16
  g.keys_per_thread = g.block_k / 4;  // 2 columns of each of the block_k / 8 key tiles
  g.wk = g.wv = 0;                    // unused
  g.col_chunks = static_cast<int>(s.dv / 8);
  g.qk_stride = static_cast<int>(s.dk) + 8;
  g.v_stride = static_cast<int>(s.dv) + 8;
  g.p_stride = 0;
  // bf16 elements → floats: every row is a multiple of 16 bytes.
  g.q_offset = 0;
  g.k_offset = g.q_offset + std::int64_t{g.block_q} * g.qk_stride / 2;
  g.v_offset = g.k_offset + std::int64_t{g.block_k} * g.qk_stride / 2;
  g.p_offset = g.v_offset + std::int64_t{g.block_k} * g.v_stride / 2;
  g.shared_floats = g.p_offset;
  return g;
}
}  // namespace

AttentionGeometry attention_geometry(const AttentionKernel& request) {
  const cpu::AttentionSpec& s = request.spec;
  check_attention_spec(s, request.threads, 4096, "attention");
  if (s.storage == DType::bf16) return mma_geometry(request);
  if (s.storage != DType::f32)
    fail("attention: q, k, v and out stored as " + std::string(dtype_name(s.storage)) + " (f32 or bf16)");

  AttentionGeometry g;
  g.threads = request.threads;
  g.warps = request.threads / 32;
  g.block_q = request.block_q > 0 ? request.block_q : 4 * g.warps * (s.dv <= 128 ? 4 : 2);
  if (g.block_q % (4 * g.warps) != 0 || g.block_q / (4 * g.warps) > 8)
    fail("attention: block_q = " + std::to_string(g.block_q) +
         " must be 4·warps·R with R in [1, 8] (warps = " + std::to_string(g.warps) + ")");
  g.rows_per_thread = g.block_q / (4 * g.warps);
  g.block_k = request.block_k > 0 ? request.block_k : (s.dk <= 64 && s.dv <= 64 ? 64 : 32);
  if (g.block_k % 8 != 0 || g.block_k > 128)
    fail("attention: block_k = " + std::to_string(g.block_k) + " must be a multiple of 8 in [8, 128]");
  g.keys_per_thread = g.block_k / 8;

  const auto dk = static_cast<int>(s.dk), dv = static_cast<int>(s.dv);
  g.wk = dk % 4 == 0 ? 4 : 1;
  g.wv = dv % 4 == 0 ? 4 : 1;
  if (g.wk == 4) {
    g.qk_stride = dk + 4;
    if ((g.qk_stride / 4) % 2 == 0) g.qk_stride += 4;  // stride/4 odd: 8 rows' float4 cover 32 banks
  } else {
    g.qk_stride = dk % 2 == 1 ? dk : dk + 1;  // odd: 8 rows' floats in distinct banks
  }
  g.col_chunks = (dv + 8 * g.wv - 1) / (8 * g.wv);
  g.v_stride = g.col_chunks * 8 * g.wv;
  g.p_stride = g.block_k + 4;  // block_k / 4 + 1 is odd
  const int accumulators = g.rows_per_thread * (g.keys_per_thread + g.col_chunks * g.wv);
  if (accumulators > kMaxAccumulators)
    fail("attention: " + std::to_string(accumulators) +
         " accumulators per thread (R·(block_k/8 + dv/8) with R = " + std::to_string(g.rows_per_thread) + ") exceed " +
         std::to_string(kMaxAccumulators) + ": use a smaller block_q or block_k");

  g.q_offset = 0;
  g.k_offset = g.q_offset + std::int64_t{g.block_q} * g.qk_stride;
  g.v_offset = g.k_offset + std::int64_t{g.block_k} * g.qk_stride;
  g.p_offset = g.v_offset + std::int64_t{g.block_k} * g.v_stride;
  g.shared_floats = g.p_offset + std::int64_t{g.block_q} * g.p_stride;
  if (g.shared_floats * 4 > max_shared_bytes(90))
    fail("attention: " + std::to_string(g.shared_floats * 4) + " bytes of shared memory per block exceed 227 KiB");
  return g;
}

std::string mma_attention_backward_unsupported(const AttentionBackwardKernel& request) {
  if (std::string why = mma_limits_unmet(request.spec, request.threads); !why.empty()) return why;
  const bool dkdv = request.part == AttentionBackwardKernel::Part::dkdv;
  const int own = dkdv ? request.block_k : request.block_q, swept = dkdv ? request.block_q : request.block_k;
  if (own != 0 && own != 16 * (request.threads / 32))
    return std::string(dkdv ? "block_k = " : "block_q = ") + std::to_string(own) + " is not 16 rows per warp";
  if (swept != 0 && (swept % 16 != 0 || swept > 128))
    return std::string(dkdv ? "block_q = " : "block_k = ") + std::to_string(swept) +
           " is not a multiple of 16 in [16, 128]";
  return {};
}

namespace {
BackwardGeometry mma_backward_geometry(const AttentionBackwardKernel& request) {
  if (const std::string why = mma_attention_backward_unsupported(request); !why.empty())
    fail("attention backward (bf16, tensor cores): " + why);
  const cpu::AttentionSpec& s = request.spec;
  BackwardGeometry g;
  g.mma = true;
  g.dkdv = request.part == AttentionBackwardKernel::Part::dkdv;
  g.threads = request.threads;
  g.warps = request.threads / 32;
  // The swept tile: dq 64 keys (32 for heads wider than 64), dkdv 32 query rows — its scores,
  // dP, f' and (dkdv) the columns' lse and D share the registers with the gradients'
  // accumulators (dkdv: dK and dV both); past that, ptxas spills.
  g.block_q = g.dkdv ? (request.block_q > 0 ? request.block_q : 32) : 16 * g.warps;
  g.block_k = g.dkdv ? 16 * g.warps : (request.block_k > 0 ? request.block_k : s.dk <= 64 && s.dv <= 64 ? 64 : 32);
  g.rows_per_thread = g.keys_per_thread = g.key_rows = g.wk = g.wv = g.tck = g.tcv = g.t_stride = 0;  // unused
  g.k_stride = static_cast<int>(s.dk) + 8;
  g.v_stride = static_cast<int>(s.dv) + 8;
  // bf16 elements → floats: every row is a multiple of 16 bytes.
  g.q_offset = 0;
  g.do_offset = g.q_offset + std::int64_t{g.block_q} * g.k_stride / 2;
  g.k_offset = g.do_offset + std::int64_t{g.block_q} * g.v_stride / 2;
  g.v_offset = g.k_offset + std::int64_t{g.block_k} * g.k_stride / 2;
  g.t0_offset = g.t1_offset = g.v_offset + std::int64_t{g.block_k} * g.v_stride / 2;
  g.shared_floats = g.t0_offset;
  return g;
}
}  // namespace

namespace {
BackwardGeometry tiles_geometry(const AttentionBackwardKernel& request);

/// dkdv with tensor gradients: the scratch region of TensorGradsPtx after the tiles.
BackwardGeometry with_grad_scratch(BackwardGeometry g, const cpu::AttentionSpec& s) {
  if (!g.dkdv || s.tensor_grads.empty()) return g;
  g.grad_entries = g.block_q * g.block_k;
  g.grad_offset = (g.shared_floats + 3) / 4 * 4;
  g.shared_floats = g.grad_offset + (3 * std::int64_t{g.grad_entries} + g.warps + 3) / 4 * 4;
  if (g.shared_floats * 4 > max_shared_bytes(90))
    fail("attention backward: " + std::to_string(g.shared_floats * 4) +
         " bytes of shared memory per block exceed 227 KiB");
  return g;
}
}  // namespace

BackwardGeometry attention_backward_geometry(const AttentionBackwardKernel& request) {
  const cpu::AttentionSpec& s = request.spec;
  if (s.storage != DType::f32 && s.storage != DType::bf16)
    fail("attention backward: q, k, v and out stored as " + std::string(dtype_name(s.storage)) + " (f32 or bf16)");
  for (const auto& t : s.tensor_grads)
    if (t.tensor < 0 || t.tensor >= static_cast<int>(s.tensors.size()) ||
        s.tensors[static_cast<std::size_t>(t.tensor)].dtype != DType::f32)
      fail("attention backward: a tensor gradient of a mod tensor that is not an f32 tensor of the mod");
  check_attention_spec(s, request.threads, 256, "attention backward");
  if (request.part == AttentionBackwardKernel::Part::dtensor) {
    if (s.tensor_grads.empty()) fail("attention backward: the dtensor part without gradients of a mod's tensors");
    AttentionBackwardKernel dkdv = request;
    dkdv.part = AttentionBackwardKernel::Part::dkdv;
    BackwardGeometry g = tiles_geometry(dkdv);
    g.dkdv = false;
    g.dtensor = true;
    g.shared_floats = 0;
    return g;
  }
  return with_grad_scratch(tiles_geometry(request), s);
}

namespace {
BackwardGeometry tiles_geometry(const AttentionBackwardKernel& request) {
  const cpu::AttentionSpec& s = request.spec;
  if (s.storage == DType::bf16) return mma_backward_geometry(request);

  BackwardGeometry g;
  g.dkdv = request.part == AttentionBackwardKernel::Part::dkdv;
  g.threads = request.threads;
  g.warps = request.threads / 32;
  const bool narrow = s.dk <= 64 && s.dv <= 64;
  const int rows = 4 * g.warps;
  g.block_q = request.block_q > 0 ? request.block_q : g.dkdv ? std::max(32, rows) : (narrow ? 16 : 8) * g.warps;
  g.block_k = request.block_k > 0 ? request.block_k : g.dkdv ? std::min(128, 8 * g.warps) : 32;
  if (g.block_q % rows != 0 || g.block_q / rows > 8)
    fail("attention backward: block_q = " + std::to_string(g.block_q) +
         " must be 4·warps·R with R in [1, 8] (warps = " + std::to_string(g.warps) + ")");
  if (g.block_k % 8 != 0 || g.block_k > 128 || (g.dkdv && g.block_k % rows != 0))
    fail("attention backward: block_k = " + std::to_string(g.block_k) + " must be a multiple of 8" +
         (g.dkdv ? " and of 4·warps = " + std::to_string(rows) : std::string()) + " in [8, 128]");
  g.rows_per_thread = g.block_q / rows;
  g.keys_per_thread = g.block_k / 8;
  g.key_rows = g.dkdv ? g.block_k / rows : 0;
  auto width = [](std::int64_t d) { return d % 4 == 0 ? 4 : 1; };
  auto chunks = [](std::int64_t d, int w) { return static_cast<int>((d + 8 * w - 1) / (8 * w)); };
  g.wk = width(s.dk);
  g.wv = width(s.dv);
  g.tck = chunks(s.dk, g.wk);
  g.tcv = chunks(s.dv, g.wv);
  g.k_stride = g.tck * 8 * g.wk + g.wk;
  g.v_stride = g.tcv * 8 * g.wv + g.wv;
  g.t_stride = (g.dkdv ? g.block_q : g.block_k) + 4;
  const int scores = 3 * g.rows_per_thread * g.keys_per_thread;  // P, dP and f'
  const int accumulators =
      scores + (g.dkdv ? g.key_rows * (g.tck * g.wk + g.tcv * g.wv) : g.rows_per_thread * g.tck * g.wk);
  if (accumulators > kMaxAccumulators)
    fail("attention backward: " + std::to_string(accumulators) +
         " registers of scores and gradients per thread exceed " + std::to_string(kMaxAccumulators) +
         ": use a smaller block_q or block_k");

  auto region = [](std::int64_t& at, std::int64_t floats) {
    const std::int64_t start = at;
    at += (floats + 3) / 4 * 4;  // every region 16-byte aligned
    return start;
  };
  std::int64_t at = 0;
  g.q_offset = region(at, std::int64_t{g.block_q} * g.k_stride);
  g.do_offset = region(at, std::int64_t{g.block_q} * g.v_stride);
  g.k_offset = region(at, std::int64_t{g.block_k} * g.k_stride);
  g.v_offset = region(at, std::int64_t{g.block_k} * g.v_stride);
  const std::int64_t t = std::int64_t{g.dkdv ? g.block_k : g.block_q} * g.t_stride;
  g.t0_offset = region(at, t);
  g.t1_offset = g.dkdv ? region(at, t) : g.t0_offset;
  g.shared_floats = at;
  if (g.shared_floats * 4 > max_shared_bytes(90))
    fail("attention backward: " + std::to_string(g.shared_floats * 4) +
         " bytes of shared memory per block exceed 227 KiB");
  return g;
}

}  // namespace

std::string attention_backward_params() {
  return "const float* q, const float* k, const float* v, const float* out, const float* d_out, const float* lse, "
         "float* delta, float* dq, float* dk, float* dv, const uint8_t* key_keep, const float* bias, "
         "const void* const* tensors, const int64_t* extents, int64_t batch, int64_t len_q, int64_t len_k, "
         "int64_t seed";
}

std::string attention_params() {
  return "const float* q, const float* k, const float* v, float* out, float* weights, const uint8_t* key_keep, "
         "const float* bias, const void* const* tensors, const int64_t* extents, int64_t batch, int64_t len_q, "
         "int64_t len_k, int64_t seed, float* lse";
}
std::string decode_attention_params() {
  return "const float* q, const float* k, const float* v, float* out, const uint8_t* key_keep, const float* bias, "
         "const void* const* tensors, const int64_t* extents, int64_t batch, int64_t len_q, int64_t len_k, float* lse, "
         "int64_t chunk_len, float* partials";
}
std::string decode_merge_params() {
  return "float* out, float* lse, const float* partials, int64_t batch, int64_t len_q, int64_t chunks";
}
std::string linear_params() {
  return "const float* x, const float* w, const float* b, float* y, int64_t m, int64_t n, int64_t k";
}
std::string layer_norm_params() {
  return "const float* x, const float* gamma, const float* beta, float* y, int64_t rows, int64_t n, float eps";
}
std::string elementwise_params() { return "const float* a, const float* b_or_null, float* y, int64_t count"; }
std::string strided_copy_params() {
  return "const float* src, float* dst, int64_t count, int64_t offset, int64_t size0, int64_t size1, "
         "int64_t size2, int64_t size3, int64_t size4, int64_t size5, int64_t stride0, int64_t stride1, "
         "int64_t stride2, int64_t stride3, int64_t stride4, int64_t stride5";
}

}  // namespace detail

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return a <= 0 ? 0 : (a + b - 1) / b; }

/// Whether `resolve` (a geometry) returns; else `*why` (if non-null) is its runtime_error's message.
template <class F>
bool resolves(const F& resolve, std::string* why) {
  try {
    resolve();
  } catch (const std::runtime_error& e) {
    if (why) *why = e.what();
    return false;
  }
  if (why) why->clear();
  return true;
}

/// The spec a GPU kernel's name hashes: without the CPU kernels' tiling fields.
cpu::AttentionSpec gpu_spec(cpu::AttentionSpec s) {
  s.vector_floats = s.query_vectors = s.key_tile = s.qk_keys = s.pv_dims = 0;
  return s;
}

std::string hex(std::uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}
}  // namespace

Dim3 attention_grid(const AttentionKernel& kernel, std::int64_t batch, std::int64_t len_q) {
  const auto g = detail::attention_geometry(kernel);
  const std::int64_t tiles = ceil_div(len_q, g.block_q);
  if (tiles == 0 || batch <= 0) return {0, 0, 0};
  return {tiles, kernel.spec.hq, batch};
}

Dim3 linear_grid(const LinearKernel& kernel, std::int64_t m, std::int64_t n) {
  const std::int64_t gx = ceil_div(m, kernel.block_m), gy = ceil_div(n, kernel.block_n);
  if (gx == 0 || gy == 0) return {0, 0, 0};
  return {gx, gy, 1};
}

Dim3 layer_norm_grid(const LayerNormKernel& kernel, std::int64_t rows) {
  const std::int64_t gx = ceil_div(rows, kernel.threads / 32);
  if (gx == 0) return {0, 0, 0};
  return {gx, 1, 1};
}

Dim3 elementwise_grid(int threads, std::int64_t count) {
  const std::int64_t gx = ceil_div(count, threads);
  if (gx == 0) return {0, 0, 0};
  return {gx < 65535 ? gx : 65535, 1, 1};
}

Dim3 attention_backward_grid(const AttentionBackwardKernel& kernel, std::int64_t batch, std::int64_t len_q,
                             std::int64_t len_k) {
  const auto g = detail::attention_backward_geometry(kernel);
  const std::int64_t tiles = g.dkdv || g.dtensor ? ceil_div(len_k, g.block_k) : ceil_div(len_q, g.block_q);
  if (tiles == 0 || batch <= 0) return {0, 0, 0};
  if (g.dtensor) return {detail::kDtensorBlocks, 1, 1};
  return {tiles, g.dkdv ? kernel.spec.hkv : kernel.spec.hq, batch};
}

int attention_backward_shared_bytes(const AttentionBackwardKernel& kernel) {
  return detail::attention_backward_geometry(kernel).shared_bytes();
}

bool attention_backward_supported(const AttentionBackwardKernel& kernel, std::string* why) {
  return resolves([&] { (void)detail::attention_backward_geometry(kernel); }, why);
}

int attention_shared_bytes(const AttentionKernel& kernel) { return detail::attention_geometry(kernel).shared_bytes(); }

bool attention_supported(const AttentionKernel& kernel, std::string* why) {
  return resolves([&] { (void)detail::attention_geometry(kernel); }, why);
}

bool decode_attention_supported(const cpu::AttentionSpec& spec, std::string* why) {
  const std::string no = detail::decode_unsupported(spec);
  if (why) *why = no;
  return no.empty();
}

DecodeSplit decode_split(const DecodeAttentionKernel& kernel, std::int64_t batch, std::int64_t len_q,
                         std::int64_t len_k) {
  // About 256 blocks (two per SM of a large GPU), chunks of >= 128 keys in multiples of 32.
  if (len_k <= 0) return {1, 0};
  const std::int64_t units = std::max<std::int64_t>(1, batch * kernel.spec.hkv * len_q);
  const std::int64_t chunks =
      std::max<std::int64_t>(1, std::min({ceil_div(256, units), std::int64_t{64}, ceil_div(len_k, 128)}));
  const std::int64_t len = ceil_div(ceil_div(len_k, chunks), 32) * 32;
  return {ceil_div(len_k, len), len};
}

Dim3 decode_grid(const DecodeAttentionKernel& kernel, std::int64_t batch, std::int64_t len_q, std::int64_t len_k) {
  const std::int64_t units = batch * kernel.spec.hkv * len_q;
  if (units <= 0) return {0, 0, 0};
  return {decode_split(kernel, batch, len_q, len_k).chunks, units, 1};
}

Dim3 decode_merge_grid(const DecodeMergeKernel& kernel, std::int64_t batch, std::int64_t len_q) {
  const std::int64_t units = batch * kernel.spec.hkv * len_q;
  if (units <= 0) return {0, 0, 0};
  return {units, 1, 1};
}

std::string kernel_name(const KernelRequest& request) {
  return std::visit(
      [](const auto& r) -> std::string {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, AttentionKernel>) {
          const cpu::AttentionSpec s = gpu_spec(r.spec);
          const auto g = detail::attention_geometry(r);
          Fnv1a h;
          h.i(static_cast<std::int64_t>(s.hash()));
          for (int v : {g.block_q, g.block_k, g.threads}) h.i(v);
          return "qkv_attention_" + hex(h.value());
        } else if constexpr (std::is_same_v<T, AttentionBackwardKernel>) {
          cpu::AttentionSpec s = gpu_spec(r.spec);
          s.write_weights = s.write_lse = false;  // the forward's outputs: not the backward's business
          const auto g = detail::attention_backward_geometry(r);
          Fnv1a h;
          h.i(static_cast<std::int64_t>(s.hash()));
          for (int v : {g.block_q, g.block_k, g.threads}) h.i(v);
          return std::string(g.dtensor ? "qkv_attention_dtensor_"
                             : g.dkdv  ? "qkv_attention_dkdv_"
                                       : "qkv_attention_dq_") +
                 hex(h.value());
        } else if constexpr (std::is_same_v<T, DecodeAttentionKernel> || std::is_same_v<T, DecodeMergeKernel>) {
          cpu::AttentionSpec s = gpu_spec(r.spec);
          s.decode_queries = s.decode_chunk = 0;
          Fnv1a h;
          h.i(static_cast<std::int64_t>(s.hash())).i(r.threads);
          return std::string(std::is_same_v<T, DecodeAttentionKernel> ? "qkv_decode_" : "qkv_decode_merge_") +
                 hex(h.value());
        } else if constexpr (std::is_same_v<T, LinearKernel>) {
          return std::string(r.storage == DType::bf16 ? "qkv_linear_bf16_" : "qkv_linear_") +
                 std::to_string(r.block_m) + "x" + std::to_string(r.block_n) + "x" + std::to_string(r.block_k);
        } else if constexpr (std::is_same_v<T, LayerNormKernel>) {
          return "qkv_layer_norm_t" + std::to_string(r.threads);
        } else if constexpr (std::is_same_v<T, ElementwiseKernel>) {
          static constexpr const char* kOps[] = {"relu", "gelu", "add", "scale"};
          static_assert(std::size(kOps) == static_cast<std::size_t>(ElementwiseOp::scale) + 1,
                        "a name for every ElementwiseOp, in the enum's order");
          std::string name = std::string("qkv_") + kOps[static_cast<int>(r.op)] + "_t" + std::to_string(r.threads);
          if (r.op == ElementwiseOp::scale) {
            std::uint32_t bits = 0;
            static_assert(sizeof bits == sizeof r.factor);
            std::memcpy(&bits, &r.factor, sizeof bits);
            name += "_" + hex(bits).substr(8);
          }
          return name;
        } else {
          return "qkv_strided_copy_r" + std::to_string(r.rank) + "_t" + std::to_string(r.threads);
        }
      },
      request);
}

}  // namespace qkv::codegen::nvptx
