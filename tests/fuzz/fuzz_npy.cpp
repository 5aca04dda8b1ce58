// libFuzzer target for the .npy reader: parse_npy must either return a well-formed array or throw
// qkv::IoError. Any other exception, crash or sanitizer report is a finding. Accepted arrays are
// also checked for internal consistency and for a lossless serialize → parse round trip, outside
// the try block, so an IoError there is a finding too.
#include <qkv/runtime/io/npy.hpp>

#include <cstddef>
#include <cstdint>
#include <span>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);
  qkv::NdArray a;
  try {
    a = qkv::parse_npy(input, "fuzz.npy");
  } catch (const qkv::IoError&) {
    return 0;  // rejected input: expected
  }
  const auto n = static_cast<std::size_t>(a.numel());
  if (a.bytes.size() != n * qkv::dtype_size(a.dtype)) __builtin_trap();
  if (a.to_f32().size() != n) __builtin_trap();
  if (a.dtype == qkv::DType::boolean)
    for (std::byte b : a.bytes)
      if (b != std::byte{0} && b != std::byte{1}) __builtin_trap();
  // Everything the reader accepts (bf16 from '<V2' included) must survive a round trip unchanged.
  if (!(qkv::parse_npy(qkv::serialize_npy(a), "roundtrip.npy") == a)) __builtin_trap();
  return 0;
}
