// qkv/ir/rope.hpp — the rotary embedding's frequencies (Hugging Face Llama's convention), the
// reference every backend's rope follows. Plain data, no templates.
//
// For D features (D even) feature pair (i, i + D/2), i < D/2, turns by the angle
//   a = f32(position · inv_freq[i]),   inv_freq[i] = f32(theta^(−2i/D))   (then Llama 3's rescaling)
//   out[i]       = x[i]·cos a − x[i + D/2]·sin a
//   out[i + D/2] = x[i + D/2]·cos a + x[i]·sin a
// ("rotate half": HF's q·cos + rotate_half(q)·sin). Hugging Face computes inv_freq in f32; qkv
// computes it in double and rounds once (at most an ulp from HF's), and rounds the angle to f32
// as HF's f32 product does, so angles agree with HF's even at large positions.
#pragma once

#include <cmath>
#include <cstdint>

#include <qkv/ir/graph.hpp>

namespace qkv {

/// inv_freq[i] of the rotary embedding over `d` features, as a double (round it to f32 to use it).
inline double rope_inv_freq(const RopeAttrs& r, std::int64_t i, std::int64_t d) {
  double f = std::pow(r.theta, -2.0 * static_cast<double>(i) / static_cast<double>(d));
  f = static_cast<float>(f);
  if (!r.llama3) return f;
  // transformers' _compute_llama3_parameters: long wavelengths are slowed by `factor`, short
  // ones kept, the band in between interpolated.
  constexpr double kPi = 3.14159265358979323846;
  const double wavelen = 2.0 * kPi / f;
  const double low_wavelen = r.original_max_positions / r.low_freq_factor;
  const double high_wavelen = r.original_max_positions / r.high_freq_factor;
  if (wavelen < high_wavelen) return f;
  if (wavelen > low_wavelen) return f / r.factor;
  const double smooth =
      (r.original_max_positions / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  return (1.0 - smooth) * f / r.factor + smooth * f;
}

/// The angle of feature pair i at `position`, as every backend rounds it.
inline float rope_angle(const RopeAttrs& r, std::int64_t i, std::int64_t d, double position) {
  return static_cast<float>(rope_inv_freq(r, i, d)) * static_cast<float>(position);
}

}  // namespace qkv
