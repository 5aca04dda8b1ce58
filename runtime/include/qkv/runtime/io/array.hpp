// qkv/runtime/io/array.hpp — an n-dimensional array of bytes plus a dtype and shape (its bytes
// owned, or a window onto a checkpoint's mapping: io/bytes.hpp); the in-memory form of every
// tensor the file readers (npy, safetensors) produce and the writers take.
//
// Layout contract: `bytes` holds numel() elements of `dtype` in C (row-major) order, in the host's
// native byte order, which qkv requires to be little-endian (checked below). Boolean elements are
// the bytes 0 and 1 only; the readers normalise any non-zero byte to 1.
#pragma once

#include <qkv/runtime/io/bytes.hpp>

#include <qkv/ir/dtype.hpp>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

static_assert(std::endian::native == std::endian::little, "qkv's tensor I/O assumes a little-endian host");

namespace qkv {

/// Any failure to read, parse, validate or write a tensor file. what() always starts with the file
/// name (or the caller-supplied `what` for in-memory parsing) followed by ": " and the problem.
class IoError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Python-style rendering of a shape, as numpy prints it: "()", "(3,)", "(2, 3)".
inline std::string shape_to_string(std::span<const std::int64_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

/// Number of bytes an array of `shape` and `dtype` occupies. Throws IoError (prefixed by `what`)
/// if a dimension is negative, or if the product of the non-zero dimensions times the item size
/// does not fit in int64 — so numel() of an accepted shape can never overflow, in any order.
inline std::size_t checked_nbytes(std::span<const std::int64_t> shape, DType dtype, std::string_view what) {
  constexpr auto kMax = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t nonzero_product = dtype_size(dtype);
  bool has_zero = false;
  for (std::int64_t d : shape) {
    if (d < 0)
      throw IoError(std::string(what) + ": negative dimension " + std::to_string(d) + " in shape " +
                    shape_to_string(shape));
    if (d == 0) {
      has_zero = true;
      continue;
    }
    if (nonzero_product > kMax / static_cast<std::uint64_t>(d))
      throw IoError(std::string(what) + ": shape " + shape_to_string(shape) +
                    " is too large (element count times item size overflows)");
    nonzero_product *= static_cast<std::uint64_t>(d);
  }
  return has_zero ? 0 : static_cast<std::size_t>(nonzero_product);
}

namespace detail {
/// True if a span of T may view elements of dtype `t` (see NdArray::as).
template <class T>
constexpr bool dtype_matches(DType t) {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return t == DType::f32;
  else if constexpr (std::is_same_v<U, double>)
    return t == DType::f64;
  else if constexpr (std::is_same_v<U, bool> || std::is_same_v<U, std::uint8_t>)
    return t == DType::boolean;
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return t == DType::i32;
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return t == DType::i64;
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return t == DType::i8;
  else if constexpr (std::is_same_v<U, std::uint16_t>)
    return t == DType::f16 || t == DType::bf16;
  else
    return false;
}

template <class T>
constexpr std::string_view ctype_name() {
  using U = std::remove_cv_t<T>;
  if constexpr (std::is_same_v<U, float>)
    return "float";
  else if constexpr (std::is_same_v<U, double>)
    return "double";
  else if constexpr (std::is_same_v<U, bool>)
    return "bool";
  else if constexpr (std::is_same_v<U, std::uint8_t>)
    return "uint8_t";
  else if constexpr (std::is_same_v<U, std::int32_t>)
    return "int32_t";
  else if constexpr (std::is_same_v<U, std::int64_t>)
    return "int64_t";
  else if constexpr (std::is_same_v<U, std::int8_t>)
    return "int8_t";
  else if constexpr (std::is_same_v<U, std::uint16_t>)
    return "uint16_t";
  else
    return "unsupported type";
}

template <class T>
T load_unaligned(const std::byte* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

/// madvise over the whole pages of size `page` inside [p, p + n) (advice only: a failure, or a
/// system without madvise, changes nothing).
inline void advise(const void* p, std::size_t n, std::size_t page, int advice) {
#if defined(__linux__)
  const auto begin = (reinterpret_cast<std::uintptr_t>(p) + page - 1) / page * page;
  const auto end = (reinterpret_cast<std::uintptr_t>(p) + n) / page * page;
  if (end > begin) ::madvise(reinterpret_cast<void*>(begin), end - begin, advice);
#else
  (void)p, (void)n, (void)page, (void)advice;
#endif
}

/// Buffers of this many bytes or more are asked for transparent huge pages (a VM's THP is often
/// "madvise" only): filling a checkpoint's worth of memory 4 KiB page by page, each fault a trap
/// to the hypervisor, took longer than the copy or conversion itself.
inline constexpr std::size_t kHugePageBytes = std::size_t{4} << 20;

/// An empty vector with room for n bytes, backed by huge pages where the kernel gives them.
inline std::vector<std::byte> reserved_bytes(std::size_t n) {
  std::vector<std::byte> v;
  v.reserve(n);
#if defined(__linux__)
  if (n >= kHugePageBytes) advise(v.data(), n, std::size_t{2} << 20, MADV_HUGEPAGE);
#endif
  return v;
}

}  // namespace detail

/// IEEE 754 binary16 bits → float. Exact for every input (normals, subnormals, ±0, ±inf, NaN with
/// its payload kept in the top mantissa bits).
inline float f16_to_f32(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t exp = (h >> 10) & 0x1Fu;
  const std::uint32_t mant = h & 0x3FFu;
  if (exp == 0) {  // zero or subnormal: mant × 2^-24
    const float mag = std::ldexp(static_cast<float>(mant), -24);
    return sign ? -mag : mag;
  }
  if (exp == 31) return std::bit_cast<float>(sign | 0x7F800000u | (mant << 13));  // inf / NaN
  return std::bit_cast<float>(sign | ((exp + (127 - 15)) << 23) | (mant << 13));
}

/// bfloat16 bits → float (bf16 is the top half of an f32, so this is exact).
inline float bf16_to_f32(std::uint16_t b) { return std::bit_cast<float>(static_cast<std::uint32_t>(b) << 16); }

/// float → bfloat16 bits, rounded to nearest, ties to even (as PyTorch's c10::BFloat16 and
/// vcvtneps2bf16); a NaN stays a NaN (quiet, sign and top payload bits kept).
inline std::uint16_t f32_to_bf16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<std::uint16_t>((u >> 16) | 0x0040u);
  return static_cast<std::uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

/// float → IEEE 754 binary16 bits, rounded to nearest, ties to even (as vcvtps2ph with
/// rounding mode 0): overflow → ±inf, subnormal results rounded once, a NaN stays a quiet NaN.
inline std::uint16_t f32_to_f16(float f) {
  const auto u = std::bit_cast<std::uint32_t>(f);
  const auto sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return static_cast<std::uint16_t>(sign | 0x7E00u | ((a >> 13) & 0x3FFu));  // NaN
  if (a >= 0x47800000u) return static_cast<std::uint16_t>(sign | 0x7C00u);  // >= 65536 (and inf): inf
  if (a < 0x38800000u) {               // below 2^-14: a subnormal (or zero) result, in units of 2^-24
    if (a < 0x33000000u) return sign;  // below 2^-25: rounds to zero (2^-25 itself ties to 0, even)
    const std::uint32_t e = a >> 23, m = (a & 0x7FFFFFu) | 0x800000u;
    const std::uint32_t shift = 126 - e;  // m·2^(e-150) / 2^-24 = m >> (126 - e)
    const std::uint32_t q = m >> shift, rest = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    return static_cast<std::uint16_t>(sign | (q + (rest > half || (rest == half && (q & 1u)))));
  }
  // normal: rebias the exponent, round the 13 dropped bits (a carry into the exponent is right,
  // up to inf at 65520).
  const std::uint32_t r = a - 0x38000000u;
  return static_cast<std::uint16_t>(sign | ((r + 0xFFFu + ((r >> 13) & 1u)) >> 13));
}

/// `f` rounded to dtype `t` and back (f16/bf16: the nearest value of that type; others: f).
inline float round_to_dtype(float f, DType t) {
  if (t == DType::bf16) return bf16_to_f32(f32_to_bf16(f));
  if (t == DType::f16) return f16_to_f32(f32_to_f16(f));
  return f;
}

struct NdArray {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;  ///< {} is a scalar (one element)
  Bytes bytes;  ///< C-order, little-endian (= native), numel()*dtype_size bytes; owned or a file's window

  /// Product of the dimensions; 1 for a scalar, 0 if any dimension is 0.
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }

  /// An array of the given shape with every byte zero (0.0, false, 0). Throws IoError on a
  /// negative or overflowing shape.
  static NdArray zeros(DType dtype, std::vector<std::int64_t> shape) {
    const std::size_t n = checked_nbytes(shape, dtype, "NdArray::zeros");
    std::vector<std::byte> storage = detail::reserved_bytes(n);  // huge pages for a large one
    storage.resize(n);
    return NdArray{dtype, std::move(shape), std::move(storage)};
  }

  /// Typed view of the elements. T must match the dtype: float↔f32, double↔f64,
  /// bool/uint8_t↔boolean, int32_t↔i32, int64_t↔i64, int8_t↔i8, uint16_t↔f16/bf16 (raw bits).
  /// Throws IoError otherwise. The span is invalidated by anything that reallocates `bytes`.
  template <class T>
  [[nodiscard]] std::span<T> as() {
    check_view<T>();
    return {reinterpret_cast<T*>(bytes.data()), bytes.size() / sizeof(T)};
  }
  template <class T>
  [[nodiscard]] std::span<const T> as() const {
    check_view<T>();
    return {reinterpret_cast<const T*>(bytes.data()), bytes.size() / sizeof(T)};
  }

  /// Every element converted to float: f16/bf16 decoded exactly, f64 rounded (overflow → ±inf),
  /// integers rounded to nearest float, booleans → 0.0 / 1.0.
  [[nodiscard]] std::vector<float> to_f32() const {
    const std::size_t isz = dtype_size(dtype);
    const std::size_t n = isz ? bytes.size() / isz : 0;
    std::vector<float> out(n);
    const std::byte* p = bytes.data();
    for (std::size_t i = 0; i < n; ++i, p += isz) {
      switch (dtype) {
        case DType::f32:
          out[i] = detail::load_unaligned<float>(p);
          break;
        case DType::f64: {
          const double d = detail::load_unaligned<double>(p);
          constexpr double kFltMax = std::numeric_limits<float>::max();
          if (std::isfinite(d) && std::fabs(d) > kFltMax)  // avoid an out-of-range conversion
            out[i] = d > 0 ? std::numeric_limits<float>::infinity() : -std::numeric_limits<float>::infinity();
          else
            out[i] = static_cast<float>(d);
          break;
        }
        case DType::f16:
          out[i] = f16_to_f32(detail::load_unaligned<std::uint16_t>(p));
          break;
        case DType::bf16:
          out[i] = bf16_to_f32(detail::load_unaligned<std::uint16_t>(p));
          break;
        case DType::boolean:
          out[i] = std::to_integer<unsigned>(*p) != 0 ? 1.0f : 0.0f;
          break;
        case DType::i32:
          out[i] = static_cast<float>(detail::load_unaligned<std::int32_t>(p));
          break;
        case DType::i64:
          out[i] = static_cast<float>(detail::load_unaligned<std::int64_t>(p));
          break;
        case DType::i8:
          out[i] = static_cast<float>(static_cast<std::int8_t>(std::to_integer<unsigned>(*p)));
          break;
      }
    }
    return out;
  }

  /// An f32 array holding `values`; throws IoError if values.size() != product of `shape`.
  static NdArray from_f32(std::vector<float> values, std::vector<std::int64_t> shape) {
    const std::size_t n = checked_nbytes(shape, DType::f32, "NdArray::from_f32");
    if (n != values.size() * sizeof(float))
      throw IoError("NdArray::from_f32: shape " + shape_to_string(shape) + " needs " +
                    std::to_string(n / sizeof(float)) + " values, got " + std::to_string(values.size()));
    NdArray a{DType::f32, std::move(shape), std::vector<std::byte>(n)};
    if (n) std::memcpy(a.bytes.data(), values.data(), n);
    return a;
  }

  /// `values` stored as dtype `t` (f32, or f16/bf16 rounded to nearest even); throws IoError
  /// for another dtype or a size that does not match `shape`.
  static NdArray from_f32_as(DType t, const std::vector<float>& values, std::vector<std::int64_t> shape) {
    if (t == DType::f32) return from_f32(values, std::move(shape));
    if (t != DType::f16 && t != DType::bf16)
      throw IoError("NdArray::from_f32_as: cannot store floats as " + std::string(dtype_name(t)));
    const std::size_t n = checked_nbytes(shape, t, "NdArray::from_f32_as");
    if (n != values.size() * 2)
      throw IoError("NdArray::from_f32_as: shape " + shape_to_string(shape) + " needs " + std::to_string(n / 2) +
                    " values, got " + std::to_string(values.size()));
    NdArray a{t, std::move(shape), std::vector<std::byte>(n)};
    auto* out = reinterpret_cast<std::uint16_t*>(a.bytes.data());
    for (std::size_t i = 0; i < values.size(); ++i)
      out[i] = t == DType::bf16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
    return a;
  }

  /// This array's values as dtype `t`: f32, f16 or bf16 (rounded to nearest even when narrower),
  /// or i32 / i64 (integers exactly; floats truncated toward zero, NaN and values out of range -1:
  /// an index no table has).
  [[nodiscard]] NdArray converted(DType t) const {
    if (dtype == t) return *this;
    if ((is_half(dtype) && t == DType::f32) || (dtype == DType::f32 && is_half(t))) return converted_float(t);
    if (t != DType::i32 && t != DType::i64) return from_f32_as(t, to_f32(), shape);
    NdArray out = zeros(t, shape);
    const std::vector<float> floats = dtype == DType::i32 || dtype == DType::i64 ? std::vector<float>{} : to_f32();
    for (std::size_t i = 0; i < static_cast<std::size_t>(numel()); ++i) {
      std::int64_t v = -1;
      if (dtype == DType::i64)
        v = as<std::int64_t>()[i];
      else if (dtype == DType::i32)
        v = as<std::int32_t>()[i];
      else if (floats[i] >= -9.2e18f && floats[i] <= 9.2e18f)
        v = static_cast<std::int64_t>(floats[i]);
      if (t == DType::i64)
        out.as<std::int64_t>()[i] = v;
      else
        out.as<std::int32_t>()[i] = v >= INT32_MIN && v <= INT32_MAX ? static_cast<std::int32_t>(v) : -1;
    }
    return out;
  }

  friend bool operator==(const NdArray&, const NdArray&) = default;  // bytewise, NaN == same NaN

 private:
  static bool is_half(DType t) { return t == DType::f16 || t == DType::bf16; }
  /// f32 <-> f16 / bf16 in one pass (no f32 copy of the whole array between; a checkpoint's
  /// weights converted on load went through 1.5 times their size in temporaries).
  [[nodiscard]] NdArray converted_float(DType t) const {
    NdArray out = zeros(t, shape);
    auto each = [](auto in, auto to, auto convert) {  // one loop per conversion, no branch inside
      for (std::size_t i = 0; i < in.size(); ++i) to[i] = convert(in[i]);
    };
    if (dtype == DType::bf16)
      each(as<std::uint16_t>(), out.as<float>(), bf16_to_f32);
    else if (dtype == DType::f16)
      each(as<std::uint16_t>(), out.as<float>(), f16_to_f32);
    else if (t == DType::bf16)
      each(as<float>(), out.as<std::uint16_t>(), f32_to_bf16);
    else
      each(as<float>(), out.as<std::uint16_t>(), f32_to_f16);
    return out;
  }

  template <class T>
  void check_view() const {
    if (!detail::dtype_matches<T>(dtype))
      throw IoError("NdArray::as<" + std::string(detail::ctype_name<T>()) + ">: array dtype is " +
                    std::string(dtype_name(dtype)));
  }
};

}  // namespace qkv
