// AttentionSpec's derived values (no LLVM: cheap to compile).
#include <qkv/codegen/cpu/attention.hpp>

#include <cmath>
#include <cstring>

#include <qkv/ir/hash.hpp>

namespace qkv::codegen::cpu {

double AttentionSpec::effective_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(dk));
}

std::uint64_t AttentionSpec::hash() const {
  Fnv1a h;
  h.i(dk).i(dv).i(hq).i(hkv).d(scale).i(causal).i(static_cast<std::int64_t>(align)).i(key_padding).i(bias);
  h.d(dropout_p).i(write_weights);
  for (int t : {vector_floats, query_vectors, key_tile, qk_keys, pv_dims}) h.i(t);
  return h.value();
}

double attention_flops(const AttentionSpec& spec, std::int64_t batch, std::int64_t len_q, std::int64_t len_k) {
  const double d = 0.5 * static_cast<double>(spec.dk + spec.dv);
  const double full = 4.0 * static_cast<double>(batch) * static_cast<double>(spec.hq) * static_cast<double>(len_q) *
                      static_cast<double>(len_k) * d;
  return spec.causal && len_q == len_k ? full / 2 : full;
}

}  // namespace qkv::codegen::cpu
