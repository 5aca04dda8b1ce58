// codegen/cpu/schedule.hpp — how the CPU backend splits its parallel work into tasks: one
// policy for the C++ drivers (run_linear, run_attention) and the code generated for whole graphs,
// written once as templates over the integer type (std::int64_t, or ir::Int in generated code).
// No LLVM here. The split never depends on the thread count, so results are bitwise identical
// for any number of threads.
#pragma once

#include <algorithm>
#include <cstdint>

namespace qkv::codegen::cpu {

// The integer vocabulary the policies use; ir::Int has the same functions (found by ADL).
inline std::int64_t imin(std::int64_t a, std::int64_t b) { return std::min(a, b); }
inline std::int64_t imax(std::int64_t a, std::int64_t b) { return std::max(a, b); }
inline std::int64_t pick(bool c, std::int64_t a, std::int64_t b) { return c ? a : b; }
template <class I, class J>
auto ceil_div(I a, J b) {
  return (a + b - 1) / b;
}
template <class I>
I round_up(I a, std::int64_t to) {
  return ceil_div(a, to) * to;
}

/// Tasks a parallel loop aims for: enough that up to a few threads finish together, few enough
/// that each reuses what it packed.
inline constexpr std::int64_t kTaskTarget = 32;
/// Below about this many flops a loop runs on the calling thread (starting threads costs more).
inline constexpr std::int64_t kParallelMinFlops = 1'000'000;

/// The GEMM's tasks: blocks of `mc` rows (a multiple of MR, at most 8·MR) × blocks of
/// `panels_per` panels of NR columns; task t covers row block t / nblocks, column block
/// t % nblocks. `tall` (a kernel that reads A in place and runs its row blocks under each panel,
/// gemm_kernel.hpp's a_in_place): row blocks as tall as 8·MR allows, split evenly, so that each
/// panel it loads serves many rows; else about kTaskTarget row blocks (each packs its rows once
/// for all its panels), but all of a call of few rows (up to 4·MR) in one, so that the tasks
/// split W's panels and each streams its share once (a batched decode step).
template <class I>
struct GemmBlocks {
  I mc, mblocks, panels_per, nblocks;
  I tasks() const { return mblocks * nblocks; }
};
template <class I>
GemmBlocks<I> gemm_blocks(I m, I n, std::int64_t mr, std::int64_t nr, bool tall) {
  const I panels = ceil_div(n, nr);
  const I mc = tall ? round_up(ceil_div(m, ceil_div(m, 8 * mr)), mr)
                    : imin(imax(round_up(ceil_div(m, kTaskTarget), mr), imin(round_up(m, mr), 4 * mr)), 8 * mr);
  const I mblocks = ceil_div(m, mc);
  const I wide = imax(imin(panels, std::max<std::int64_t>(1, 512 / nr)), 1);
  // Too few tasks with wide column blocks: narrower ones, so that there are about kTaskTarget.
  const I narrow = imax(ceil_div(panels, imax(imin(panels, ceil_div(kTaskTarget, imax(mblocks, 1))), 1)), 1);
  const I per = pick(mblocks * ceil_div(panels, wide) < kTaskTarget, narrow, wide);
  return {mc, mblocks, per, ceil_div(panels, per)};
}

/// A range [0, total) in blocks of at least `grain` units, a multiple of `align`, about
/// kTaskTarget blocks in all.
template <class I>
struct Ranges {
  I block, tasks;
};
template <class I>
Ranges<I> ranges(I total, std::int64_t grain, std::int64_t align) {
  const I block = round_up(imax(ceil_div(total, kTaskTarget), grain), align);
  return {block, ceil_div(total, block)};
}

/// One task of the fused attention: the query rows [row_block · rows, …) of (batch, head).
template <class I>
struct AttentionTask {
  I batch, head, row_block;
};
/// Task t of the fused attention over `blocks` blocks of query rows, hq query heads on hkv K/V
/// heads. Tasks go K/V head by K/V head (batch outermost): within one, block by block, and the
/// query heads that read it innermost — so the threads, taking tasks in order, all stream the
/// same K and V and keep it in the shared cache. (Blocks outermost with every head inside made
/// each task read another head's K and V: from H·S·(dk + dv) floats, past the L3 cache at
/// S = 8 192 and H = 8, 5–7 % slower there.) Causal: within a K/V head the blocks with the most
/// visible keys first, so that the cheap ones at the top finish the loop together.
template <class I>
AttentionTask<I> attention_task(I t, I blocks, std::int64_t hq, std::int64_t hkv, bool causal) {
  const std::int64_t group = hq / hkv;
  const I per_kv = blocks * group;
  const I kv = t / per_kv, within = t % per_kv;  // kv = batch · hkv + K/V head
  const I blk = within / group;
  return {kv / hkv, kv % hkv * group + within % group, causal ? blocks - 1 - blk : blk};
}

/// The fused attention backward's split of the keys: a task (batch, kv head, chunk) owns the dK
/// and dV rows of `chunk_blocks` key blocks and writes its own dQ partial sums, which are added in
/// chunk order afterwards. From the shape alone (never the thread count), so the sums are the
/// same for any number of threads: about kTaskTarget tasks over `units` = batch · kv heads, at
/// most one chunk per key block. No key blocks: no chunks.
template <class I>
struct BackwardChunks {
  I chunk_blocks, chunks;
};
template <class I>
BackwardChunks<I> backward_chunks(I units, I key_blocks) {
  const I want = imin(imax(ceil_div(kTaskTarget, imax(units, 1)), 1), imax(key_blocks, 1));
  const I per = ceil_div(imax(key_blocks, 1), want);
  return {per, ceil_div(key_blocks, per)};
}

/// The split-KV decode kernel (cpu/kernels/decode_kernel.hpp) runs calls with at most this many
/// query rows unless the spec says otherwise.
inline constexpr std::int64_t kDecodeQueries = 4;
/// Its chunks hold at least this many keys (a chunk's merge record costs about dv floats), and a
/// unit has at most kDecodeMaxChunks of them.
inline constexpr std::int64_t kDecodeMinChunk = 256;
inline constexpr std::int64_t kDecodeMaxChunks = 64;

/// How the decode kernel splits S keys for `units` independent units of work (batch, kv head,
/// head block, query row): chunks of chunk_len keys (a multiple of `tile`), enough that there
/// are about kTaskTarget tasks, none shorter than kDecodeMinChunk unless S is; `forced` > 0 sets
/// the chunk length (tests), bounded so there are at most kDecodeMaxChunks. S = 0: one chunk.
template <class I>
struct SplitKv {
  I chunks, chunk_len;
};
template <class I>
SplitKv<I> split_kv(I units, I len_k, std::int64_t tile, std::int64_t forced) {
  const I most = ceil_div(imax(len_k, 1), forced > 0 ? forced : kDecodeMinChunk);
  const I want = imin(imax(ceil_div(kTaskTarget, imax(units, 1)), 1), kDecodeMaxChunks);
  const I chunks = forced > 0 ? imin(most, kDecodeMaxChunks) : imin(want, most);
  const I len = round_up(ceil_div(imax(len_k, 1), chunks), forced > 0 ? 1 : tile);
  return {ceil_div(imax(len_k, 1), len), len};
}

/// The floats of the decode kernel's workspace: a record per (unit, row, chunk), none when each
/// unit is one chunk (its task writes the output itself).
template <class I>
I split_kv_floats(I units, std::int64_t rows, I chunks, std::int64_t record) {
  return pick(chunks > 1, units * rows * chunks * record, units * 0);
}

}  // namespace qkv::codegen::cpu
