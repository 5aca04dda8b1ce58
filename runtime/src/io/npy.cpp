// npy.cpp — .npy reading/writing (see qkv/runtime/io/npy.hpp for the accepted subset).
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/quote.hpp>

#include <qkv/runtime/io/files.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <string>

namespace qkv {
namespace {

[[noreturn]] void fail(std::string_view what, const std::string& problem) {
  throw IoError(std::string(what) + ": " + problem);
}

constexpr unsigned char kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
constexpr std::size_t kAlign = 64;  // numpy aligns the data start to 64 bytes

struct Header {
  std::string descr;
  bool fortran_order = false;
  std::vector<std::int64_t> shape;
};

// Strict parser of the header dict, e.g. "{'descr': '<f4', 'fortran_order': False, 'shape': (2,
// 3), }" followed by padding spaces and '\n'. Errors say "malformed header dict" and the offset.
class DictParser {
 public:
  DictParser(std::string_view text, std::string_view what) : s_(text), what_(what) {}

  Header parse() {
    Header h;
    bool seen_descr = false, seen_fortran = false, seen_shape = false;
    skip_ws();
    expect('{');
    skip_ws();
    while (!eat('}')) {
      const std::string key = string_literal();
      skip_ws();
      expect(':');
      skip_ws();
      auto once = [&](bool& seen) {
        if (seen) error("duplicate key " + quote_text(key));
        seen = true;
      };
      if (key == "descr") {
        once(seen_descr);
        if (peek() == '[') fail(what_, "unsupported dtype: structured (record) arrays are not supported");
        h.descr = string_literal();
      } else if (key == "fortran_order") {
        once(seen_fortran);
        h.fortran_order = boolean_literal();
      } else if (key == "shape") {
        once(seen_shape);
        h.shape = shape_tuple();
      } else {
        error("unexpected key " + quote_text(key));
      }
      skip_ws();
      if (eat(',')) {  // another entry or the closing brace (trailing comma)
        skip_ws();
        continue;
      }
      expect('}');
      break;
    }
    skip_ws();
    if (i_ != s_.size()) error("unexpected characters after the closing '}'");
    if (!seen_descr) error("missing key 'descr'");
    if (!seen_fortran) error("missing key 'fortran_order'");
    if (!seen_shape) error("missing key 'shape'");
    return h;
  }

 private:
  [[noreturn]] void error(const std::string& msg) const {
    fail(what_, "malformed header dict: " + msg + " (at header offset " + std::to_string(i_) + ")");
  }
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  bool at_end() const { return i_ >= s_.size(); }
  void skip_ws() {
    while (!at_end() && (s_[i_] == ' ' || s_[i_] == '\n' || s_[i_] == '\t' || s_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    if (!at_end() && s_[i_] == c) {
      ++i_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (at_end()) error(std::string("expected '") + c + "' but the header ended");
    if (!eat(c)) error(std::string("expected '") + c + "'");
  }

  // 'text' or "text"; no escape sequences (numpy's keys and descrs never need them).
  std::string string_literal() {
    if (at_end() || (s_[i_] != '\'' && s_[i_] != '"')) error("expected a quoted string");
    const char quote = s_[i_++];
    std::string out;
    while (true) {
      if (at_end()) error("unterminated string");
      const char c = s_[i_++];
      if (c == quote) return out;
      if (c == '\\') error("escape sequences in strings are not supported");
      if (c == '\n') error("newline inside a string");
      out += c;
    }
  }

  bool boolean_literal() {
    auto word = [&](std::string_view w) {
      if (s_.substr(i_, w.size()) != w) return false;
      const std::size_t j = i_ + w.size();
      if (j < s_.size() && (std::isalnum(static_cast<unsigned char>(s_[j])) || s_[j] == '_')) return false;
      i_ = j;
      return true;
    };
    if (word("True")) return true;
    if (word("False")) return false;
    error("expected True or False");
  }

  // A non-negative integer, optionally with Python 2's 'L' suffix.
  std::int64_t dimension() {
    if (peek() == '-') {
      std::string digits = "-";
      for (++i_; std::isdigit(static_cast<unsigned char>(peek())) && digits.size() < 24;) digits += s_[i_++];
      fail(what_, "negative dimension " + digits + " in shape");
    }
    if (!std::isdigit(static_cast<unsigned char>(peek()))) error("expected an integer");
    std::int64_t v = 0;
    while (std::isdigit(static_cast<unsigned char>(peek()))) {
      const int digit = s_[i_++] - '0';
      if (v > (std::numeric_limits<std::int64_t>::max() - digit) / 10)
        fail(what_, "shape dimension too large (overflows int64)");
      v = v * 10 + digit;
    }
    if (peek() == 'L' || peek() == 'l') ++i_;
    return v;
  }

  // "()", "(n,)", "(a, b)", "(a, b,)".
  std::vector<std::int64_t> shape_tuple() {
    expect('(');
    skip_ws();
    std::vector<std::int64_t> dims;
    if (eat(')')) return dims;
    while (true) {
      dims.push_back(dimension());
      skip_ws();
      if (eat(',')) {
        skip_ws();
        if (eat(')')) return dims;
        continue;
      }
      if (dims.size() == 1 && peek() == ')') error("a 1-element shape tuple needs a trailing comma, e.g. (3,)");
      expect(')');
      return dims;
    }
  }

  std::string_view s_;
  std::string_view what_;
  std::size_t i_ = 0;
};

struct Descr {
  DType dtype;
  bool big_endian;
};

[[noreturn]] void unsupported_dtype(const std::string& descr, std::string_view what) {
  fail(what, "unsupported dtype " + quote_text(descr) +
                 " (supported: <f4 <f8 <f2 |b1 <i4 <i8 and their big-endian variants, <V2 for bfloat16)");
}

// '<f4' etc. → dtype and byte order. One-byte types accept any byte-order character.
Descr parse_descr(const std::string& descr, std::string_view what) {
  if (descr.size() < 2) unsupported_dtype(descr, what);
  const char order = descr[0];
  const std::string code = descr.substr(1);
  DType t;
  if (code == "f4")
    t = DType::f32;
  else if (code == "f8")
    t = DType::f64;
  else if (code == "f2")
    t = DType::f16;
  else if (code == "b1")
    t = DType::boolean;
  else if (code == "i4")
    t = DType::i32;
  else if (code == "i8")
    t = DType::i64;
  else if (code == "i1")
    t = DType::i8;
  else if (code == "V2" && (order == '<' || order == '|'))  // bfloat16 bits (ml_dtypes' descr), see write_npy
    return {DType::bf16, false};
  else
    unsupported_dtype(descr, what);
  const bool single_byte = dtype_size(t) == 1;
  if (order == '<' || order == '=') return {t, false};
  if (order == '>') return {t, !single_byte};
  if (order == '|' && single_byte) return {t, false};
  unsupported_dtype(descr, what);
}

std::uint32_t read_le(const std::byte* p, std::size_t n) {
  std::uint32_t v = 0;
  for (std::size_t i = 0; i < n; ++i) v |= std::to_integer<std::uint32_t>(p[i]) << (8 * i);
  return v;
}

// Column-major → row-major copy of `n` elements of `isz` bytes each.
std::vector<std::byte> fortran_to_c(std::span<const std::byte> src, const std::vector<std::int64_t>& shape,
                                    std::size_t isz, std::int64_t n) {
  std::vector<std::byte> dst(src.size());
  const std::size_t nd = shape.size();
  std::vector<std::int64_t> fstride(nd);  // Fortran strides in elements: first index fastest
  std::int64_t s = 1;
  for (std::size_t k = 0; k < nd; ++k) {
    fstride[k] = s;
    s *= shape[k];
  }
  std::vector<std::int64_t> idx(nd, 0);  // C-order odometer, last index fastest
  std::int64_t from = 0;
  for (std::int64_t to = 0; to < n; ++to) {
    std::memcpy(dst.data() + static_cast<std::size_t>(to) * isz, src.data() + static_cast<std::size_t>(from) * isz,
                isz);
    for (std::size_t k = nd; k-- > 0;) {
      from += fstride[k];
      if (++idx[k] < shape[k]) break;
      from -= fstride[k] * shape[k];
      idx[k] = 0;
    }
  }
  return dst;
}

// The magic, the version and the header length, checked against the size of the whole file
// (`total`); `first` holds the file's first min(total, 12) bytes. Returns the offset of the dict.
struct Prefix {
  std::size_t dict_offset = 0, dict_len = 0;
  [[nodiscard]] std::size_t data_offset() const { return dict_offset + dict_len; }
};

constexpr std::size_t kMaxHeader = 16u << 20;  // numpy's own headers are a few KB at most

Prefix parse_prefix(std::span<const std::byte> first, std::uint64_t total, std::string_view what) {
  if (first.size() < 8 || std::memcmp(first.data(), kMagic, sizeof kMagic) != 0)
    fail(what, "bad magic: not an .npy file (expected \\x93NUMPY)");
  const unsigned major = std::to_integer<unsigned>(first[6]);
  const unsigned minor = std::to_integer<unsigned>(first[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(what, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (supported: 1.0, 2.0, 3.0)");
  const std::size_t len_size = major == 1 ? 2 : 4;
  Prefix p;
  p.dict_offset = 8 + len_size;
  if (total < p.dict_offset || first.size() < p.dict_offset)
    fail(what, "truncated header: file ends inside the header length");
  p.dict_len = read_le(first.data() + 8, len_size);
  if (total - p.dict_offset < p.dict_len)
    fail(what, "truncated header: header length is " + std::to_string(p.dict_len) + " bytes but only " +
                   std::to_string(total - p.dict_offset) + " follow");
  if (p.dict_len > kMaxHeader) fail(what, "header length " + std::to_string(p.dict_len) + " exceeds the 16 MiB limit");
  return p;
}

// Everything the header says, checked against the size of the data that follows it.
struct Layout {
  Header header;
  Descr descr;
  std::size_t data_offset = 0, nbytes = 0;
};

Layout parse_layout(const Prefix& p, std::span<const std::byte> dict, std::uint64_t total, std::string_view what) {
  // Versions 1.0/2.0 are latin-1 and 3.0 is UTF-8; both agree on the ASCII the parser accepts
  // outside strings, and strings are compared byte-wise against ASCII descrs, so no decoding.
  const std::string_view text(reinterpret_cast<const char*>(dict.data()), dict.size());
  Layout l{DictParser(text, what).parse(), {}, p.data_offset(), 0};
  l.descr = parse_descr(l.header.descr, what);
  l.nbytes = checked_nbytes(l.header.shape, l.descr.dtype, what);
  const std::uint64_t payload = total - l.data_offset;
  if (payload != l.nbytes)
    fail(what, "shape " + shape_to_string(l.header.shape) + " needs " + std::to_string(l.nbytes) + " bytes of " +
                   std::string(dtype_name(l.descr.dtype)) + " data, file has " + std::to_string(payload) +
                   (payload < l.nbytes ? " (truncated data)" : " (trailing data)"));
  return l;
}

// The array from its raw payload: C order, native byte order, booleans 0/1.
NdArray decode(const Layout& l, std::vector<std::byte> payload) {
  NdArray a;
  a.dtype = l.descr.dtype;
  a.shape = l.header.shape;
  const std::size_t isz = dtype_size(a.dtype);
  if (l.header.fortran_order && a.shape.size() > 1)
    a.bytes = fortran_to_c(payload, a.shape, isz, a.numel());
  else
    a.bytes = std::move(payload);
  if (l.descr.big_endian)
    for (std::size_t off = 0; off < a.bytes.size(); off += isz)
      std::reverse(a.bytes.begin() + static_cast<std::ptrdiff_t>(off),
                   a.bytes.begin() + static_cast<std::ptrdiff_t>(off + isz));
  if (a.dtype == DType::boolean)
    for (std::byte& b : a.bytes) b = b != std::byte{0} ? std::byte{1} : std::byte{0};
  return a;
}

// The header of an open file, read before any of its data.
Layout read_layout(const InputFile& f) {
  std::array<std::byte, 12> first{};
  const auto head = std::span(first).first(static_cast<std::size_t>(std::min<std::uint64_t>(f.size(), first.size())));
  f.read_at(0, head);
  const Prefix p = parse_prefix(head, f.size(), f.what());
  std::vector<std::byte> dict(p.dict_len);
  f.read_at(p.dict_offset, dict);
  return parse_layout(p, dict, f.size(), f.what());
}

}  // namespace

NdArray parse_npy(std::span<const std::byte> data, std::string_view what) {
  const Prefix p = parse_prefix(data.first(std::min<std::size_t>(data.size(), 12)), data.size(), what);
  const Layout l = parse_layout(p, data.subspan(p.dict_offset, p.dict_len), data.size(), what);
  const auto payload = data.subspan(l.data_offset);
  return decode(l, std::vector<std::byte>(payload.begin(), payload.end()));
}

NpyInfo read_npy_info(const std::filesystem::path& path) {
  const Layout l = read_layout(InputFile::open(path));
  return {l.descr.dtype, l.header.shape, l.nbytes};
}

NdArray read_npy(const std::filesystem::path& path) {
  const InputFile f = InputFile::open(path);
  const Layout l = read_layout(f);
  std::vector<std::byte> payload(l.nbytes);  // the header has been checked against the file size
  f.read_at(l.data_offset, payload);
  return decode(l, std::move(payload));
}

namespace {
std::string_view descr_of(DType t, std::string_view what) {
  switch (t) {
    case DType::f32:
      return "<f4";
    case DType::f64:
      return "<f8";
    case DType::f16:
      return "<f2";
    case DType::boolean:
      return "|b1";
    case DType::i32:
      return "<i4";
    case DType::i64:
      return "<i8";
    case DType::i8:
      return "|i1";
    case DType::bf16:
      return "<V2";  // NumPy has no bfloat16: its bits as 2-byte voids, as ml_dtypes' bfloat16 saves
  }
  fail(what, "unsupported dtype");
}

std::vector<std::byte> header_impl(const NdArray& array, std::string_view what) {
  const std::string_view descr = descr_of(array.dtype, what);
  const std::size_t need = checked_nbytes(array.shape, array.dtype, what);
  if (array.bytes.size() != need)
    fail(what, "shape " + shape_to_string(array.shape) + " needs " + std::to_string(need) + " bytes of " +
                   std::string(dtype_name(array.dtype)) + " data, array has " + std::to_string(array.bytes.size()));

  const std::string dict = "{'descr': '" + std::string(descr) +
                           "', 'fortran_order': False, 'shape': " + shape_to_string(array.shape) + ", }";
  // Version 1.0 stores the header length in 2 bytes; fall back to 2.0 (4 bytes) if needed.
  unsigned major = 1;
  std::size_t prefix = 10;
  auto padded_len = [&] { return (prefix + dict.size() + 1 + kAlign - 1) / kAlign * kAlign - prefix; };
  if (padded_len() > 0xFFFF) {
    major = 2;
    prefix = 12;
  }
  const std::size_t header_len = padded_len();

  std::vector<std::byte> out;
  out.reserve(prefix + header_len);
  for (unsigned char c : kMagic) out.push_back(std::byte{c});
  out.push_back(static_cast<std::byte>(major));
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<std::byte>((header_len >> (8 * i)) & 0xFF));
  for (char c : dict) out.push_back(static_cast<std::byte>(c));
  out.resize(prefix + header_len - 1, std::byte{' '});
  out.push_back(std::byte{'\n'});
  return out;
}
}  // namespace

std::vector<std::byte> npy_header(const NdArray& array) { return header_impl(array, "npy_header"); }

std::vector<std::byte> serialize_npy(const NdArray& array) {
  std::vector<std::byte> out = header_impl(array, "serialize_npy");
  out.insert(out.end(), array.bytes.begin(), array.bytes.end());
  return out;
}

void write_npy(const std::filesystem::path& path, const NdArray& array) {
  const std::vector<std::byte> header = header_impl(array, path.string());
  OutputGroup group;
  const std::size_t i = group.add_file(path);
  group.write(i, {header, array.bytes});
  group.commit();
}

}  // namespace qkv
