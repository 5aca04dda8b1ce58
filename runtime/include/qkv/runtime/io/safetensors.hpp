// qkv/runtime/io/safetensors.hpp — the safetensors format (many named tensors per file).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON header, then the data section.
// The header is an object mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the data section), plus an optional "__metadata__" object of string →
// string. Supported dtypes: F32 F64 F16 BF16 BOOL I32 I64.
//
// Validation on open (each failure is an IoError starting with the file name): not a regular
// file (qkv/runtime/io/files.hpp: InputFile, so a FIFO never blocks); file shorter than 8 bytes;
// header length beyond the file or above 100 MB; header not JSON or not an object; duplicate keys
// (at any depth — so duplicate tensor names; found in time linear in the number of keys); entries
// that are not objects or lack dtype/shape/data_offsets or have the wrong JSON types; unsupported
// dtypes; negative or overflowing shapes; data_offsets not [begin, end] with begin <= end; end
// beyond the data section; end − begin != numel × itemsize; overlapping tensors; a malformed
// __metadata__.
// Tolerated (as the data is still unambiguous): unknown extra keys in an entry, gaps between
// tensors and unused bytes at the end of the data section.
//
// Writing: tensors are laid out by decreasing item size, then those of a multiple of 64 bytes
// first, then by name, so each tensor's data is aligned to its item size, and most to 64 bytes;
// the header is padded with spaces so the data section starts at a multiple of 64 (the reference
// implementation pads to 8, and reads any padding).
#pragma once

#include <qkv/runtime/io/array.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace qkv {

/// A tensor inside an open SafetensorsFile; `data` points into the file's bytes (not necessarily
/// aligned for the element type) and is valid while the file object lives. Boolean bytes are raw.
struct TensorView {
  DType dtype;
  std::vector<std::int64_t> shape;
  std::span<const std::byte> data;
  [[nodiscard]] std::int64_t numel() const {
    std::int64_t n = 1;
    for (std::int64_t d : shape) n *= d;
    return n;
  }
};

/// A validated safetensors file: memory-mapped (open) or owning its bytes (from_bytes). Move-only.
class SafetensorsFile {
 public:
  /// mmaps `path` read-only and validates it. With `windows`, load() gives large tensors as
  /// windows onto the file instead of copies (see load). (If another process truncates the file
  /// while it, or such a window, is mapped, touching the lost pages raises SIGBUS — the usual mmap
  /// caveat, as with llama.cpp; qkv's own writers replace a file, never rewrite it.)
  static SafetensorsFile open(const std::filesystem::path& path, bool windows = true);
  /// Same validation over an in-memory image; `what` names it in error messages.
  static SafetensorsFile from_bytes(std::vector<std::byte> bytes, std::string what);

  SafetensorsFile(SafetensorsFile&& other) noexcept;
  SafetensorsFile& operator=(SafetensorsFile&& other) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;
  ~SafetensorsFile();

  /// Tensor names, sorted by name (byte-wise), excluding "__metadata__".
  [[nodiscard]] std::vector<std::string> names() const;
  [[nodiscard]] std::size_t size() const { return entries_.size(); }
  [[nodiscard]] bool contains(std::string_view name) const;
  /// A view into the file; IoError if there is no such tensor.
  [[nodiscard]] TensorView get(std::string_view name) const;
  /// The least bytes of a tensor that load() maps as a window (smaller ones are copied).
  static constexpr std::size_t kWindowBytes = 16384;
  /// The tensor as an array of its own (booleans normalised to 0/1); IoError if there is no such
  /// tensor. From a file opened with windows, a tensor of kWindowBytes or more that starts on
  /// a multiple of its item size is a window onto a private mapping of the file (no copy: the page
  /// cache's pages until written; see window()), which outlives this object; otherwise a copy.
  [[nodiscard]] NdArray load(std::string_view name) const;
  /// The tensor as dtype `as` (NdArray::converted's rules): an f32 tensor read as f16 / bf16 is
  /// converted in one pass from the file's bytes, with no f32 copy between (a 262 MB embedding
  /// table read as bf16 had its f32 copy resident beside the bf16 one); others load, then convert.
  [[nodiscard]] NdArray load_as(std::string_view name, DType as) const;
  /// The "__metadata__" object (empty if absent).
  [[nodiscard]] const std::map<std::string, std::string>& metadata() const { return metadata_; }
  /// The file name (or `what`) used in messages.
  [[nodiscard]] const std::string& what() const { return what_; }

 private:
  struct Entry {
    DType dtype;
    std::vector<std::int64_t> shape;
    std::size_t begin;  // absolute offsets into the file image
    std::size_t end;
  };

  SafetensorsFile() = default;
  void parse();  // validates the image and fills entries_ / metadata_
  [[nodiscard]] std::span<const std::byte> image() const;
  [[nodiscard]] const Entry& entry(std::string_view name) const;
  void release() noexcept;
  /// `e` as a window onto windows_ (io/bytes.hpp), or nullopt where it is copied instead: an
  /// in-memory image, a file opened without windows, a tensor under kWindowBytes, booleans
  /// (normalised to 0 / 1 as they are read), data that does not start on a multiple of its item
  /// size (the compiled code's loads assume it), or an entry loaded before (its window's written
  /// pages may outlive it). Rows off a cache line cost the kernels' 64-byte loads two lines each:
  /// decoding f32 from a file whose data section starts on 8 bytes (a Hugging Face writer's) was
  /// 5–8 % slower than from a copy; a file qkv writes starts it on 64 (serialize_safetensors).
  [[nodiscard]] std::optional<NdArray> window(const Entry& e) const;

  std::string what_;
  std::map<std::string, Entry, std::less<>> entries_;
  std::map<std::string, std::string> metadata_;
  std::vector<std::byte> owned_;  // from_bytes
  void* map_ = nullptr;           // open: mmap'ed region
  std::size_t map_size_ = 0;
  struct Windows;
  std::shared_ptr<Windows> windows_;  // open with windows: load()'s mapping
};

/// Serialises tensors (+ optional metadata) to a safetensors image. IoError on an array whose
/// bytes do not match its shape, on the reserved name "__metadata__", or on names / metadata that
/// are not valid UTF-8.
std::vector<std::byte> serialize_safetensors(const std::map<std::string, NdArray>& tensors,
                                             const std::map<std::string, std::string>& metadata = {});

/// serialize_safetensors + write_file_atomic (temporary file in the same directory, then rename).
void write_safetensors(const std::filesystem::path& path, const std::map<std::string, NdArray>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace qkv
