// Unit tests for the safetensors reader/writer (qkv/runtime/io/safetensors.hpp).
#include <qkv/runtime/io/safetensors.hpp>

#include <qkv/runtime/io/files.hpp>

#include <gtest/gtest.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "io_test_helpers.hpp"

namespace {

using namespace qkv::testing_io;
using qkv::DType;
using qkv::NdArray;
using qkv::SafetensorsFile;
namespace fs = std::filesystem;

template <class T>
NdArray make(DType t, std::vector<std::int64_t> shape, const std::vector<T>& values) {
  return NdArray{t, std::move(shape), le_bytes(values)};
}

// f32 values 0.5, 1.5, 2.5, … of shape [n].
NdArray ramp(std::int64_t n) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) + 0.5f;
  return NdArray::from_f32(v, {n});
}

// A hand-built safetensors image: 8-byte little-endian header length, header text, data section.
std::vector<std::byte> image(std::string_view header, const std::vector<std::byte>& data = {}) {
  std::vector<std::byte> out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<std::byte>((header.size() >> (8 * i)) & 0xFF));
  for (char c : header) out.push_back(static_cast<std::byte>(c));
  out.insert(out.end(), data.begin(), data.end());
  return out;
}

// The file `p` holding exactly `img`.
void write_bytes(const fs::path& p, const std::vector<std::byte>& img) {
  std::FILE* f = std::fopen(p.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(std::fwrite(img.data(), 1, img.size(), f), img.size());
  std::fclose(f);
}

// The whole file `p`, read as qkv reads its inputs.
std::vector<std::byte> read_bytes(const fs::path& p) { return qkv::InputFile::open(p).read_all(1u << 30, "a test"); }

constexpr const char* kName = "model.safetensors";

SafetensorsFile from(std::string_view header, std::size_t data_size = 64) {
  return SafetensorsFile::from_bytes(image(header, std::vector<std::byte>(data_size)), kName);
}

// One F32 tensor "t" of shape [2] at [0, 8] with `field` replaced by `value` (or removed if empty).
std::string entry_with(const std::string& field, const std::string& value) {
  std::string dtype = "\"dtype\":\"F32\"", shape = "\"shape\":[2]", offsets = "\"data_offsets\":[0,8]";
  std::string* target = field == "dtype" ? &dtype : field == "shape" ? &shape : &offsets;
  *target = value.empty() ? "" : "\"" + field + "\":" + value;
  std::string body;
  for (const std::string* part : {&dtype, &shape, &offsets})
    if (!part->empty()) body += (body.empty() ? "" : ",") + *part;
  return "{\"t\":{" + body + "}}";
}

std::map<std::string, NdArray> every_dtype() {
  return {
      {"f32", make<float>(DType::f32, {2, 3}, {1, 2, 3, 4, 5, -6.5f})},
      {"f64", make<double>(DType::f64, {3}, {1e-300, -2, 3.25})},
      {"f16", make<std::uint16_t>(DType::f16, {2, 2}, {0x3C00, 0xC000, 0x7C00, 0x0001})},
      {"bf16", make<std::uint16_t>(DType::bf16, {3}, {0x3F80, 0xC000, 0x7F80})},
      {"bool", make<std::uint8_t>(DType::boolean, {1, 3}, {1, 0, 1})},
      {"i32", make<std::int32_t>(DType::i32, {2}, {-1, std::numeric_limits<std::int32_t>::max()})},
      {"i64", make<std::int64_t>(DType::i64, {}, {std::numeric_limits<std::int64_t>::min()})},
      {"empty", make<float>(DType::f32, {0, 4}, {})},
  };
}

// --- round trips and layout ----------------------------------------------------------------------

TEST(Safetensors, RoundTripEveryDTypeThroughMmap) {
  TempDir dir("qkv_st");
  const auto tensors = every_dtype();
  const std::map<std::string, std::string> meta = {{"format", "pt"}, {"note", "\xC3\xA9t\xC3\xA9"}};
  const fs::path p = dir.path / "m.safetensors";
  qkv::write_safetensors(p, tensors, meta);
  const SafetensorsFile f = SafetensorsFile::open(p);
  EXPECT_EQ(f.what(), p.string());
  EXPECT_EQ(f.size(), tensors.size());
  EXPECT_EQ(f.metadata(), meta);
  for (const auto& [name, a] : tensors) {
    ASSERT_TRUE(f.contains(name)) << name;
    EXPECT_EQ(f.load(name), a) << name;
    const qkv::TensorView v = f.get(name);
    EXPECT_EQ(v.dtype, a.dtype);
    EXPECT_EQ(v.shape, a.shape);
    EXPECT_EQ(v.numel(), a.numel());
    EXPECT_TRUE(std::equal(v.data.begin(), v.data.end(), a.bytes.begin(), a.bytes.end())) << name;
  }
}

TEST(Safetensors, RoundTripInMemory) {
  const auto tensors = every_dtype();
  const SafetensorsFile f = SafetensorsFile::from_bytes(qkv::serialize_safetensors(tensors), "mem");
  EXPECT_TRUE(f.metadata().empty());
  for (const auto& [name, a] : tensors) EXPECT_EQ(f.load(name), a) << name;
}

TEST(Safetensors, NamesAreSorted) {
  const SafetensorsFile f = SafetensorsFile::from_bytes(qkv::serialize_safetensors(every_dtype()), "mem");
  EXPECT_EQ(f.names(), (std::vector<std::string>{"bf16", "bool", "empty", "f16", "f32", "f64", "i32", "i64"}));
  EXPECT_FALSE(f.contains("nope"));
  EXPECT_FALSE(f.contains("__metadata__"));
}

TEST(Safetensors, WriterLayoutIsPaddedAndAligned) {
  const auto img = qkv::serialize_safetensors(every_dtype(), {{"k", "v"}});
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::to_integer<std::uint64_t>(img[static_cast<std::size_t>(i)]) << (8 * i);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ((8 + n) % 64, 0u);  // the data section on a cache line
  const std::string header(reinterpret_cast<const char*>(img.data() + 8), n);
  EXPECT_EQ(header.front(), '{');
  EXPECT_NE(header.find("\"__metadata__\":{\"k\":\"v\"}"), std::string::npos);
  const std::size_t close = header.rfind('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);  // only spaces after '}'
  const SafetensorsFile f = SafetensorsFile::from_bytes(img, "mem");
  for (const std::string& name : f.names()) {
    const auto v = f.get(name);
    const auto offset = static_cast<std::size_t>(v.data.data() - img.data() - 8 - static_cast<std::ptrdiff_t>(n));
    EXPECT_EQ(offset % qkv::dtype_size(v.dtype), 0u) << name;
  }
}

// Within an item size, the tensors of a multiple of 64 bytes come first, so they start on cache
// lines (a reader can map them in place: SafetensorsFile::window); the first other one too.
TEST(Safetensors, WriterPutsWholeCacheLinesFirst) {
  const std::map<std::string, NdArray> t{
      {"a", ramp(3)}, {"b", ramp(16)}, {"c", ramp(5)}, {"d", ramp(48)}, {"h", NdArray::zeros(DType::f16, {32})}};
  const SafetensorsFile f = SafetensorsFile::from_bytes(qkv::serialize_safetensors(t), "mem");
  const std::byte* data = f.get("b").data.data();  // the first tensor: the data section's start
  auto offset = [&](const std::string& name) { return f.get(name).data.data() - data; };
  EXPECT_EQ(offset("b"), 0);
  EXPECT_EQ(offset("d"), 64);
  EXPECT_EQ(offset("a"), 64 + 192);
  EXPECT_EQ(offset("c"), 64 + 192 + 12);
  EXPECT_EQ(offset("h"), 64 + 192 + 12 + 20);  // smaller items after every f32
}

TEST(Safetensors, HandBuiltFixture) {
  // As written by the reference implementation: header padded with spaces.
  const auto data = le_bytes<float>({1, 2, 3, 4, 5, 6});
  auto img =
      image(R"({"__metadata__":{"format":"pt"},"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}    )", data);
  const SafetensorsFile f = SafetensorsFile::from_bytes(img, kName);
  EXPECT_EQ(f.names(), std::vector<std::string>{"w"});
  EXPECT_EQ(f.metadata().at("format"), "pt");
  EXPECT_EQ(f.load("w").to_f32(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(f.load("w").shape, (std::vector<std::int64_t>{2, 3}));
}

TEST(Safetensors, LoadAsConvertsAsItReadsLikeConvertingACopy) {
  // f32 at an odd byte offset (read by copies, not casts), with values that round: ties to even
  // in bf16 and f16, overflow to f16 infinity, subnormals, NaN and infinities; and other pairs
  // (bf16 → f32, i32 → f32) through load then convert.
  const std::vector<float> values = {1.0f,          1.00390625f, 1.01171875f, -3.14159f,
                                     65520.0f,      1e-41f,      -1e-45f,     std::numeric_limits<float>::infinity(),
                                     std::nanf(""), 0.1f,        -65504.0f,   3.0e38f};
  auto data = le_bytes<float>(values);
  data.insert(data.begin(), std::byte{0});                      // the tensor starts at offset 1
  data.insert(data.end(), {std::byte{0x80}, std::byte{0x3F}});  // a bf16 after it: 1.0
  const std::string header = R"({"w":{"dtype":"F32","shape":[3,4],"data_offsets":[1,49]},)"
                             R"("h":{"dtype":"BF16","shape":[1],"data_offsets":[49,51]}})";
  const auto f = SafetensorsFile::from_bytes(image(header, data), kName);
  for (const DType to : {DType::bf16, DType::f16, DType::f32}) {
    const qkv::NdArray got = f.load_as("w", to), want = f.load("w").converted(to);
    EXPECT_EQ(got.dtype, to);
    EXPECT_EQ(got.shape, want.shape);
    EXPECT_EQ(got.bytes, want.bytes) << qkv::dtype_name(to);
  }
  EXPECT_EQ(f.load_as("h", DType::f32).to_f32(), std::vector<float>{1.0f});
}

TEST(Safetensors, LoadAsThroughTheMappingInChunks) {
  // Past one 16 MB chunk (the mapping's pages released chunk by chunk), read back through mmap.
  TempDir dir("qkv_st");
  std::vector<float> values((std::size_t{4} << 20) + 3);
  for (std::size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  const fs::path p = dir.path / "big.safetensors";
  qkv::write_safetensors(p, {{"w", qkv::NdArray::from_f32(values, {static_cast<std::int64_t>(values.size())})}});
  const SafetensorsFile f = SafetensorsFile::open(p);
  const qkv::NdArray got = f.load_as("w", DType::bf16);
  EXPECT_EQ(got.bytes, f.load("w").converted(DType::bf16).bytes);
  EXPECT_EQ(got.to_f32()[values.size() - 1], qkv::bf16_to_f32(qkv::f32_to_bf16(values.back())));
}

TEST(Safetensors, EmptyFileScalarAndZeroSizedTensors) {
  EXPECT_EQ(from("{}", 0).size(), 0u);
  const auto f = SafetensorsFile::from_bytes(image(R"({"s":{"dtype":"I64","shape":[],"data_offsets":[0,8]},)"
                                                   R"("z":{"dtype":"F32","shape":[3,0],"data_offsets":[8,8]}})",
                                                   le_bytes<std::int64_t>({-5})),
                                             kName);
  EXPECT_EQ(f.load("s").as<std::int64_t>()[0], -5);
  EXPECT_EQ(f.load("z").numel(), 0);
}

TEST(Safetensors, GapsAndUnusedTailAreTolerated) {
  const auto f = from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,12]},"b":)"
                      R"({"dtype":"BOOL","shape":[1],"data_offsets":[0,1],"x":1}})",
                      32);
  EXPECT_EQ(f.size(), 2u);
}

TEST(Safetensors, BooleansAreNormalisedOnLoad) {
  const auto f = SafetensorsFile::from_bytes(
      image(R"({"b":{"dtype":"BOOL","shape":[3],"data_offsets":[0,3]}})", {std::byte{0}, std::byte{7}, std::byte{1}}),
      kName);
  EXPECT_EQ(f.get("b").data[1], std::byte{7});  // the view is raw
  EXPECT_EQ(f.load("b").bytes, (std::vector<std::byte>{std::byte{0}, std::byte{1}, std::byte{1}}));
}

TEST(Safetensors, MoveKeepsViewsValid) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "m.safetensors";
  qkv::write_safetensors(p, every_dtype());
  SafetensorsFile a = SafetensorsFile::open(p);
  const auto before = a.get("f32").data;
  SafetensorsFile b = std::move(a);
  EXPECT_EQ(b.get("f32").data.data(), before.data());
  SafetensorsFile c = SafetensorsFile::from_bytes(qkv::serialize_safetensors({}), "empty");
  c = std::move(b);
  EXPECT_EQ(c.load("f32"), every_dtype().at("f32"));
  SafetensorsFile d = SafetensorsFile::from_bytes(qkv::serialize_safetensors(every_dtype()), "mem");
  const auto* owned = d.get("i64").data.data();
  SafetensorsFile e = std::move(d);
  EXPECT_EQ(e.get("i64").data.data(), owned);
}

TEST(Safetensors, WriteReplacesAtomically) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "m.safetensors";
  qkv::write_safetensors(p, every_dtype());
  qkv::write_safetensors(p, {{"only", NdArray::from_f32({1}, {1})}});
  EXPECT_EQ(SafetensorsFile::open(p).names(), std::vector<std::string>{"only"});
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path), fs::directory_iterator()), 1);
}

// --- writer errors -------------------------------------------------------------------------------

TEST(SafetensorsWriteErrors, MissingDirectoryThrowsAndLeavesNoFile) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "missing" / "m.safetensors";
  EXPECT_IO_ERROR(qkv::write_safetensors(p, every_dtype()), p.string(), "temporary file");
  EXPECT_FALSE(fs::exists(p));
  EXPECT_TRUE(fs::is_empty(dir.path));
}

TEST(SafetensorsWriteErrors, BadArrays) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "m.safetensors";
  NdArray bad = NdArray::zeros(DType::f32, {2, 3});
  bad.bytes.resize(20);
  EXPECT_IO_ERROR(qkv::write_safetensors(p, {{"w", bad}}), p.string(), "tensor 'w'", "needs 24 bytes");
  EXPECT_IO_ERROR(qkv::write_safetensors(p, {{"__metadata__", NdArray::from_f32({1}, {1})}}), p.string(), "reserved");
  EXPECT_IO_ERROR(qkv::write_safetensors(p, {{"bad\xFF", NdArray::from_f32({1}, {1})}}), p.string(), "UTF-8");
  EXPECT_IO_ERROR(qkv::serialize_safetensors({}, {{"k", "\xC3"}}), "serialize_safetensors", "UTF-8");
  EXPECT_TRUE(fs::is_empty(dir.path));
}

// --- reader errors: each names the file and the problem ------------------------------------------

TEST(SafetensorsErrors, ShorterThan8Bytes) {
  EXPECT_IO_ERROR(SafetensorsFile::from_bytes(std::vector<std::byte>(5), kName), kName, "5 bytes", "too short");
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "tiny.safetensors";
  write_bytes(p, {});
  EXPECT_IO_ERROR(SafetensorsFile::open(p), p.string(), "0 bytes", "too short");
}

TEST(SafetensorsErrors, HeaderLengthBeyondFile) {
  auto img = image("{}");
  img[0] = std::byte{3};  // claims 3 bytes, file has 2 after the length
  EXPECT_IO_ERROR(SafetensorsFile::from_bytes(img, kName), kName, "header length 3 exceeds the file size");
}

TEST(SafetensorsErrors, HeaderLengthAboveLimit) {
  auto img = image("{}");
  const std::uint64_t n = 100'000'001;
  for (int i = 0; i < 8; ++i) img[static_cast<std::size_t>(i)] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  EXPECT_IO_ERROR(SafetensorsFile::from_bytes(img, kName), kName, "100 MB");
  img[7] = std::byte{0xFF};  // ~2^64: must not wrap around
  EXPECT_IO_ERROR(SafetensorsFile::from_bytes(img, kName), kName, "100 MB");
}

TEST(SafetensorsErrors, HeaderNotJson) {
  EXPECT_IO_ERROR(from("{\"a\":", 0), kName, "not valid JSON");
  EXPECT_IO_ERROR(from("{\"a\": 1} trailing", 0), kName, "not valid JSON");
  EXPECT_IO_ERROR(from("{\"\xFF\":{}}", 0), kName, "not valid JSON");
}

TEST(SafetensorsErrors, HeaderNotObject) {
  EXPECT_IO_ERROR(from("[1, 2]", 0), kName, "not a JSON object", "array");
  EXPECT_IO_ERROR(from("\"str\"", 0), kName, "not a JSON object");
}

TEST(SafetensorsErrors, EntryNotObject) {
  EXPECT_IO_ERROR(from(R"({"t": [1, 2]})"), kName, "tensor 't'", "not a JSON object");
}

TEST(SafetensorsErrors, MissingDType) {
  EXPECT_IO_ERROR(from(entry_with("dtype", "")), kName, "tensor 't'", "missing 'dtype'");
}

TEST(SafetensorsErrors, MissingShape) {
  EXPECT_IO_ERROR(from(entry_with("shape", "")), kName, "tensor 't'", "missing 'shape'");
}

TEST(SafetensorsErrors, MissingDataOffsets) {
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "")), kName, "tensor 't'", "missing 'data_offsets'");
}

TEST(SafetensorsErrors, DTypeWrongType) {
  EXPECT_IO_ERROR(from(entry_with("dtype", "7")), kName, "'dtype' is not a string");
}

TEST(SafetensorsErrors, ShapeWrongType) {
  EXPECT_IO_ERROR(from(entry_with("shape", "2")), kName, "'shape' is not an array");
  EXPECT_IO_ERROR(from(entry_with("shape", "[2.0]")), kName, "'shape' must contain integers");
  EXPECT_IO_ERROR(from(entry_with("shape", "[\"2\"]")), kName, "'shape' must contain integers");
}

TEST(SafetensorsErrors, DataOffsetsWrongType) {
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "{}")), kName, "'data_offsets' must be an array [begin, end]");
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[0]")), kName, "[begin, end]");
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[0, 4, 8]")), kName, "[begin, end]");
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[0, 8.5]")), kName, "'data_offsets' must contain integers");
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[-8, 0]")), kName, "'data_offsets' has negative value -8");
}

TEST(SafetensorsErrors, UnsupportedDType) {
  for (const char* t : {"U8", "I16", "F8_E4M3", "F8_E5M2", "U16", "XYZ", ""})
    EXPECT_IO_ERROR(from(entry_with("dtype", std::string("\"") + t + "\"")), kName, "tensor 't'",
                    "unsupported dtype '" + std::string(t) + "'");
}

TEST(SafetensorsErrors, NegativeShape) {
  EXPECT_IO_ERROR(from(entry_with("shape", "[2, -1]")), kName, "tensor 't'", "negative dimension -1");
}

TEST(SafetensorsErrors, OverflowingShape) {
  EXPECT_IO_ERROR(from(entry_with("shape", "[4294967296, 4294967296]")), kName, "tensor 't'", "too large");
  EXPECT_IO_ERROR(from(entry_with("shape", "[18446744073709551615]")), kName, "overflows int64");
}

TEST(SafetensorsErrors, BeginAfterEnd) {
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[8, 0]")), kName, "data_offsets [8, 0] has begin > end");
}

TEST(SafetensorsErrors, EndBeyondDataSection) {
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[60, 68]"), 64), kName, "tensor 't'",
                  "data_offsets [60, 68] end is beyond the data section (64 bytes)");
}

TEST(SafetensorsErrors, SizeMismatch) {
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[0, 12]")), kName, "tensor 't'",
                  "span 12 bytes but shape (2,) needs 8 bytes of F32");
}

TEST(SafetensorsErrors, OverlappingTensors) {
  EXPECT_IO_ERROR(from(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                       R"("b":{"dtype":"I32","shape":[2],"data_offsets":[8,16]}})"),
                  kName, "tensors 'a' [0, 16] and 'b' [8, 16] overlap");
  // Overlap with a tensor that is not the immediately preceding one.
  EXPECT_IO_ERROR(from(R"({"a":{"dtype":"F64","shape":[4],"data_offsets":[0,32]},)"
                       R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                       R"("c":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})"),
                  kName, "overlap");
}

TEST(SafetensorsErrors, DuplicateTensorNames) {
  EXPECT_IO_ERROR(from(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                       R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})"),
                  kName, "duplicate tensor name 'a'");
}

TEST(SafetensorsErrors, DuplicateKeysInsideAnEntry) {
  EXPECT_IO_ERROR(from(R"({"a":{"dtype":"F32","dtype":"I32","shape":[1],"data_offsets":[0,4]}})"), kName,
                  "duplicate key 'dtype'");
}

TEST(SafetensorsErrors, MetadataNotObject) {
  EXPECT_IO_ERROR(from(R"({"__metadata__":["a"]})"), kName, "__metadata__ must be an object");
}

TEST(SafetensorsErrors, MetadataValueNotString) {
  EXPECT_IO_ERROR(from(R"({"__metadata__":{"epoch":3}})"), kName, "__metadata__ value for 'epoch' must be a string");
}

TEST(SafetensorsErrors, DeeplyNestedHeaderDoesNotOverflowTheStack) {
  // Past 64 levels the header is refused before it is parsed (issue 28 item 2), wherever the nest is.
  const std::size_t depth = 200'000;
  const std::string nest = std::string(depth, '[') + std::string(depth, ']');
  const std::string deep = "header nests arrays or objects deeper than 64 levels";
  EXPECT_IO_ERROR(from(nest, 0), kName, deep + " (at byte 64)");
  EXPECT_IO_ERROR(from("{\"t\":" + nest + "}", 0), kName, deep);
  EXPECT_IO_ERROR(from(entry_with("shape", nest)), kName, deep);
  EXPECT_IO_ERROR(from("{\"__metadata__\":{\"k\":" + nest + "}}", 0), kName, deep);
  EXPECT_IO_ERROR(from("{\"k\":\"" + std::string(depth, '[') + "\"}", 0), kName, "entry is not a JSON object");
  // Within the limit, a nested value is named by its kind and size, never written out.
  const std::string shallow = "[[[[1, 2]]], 3]";
  EXPECT_IO_ERROR(from("{\"t\":" + shallow + "}", 0), kName, "tensor 't': entry is not a JSON object");
  EXPECT_IO_ERROR(from(entry_with("shape", shallow)), kName,
                  "'shape' must contain integers, found an array of 1 element(s)");
  EXPECT_IO_ERROR(from(entry_with("data_offsets", "[" + shallow + ", 8]")), kName, "found an array of 2 element(s)");
  EXPECT_IO_ERROR(from("{\"__metadata__\":{\"k\":" + shallow + "}}", 0), kName, "must be a string, not array");
}

TEST(SafetensorsErrors, NamesInMessagesAreBoundedAndEscaped) {
  // Issue 28 item 11: a 1 MB tensor name, and names with a NUL byte or a newline.
  const std::string huge(1 << 20, 'n');
  EXPECT_IO_ERROR(from("{\"" + huge + "\":[]}", 0), kName,
                  "tensor '" + std::string(80, 'n') + "'... (1048576 bytes): entry is not a JSON object");
  EXPECT_IO_ERROR(from(R"({"a\u0000b":[], "c":1})", 0), kName, "tensor 'a\\x00b': entry is not a JSON object");
  EXPECT_IO_ERROR(from(R"({"a\nb":[]})", 0), kName, "tensor 'a\\nb': entry is not a JSON object");
}

TEST(SafetensorsErrors, MissingTensor) {
  const auto f = SafetensorsFile::from_bytes(qkv::serialize_safetensors(every_dtype()), kName);
  EXPECT_IO_ERROR(f.get("nope"), kName, "no tensor named 'nope'");
  EXPECT_IO_ERROR(f.load("nope"), kName, "no tensor named 'nope'");
}

TEST(SafetensorsErrors, OpenMissingFileOrDirectory) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "absent.safetensors";
  EXPECT_IO_ERROR(SafetensorsFile::open(p), p.string(), "cannot open");
  EXPECT_IO_ERROR(SafetensorsFile::open(dir.path), dir.path.string(), "not a regular file");
}

TEST(SafetensorsErrors, OpenValidatesLikeFromBytes) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "bad.safetensors";
  write_bytes(p, image(entry_with("data_offsets", "[0, 12]"), std::vector<std::byte>(16)));
  EXPECT_IO_ERROR(SafetensorsFile::open(p), p.string(), "span 12 bytes");
}

// --- windows: a file's large tensors are mapped, not copied ------------------------------------

// A tensor of kWindowBytes or more is a window onto the file's mapping: it outlives the file object,
// a write to it stays in this process (the file and a later load keep the stored values), and a
// copy of it, or a resize, owns its bytes. Smaller tensors and booleans (normalised) are copies.
TEST(Safetensors, LargeTensorsAreWindowsThatOutliveTheFileAndNeverWriteIt) {
  TempDir dir("qkv_st");
  const fs::path p = dir.path / "m.safetensors";
  const auto n = static_cast<std::int64_t>(SafetensorsFile::kWindowBytes / 4);
  std::map<std::string, NdArray> t{{"big", ramp(n + 3)}, {"small", ramp(n - 1)}};
  t["flags"] = NdArray::zeros(DType::boolean, {n * 4});
  t["flags"].bytes[7] = std::byte{1};
  qkv::write_safetensors(p, t);
  const std::vector<std::byte> stored = read_bytes(p);
  NdArray big;
  {
    const SafetensorsFile f = SafetensorsFile::open(p);
    big = f.load("big");
    EXPECT_TRUE(big.bytes.is_window());
    EXPECT_FALSE(f.load("small").bytes.is_window());
    EXPECT_EQ(f.load("small"), t["small"]);
    const NdArray flags = f.load("flags");
    EXPECT_FALSE(flags.bytes.is_window());
    EXPECT_EQ(flags, t["flags"]);
  }  // the file object (its mapping and descriptor) is gone; the window is not
  EXPECT_EQ(big, t["big"]);
  big.as<float>()[0] = -1.0f;
  big.as<float>()[static_cast<std::size_t>(n + 2)] = -2.0f;
  EXPECT_EQ(read_bytes(p), stored);
  {
    const SafetensorsFile f = SafetensorsFile::open(p);
    std::optional<NdArray> first = f.load("big");
    first->as<float>()[0] = -3.0f;
    const NdArray second = f.load("big");  // loaded before: a copy, of the file's values
    EXPECT_FALSE(second.bytes.is_window());
    EXPECT_EQ(second, t["big"]);
    first.reset();
    const NdArray third = f.load("big");
    EXPECT_FALSE(third.bytes.is_window());
    EXPECT_EQ(third, t["big"]);
  }
  NdArray copy = big;
  EXPECT_FALSE(copy.bytes.is_window());
  EXPECT_EQ(copy, big);
  copy.as<float>()[1] = 7.0f;
  EXPECT_EQ(big.as<float>()[1], 1.5f);
  big.bytes.resize(8);
  EXPECT_FALSE(big.bytes.is_window());
  EXPECT_EQ(big.bytes.size(), 8u);
  EXPECT_EQ(big.as<float>()[0], -1.0f);
  EXPECT_EQ(big.as<float>()[1], 1.5f);
}

// A tensor whose bytes do not start on a multiple of its item size in the file (another writer's)
// is copied; one that does is a window; a file opened without windows copies every tensor.
TEST(Safetensors, TensorsOffTheirItemSizeAreCopied) {
  TempDir dir("qkv_st");
  const auto n = static_cast<std::int64_t>(SafetensorsFile::kWindowBytes / 4);
  const NdArray a = ramp(n);
  for (const std::int64_t shift : {2, 4, 6, 8, 64}) {
    const fs::path p = dir.path / ("shift" + std::to_string(shift) + ".safetensors");
    std::vector<std::byte> data(static_cast<std::size_t>(shift));
    data.insert(data.end(), a.bytes.begin(), a.bytes.end());
    const std::string offsets = std::to_string(shift) + "," + std::to_string(shift + 4 * n);
    std::string header =
        "{\"t\":{\"dtype\":\"F32\",\"shape\":[" + std::to_string(n) + "],\"data_offsets\":[" + offsets + "]}}";
    header.resize((8 + header.size() + 7) / 8 * 8 - 8, ' ');  // the data section on 8 bytes
    write_bytes(p, image(header, data));
    const NdArray got = SafetensorsFile::open(p).load("t");
    EXPECT_EQ(got, a) << shift;
    EXPECT_EQ(got.bytes.is_window(), shift % 4 == 0) << shift;
    const NdArray copied = SafetensorsFile::open(p, /*windows=*/false).load("t");
    EXPECT_EQ(copied, a) << shift;
    EXPECT_FALSE(copied.bytes.is_window()) << shift;
  }
}

}  // namespace
