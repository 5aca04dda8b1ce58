// AttentionSpec's derived values (no LLVM: cheap to compile).
#include <qkv/codegen/cpu/attention.hpp>

#include <cmath>
#include <cstring>

namespace qkv::codegen::cpu {

double AttentionSpec::effective_scale() const {
  return scale != 0.0 ? scale : 1.0 / std::sqrt(static_cast<double>(dk));
}

std::uint64_t AttentionSpec::hash() const {
  std::uint64_t h = 1469598103934665603ull;  // FNV-1a, as Graph::hash
  auto mix = [&h](const void* p, std::size_t n) {
    const auto* c = static_cast<const unsigned char*>(p);
    for (std::size_t i = 0; i < n; ++i) {
      h ^= c[i];
      h *= 1099511628211ull;
    }
  };
  auto mix_i = [&](std::int64_t v) { mix(&v, sizeof v); };
  auto mix_d = [&](double v) { mix(&v, sizeof v); };
  mix_i(dk);
  mix_i(dv);
  mix_i(hq);
  mix_i(hkv);
  mix_d(scale);
  mix_i(causal);
  mix_i(static_cast<std::int64_t>(align));
  mix_i(key_padding);
  mix_i(bias);
  mix_d(dropout_p);
  mix_i(write_weights);
  for (int t : {vector_floats, query_vectors, key_tile, qk_keys, pv_dims}) mix_i(t);
  return h;
}

double attention_flops(const AttentionSpec& spec, std::int64_t batch, std::int64_t len_q, std::int64_t len_k) {
  const double d = 0.5 * static_cast<double>(spec.dk + spec.dv);
  const double full = 4.0 * static_cast<double>(batch) * static_cast<double>(spec.hq) * static_cast<double>(len_q) *
                      static_cast<double>(len_k) * d;
  return spec.causal && len_q == len_k ? full / 2 : full;
}

}  // namespace qkv::codegen::cpu
