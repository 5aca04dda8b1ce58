// qkv/ir/dtype.hpp — element types of the Graph IR and of tensors on disk.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace qkv {

enum class DType : std::uint8_t { f32, f64, f16, bf16, boolean, i32, i64, i8 };

inline std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32:
      return "f32";
    case DType::f64:
      return "f64";
    case DType::f16:
      return "f16";
    case DType::bf16:
      return "bf16";
    case DType::boolean:
      return "bool";
    case DType::i32:
      return "i32";
    case DType::i64:
      return "i64";
    case DType::i8:
      return "i8";
  }
  return "?";
}

/// Bytes per element.
inline std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::f64:
    case DType::i64:
      return 8;
    case DType::f32:
    case DType::i32:
      return 4;
    case DType::f16:
    case DType::bf16:
      return 2;
    case DType::boolean:
    case DType::i8:
      return 1;
  }
  return 0;
}

/// i32 or i64 (token ids, positions, sizes fed by value).
inline bool is_integer(DType t) { return t == DType::i32 || t == DType::i64; }

}  // namespace qkv
