// qkv/runtime/io/npy.hpp — numpy's .npy format (one array per file).
//
// Reading accepts format versions 1.0, 2.0 and 3.0; dtype descrs f4 f8 f2 b1 i4 i8 in either byte
// order ('<', '>', '=' or '|' for one-byte types — big-endian data is byte-swapped on read), and
// '<V2' / '|V2' as bfloat16 (see below);
// fortran_order True (transposed to C order on read); any shape including () scalars. The header
// dict is parsed by a small strict parser for the Python-literal dict numpy writes: exactly the keys
// 'descr', 'fortran_order', 'shape' (any order, trailing comma allowed), strings without escapes,
// True/False, and a tuple of non-negative integers (a 1-tuple needs its trailing comma, as in
// Python; Python 2's "3L" suffix is accepted). Boolean bytes other than 0 are normalised to 1.
//
// Writing produces version 1.0 (2.0 only if the header exceeds 65535 bytes), little-endian,
// C order, header padded with spaces and a final '\n' so the data starts at a multiple of 64.
// bf16: NumPy has no bfloat16, so its raw bits (little-endian) are written as 2-byte voids,
// descr '<V2' — what NumPy itself makes of an ml_dtypes.bfloat16 array. Plain NumPy reads them
// with np.load(f).view(np.uint16) (the bits) and PyTorch with
// torch.from_numpy(a.view(np.int16)).view(torch.bfloat16); a bfloat16 tensor t is saved for qkv
// by np.save(f, t.view(torch.int16).numpy().view('<V2')).
//
// Every error is an IoError whose message starts with the file name (or `what`).
#pragma once

#include <qkv/runtime/io/array.hpp>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <span>
#include <string_view>
#include <vector>

namespace qkv {

/// Reads and parses the file: a regular file only (qkv/runtime/io/files.hpp: InputFile), its
/// header parsed and checked against the file size before any data is read or allocated.
NdArray read_npy(const std::filesystem::path& path);

/// What an .npy file holds, from its header alone.
struct NpyInfo {
  DType dtype = DType::f32;
  std::vector<std::int64_t> shape;
  std::size_t nbytes = 0;  // of the data
};
/// Reads and checks the header only (including that the file holds exactly the data it announces).
NpyInfo read_npy_info(const std::filesystem::path& path);

/// Parses an in-memory .npy image; `what` names it in error messages.
NdArray parse_npy(std::span<const std::byte> data, std::string_view what);

/// Serialises `array` (validated: bytes.size() must match shape × itemsize) to an .npy image.
std::vector<std::byte> serialize_npy(const NdArray& array);

/// The header serialize_npy writes before the data (magic, version, dict, padding).
std::vector<std::byte> npy_header(const NdArray& array);

/// Writes `array` as one OutputGroup (qkv/runtime/io/files.hpp): a staged file renamed into place.
void write_npy(const std::filesystem::path& path, const NdArray& array);

}  // namespace qkv
