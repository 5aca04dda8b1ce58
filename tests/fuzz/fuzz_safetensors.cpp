// libFuzzer target for the safetensors reader: SafetensorsFile::from_bytes must either accept the
// image or throw qkv::IoError, and then every tensor of the accepted image must load. Any other
// exception (or an IoError after acceptance), crash or sanitizer report is a finding. Accepted
// images are also checked for a lossless load → serialize → parse round trip.
#include <qkv/runtime/io/safetensors.hpp>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto* bytes = reinterpret_cast<const std::byte*>(data);
  std::optional<qkv::SafetensorsFile> f;
  try {
    f.emplace(qkv::SafetensorsFile::from_bytes(std::vector<std::byte>(bytes, bytes + size), "fuzz.safetensors"));
  } catch (const qkv::IoError&) {
    return 0;  // rejected input: expected
  }
  std::map<std::string, qkv::NdArray> loaded;
  for (const std::string& name : f->names()) {
    if (!f->contains(name)) __builtin_trap();
    const qkv::TensorView v = f->get(name);
    qkv::NdArray a = f->load(name);
    const auto n = static_cast<std::size_t>(a.numel());
    if (v.data.size() != a.bytes.size() || a.bytes.size() != n * qkv::dtype_size(a.dtype)) __builtin_trap();
    if (v.data.size() > size) __builtin_trap();  // a view can never exceed the image
    if (a.to_f32().size() != n) __builtin_trap();
    loaded.emplace(name, std::move(a));
  }
  const auto g = qkv::SafetensorsFile::from_bytes(qkv::serialize_safetensors(loaded, f->metadata()), "roundtrip");
  if (g.names() != f->names() || g.metadata() != f->metadata()) __builtin_trap();
  for (const auto& [name, a] : loaded)
    if (!(g.load(name) == a)) __builtin_trap();
  return 0;
}
