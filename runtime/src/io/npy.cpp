// npy.cpp — .npy reading/writing (see qkv/runtime/io/npy.hpp for the accepted subset), plus the
// shared write_file_atomic helper.
#include <qkv/runtime/io/npy.hpp>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <random>
#include <string>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

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
        if (seen) error("duplicate key '" + key + "'");
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
        error("unexpected key '" + key + "'");
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
  fail(what, "unsupported dtype '" + descr + "' (supported: <f4 <f8 <f2 |b1 <i4 <i8 and their big-endian variants)");
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

std::string read_whole_file(const std::filesystem::path& path, std::vector<std::byte>& out) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::string("cannot open: ") + std::strerror(errno);
  struct stat st{};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return "not a regular file";
  }
  out.resize(static_cast<std::size_t>(st.st_size));
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      const int e = errno;
      ::close(fd);
      return std::string("read failed: ") + std::strerror(e);
    }
    if (r == 0) break;  // shrank while reading: parse what we got
    got += static_cast<std::size_t>(r);
  }
  out.resize(got);
  ::close(fd);
  return {};
}

}  // namespace

NdArray parse_npy(std::span<const std::byte> data, std::string_view what) {
  if (data.size() < 8 || std::memcmp(data.data(), kMagic, sizeof kMagic) != 0)
    fail(what, "bad magic: not an .npy file (expected \\x93NUMPY)");
  const unsigned major = std::to_integer<unsigned>(data[6]);
  const unsigned minor = std::to_integer<unsigned>(data[7]);
  if (major < 1 || major > 3 || minor != 0)
    fail(what, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " (supported: 1.0, 2.0, 3.0)");
  const std::size_t len_size = major == 1 ? 2 : 4;
  const std::size_t prefix = 8 + len_size;
  if (data.size() < prefix) fail(what, "truncated header: file ends inside the header length");
  const std::size_t header_len = read_le(data.data() + 8, len_size);
  if (data.size() - prefix < header_len)
    fail(what, "truncated header: header length is " + std::to_string(header_len) + " bytes but only " +
                   std::to_string(data.size() - prefix) + " follow");
  // Versions 1.0/2.0 are latin-1 and 3.0 is UTF-8; both agree on the ASCII the parser accepts
  // outside strings, and strings are compared byte-wise against ASCII descrs, so no decoding.
  const std::string_view text(reinterpret_cast<const char*>(data.data() + prefix), header_len);
  const Header h = DictParser(text, what).parse();
  const Descr d = parse_descr(h.descr, what);

  const std::size_t isz = dtype_size(d.dtype);
  const std::size_t need = checked_nbytes(h.shape, d.dtype, what);
  const std::span<const std::byte> payload = data.subspan(prefix + header_len);
  if (payload.size() != need)
    fail(what, "shape " + shape_to_string(h.shape) + " needs " + std::to_string(need) + " bytes of " +
                   std::string(dtype_name(d.dtype)) + " data, file has " + std::to_string(payload.size()) +
                   (payload.size() < need ? " (truncated data)" : " (trailing data)"));

  NdArray a;
  a.dtype = d.dtype;
  a.shape = h.shape;
  const std::int64_t n = a.numel();
  if (h.fortran_order && a.shape.size() > 1)
    a.bytes = fortran_to_c(payload, a.shape, isz, n);
  else
    a.bytes.assign(payload.begin(), payload.end());
  if (d.big_endian)
    for (std::size_t off = 0; off < a.bytes.size(); off += isz)
      std::reverse(a.bytes.begin() + static_cast<std::ptrdiff_t>(off),
                   a.bytes.begin() + static_cast<std::ptrdiff_t>(off + isz));
  if (a.dtype == DType::boolean)
    for (std::byte& b : a.bytes) b = b != std::byte{0} ? std::byte{1} : std::byte{0};
  return a;
}

NdArray read_npy(const std::filesystem::path& path) {
  std::vector<std::byte> data;
  if (std::string err = read_whole_file(path, data); !err.empty()) fail(path.string(), err);
  return parse_npy(data, path.string());
}

namespace {
std::vector<std::byte> serialize_impl(const NdArray& array, std::string_view what) {
  std::string descr;
  switch (array.dtype) {
    case DType::f32:
      descr = "<f4";
      break;
    case DType::f64:
      descr = "<f8";
      break;
    case DType::f16:
      descr = "<f2";
      break;
    case DType::boolean:
      descr = "|b1";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    case DType::bf16:
      fail(what, "unsupported dtype bf16: the .npy format has no bfloat16 (convert with to_f32())");
  }
  const std::size_t need = checked_nbytes(array.shape, array.dtype, what);
  if (array.bytes.size() != need)
    fail(what, "shape " + shape_to_string(array.shape) + " needs " + std::to_string(need) + " bytes of " +
                   std::string(dtype_name(array.dtype)) + " data, array has " + std::to_string(array.bytes.size()));

  const std::string dict =
      "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape_to_string(array.shape) + ", }";
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
  out.reserve(prefix + header_len + need);
  for (unsigned char c : kMagic) out.push_back(std::byte{c});
  out.push_back(static_cast<std::byte>(major));
  out.push_back(std::byte{0});
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<std::byte>((header_len >> (8 * i)) & 0xFF));
  for (char c : dict) out.push_back(static_cast<std::byte>(c));
  out.resize(prefix + header_len - 1, std::byte{' '});
  out.push_back(std::byte{'\n'});
  out.insert(out.end(), array.bytes.begin(), array.bytes.end());
  return out;
}
}  // namespace

std::vector<std::byte> serialize_npy(const NdArray& array) { return serialize_impl(array, "serialize_npy"); }

void write_npy(const std::filesystem::path& path, const NdArray& array) {
  write_file_atomic(path, serialize_impl(array, path.string()));
}

void write_file_atomic(const std::filesystem::path& path, std::span<const std::byte> data) {
  const std::string what = path.string();
  if (!path.has_filename()) fail(what, "cannot write: path has no file name");
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : ".";

  // O_EXCL on a random name rather than mkstemp, so the final file gets the usual 0666 & ~umask.
  static std::atomic<unsigned> counter{0};
  std::random_device rd;
  std::string tmp;
  int fd = -1;
  for (int attempt = 0; attempt < 16 && fd < 0; ++attempt) {
    tmp = (dir / ("." + path.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                  std::to_string(counter++) + "." + std::to_string(rd())))
              .string();
    fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
    if (fd < 0 && errno != EEXIST) break;
  }
  if (fd < 0) fail(what, "cannot create a temporary file in '" + dir.string() + "': " + std::strerror(errno));

  auto abandon = [&](const std::string& problem) {
    const int e = errno;
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    fail(what, problem + ": " + std::strerror(e));
  };
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t w = ::write(fd, data.data() + done, data.size() - done);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) abandon("write failed");
    done += static_cast<std::size_t>(w);
  }
  if (::fsync(fd) != 0) abandon("fsync failed");
  const int rc = ::close(fd);
  fd = -1;
  if (rc != 0) abandon("close failed");
  if (::rename(tmp.c_str(), path.c_str()) != 0) abandon("rename failed");
}

}  // namespace qkv
