// AttentionSpec's derived values (no LLVM: cheap to compile).
#include <qkv/codegen/cpu/attention.hpp>

#include <cmath>
#include <cstring>

#include <qkv/ir/hash.hpp>
#include <string>
#include <utility>
#include <vector>

namespace qkv::codegen::cpu {

double AttentionSpec::effective_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(dk));
}

std::uint64_t AttentionSpec::hash() const {
  Fnv1a h;
  h.i(dk).i(dv).i(hq).i(hkv).d(scale).i(causal).i(static_cast<std::int64_t>(align)).i(key_padding).i(bias);
  h.d(dropout_p).i(write_weights);
  mix_hash(h, mod);
  h.str(axes.batch).str(axes.query).str(axes.key).i(static_cast<std::int64_t>(axes.heads.size()));
  for (const auto& x : axes.heads) h.str(x.name).i(x.stride).i(x.extent);
  h.i(static_cast<std::int64_t>(tensors.size()));
  for (const auto& t : tensors)
    h.i(static_cast<std::int64_t>(t.source)).i(static_cast<std::int64_t>(t.dtype)).i(t.rank);
  for (int t : {vector_floats, query_vectors, key_tile, qk_keys, pv_dims}) h.i(t);
  return h.value();
}

EffectiveMod effective_mod(const AttentionSpec& spec) {
  EffectiveMod out;
  out.axes = spec.axes;
  if (out.axes.heads.empty()) out.axes.heads.push_back({"h", 1, spec.hq});
  ModExpr& e = out.expr;
  const std::string& b = out.axes.batch;
  const std::string& q = out.axes.query;
  const std::string& k = out.axes.key;
  int score = -1, keep = -1;
  auto add = [&](ModNode n) { return e.add(std::move(n)); };
  auto node = [&](ModOp op, int x, int y = -1) {
    ModNode n;
    n.op = op;
    n.a = x;
    n.b = y;
    return add(n);
  };
  auto leaf = [&](ModOp op, const std::string& axis) {
    ModNode n;
    n.op = op;
    n.axis = axis;
    return add(n);
  };
  auto and_keep = [&](int x) { keep = keep < 0 ? x : node(ModOp::logical_and, keep, x); };
  auto tensor = [&](ModTensor::Source src, DType t, std::vector<int> at) {
    out.tensors.push_back({src, t, static_cast<int>(at.size())});
    ModNode n;
    n.op = ModOp::load;
    n.input = static_cast<int>(out.tensors.size()) - 1;
    n.at = std::move(at);
    return add(n);
  };
  if (spec.bias) {
    score = node(ModOp::add, leaf(ModOp::score, ""),
                 tensor(ModTensor::Source::bias, DType::f32, {leaf(ModOp::index, q), leaf(ModOp::index, k)}));
  }
  if (spec.key_padding) {
    ModNode zero;
    zero.op = ModOp::constant;
    const int flag =
        tensor(ModTensor::Source::key_keep, DType::boolean, {leaf(ModOp::index, b), leaf(ModOp::index, k)});
    and_keep(node(ModOp::ne, flag, add(zero)));
  }
  if (spec.causal) {
    // key <= query (+ S − L bottom-right), written with indices so that spec.mod may align
    // its own positions otherwise.
    int row = leaf(ModOp::index, q);
    if (spec.align == CausalAlign::bottom_right)
      row = node(ModOp::add, row, node(ModOp::sub, leaf(ModOp::length, k), leaf(ModOp::length, q)));
    and_keep(node(ModOp::le, leaf(ModOp::index, k), row));
  }
  if (!spec.mod.empty()) {
    // Append spec.mod with its node ids shifted; its score leaf reads the flags' score.
    const int tbase = static_cast<int>(out.tensors.size());
    std::vector<int> id(spec.mod.nodes.size());
    for (std::size_t i = 0; i < spec.mod.nodes.size(); ++i) {
      ModNode n = spec.mod.nodes[i];
      if (n.op == ModOp::score && score >= 0) {
        id[i] = score;
        continue;
      }
      for (int* x : {&n.a, &n.b, &n.c})
        if (*x >= 0) *x = id[static_cast<std::size_t>(*x)];
      for (int& x : n.at) x = id[static_cast<std::size_t>(x)];
      if (n.op == ModOp::load) n.input += tbase;
      id[i] = add(std::move(n));
    }
    if (spec.mod.score >= 0) score = id[static_cast<std::size_t>(spec.mod.score)];
    if (spec.mod.keep >= 0) and_keep(id[static_cast<std::size_t>(spec.mod.keep)]);
    if (!spec.mod.query.empty()) {
      e.query = spec.mod.query;
      e.key = spec.mod.key;
      e.align = spec.mod.align;
    }
    for (const auto& t : spec.tensors) out.tensors.push_back(t);
  }
  e.score = score;
  e.keep = keep;
  return out;
}

bool triangular_work(const AttentionSpec& spec) {
  if (spec.causal) return true;
  const ModExpr& e = spec.mod;
  const ModAxes& a = spec.axes;
  return e.keep >= 0 && mod_depends_on(e, e.keep, a.query) && mod_depends_on(e, e.keep, a.key);
}

double attention_flops(const AttentionSpec& spec, std::int64_t batch, std::int64_t len_q, std::int64_t len_k) {
  const double d = 0.5 * static_cast<double>(spec.dk + spec.dv);
  const double full = 4.0 * static_cast<double>(batch) * static_cast<double>(spec.hq) * static_cast<double>(len_q) *
                      static_cast<double>(len_k) * d;
  return spec.causal && len_q == len_k ? full / 2 : full;  // a mod's skipped tiles are not known here
}

}  // namespace qkv::codegen::cpu
