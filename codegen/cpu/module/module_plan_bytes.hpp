// codegen/cpu/module/module_plan_bytes.hpp — block_bytes (module_builder.hpp): one formula for the
// planner's estimates and the generated code's sizes. No LLVM.
#pragma once

#include <vector>

#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/codegen/lowering/storage.hpp>

#include "cpu/kernels/decode_kernel.hpp"
#include "cpu/kernels/gemm_kernel.hpp"
#include "cpu/schedule.hpp"

namespace qkv::codegen::cpu {

template <class I, class Dim>
I block_bytes(const Graph& g, const ModulePlan& plan, const ModulePlan::Alloc& a, const Dim& dim) {
  const Node& n = g.node(a.node);
  auto numel = [&](const std::vector<Axis>& axes) {
    I count = dim(Extent::fixed(1));
    for (const auto& x : axes) count = count * dim(x.extent);
    return count;
  };
  switch (a.kind) {
    case ModulePlan::Block::value:
      return numel(n.axes) * static_cast<std::int64_t>(storage_bytes(n.dtype));
    case ModulePlan::Block::weights: {
      const AttentionCall& c = plan.attention.at(a.node);
      return dim(c.batch) * c.spec.hq * dim(c.len_q) * dim(c.len_k) * 4;
    }
    case ModulePlan::Block::lse: {
      const AttentionCall& c = plan.attention.at(a.node);
      return dim(c.batch) * c.spec.hq * dim(c.len_q) * 4;
    }
    case ModulePlan::Block::split_kv: {
      const AttentionCall& c = plan.attention.at(a.node);
      const ModulePlan::Decode& d = plan.decode.at(a.node);
      const I lq = dim(c.len_q), units = dim(c.batch) * c.spec.hkv * d.config.nblocks * lq;
      const SplitKv<I> split = split_kv(units, dim(c.len_k), d.config.key_tile, c.spec.decode_chunk);
      const I floats = split_kv_floats(units, d.config.rows, split.chunks, decode_record_floats(c.spec));
      return pick(lq <= d.max_queries, floats * 4, dim(Extent::fixed(0)));
    }
    case ModulePlan::Block::backward_delta:
    case ModulePlan::Block::backward_dq:
    case ModulePlan::Block::backward_dk:
    case ModulePlan::Block::backward_dv: {
      const ModulePlan::Backward& bw = plan.backward.at(a.node);
      const AttentionSpec& spec = bw.call.spec;
      const I batch = dim(bw.call.batch), lq = dim(bw.call.len_q), lk = dim(bw.call.len_k);
      if (a.kind == ModulePlan::Block::backward_delta) return batch * spec.hq * lq * 4;
      if (a.kind == ModulePlan::Block::backward_dk) return batch * spec.hkv * lk * spec.dk * 4;
      if (a.kind == ModulePlan::Block::backward_dv) return batch * spec.hkv * lk * spec.dv * 4;
      const BackwardChunks<I> split = backward_chunks(batch * spec.hkv, ceil_div(lk, std::int64_t{bw.config.keys}));
      return split.chunks * batch * spec.hq * round_up(lq, bw.config.rows) * bw.config.dkp * 4;
    }
    case ModulePlan::Block::backward_dtensor: {
      const ModulePlan::Backward& bw = plan.backward.at(n.inputs[0]);
      const I batch = dim(bw.call.batch), lk = dim(bw.call.len_k);
      const BackwardChunks<I> split =
          backward_chunks(batch * bw.call.spec.hkv, ceil_div(lk, std::int64_t{bw.config.keys}));
      for (const auto& t : bw.call.spec.tensor_grads)
        if (t.tensor == n.offset)
          return tensor_grad_slots(t, batch, bw.call.spec.hkv, split.chunks) * numel(n.axes) * 4;
      return dim(Extent::fixed(0));
    }
    case ModulePlan::Block::gemm_panels:
    case ModulePlan::Block::gemm_bias: {
      const auto& w = g.node(n.inputs[1]).axes;  // W [out, in]
      const GemmConfig& cfg = plan.gemm_config.at(a.node);
      if (a.kind == ModulePlan::Block::gemm_bias) return round_up(dim(w[0].extent), cfg.cols()) * 4;
      // The panels of the packed Bᵀ; none when the GEMV reads W in place (at most kGemvMaxRows rows).
      const I k = dim(w[1].extent);
      const I rows = numel(g.node(n.inputs[0]).axes) / imax(k, 1);
      // A quantized W's linear: its rounded rows, then the panels (module_quantized.cpp).
      const std::int64_t group = cfg.quant_group > 0 ? cfg.quant_group : cfg.round_group;
      const I rounded = group > 0 ? round_up(rounded_activation_bytes(group, rows, k), 64) : dim(Extent::fixed(0));
      return rounded + pick(rows <= (cfg.quant_group > 0 ? kQuantGemvMaxRows : kGemvMaxRows), dim(Extent::fixed(0)),
                            gemm_panel_bytes(cfg, dim(w[0].extent), k));
    }
  }
  return dim(Extent::fixed(0));
}

/// The arena: slot k at offsets[k] (64-byte aligned), as large as its largest block.
template <class I>
struct ArenaLayout {
  std::vector<I> offsets;
  I total;
};
template <class I, class Dim>
ArenaLayout<I> arena_layout(const Graph& g, const ModulePlan& plan, const Dim& dim) {
  const I zero = dim(Extent::fixed(0));
  std::vector<I> size(static_cast<std::size_t>(plan.slots), zero);
  for (const auto& a : plan.allocs) {
    auto& s = size[static_cast<std::size_t>(a.slot)];
    s = imax(s, block_bytes<I>(g, plan, a, dim));
  }
  ArenaLayout<I> out{{}, zero};
  for (const I& s : size) {
    out.offsets.push_back(out.total);
    out.total = out.total + round_up(s, 64);
  }
  return out;
}

}  // namespace qkv::codegen::cpu
