// Unit tests for qkv/runtime/io/array.hpp and the .npy reader/writer.
#include <qkv/runtime/io/npy.hpp>

#include <gtest/gtest.h>

#include <unistd.h>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "io_test_helpers.hpp"

namespace {

using namespace qkv::testing_io;
using qkv::DType;
using qkv::NdArray;
namespace fs = std::filesystem;

template <class T>
std::vector<std::byte> be_bytes(const std::vector<T>& v) {
  std::vector<std::byte> out = le_bytes(v);
  for (std::size_t i = 0; i < out.size(); i += sizeof(T))
    std::reverse(out.begin() + static_cast<std::ptrdiff_t>(i),
                 out.begin() + static_cast<std::ptrdiff_t>(i + sizeof(T)));
  return out;
}

// A hand-built .npy image: magic, version major.0, header length (2 bytes for v1, 4 otherwise),
// the dict padded with spaces and '\n' to a multiple of 64 (if pad), then the payload.
std::vector<std::byte> npy_image(int major, std::string_view dict, const std::vector<std::byte>& payload,
                                 bool pad = true) {
  const std::size_t prefix = major == 1 ? 10 : 12;
  std::string header(dict);
  if (pad) {
    header += '\n';
    while ((prefix + header.size()) % 64 != 0) header.insert(header.size() - 1, " ");
  }
  std::vector<std::byte> out;
  for (int c : {0x93, int{'N'}, int{'U'}, int{'M'}, int{'P'}, int{'Y'}}) out.push_back(static_cast<std::byte>(c));
  out.push_back(static_cast<std::byte>(major));
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

NdArray parse(const std::vector<std::byte>& image) { return qkv::parse_npy(image, "fixture.npy"); }

std::string dict(std::string_view descr, std::string_view shape, bool fortran = false) {
  return "{'descr': '" + std::string(descr) + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + std::string(shape) + ", }";
}

template <class T>
NdArray make(DType t, std::vector<std::int64_t> shape, const std::vector<T>& values) {
  return NdArray{t, std::move(shape), le_bytes(values)};
}

// --- NdArray -------------------------------------------------------------------------------------

TEST(NdArray, NumelZerosAndShapeString) {
  const NdArray a = NdArray::zeros(DType::i64, {2, 3, 4});
  EXPECT_EQ(a.numel(), 24);
  EXPECT_EQ(a.bytes.size(), 24u * 8);
  for (std::int64_t v : a.as<std::int64_t>()) EXPECT_EQ(v, 0);
  EXPECT_EQ(NdArray::zeros(DType::f32, {}).numel(), 1);
  EXPECT_EQ(NdArray::zeros(DType::f32, {5, 0}).bytes.size(), 0u);
  EXPECT_EQ(qkv::shape_to_string(std::vector<std::int64_t>{}), "()");
  EXPECT_EQ(qkv::shape_to_string(std::vector<std::int64_t>{3}), "(3,)");
  EXPECT_EQ(qkv::shape_to_string(std::vector<std::int64_t>{2, 3}), "(2, 3)");
}

TEST(NdArray, ZerosRejectsBadShapes) {
  EXPECT_IO_ERROR(NdArray::zeros(DType::f32, {2, -1}), "NdArray::zeros", "negative dimension");
  EXPECT_IO_ERROR(NdArray::zeros(DType::f32, {1LL << 40, 1LL << 40}), "NdArray::zeros", "too large");
}

TEST(NdArray, TypedSpansCheckDType) {
  NdArray a = NdArray::from_f32({1, 2, 3, 4, 5, 6}, {2, 3});
  auto s = a.as<float>();
  ASSERT_EQ(s.size(), 6u);
  s[4] = 50.0f;
  const NdArray& c = a;
  EXPECT_EQ(c.as<float>()[4], 50.0f);
  EXPECT_IO_ERROR(a.as<double>(), "as<double>", "f32");
  EXPECT_IO_ERROR(c.as<std::int32_t>(), "as<int32_t>", "f32");
  EXPECT_IO_ERROR(a.as<std::uint16_t>(), "as<uint16_t>");

  NdArray b = NdArray::zeros(DType::boolean, {3});
  EXPECT_EQ(b.as<bool>().size(), 3u);
  EXPECT_EQ(b.as<std::uint8_t>().size(), 3u);
  EXPECT_NO_THROW((void)NdArray::zeros(DType::f16, {2}).as<std::uint16_t>());
  EXPECT_NO_THROW((void)NdArray::zeros(DType::bf16, {2}).as<std::uint16_t>());
  EXPECT_NO_THROW((void)NdArray::zeros(DType::i32, {2}).as<std::int32_t>());
  EXPECT_NO_THROW((void)NdArray::zeros(DType::i64, {2}).as<std::int64_t>());
  EXPECT_NO_THROW((void)NdArray::zeros(DType::f64, {2}).as<double>());
}

TEST(NdArray, FromF32ChecksCount) {
  EXPECT_IO_ERROR(NdArray::from_f32({1, 2, 3, 4, 5}, {2, 3}), "from_f32", "needs 6 values, got 5");
  const NdArray s = NdArray::from_f32({7}, {});
  EXPECT_EQ(s.to_f32(), std::vector<float>{7});
}

TEST(NdArray, HalfPrecisionDecode) {
  EXPECT_EQ(qkv::f16_to_f32(0x3C00), 1.0f);
  EXPECT_EQ(qkv::f16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(qkv::f16_to_f32(0x7BFF), 65504.0f);                       // largest normal
  EXPECT_EQ(qkv::f16_to_f32(0x0400), std::ldexp(1.0f, -14));          // smallest normal
  EXPECT_EQ(qkv::f16_to_f32(0x0001), std::ldexp(1.0f, -24));          // smallest subnormal
  EXPECT_EQ(qkv::f16_to_f32(0x03FF), 1023 * std::ldexp(1.0f, -24));   // largest subnormal
  EXPECT_EQ(qkv::f16_to_f32(0x3555), 0.25f * (1 + 0x155 / 1024.0f));  // ≈ 1/3
  EXPECT_EQ(qkv::f16_to_f32(0x7C00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(qkv::f16_to_f32(0xFC00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(qkv::f16_to_f32(0x7E00)));
  EXPECT_TRUE(std::signbit(qkv::f16_to_f32(0x8000)));
  EXPECT_EQ(qkv::f16_to_f32(0x8000), 0.0f);

  EXPECT_EQ(qkv::bf16_to_f32(0x3F80), 1.0f);
  EXPECT_EQ(qkv::bf16_to_f32(0xC000), -2.0f);
  EXPECT_EQ(qkv::bf16_to_f32(0x7F80), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(qkv::bf16_to_f32(0x7FC0)));
  EXPECT_EQ(qkv::bf16_to_f32(0x0001), std::bit_cast<float>(0x00010000u));  // subnormal
}

// The encoders against the decoders: every f16 / bf16 value round-trips, and a float between
// two neighbours goes to the nearer one (to the even one on a tie) — the neighbours found by
// decoding, not by the encoders' arithmetic.
TEST(NdArray, HalfPrecisionEncodeRoundsToNearestEven) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const auto bits = static_cast<std::uint16_t>(h);
    const float f = qkv::f16_to_f32(bits), b = qkv::bf16_to_f32(bits);
    if (std::isnan(f))
      EXPECT_TRUE(std::isnan(qkv::f16_to_f32(qkv::f32_to_f16(f)))) << h;
    else
      ASSERT_EQ(qkv::f32_to_f16(f), bits) << h;
    if (std::isnan(b))
      EXPECT_TRUE(std::isnan(qkv::bf16_to_f32(qkv::f32_to_bf16(b)))) << h;
    else
      ASSERT_EQ(qkv::f32_to_bf16(b), bits) << h;
  }
  // Midpoints and points just off them between positive neighbours (the sign is symmetric).
  auto check = [](auto decode, auto encode, std::uint16_t lo, std::uint16_t hi) {
    const double a = decode(lo), c = decode(hi), mid = (a + c) / 2;
    const auto even = (lo & 1) ? hi : lo;
    EXPECT_EQ(encode(static_cast<float>(mid)), even) << lo;
    EXPECT_EQ(encode(std::nextafter(static_cast<float>(mid), 0.0f)), lo) << lo;
    EXPECT_EQ(encode(std::nextafter(static_cast<float>(mid), std::numeric_limits<float>::infinity())), hi) << lo;
  };
  for (std::uint16_t lo : {0x0000, 0x0001, 0x0002, 0x03FF, 0x0400, 0x3C00, 0x3C01, 0x7BFE})
    check(qkv::f16_to_f32, qkv::f32_to_f16, lo, static_cast<std::uint16_t>(lo + 1));
  for (std::uint16_t lo : {0x0000, 0x0001, 0x007F, 0x0080, 0x3F80, 0x3F81, 0x7F7E})
    check(qkv::bf16_to_f32, qkv::f32_to_bf16, lo, static_cast<std::uint16_t>(lo + 1));
  // Past the largest finite value: the midpoint to the next power of two and above go to inf.
  EXPECT_EQ(qkv::f32_to_f16(65519.0f), 0x7BFF);
  EXPECT_EQ(qkv::f32_to_f16(65520.0f), 0x7C00);
  EXPECT_EQ(qkv::f32_to_f16(-1e10f), 0xFC00);
  EXPECT_EQ(qkv::f32_to_bf16(std::numeric_limits<float>::max()), 0x7F80);
  EXPECT_EQ(qkv::f32_to_f16(1e-10f), 0x0000);
  EXPECT_EQ(qkv::f32_to_f16(-1e-10f), 0x8000);
  const NdArray r = NdArray::from_f32_as(DType::bf16, {1.0f, 1.00390625f, -3.0f}, {3});
  EXPECT_EQ(r.dtype, DType::bf16);
  EXPECT_EQ(r.to_f32(), (std::vector<float>{1.0f, 1.0f, -3.0f}));  // 1 + 2^-8 is a tie: to even
  EXPECT_EQ(r.converted(DType::f32).to_f32(), r.to_f32());
  EXPECT_IO_ERROR(NdArray::from_f32_as(DType::i32, {1}, {1}), "from_f32_as", "i32");
}

TEST(NdArray, ToF32ConvertsEveryDType) {
  EXPECT_EQ(make<std::uint16_t>(DType::f16, {4}, {0x3C00, 0xC000, 0x0001, 0x7C00}).to_f32(),
            (std::vector<float>{1, -2, std::ldexp(1.0f, -24), std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(make<std::uint16_t>(DType::bf16, {2}, {0x3F80, 0x4040}).to_f32(), (std::vector<float>{1, 3}));
  EXPECT_EQ(
      make<double>(DType::f64, {3}, {0.5, -1e300, 1e300}).to_f32(),
      (std::vector<float>{0.5f, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()}));
  EXPECT_EQ(make<std::int32_t>(DType::i32, {2}, {-7, 1 << 20}).to_f32(), (std::vector<float>{-7, 1 << 20}));
  EXPECT_EQ(make<std::int64_t>(DType::i64, {2}, {-3, 1LL << 40}).to_f32(),
            (std::vector<float>{-3, std::ldexp(1.0f, 40)}));
  EXPECT_EQ(make<std::uint8_t>(DType::boolean, {3}, {0, 1, 1}).to_f32(), (std::vector<float>{0, 1, 1}));
  EXPECT_EQ(make<float>(DType::f32, {2}, {1.5f, -0.25f}).to_f32(), (std::vector<float>{1.5f, -0.25f}));
}

// --- .npy round trips ----------------------------------------------------------------------------

TEST(Npy, RoundTripEveryDType) {
  TempDir dir("qkv_npy");
  const std::vector<NdArray> arrays = {
      make<float>(DType::f32, {2, 3}, {1, 2, 3, 4, 5, -6.5f}),
      make<double>(DType::f64, {3}, {1e-300, -2, 3.25}),
      make<std::uint16_t>(DType::f16, {2, 2}, {0x3C00, 0xC000, 0x7C00, 0x0001}),
      make<std::uint8_t>(DType::boolean, {1, 4}, {1, 0, 0, 1}),
      make<std::int32_t>(DType::i32, {2, 1, 2}, {-1, 2, std::numeric_limits<std::int32_t>::min(), 4}),
      make<std::int64_t>(DType::i64, {}, {std::numeric_limits<std::int64_t>::max()}),
      make<float>(DType::f32, {0, 5}, {}),
      make<float>(DType::f32, {0}, {}),
  };
  for (std::size_t i = 0; i < arrays.size(); ++i) {
    const fs::path p = dir.path / ("a" + std::to_string(i) + ".npy");
    qkv::write_npy(p, arrays[i]);
    EXPECT_EQ(qkv::read_npy(p), arrays[i]) << "array " << i;
    EXPECT_EQ(qkv::parse_npy(qkv::serialize_npy(arrays[i]), "mem"), arrays[i]) << "array " << i;
  }
}

TEST(Npy, WriterHeaderLayout) {
  const auto img = qkv::serialize_npy(make<float>(DType::f32, {2, 3}, {1, 2, 3, 4, 5, 6}));
  ASSERT_GE(img.size(), 10u);
  EXPECT_EQ(std::memcmp(img.data(), "\x93NUMPY\x01\x00", 8), 0);
  const std::size_t hlen = std::to_integer<std::size_t>(img[8]) | std::to_integer<std::size_t>(img[9]) << 8;
  EXPECT_EQ((10 + hlen) % 64, 0u);
  EXPECT_EQ(img.size(), 10 + hlen + 24);
  const std::string header(reinterpret_cast<const char*>(img.data() + 10), hlen);
  EXPECT_EQ(header.rfind("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }", 0), 0u);
  EXPECT_EQ(header.back(), '\n');
}

TEST(Npy, WriterUsesVersion2ForHugeHeaders) {
  // 22000 dimensions of 1 need a header longer than v1's 65535-byte limit.
  const NdArray a = make<float>(DType::f32, std::vector<std::int64_t>(22000, 1), {42.0f});
  const auto img = qkv::serialize_npy(a);
  EXPECT_EQ(std::to_integer<int>(img[6]), 2);
  EXPECT_EQ(qkv::parse_npy(img, "big.npy"), a);
}

TEST(Npy, Bf16IsWrittenAsTwoByteVoidsAndReadBack) {
  const NdArray a = make<std::uint16_t>(DType::bf16, {3}, {0x3F80, 0xC040, 0x7FC1});
  const std::vector<std::byte> img = qkv::serialize_npy(a);
  const std::string head(reinterpret_cast<const char*>(img.data()), 64);
  EXPECT_NE(head.find("'descr': '<V2'"), std::string::npos) << head;
  EXPECT_EQ(qkv::parse_npy(img, "b.npy"), a);
  // NumPy's own spelling of a plain 2-byte void is '|V2': the same bits.
  std::vector<std::byte> piped = img;
  const auto at = head.find("<V2");
  piped[at] = std::byte{'|'};
  EXPECT_EQ(qkv::parse_npy(piped, "b.npy"), a);
  // Other void sizes and a big-endian V2 are not bfloat16.
  std::vector<std::byte> big = img;
  big[at] = std::byte{'>'};
  EXPECT_IO_ERROR(qkv::parse_npy(big, "big.npy"), "big.npy", "unsupported dtype '>V2'");
}

TEST(Npy, WriterRejectsBadArrays) {
  TempDir dir("qkv_npy");
  NdArray bad = NdArray::zeros(DType::f32, {2, 3});
  bad.bytes.pop_back();
  EXPECT_IO_ERROR(qkv::write_npy(dir.path / "c.npy", bad), "c.npy", "needs 24 bytes", "has 23");
  EXPECT_IO_ERROR(qkv::serialize_npy(bad), "serialize_npy", "needs 24 bytes");
  EXPECT_FALSE(fs::exists(dir.path / "b.npy"));
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(Npy, WriteIntoMissingDirectoryThrowsAndLeavesNoFile) {
  TempDir dir("qkv_npy");
  const fs::path p = dir.path / "no_such_dir" / "x.npy";
  EXPECT_IO_ERROR(qkv::write_npy(p, NdArray::from_f32({1}, {1})), p.string(), "temporary file");
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(Npy, WriteReplacesExistingFileAndLeavesNoTemporaries) {
  TempDir dir("qkv_npy");
  const fs::path p = dir.path / "x.npy";
  qkv::write_npy(p, NdArray::from_f32({1, 2}, {2}));
  qkv::write_npy(p, NdArray::from_f32({3}, {}));
  EXPECT_EQ(qkv::read_npy(p).to_f32(), std::vector<float>{3});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

// --- hand-built fixtures -------------------------------------------------------------------------

TEST(Npy, ReadsVersion1) {
  const auto a = parse(npy_image(1, dict("<i4", "(3,)"), le_bytes<std::int32_t>({7, -8, 9})));
  EXPECT_EQ(a.dtype, DType::i32);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{3}));
  EXPECT_EQ(std::vector<std::int32_t>(a.as<std::int32_t>().begin(), a.as<std::int32_t>().end()),
            (std::vector<std::int32_t>{7, -8, 9}));
}

TEST(Npy, ReadsVersion2) {
  const auto a = parse(npy_image(2, dict("<f8", "(2,)"), le_bytes<double>({0.5, 1.5})));
  EXPECT_EQ(a.dtype, DType::f64);
  EXPECT_EQ(a.to_f32(), (std::vector<float>{0.5f, 1.5f}));
}

TEST(Npy, ReadsVersion3Utf8Header) {
  const auto a = parse(npy_image(3, dict("<f2", "(1, 2)"), le_bytes<std::uint16_t>({0x3C00, 0xC000})));
  EXPECT_EQ(a.dtype, DType::f16);
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{1, 2}));
  EXPECT_EQ(a.to_f32(), (std::vector<float>{1, -2}));
}

TEST(Npy, FortranOrderIsTransposedToCOrder) {
  // The C-order matrix [[1,2,3],[4,5,6]] stored column-major.
  const auto a = parse(npy_image(1, dict("<f4", "(2, 3)", true), le_bytes<float>({1, 4, 2, 5, 3, 6})));
  EXPECT_EQ(a.shape, (std::vector<std::int64_t>{2, 3}));
  EXPECT_EQ(a.to_f32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
}

TEST(Npy, FortranOrder3D) {
  // Element (i, j, k) of a (2, 3, 4) array holds 100i + 10j + k; Fortran order stores i fastest.
  std::vector<std::int32_t> fortran;
  for (int k = 0; k < 4; ++k)
    for (int j = 0; j < 3; ++j)
      for (int i = 0; i < 2; ++i) fortran.push_back(100 * i + 10 * j + k);
  const auto a = parse(npy_image(1, dict("<i4", "(2, 3, 4)", true), le_bytes(fortran)));
  const auto v = a.as<std::int32_t>();
  std::size_t n = 0;
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 3; ++j)
      for (int k = 0; k < 4; ++k) EXPECT_EQ(v[n++], 100 * i + 10 * j + k);
  // 1-D and empty Fortran arrays are the same as C order.
  EXPECT_EQ(parse(npy_image(1, dict("<i4", "(2,)", true), le_bytes<std::int32_t>({5, 6}))).as<std::int32_t>()[1], 6);
  EXPECT_EQ(parse(npy_image(1, dict("<i4", "(0, 3)", true), {})).numel(), 0);
}

TEST(Npy, BigEndianIsByteSwapped) {
  const auto f = parse(npy_image(1, dict(">f4", "(3,)"), be_bytes<float>({1.0f, -2.5f, 1e30f})));
  EXPECT_EQ(f.to_f32(), (std::vector<float>{1.0f, -2.5f, 1e30f}));
  const auto i = parse(npy_image(1, dict(">i8", "(2,)"), be_bytes<std::int64_t>({-2, 1LL << 50})));
  EXPECT_EQ(i.as<std::int64_t>()[0], -2);
  EXPECT_EQ(i.as<std::int64_t>()[1], 1LL << 50);
  const auto h = parse(npy_image(1, dict(">f2", "(1,)"), be_bytes<std::uint16_t>({0x3C00})));
  EXPECT_EQ(h.to_f32(), std::vector<float>{1});
  const auto b = parse(npy_image(1, dict(">b1", "(1,)"), {std::byte{1}}));
  EXPECT_TRUE(b.as<bool>()[0]);
  // Big-endian and Fortran order together.
  const auto m = parse(npy_image(1, dict(">i4", "(2, 2)", true), be_bytes<std::int32_t>({1, 3, 2, 4})));
  EXPECT_EQ(m.to_f32(), (std::vector<float>{1, 2, 3, 4}));
}

TEST(Npy, ScalarShape) {
  const auto a = parse(npy_image(1, dict("<f8", "()"), le_bytes<double>({3.5})));
  EXPECT_TRUE(a.shape.empty());
  EXPECT_EQ(a.numel(), 1);
  EXPECT_EQ(a.as<double>()[0], 3.5);
}

TEST(Npy, HeaderDictSyntaxVariants) {
  const auto one = le_bytes<float>({1});
  // Keys in another order, double quotes, no trailing comma, extra spaces, no padding at all.
  EXPECT_EQ(parse(npy_image(1, "{\"shape\": (1,), 'descr': \"<f4\", 'fortran_order': False}", one, false)).to_f32(),
            std::vector<float>{1});
  EXPECT_EQ(parse(npy_image(1, "  { 'fortran_order' : False , 'shape' : ( 1 , ) , 'descr' : '<f4' , }  \n", one, false))
                .numel(),
            1);
  // Python 2 long suffix, native byte order '=', trailing comma inside a 2-tuple.
  EXPECT_EQ(parse(npy_image(1, dict("=f4", "(1L, 1L,)"), one)).shape, (std::vector<std::int64_t>{1, 1}));
}

TEST(Npy, BooleansAreNormalised) {
  const auto b = parse(npy_image(1, dict("|b1", "(3,)"), {std::byte{0}, std::byte{2}, std::byte{255}}));
  EXPECT_EQ(b.bytes, (std::vector<std::byte>{std::byte{0}, std::byte{1}, std::byte{1}}));
}

// --- error paths: each names the file and the problem --------------------------------------------

TEST(NpyErrors, BadMagic) {
  auto img = npy_image(1, dict("<f4", "()"), le_bytes<float>({1}));
  img[1] = std::byte{'X'};
  EXPECT_IO_ERROR(parse(img), "fixture.npy", "bad magic");
}

TEST(NpyErrors, FileShorterThanMagic) {
  EXPECT_IO_ERROR(parse({std::byte{0x93}, std::byte{'N'}}), "fixture.npy", "bad magic");
  EXPECT_IO_ERROR(parse({}), "fixture.npy", "bad magic");
}

TEST(NpyErrors, UnsupportedVersion) {
  auto img = npy_image(1, dict("<f4", "()"), le_bytes<float>({1}));
  img[6] = std::byte{4};
  EXPECT_IO_ERROR(parse(img), "fixture.npy", "unsupported .npy format version 4.0");
  img[6] = std::byte{1};
  img[7] = std::byte{1};
  EXPECT_IO_ERROR(parse(img), "fixture.npy", "version 1.1");
  img[6] = std::byte{0};
  img[7] = std::byte{0};
  EXPECT_IO_ERROR(parse(img), "fixture.npy", "version 0.0");
}

TEST(NpyErrors, TruncatedHeaderLength) {
  auto img = npy_image(2, dict("<f4", "()"), {});
  img.resize(10);  // v2 needs 4 length bytes, only 2 present
  EXPECT_IO_ERROR(parse(img), "fixture.npy", "truncated header");
}

TEST(NpyErrors, TruncatedHeader) {
  auto img = npy_image(1, dict("<f4", "()"), {});
  img.resize(40);
  EXPECT_IO_ERROR(parse(img), "fixture.npy", "truncated header", "only 30 follow");
}

TEST(NpyErrors, MalformedDicts) {
  const auto one = le_bytes<float>({1});
  const char* cases[][2] = {
      {"['descr', '<f4']", "expected '{'"},
      {"{'descr': '<f4', 'fortran_order': False}", "missing key 'shape'"},
      {"{'descr': '<f4', 'shape': ()}", "missing key 'fortran_order'"},
      {"{'fortran_order': False, 'shape': ()}", "missing key 'descr'"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (), 'extra': 1}", "unexpected key 'extra'"},
      {"{'descr': '<f4', 'descr': '<f4', 'fortran_order': False, 'shape': ()}", "duplicate key 'descr'"},
      {"{'descr': '<f4' 'fortran_order': False, 'shape': ()}", "expected '}'"},
      {"{'descr': '<f4, 'fortran_order': False, 'shape': ()}", "expected '}'"},
      {"{'descr' '<f4', 'fortran_order': False, 'shape': ()}", "expected ':'"},
      {"{'descr': '<f4', 'fortran_order': false, 'shape': ()}", "expected True or False"},
      {"{'descr': '<f4', 'fortran_order': Falsey, 'shape': ()}", "expected True or False"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1)}", "trailing comma"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': [1]}", "expected '('"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (x,)}", "expected an integer"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': (1,)} x", "after the closing"},
      {"{'descr': '<\\x66\\x34', 'fortran_order': False, 'shape': ()}", "escape sequences"},
      {"{'descr': '<f4', 'fortran_order': False, 'shape': ()", "header ended"},
      {"{descr: '<f4'}", "expected a quoted string"},
      {"{'descr", "string"},  // unterminated (the padding newline is hit first)
  };
  for (const auto& [text, keyword] : cases)
    EXPECT_IO_ERROR(parse(npy_image(1, text, one)), "fixture.npy", "malformed header dict", keyword);
}

TEST(NpyErrors, UnsupportedDType) {
  const auto one = std::vector<std::byte>(16);
  for (const char* descr : {"|u1", "<u2", "<c8", "<f16", "f4", "|f4", "<U3", "<", "O", "<V4", "|V1"})
    EXPECT_IO_ERROR(parse(npy_image(1, dict(descr, "(1,)"), one)), "fixture.npy",
                    "unsupported dtype '" + std::string(descr) + "'");
  // Structured dtypes are a list of fields.
  EXPECT_IO_ERROR(parse(npy_image(1, "{'descr': [('a', '<f4')], 'fortran_order': False, 'shape': ()}", one)),
                  "fixture.npy", "unsupported dtype", "structured");
}

TEST(NpyErrors, DataShorterThanShape) {
  EXPECT_IO_ERROR(parse(npy_image(1, dict("<f4", "(2, 3)"), std::vector<std::byte>(20))), "fixture.npy",
                  "shape (2, 3) needs 24 bytes of f32 data, file has 20");
}

TEST(NpyErrors, DataLongerThanShape) {
  EXPECT_IO_ERROR(parse(npy_image(1, dict("<i8", "(2,)"), std::vector<std::byte>(17))), "fixture.npy",
                  "shape (2,) needs 16 bytes of i64 data, file has 17", "trailing");
}

TEST(NpyErrors, NegativeShape) {
  EXPECT_IO_ERROR(parse(npy_image(1, dict("<f4", "(2, -3)"), {})), "fixture.npy", "negative dimension -3");
}

TEST(NpyErrors, OverflowingShape) {
  // Each dimension fits in int64 but the byte count does not.
  EXPECT_IO_ERROR(parse(npy_image(1, dict("<f4", "(4294967296, 4294967296)"), {})), "fixture.npy", "too large");
  EXPECT_IO_ERROR(parse(npy_image(1, dict("<f8", "(2305843009213693952,)"), {})), "fixture.npy", "too large");
  EXPECT_IO_ERROR(parse(npy_image(1, dict("<f4", "(99999999999999999999,)"), {})), "fixture.npy", "too large");
}

TEST(NpyErrors, ReadMissingFile) {
  TempDir dir("qkv_npy");
  const fs::path p = dir.path / "absent.npy";
  EXPECT_IO_ERROR(qkv::read_npy(p), p.string(), "cannot open");
  EXPECT_IO_ERROR(qkv::read_npy(dir.path), dir.path.string(), "not a regular file");
}

TEST(NpyErrors, ReadFromDiskNamesThePath) {
  TempDir dir("qkv_npy");
  const fs::path p = dir.path / "short.npy";
  auto img = npy_image(1, dict("<f4", "(2, 3)"), std::vector<std::byte>(20));
  {
    FILE* f = std::fopen(p.c_str(), "wb");
    ASSERT_NE(f, nullptr);
    std::fwrite(img.data(), 1, img.size(), f);
    std::fclose(f);
  }
  EXPECT_IO_ERROR(qkv::read_npy(p), p.string(), "needs 24 bytes of f32 data, file has 20");
}

}  // namespace
