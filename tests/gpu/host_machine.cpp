#include "host_machine.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <variant>
#include <vector>

#include <qkv/codegen/cpu/run_attention.hpp>
#include <qkv/codegen/cpu/run_attention_backward.hpp>
#include <qkv/runtime/io/array.hpp>

namespace qkv::test {

using codegen::cuda::Arg;
using codegen::cuda::ParamValue;
namespace nvptx = codegen::nvptx;

std::uint64_t HostMachine::alloc(std::size_t bytes) {
  if (bytes == 0) return 0;
  Block b;
  b.data = std::make_unique<std::byte[]>(bytes);
  std::memset(b.data.get(), 0xFF, bytes);
  b.bytes = bytes;
  const auto address = reinterpret_cast<std::uint64_t>(b.data.get());
  blocks_[address] = std::move(b);
  live_bytes += bytes;
  peak_bytes = std::max(peak_bytes, live_bytes);
  return address;
}

void HostMachine::free(std::uint64_t address) {
  if (address == 0) return;
  auto it = blocks_.find(address);
  if (it == blocks_.end() || !it->second.live) {
    errors.push_back("free of memory that is not a live allocation");
    return;
  }
  it->second.live = false;
  std::memset(it->second.data.get(), 0xFF, it->second.bytes);
  live_bytes -= it->second.bytes;
}

void HostMachine::check(std::uint64_t address, std::size_t bytes, const std::string& what) {
  if (bytes == 0) return;
  auto it = blocks_.upper_bound(address);
  if (it == blocks_.begin()) {
    errors.push_back(what + ": address outside every allocation");
    return;
  }
  --it;
  if (!it->second.live) errors.push_back(what + ": memory already freed");
  if (address + bytes > it->first + it->second.bytes) errors.push_back(what + ": past the end of its allocation");
}

void HostMachine::upload(std::uint64_t address, const void* src, std::size_t n) {
  check(address, n, "upload");
  if (n > 0) std::memcpy(reinterpret_cast<void*>(address), src, n);
}

void HostMachine::download(void* dst, std::uint64_t address, std::size_t n) {
  check(address, n, "download");
  if (n > 0) std::memcpy(dst, reinterpret_cast<const void*>(address), n);
}

namespace {
template <class T>
T* ptr(const ParamValue& v) {
  return reinterpret_cast<T*>(v.address);
}
}  // namespace

/// The mod's tensor table of an attention launch (parameters `at` and `at + 1`): one device
/// address per captured tensor, their extents, and each tensor's memory as large as its extents
/// say — checked; null where the mod loads no tensor.
std::pair<const void* const*, const std::int64_t*> HostMachine::mod_tables(const codegen::cpu::AttentionSpec& s,
                                                                           const std::vector<ParamValue>& p,
                                                                           std::size_t at, const std::string& kind) {
  std::size_t captured = 0, ranks = 0;
  for (const auto& t : s.tensors)
    if (t.source == codegen::cpu::ModTensor::Source::captured) {
      ++captured;
      ranks += static_cast<std::size_t>(t.rank);
    }
  if (!captured) {
    if (p.at(at).address != 0 || p.at(at + 1).address != 0)
      errors.push_back(kind + ": a tensor table passed but the mod loads no tensor");
    return {nullptr, nullptr};
  }
  const void* const* tensors = ptr<const void* const>(p.at(at));
  const std::int64_t* extents = ptr<const std::int64_t>(p.at(at + 1));
  check(p.at(at).address, captured * sizeof(std::uint64_t), kind + " tensors");
  if (ranks) check(p.at(at + 1).address, ranks * sizeof(std::int64_t), kind + " extents");
  std::size_t k = 0, e = 0;
  for (const auto& t : s.tensors) {
    if (t.source != codegen::cpu::ModTensor::Source::captured) continue;
    std::size_t count = 1;
    for (int d = 0; d < t.rank; ++d) count *= static_cast<std::size_t>(extents[e++]);
    check(reinterpret_cast<std::uint64_t>(tensors[k++]), count * dtype_size(t.dtype), kind + " mod tensor");
  }
  return {tensors, extents};
}

void HostMachine::attention_backward(const nvptx::AttentionBackwardKernel& r, const std::vector<ParamValue>& p) {
  // The CPU backward computes every gradient; a launch keeps what its part writes. The dq part
  // also writes D = rowsum(dO ∘ O), which the dkdv part must find written (launch order). bf16
  // storage (the tensor-core kernels): q, k, v, out, dO and the gradients are bf16 bits; the
  // CPU's f32 backward runs on their values and each gradient is rounded once.
  //
  // The gradients of the mod's tensors: dkdv leaves each in slot 0 of its partial sums (the
  // table's addresses after the extents) and zeros in the other slots; dtensor sums the slots in
  // order into slot 0, as the kernels' contract says.
  codegen::cpu::AttentionSpec s = r.spec;
  const bool half = s.storage == DType::bf16;
  s.storage = DType::f32;
  using Part = nvptx::AttentionBackwardKernel::Part;
  const bool dkdv = r.part == Part::dkdv;
  const char* kind = dkdv                 ? "attention_backward_dkdv"
                     : r.part == Part::dq ? "attention_backward_dq"
                                          : "attention_backward_dtensor";
  const std::int64_t B = p.at(14).i64, L = p.at(15).i64, S = p.at(16).i64;
  if (!(l_grid_ == nvptx::attention_backward_grid(r, B, L, S)))
    errors.push_back(std::string(kind) + ": grid off the header's rule");
  ++launches[kind];
  if (std::string no; !nvptx::attention_backward_supported(r, &no)) errors.push_back(std::string(kind) + ": " + no);
  // Each tensor gradient's partial sums: [slots = the dkdv grid's blocks][numel].
  std::vector<float*> partials;
  std::vector<std::size_t> numel;
  std::size_t slots = 0;
  if (!s.tensor_grads.empty()) {
    auto blocks = r;
    blocks.part = Part::dkdv;
    const nvptx::Dim3 grid = nvptx::attention_backward_grid(blocks, B, L, S);
    slots = static_cast<std::size_t>(grid.x * grid.y * grid.z);
    const auto [tensors, extents] = mod_tables(s, p, 12, kind);
    if (!extents) return;
    std::vector<std::size_t> count(s.tensors.size(), 1);
    std::size_t e = 0;
    for (std::size_t t = 0; t < s.tensors.size(); ++t)
      for (int d = 0; d < s.tensors[t].rank; ++d) count[t] *= static_cast<std::size_t>(extents[e++]);
    check(reinterpret_cast<std::uint64_t>(extents + e), s.tensor_grads.size() * 8, std::string(kind) + " partials");
    if (!errors.empty()) return;
    for (std::size_t t = 0; t < s.tensor_grads.size(); ++t) {
      partials.push_back(reinterpret_cast<float*>(static_cast<std::uintptr_t>(extents[e + t])));
      numel.push_back(count[static_cast<std::size_t>(s.tensor_grads[t].tensor)]);
      check(reinterpret_cast<std::uint64_t>(partials.back()), slots * numel.back() * 4,
            std::string(kind) + " partial sums");
    }
  }
  if (r.part == Part::dtensor) {
    if (!errors.empty()) return;
    for (std::size_t t = 0; t < partials.size(); ++t)
      for (std::size_t i = 0; i < numel[t]; ++i) {
        float sum = 0.0f;
        for (std::size_t slot = 0; slot < slots; ++slot) sum += partials[t][slot * numel[t] + i];
        partials[t][i] = sum;
      }
    return;
  }
  const auto f = sizeof(float), e = half ? std::size_t{2} : f;
  const auto q_n = static_cast<std::size_t>(B * s.hq * L * s.dk), k_n = static_cast<std::size_t>(B * s.hkv * S * s.dk),
             v_n = static_cast<std::size_t>(B * s.hkv * S * s.dv), o_n = static_cast<std::size_t>(B * s.hq * L * s.dv),
             rows = static_cast<std::size_t>(B * s.hq * L);
  auto need = [&](std::size_t i, std::size_t bytes, const char* what) {
    check(p.at(i).address, bytes, std::string(kind) + " " + what);
  };
  need(0, q_n * e, "q");
  need(1, k_n * e, "k");
  need(2, v_n * e, "v");
  need(4, o_n * e, "d_out");
  need(5, rows * f, "lse");
  need(6, rows * f, "delta");
  if (dkdv) {
    need(8, k_n * e, "dk");
    need(9, v_n * e, "dv");
  } else {
    need(3, o_n * e, "out");
    need(7, q_n * e, "dq");
  }
  if (s.key_padding) need(10, static_cast<std::size_t>(B * S), "key_keep");
  if (s.bias) need(11, static_cast<std::size_t>(L * S) * f, "bias");
  const auto [tensors, extents] = mod_tables(s, p, 12, kind);
  if (!errors.empty()) return;

  // The inputs as f32 values (bf16: decoded copies).
  std::vector<std::vector<float>> decoded;
  decoded.reserve(5);
  auto values = [&](std::size_t i, std::size_t n) -> const float* {
    if (!half) return ptr<const float>(p[i]);
    const auto* bits = ptr<const std::uint16_t>(p[i]);
    std::vector<float>& x = decoded.emplace_back(n);
    for (std::size_t k = 0; k < n; ++k) x[k] = bf16_to_f32(bits[k]);
    return x.data();
  };
  const float* d_out = values(4, o_n);
  const float* delta = ptr<const float>(p[6]);
  std::vector<float> out(o_n, 0.0f);  // dkdv: an output whose D is delta (O ∝ dO per row)
  if (dkdv) {
    for (std::size_t row = 0; row < rows; ++row) {
      if (std::isnan(delta[row])) {
        errors.push_back(std::string(kind) + ": delta not written (the dq part runs first)");
        return;
      }
      double norm = 0;
      for (std::int64_t c = 0; c < s.dv; ++c)
        norm += static_cast<double>(d_out[row * s.dv + c]) * d_out[row * s.dv + c];
      if (norm > 0)
        for (std::int64_t c = 0; c < s.dv; ++c)
          out[row * s.dv + c] = static_cast<float>(delta[row] / norm * d_out[row * s.dv + c]);
      else if (delta[row] != 0.0f)
        errors.push_back(std::string(kind) + ": delta off rowsum(dO ∘ O)");
    }
  }
  const float* o = dkdv ? out.data() : values(3, o_n);
  std::vector<float> dq(q_n), dk(k_n), dv(v_n);
  std::vector<std::vector<float>> dtensors;
  std::vector<float*> dtensor_ptrs;
  dtensors.reserve(numel.size());
  for (std::size_t n : numel) dtensor_ptrs.push_back(dtensors.emplace_back(n).data());
  codegen::cpu::AttentionBackwardArgs a;
  a.dtensors = dtensor_ptrs.data();
  a.forward.q = values(0, q_n);
  a.forward.k = values(1, k_n);
  a.forward.v = values(2, v_n);
  a.forward.out = const_cast<float*>(o);
  a.forward.key_keep = s.key_padding ? ptr<const std::uint8_t>(p[10]) : nullptr;
  a.forward.bias = s.bias ? ptr<const float>(p[11]) : nullptr;
  a.forward.tensors = tensors;
  a.forward.extents = extents;
  a.forward.batch = B;
  a.forward.len_q = L;
  a.forward.len_k = S;
  a.forward.seed = static_cast<std::uint64_t>(p.at(17).i64);
  a.forward.lse = ptr<float>(p[5]);
  a.d_out = d_out;
  a.dq = dq.data();
  a.dk = dk.data();
  a.dv = dv.data();
  codegen::cpu::run_attention_backward(s, a, 1);
  auto write = [&](std::size_t i, const std::vector<float>& x) {
    for (std::size_t k = 0; k < x.size(); ++k)
      if (half)
        ptr<std::uint16_t>(p[i])[k] = f32_to_bf16(x[k]);
      else
        ptr<float>(p[i])[k] = x[k];
  };
  if (dkdv) {
    write(8, dk);
    write(9, dv);
    for (std::size_t t = 0; t < partials.size(); ++t) {
      std::fill(partials[t], partials[t] + slots * numel[t], 0.0f);
      std::copy(dtensors[t].begin(), dtensors[t].end(), partials[t]);
    }
  } else {
    write(7, dq);
    float* d = ptr<float>(p[6]);  // D of each row, as the kernel writes it
    for (std::size_t row = 0; row < rows; ++row) {
      float sum = 0.0f;
      for (std::int64_t c = 0; c < s.dv; ++c) sum += o[row * s.dv + c] * d_out[row * s.dv + c];
      d[row] = sum;
    }
  }
}

void HostMachine::launch(const codegen::cuda::Launch& l, const std::vector<ParamValue>& p) {
  auto expect_grid = [&](const nvptx::Dim3& want, const char* kind) {
    if (!(l.grid == want)) errors.push_back(std::string(kind) + ": grid off the header's rule");
    ++launches[kind];
  };
  auto need = [&](std::size_t i, std::size_t bytes, const char* what) { check(p.at(i).address, bytes, what); };
  std::visit(
      [&](const auto& r) {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, nvptx::AttentionKernel>) {
          const auto& s = r.spec;
          const std::int64_t B = p.at(9).i64, L = p.at(10).i64, S = p.at(11).i64;
          expect_grid(nvptx::attention_grid(r, B, L), "attention");
          const auto f = sizeof(float);
          // q, k, v, out: bf16 bits with bf16 storage (the tensor-core kernel), else f32.
          const std::size_t elem = s.storage == DType::bf16 ? 2 : f;
          if (s.storage == DType::bf16) ++launches["attention_bf16"];
          if (std::string no; !nvptx::attention_supported(r, &no)) errors.push_back("attention: " + no);
          need(0, static_cast<std::size_t>(B * s.hq * L * s.dk) * elem, "attention q");
          need(1, static_cast<std::size_t>(B * s.hkv * S * s.dk) * elem, "attention k");
          need(2, static_cast<std::size_t>(B * s.hkv * S * s.dv) * elem, "attention v");
          need(3, static_cast<std::size_t>(B * s.hq * L * s.dv) * elem, "attention out");
          if (s.write_weights) need(4, static_cast<std::size_t>(B * s.hq * L * S) * f, "attention weights");
          if (s.key_padding) need(5, static_cast<std::size_t>(B * S), "attention key_keep");
          if (s.bias) need(6, static_cast<std::size_t>(L * S) * f, "attention bias");
          if (p[4].address != 0 && !s.write_weights) errors.push_back("attention: weights passed but not asked for");
          if (s.write_lse) need(13, static_cast<std::size_t>(B * s.hq * L) * f, "attention lse");
          if (p.at(13).address != 0 && !s.write_lse) errors.push_back("attention: lse passed but not asked for");
          const auto [tensors, extents] = mod_tables(s, p, 7, "attention");
          codegen::cpu::AttentionArgs a;
          a.q = ptr<const float>(p[0]);
          a.k = ptr<const float>(p[1]);
          a.v = ptr<const float>(p[2]);
          a.out = ptr<float>(p[3]);
          a.weights = s.write_weights ? ptr<float>(p[4]) : nullptr;
          a.key_keep = s.key_padding ? ptr<const std::uint8_t>(p[5]) : nullptr;
          a.bias = s.bias ? ptr<const float>(p[6]) : nullptr;
          a.tensors = tensors;
          a.extents = extents;
          a.batch = B;
          a.len_q = L;
          a.len_k = S;
          a.seed = static_cast<std::uint64_t>(p.at(12).i64);
          a.lse = s.write_lse ? ptr<float>(p[13]) : nullptr;
          codegen::cpu::run_attention(s, a, 1);
        } else if constexpr (std::is_same_v<T, nvptx::DecodeAttentionKernel>) {
          // The rows computed at once by the CPU kernel; with a workspace, chunk 0's records say
          // (m = lse·log2 e, l = 1, O = the row) and the others are empty, which the merge turns
          // back into the row and its log-sum-exp.
          const auto& s = r.spec;
          const std::int64_t B = p.at(8).i64, L = p.at(9).i64, S = p.at(10).i64;
          expect_grid(nvptx::decode_grid(r, B, L, S), "decode attention");
          const auto split = nvptx::decode_split(r, B, L, S);
          if (p.at(12).i64 != split.chunk_len) errors.push_back("decode attention: chunk_len off decode_split");
          const auto f = sizeof(float);
          const std::size_t rows = static_cast<std::size_t>(B * s.hq * L);
          need(0, rows * static_cast<std::size_t>(s.dk) * f, "decode q");
          need(1, static_cast<std::size_t>(B * s.hkv * S * s.dk) * f, "decode k");
          need(2, static_cast<std::size_t>(B * s.hkv * S * s.dv) * f, "decode v");
          need(3, rows * static_cast<std::size_t>(s.dv) * f, "decode out");
          if (s.write_lse) need(11, rows * f, "decode lse");
          const bool split_keys = split.chunks > 1;
          if ((p.at(13).address != 0) != split_keys) errors.push_back("decode attention: a workspace iff chunks > 1");
          const auto rec = static_cast<std::size_t>(codegen::cpu::decode_record_floats(s));
          if (split_keys) need(13, rows * static_cast<std::size_t>(split.chunks) * rec * f, "decode partials");
          std::vector<float> lse(rows);
          codegen::cpu::AttentionArgs a;
          a.q = ptr<const float>(p[0]);
          a.k = ptr<const float>(p[1]);
          a.v = ptr<const float>(p[2]);
          a.out = ptr<float>(p[3]);
          a.tensors = p.at(6).address ? ptr<const void* const>(p[6]) : nullptr;
          a.extents = p.at(7).address ? ptr<const std::int64_t>(p[7]) : nullptr;
          a.batch = B;
          a.len_q = L;
          a.len_k = S;
          codegen::cpu::AttentionSpec with_lse = s;
          with_lse.write_lse = true;
          a.lse = lse.data();
          codegen::cpu::run_attention(with_lse, a, 1);
          if (s.write_lse) std::memcpy(ptr<float>(p[11]), lse.data(), rows * f);
          if (split_keys) {
            // Records ((unit·G + r)·chunks + c), unit = (b·Hkv + kvh)·L + i, head h = kvh·G + r.
            const std::int64_t G = s.hq / s.hkv;
            float* w = ptr<float>(p[13]);
            for (std::int64_t b = 0; b < B; ++b)
              for (std::int64_t h = 0; h < s.hq; ++h)
                for (std::int64_t i = 0; i < L; ++i) {
                  const std::int64_t unit = (b * s.hkv + h / G) * L + i;
                  const std::size_t row = static_cast<std::size_t>((b * s.hq + h) * L + i);
                  for (std::int64_t c = 0; c < split.chunks; ++c) {
                    float* x = w + static_cast<std::size_t>((unit * G + h % G) * split.chunks + c) * rec;
                    const bool first = c == 0 && std::isfinite(lse[row]);
                    x[0] = first ? static_cast<float>(lse[row] * 1.4426950408889634) : -INFINITY;
                    x[1] = first ? 1.0f : 0.0f;
                    for (std::size_t d = 0; d < static_cast<std::size_t>(s.dv); ++d)
                      x[2 + d] = first ? static_cast<float*>(a.out)[row * static_cast<std::size_t>(s.dv) + d] : 0.0f;
                  }
                }
            std::fill(static_cast<float*>(a.out), static_cast<float*>(a.out) + rows * static_cast<std::size_t>(s.dv),
                      NAN);  // the merge writes it
          }
        } else if constexpr (std::is_same_v<T, nvptx::DecodeMergeKernel>) {
          const auto& s = r.spec;
          const std::int64_t B = p.at(3).i64, L = p.at(4).i64, chunks = p.at(5).i64;
          expect_grid(nvptx::decode_merge_grid(r, B, L), "decode merge");
          const std::size_t rows = static_cast<std::size_t>(B * s.hq * L),
                            rec = static_cast<std::size_t>(codegen::cpu::decode_record_floats(s));
          need(0, rows * static_cast<std::size_t>(s.dv) * 4, "merge out");
          if (s.write_lse) need(1, rows * 4, "merge lse");
          need(2, rows * static_cast<std::size_t>(chunks) * rec * 4, "merge partials");
          const std::int64_t G = s.hq / s.hkv;
          const float* w = ptr<const float>(p[2]);
          for (std::int64_t b = 0; b < B; ++b)
            for (std::int64_t h = 0; h < s.hq; ++h)
              for (std::int64_t i = 0; i < L; ++i) {
                const std::int64_t unit = (b * s.hkv + h / G) * L + i;
                const std::size_t row = static_cast<std::size_t>((b * s.hq + h) * L + i);
                const float* base = w + static_cast<std::size_t>((unit * G + h % G) * chunks) * rec;
                float big = -INFINITY;
                for (std::int64_t c = 0; c < chunks; ++c) big = std::max(big, base[static_cast<std::size_t>(c) * rec]);
                const float m_use = std::isinf(big) ? 0.0f : big;
                double sum = 0;
                std::vector<double> o(static_cast<std::size_t>(s.dv), 0.0);
                for (std::int64_t c = 0; c < chunks; ++c) {
                  const float* x = base + static_cast<std::size_t>(c) * rec;
                  const double wt = std::exp2(static_cast<double>(x[0]) - m_use);
                  sum += wt * x[1];
                  for (std::size_t d = 0; d < o.size(); ++d) o[d] += wt * x[2 + d];
                }
                for (std::size_t d = 0; d < o.size(); ++d)
                  ptr<float>(p[0])[row * o.size() + d] = sum > 0 ? static_cast<float>(o[d] / sum) : 0.0f;
                if (s.write_lse)
                  ptr<float>(p[1])[row] =
                      sum > 0 ? static_cast<float>((m_use + std::log2(sum)) * 0.6931471805599453) : -INFINITY;
              }
        } else if constexpr (std::is_same_v<T, nvptx::LinearKernel>) {
          const std::int64_t m = p.at(4).i64, n = p.at(5).i64, k = p.at(6).i64;
          // bf16 storage (the tensor-core kernel): x, w, b and y are bf16 bits; the sums are
          // exact here (fp64 of the bf16 values), y rounded once to bf16.
          const bool half = r.storage == DType::bf16;
          const std::size_t e = half ? 2 : 4;
          expect_grid(nvptx::linear_grid(r, m, n), half ? "linear_bf16" : "linear");
          need(0, static_cast<std::size_t>(m * k) * e, "linear x");
          need(1, static_cast<std::size_t>(n * k) * e, "linear w");
          if (p[2].address) need(2, static_cast<std::size_t>(n) * e, "linear b");
          need(3, static_cast<std::size_t>(m * n) * e, "linear y");
          auto at = [&](const ParamValue& v, std::int64_t i) -> double {
            return half ? bf16_to_f32(ptr<const std::uint16_t>(v)[i]) : ptr<const float>(v)[i];
          };
          for (std::int64_t i = 0; i < m; ++i)
            for (std::int64_t j = 0; j < n; ++j) {
              double acc = p[2].address ? at(p[2], j) : 0.0;
              for (std::int64_t c = 0; c < k; ++c) acc += at(p[0], i * k + c) * at(p[1], j * k + c);
              if (half)
                ptr<std::uint16_t>(p[3])[i * n + j] = f32_to_bf16(static_cast<float>(acc));
              else
                ptr<float>(p[3])[i * n + j] = static_cast<float>(acc);
            }
        } else if constexpr (std::is_same_v<T, nvptx::LayerNormKernel>) {
          const std::int64_t rows = p.at(4).i64, n = p.at(5).i64;
          const double eps = p.at(6).f32;
          expect_grid(nvptx::layer_norm_grid(r, rows), "layer_norm");
          need(0, static_cast<std::size_t>(rows * n) * 4, "layer_norm x");
          need(1, static_cast<std::size_t>(n) * 4, "layer_norm gamma");
          need(2, static_cast<std::size_t>(n) * 4, "layer_norm beta");
          need(3, static_cast<std::size_t>(rows * n) * 4, "layer_norm y");
          const float *x = ptr<const float>(p[0]), *g = ptr<const float>(p[1]), *b = ptr<const float>(p[2]);
          float* y = ptr<float>(p[3]);
          for (std::int64_t i = 0; i < rows; ++i) {
            double mean = 0, var = 0;
            for (std::int64_t c = 0; c < n; ++c) mean += x[i * n + c];
            mean /= static_cast<double>(n);
            for (std::int64_t c = 0; c < n; ++c) var += (x[i * n + c] - mean) * (x[i * n + c] - mean);
            var /= static_cast<double>(n);
            const double inv = 1.0 / std::sqrt(var + eps);
            for (std::int64_t c = 0; c < n; ++c)
              y[i * n + c] = static_cast<float>((x[i * n + c] - mean) * inv * g[c] + b[c]);
          }
        } else if constexpr (std::is_same_v<T, nvptx::ElementwiseKernel>) {
          const std::int64_t count = p.at(3).i64;
          expect_grid(nvptx::elementwise_grid(r.threads, count), "elementwise");
          const auto bytes = static_cast<std::size_t>(count) * 4;
          need(0, bytes, "elementwise a");
          if (r.op == nvptx::ElementwiseOp::add) need(1, bytes, "elementwise b");
          need(2, bytes, "elementwise y");
          const float *a = ptr<const float>(p[0]), *b = ptr<const float>(p[1]);
          float* y = ptr<float>(p[2]);
          for (std::int64_t i = 0; i < count; ++i) {
            const float v = a[i];
            switch (r.op) {
              case nvptx::ElementwiseOp::relu:
                y[i] = std::isnan(v) ? v : (v > 0.0f ? v : 0.0f);
                break;
              case nvptx::ElementwiseOp::gelu:
                y[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
                break;
              case nvptx::ElementwiseOp::add:
                y[i] = v + b[i];
                break;
              case nvptx::ElementwiseOp::scale:
                y[i] = v * r.factor;
                break;
            }
          }
        } else if constexpr (std::is_same_v<T, nvptx::AttentionBackwardKernel>) {
          l_grid_ = l.grid;
          attention_backward(r, p);
        } else {  // StridedCopyKernel
          const std::int64_t count = p.at(2).i64, offset = p.at(3).i64;
          expect_grid(nvptx::elementwise_grid(r.threads, count), "copy");
          std::int64_t size[6], stride[6], prod = 1;
          for (int a = 0; a < 6; ++a) {
            size[a] = p.at(static_cast<std::size_t>(4 + a)).i64;
            stride[a] = p.at(static_cast<std::size_t>(10 + a)).i64;
            if (a >= r.rank && (size[a] != 1 || stride[a] != 0)) errors.push_back("copy: unused axes not (1, 0)");
            if (a < r.rank) prod *= size[a];
          }
          if (prod != count) errors.push_back("copy: count is not the product of the sizes");
          need(1, static_cast<std::size_t>(count) * 4, "copy dst");
          const float* src = ptr<const float>(p[0]);
          float* dst = ptr<float>(p[1]);
          std::int64_t lo = offset, hi = offset;  // the source range read
          for (int a = 0; a < r.rank; ++a) {
            const std::int64_t span = (size[a] - 1) * stride[a];
            (span < 0 ? lo : hi) += span;
          }
          if (count > 0) {
            if (lo < 0) errors.push_back("copy: reads before its source");
            check(p[0].address + static_cast<std::uint64_t>(std::max<std::int64_t>(lo, 0)) * 4,
                  static_cast<std::size_t>(hi - std::max<std::int64_t>(lo, 0) + 1) * 4, "copy src");
          }
          for (std::int64_t i = 0; i < count; ++i) {
            std::int64_t rest = i, at = offset;
            for (int a = r.rank; a-- > 0;) {
              at += rest % size[a] * stride[a];
              rest /= size[a];
            }
            dst[i] = src[at];
          }
        }
      },
      l.request);
}

}  // namespace qkv::test
