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
  h.d(dropout_p).i(write_weights).i(write_lse).i(static_cast<std::int64_t>(storage));
  mix_hash(h, mod);
  h.str(axes.batch).str(axes.query).str(axes.key).i(static_cast<std::int64_t>(axes.heads.size()));
  for (const auto& x : axes.heads) h.str(x.name).i(x.stride).i(x.extent);
  h.i(static_cast<std::int64_t>(tensors.size()));
  for (const auto& t : tensors)
    h.i(static_cast<std::int64_t>(t.source)).i(static_cast<std::int64_t>(t.dtype)).i(t.rank);
  h.i(static_cast<std::int64_t>(tensor_grads.size()));
  for (const auto& t : tensor_grads) h.i(t.tensor).i(t.per_batch).i(t.per_kv_head).i(t.per_chunk);
  for (int t : {vector_floats, query_vectors, key_tile, qk_keys, pv_dims, decode_queries, decode_chunk}) h.i(t);
  return h.value();
}

EffectiveMod effective_mod(const AttentionSpec& spec) {
  EffectiveMod out;
  out.axes = spec.axes;
  if (out.axes.heads.empty()) out.axes.heads.push_back({"h", 1, spec.hq});
  const ModAxes& a = out.axes;
  ModBuilder m;
  auto tensor = [&](ModTensor::Source src, DType t) {
    out.tensors.push_back({src, t, 2});
    return static_cast<int>(out.tensors.size()) - 1;
  };
  if (spec.bias) m.add_to_score(m.load_by_axes(tensor(ModTensor::Source::bias, DType::f32), {a.query, a.key}));
  if (spec.key_padding)
    m.keep_nonzero(m.load_by_axes(tensor(ModTensor::Source::key_keep, DType::boolean), {a.batch, a.key}));
  if (spec.causal) m.keep_causal(a.query, a.key, spec.align);
  if (!spec.mod.empty()) {
    const int base = static_cast<int>(out.tensors.size());
    m.splice(spec.mod, [base](int input) { return input + base; });
    out.tensors.insert(out.tensors.end(), spec.tensors.begin(), spec.tensors.end());
    if (!spec.mod.query.empty()) {
      m.expr().query = spec.mod.query;
      m.expr().key = spec.mod.key;
      m.expr().align = spec.mod.align;
    }
  }
  out.expr = m.finish();
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
