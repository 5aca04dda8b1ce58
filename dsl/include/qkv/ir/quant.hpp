// qkv/ir/quant.hpp — where Op::dequantize finds entry k of a 4-bit q (Q4_0's order within a
// group). The quantizer, the interpreter and every CPU kernel that reads a q4 weight share it.
//
// Plain arithmetic, templated on the integer type: std::int64_t, or the generated code's ir::Int.
#pragma once

#include <cstdint>

#include <qkv/ir/graph.hpp>

namespace qkv {

/// Whether a dequantize reads a 4-bit q (`scalar` 4: two entries a byte), not one i8 an entry.
inline bool dequantizes_q4(const Node& n) { return n.op == Op::dequantize && n.scalar == 4.0; }

/// The byte of a q4 row that holds entry k: in each group of `group` entries (even), byte j <
/// group / 2 holds entry j (its low four bits) and entry j + group / 2 (its high four).
template <class I>
I q4_byte(const I& k, const I& group) {
  const I half = group / 2;
  return k / group * half + k % group % half;
}
/// Whether entry k is in its byte's high four bits.
template <class I>
auto q4_high(const I& k, const I& group) {
  return k % group >= group / 2;
}
/// The value of a 4-bit entry (0…15 as stored): nibble − 8.
inline constexpr int kQ4Zero = 8;

/// The value of the entry in `byte`'s high or low four bits.
inline int q4_value(std::uint8_t byte, bool high) { return (high ? byte >> 4 : byte & 0x0F) - kQ4Zero; }

}  // namespace qkv
