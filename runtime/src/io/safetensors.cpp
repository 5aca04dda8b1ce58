// safetensors.cpp — reading (mmap or in-memory) and writing of safetensors files; see
// qkv/runtime/io/safetensors.hpp for the format and the validation performed.
#include <qkv/runtime/io/safetensors.hpp>

#include <nlohmann/json.hpp>

#include <qkv/runtime/io/files.hpp>
#include <qkv/runtime/io/quote.hpp>

#include "json_text.hpp"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <unordered_set>
#include <utility>

#include <sys/mman.h>

namespace qkv {
namespace {

using nlohmann::json;

constexpr std::uint64_t kMaxHeader = 100'000'000;  // same limit as the reference implementation

[[noreturn]] void fail(std::string_view what, const std::string& problem) {
  throw IoError(std::string(what) + ": " + problem);
}

// safetensors dtype names of the supported types.
constexpr std::pair<std::string_view, DType> kDTypes[] = {
    {"F32", DType::f32},      {"F64", DType::f64}, {"F16", DType::f16}, {"BF16", DType::bf16},
    {"BOOL", DType::boolean}, {"I32", DType::i32}, {"I64", DType::i64}, {"I8", DType::i8},
};

std::optional<DType> dtype_from_name(std::string_view s) {
  for (const auto& [name, t] : kDTypes)
    if (name == s) return t;
  return std::nullopt;
}

std::string_view name_of(DType t) {
  for (const auto& [name, u] : kDTypes)
    if (u == t) return name;
  return "?";
}

// nlohmann's DOM parser with a check for duplicate keys in every object (nlohmann itself would
// silently keep the last one), in time linear in the number of keys: one hash set per open
// object. (Its callback parser rescans the parent object after every child object: quadratic.)
class DuplicateCheckingSax {
 public:
  explicit DuplicateCheckingSax(json& result) : dom_(result, true) {}
  std::optional<std::string> duplicate;
  std::size_t duplicate_depth = 0;  // 1: the top-level object, so a duplicate tensor name

  bool null() { return dom_.null(); }
  bool boolean(bool v) { return dom_.boolean(v); }
  bool number_integer(json::number_integer_t v) { return dom_.number_integer(v); }
  bool number_unsigned(json::number_unsigned_t v) { return dom_.number_unsigned(v); }
  bool number_float(json::number_float_t v, const json::string_t& s) { return dom_.number_float(v, s); }
  bool string(json::string_t& v) { return dom_.string(v); }
  bool binary(json::binary_t& v) { return dom_.binary(v); }
  bool start_object(std::size_t n) {
    keys_.emplace_back();
    return dom_.start_object(n);
  }
  bool key(json::string_t& k) {
    if (!keys_.back().insert(k).second) {
      duplicate = k;
      duplicate_depth = keys_.size();
      return false;  // stops the parse
    }
    return dom_.key(k);
  }
  bool end_object() {
    keys_.pop_back();
    return dom_.end_object();
  }
  bool start_array(std::size_t n) { return dom_.start_array(n); }
  bool end_array() { return dom_.end_array(); }
  template <class Exception>
  bool parse_error(std::size_t position, const std::string& token, const Exception& e) {
    return dom_.parse_error(position, token, e);  // throws e
  }

 private:
  nlohmann::detail::json_sax_dom_parser<json> dom_;
  std::vector<std::unordered_set<std::string>> keys_;
};

json parse_header(std::string_view text, std::string_view what) {
  if (const auto at = json_text::too_deep(text))
    fail(what, "header nests arrays or objects deeper than " + std::to_string(json_text::kMaxDepth) +
                   " levels (at byte " + std::to_string(*at) + ")");
  json header;
  DuplicateCheckingSax sax(header);
  try {
    json::sax_parse(text.begin(), text.end(), &sax);
  } catch (const json::exception& e) {
    fail(what, std::string("header is not valid JSON: ") + e.what());
  }
  if (sax.duplicate) {
    if (sax.duplicate_depth == 1) fail(what, "duplicate tensor name " + quote_text(*sax.duplicate) + " in the header");
    fail(what, "duplicate key " + quote_text(*sax.duplicate) + " in the header");
  }
  if (!header.is_object()) fail(what, std::string("header is not a JSON object (it is ") + header.type_name() + ")");
  return header;
}

// A JSON integer that must be ≥ 0 and fit in int64.
std::int64_t non_negative(const json& v, std::string_view what, const std::string& where) {
  if (v.is_number_unsigned()) {
    const auto u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max()))
      fail(what, where + " value " + std::to_string(u) + " overflows int64");
    return static_cast<std::int64_t>(u);
  }
  if (v.is_number_integer()) fail(what, where + " has negative value " + v.dump());
  fail(what, where + " must contain integers, found " + json_text::excerpt(v));
}

const json& member(const json& entry, const char* key, std::string_view what, const std::string& tensor) {
  const auto it = entry.find(key);
  if (it == entry.end()) fail(what, tensor + ": missing '" + key + "'");
  return *it;
}

std::vector<std::byte> serialize_impl(const std::map<std::string, NdArray>& tensors,
                                      const std::map<std::string, std::string>& metadata, std::string_view what) {
  std::vector<const std::pair<const std::string, NdArray>*> order;
  for (const auto& kv : tensors) {
    const auto& [name, a] = kv;
    if (name == "__metadata__") fail(what, "'__metadata__' is reserved and cannot name a tensor");
    const std::string where = std::string(what) + ": tensor '" + name + "'";
    const std::size_t need = checked_nbytes(a.shape, a.dtype, where);
    if (a.bytes.size() != need)
      fail(where, "shape " + shape_to_string(a.shape) + " needs " + std::to_string(need) + " bytes of " +
                      std::string(dtype_name(a.dtype)) + " data, array has " + std::to_string(a.bytes.size()));
    order.push_back(&kv);
  }
  // Larger item sizes first: every tensor then starts at a multiple of its own item size. Within
  // an item size, tensors of a multiple of 64 bytes first: those and the first of the others start
  // on a cache line, read fastest where a reader maps them in place (SafetensorsFile::window).
  // (std::sort with a total order: libstdc++-12's stable_sort trips a deprecation warning in clang.)
  std::sort(order.begin(), order.end(), [](const auto* x, const auto* y) {
    const std::size_t sx = dtype_size(x->second.dtype), sy = dtype_size(y->second.dtype);
    const bool ox = x->second.bytes.size() % 64 != 0, oy = y->second.bytes.size() % 64 != 0;
    return sx != sy ? sx > sy : ox != oy ? oy : x->first < y->first;
  });

  json header = json::object();
  std::uint64_t offset = 0;
  for (const auto* kv : order) {
    const NdArray& a = kv->second;
    const std::uint64_t end = offset + a.bytes.size();
    header[kv->first] = json{
        {"dtype", std::string(name_of(a.dtype))}, {"shape", a.shape}, {"data_offsets", json::array({offset, end})}};
    offset = end;
  }
  if (!metadata.empty()) header["__metadata__"] = metadata;

  std::string text;
  try {
    text = header.dump();  // throws on names / metadata that are not valid UTF-8
  } catch (const json::exception& e) {
    fail(what, std::string("cannot encode the header: ") + e.what());
  }
  text.resize((8 + text.size() + 63) / 64 * 64 - 8, ' ');  // the data section starts on 64 bytes

  std::vector<std::byte> out;
  out.reserve(8 + text.size() + offset);
  for (int i = 0; i < 8; ++i)
    out.push_back(static_cast<std::byte>((static_cast<std::uint64_t>(text.size()) >> (8 * i)) & 0xFF));
  for (char c : text) out.push_back(static_cast<std::byte>(c));
  for (const auto* kv : order) out.insert(out.end(), kv->second.bytes.begin(), kv->second.bytes.end());
  return out;
}

/// Asks for the file's pages in 2 MiB folios where the page cache reads them from disk
/// (MADV_HUGEPAGE on a file mapping: readahead in whole huge pages where the file system has large
/// folios, as ext4 on Linux 6.18) — the kernel then maps them 2 MiB at a time, read through fewer
/// TLB entries: touching a 1.9 GB checkpoint took 0.03 s instead of 0.8 s, streaming it 33 GB/s
/// instead of 21. (No MADV_WILLNEED: its readahead fills the page cache with 4 KiB pages, and
/// those stay there for the next run.) Advice only.
void hugepage_advice(void* m, std::size_t n) {
#if defined(MADV_HUGEPAGE)
  if (n >= detail::kHugePageBytes) detail::advise(m, n, 4096, MADV_HUGEPAGE);
#else
  (void)m, (void)n;
#endif
}

}  // namespace

// --- SafetensorsFile -----------------------------------------------------------------------------

SafetensorsFile SafetensorsFile::open(const std::filesystem::path& path, bool windows) {
  SafetensorsFile f;
  f.what_ = path.string();
  const InputFile in = InputFile::open(path);  // regular files only, never blocks on a FIFO
  const auto size = static_cast<std::size_t>(in.size());
  if (size < 8)  // also avoids mmap of length 0
    fail(f.what_, "file is " + std::to_string(size) + " bytes, too short for the 8-byte header length");
  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, in.fd(), 0);
  if (m == MAP_FAILED) fail(f.what_, std::string("mmap failed: ") + std::strerror(errno));
  f.map_ = m;  // the mapping keeps the file alive after `in` closes it
  f.map_size_ = size;
  hugepage_advice(m, size);
  f.parse();  // on error f's destructor unmaps
  if (windows) {
    // Private and writable: a write (training updates its weights in place) copies the page for
    // this process. No MAP_POPULATE: on a writable private mapping it would copy every page.
    void* w = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_NORESERVE, in.fd(), 0);
    if (w != MAP_FAILED) {  // else every tensor is copied
      try {
        f.windows_ = std::make_shared<Windows>(static_cast<std::byte*>(w), size);
      } catch (...) {
        ::munmap(w, size);
        throw;
      }
      hugepage_advice(w, size);
    }
  }
  return f;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::byte> bytes, std::string what) {
  SafetensorsFile f;
  f.what_ = std::move(what);
  f.owned_ = std::move(bytes);
  f.parse();
  return f;
}

SafetensorsFile::SafetensorsFile(SafetensorsFile&& other) noexcept
    : what_(std::move(other.what_)),
      entries_(std::move(other.entries_)),
      metadata_(std::move(other.metadata_)),
      owned_(std::move(other.owned_)),  // moving a vector keeps its buffer, so spans stay valid
      map_(std::exchange(other.map_, nullptr)),
      map_size_(std::exchange(other.map_size_, 0)),
      windows_(std::move(other.windows_)) {}

SafetensorsFile& SafetensorsFile::operator=(SafetensorsFile&& other) noexcept {
  if (this != &other) {
    release();
    what_ = std::move(other.what_);
    entries_ = std::move(other.entries_);
    metadata_ = std::move(other.metadata_);
    owned_ = std::move(other.owned_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    windows_ = std::move(other.windows_);
  }
  return *this;
}

SafetensorsFile::~SafetensorsFile() { release(); }

void SafetensorsFile::release() noexcept {
  if (map_) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  windows_.reset();
}

std::span<const std::byte> SafetensorsFile::image() const {
  if (map_) return {static_cast<const std::byte*>(map_), map_size_};
  return owned_;
}

void SafetensorsFile::parse() {
  const std::span<const std::byte> img = image();
  if (img.size() < 8)
    fail(what_, "file is " + std::to_string(img.size()) + " bytes, too short for the 8-byte header length");
  std::uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= std::to_integer<std::uint64_t>(img[static_cast<std::size_t>(i)]) << (8 * i);
  if (n > kMaxHeader) fail(what_, "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > img.size() - 8)
    fail(what_, "header length " + std::to_string(n) + " exceeds the file size minus 8 (" +
                    std::to_string(img.size() - 8) + " bytes)");
  const std::string_view text(reinterpret_cast<const char*>(img.data() + 8), static_cast<std::size_t>(n));
  const json header = parse_header(text, what_);

  const std::size_t data_start = 8 + static_cast<std::size_t>(n);
  const std::size_t data_size = img.size() - data_start;
  struct Range {
    std::uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Range> ranges;

  for (const auto& [name, val] : header.items()) {
    if (name == "__metadata__") {
      if (!val.is_object())
        fail(what_, std::string("__metadata__ must be an object of string to string, not ") + val.type_name());
      for (const auto& [k, v] : val.items()) {
        if (!v.is_string())
          fail(what_, "__metadata__ value for " + quote_text(k) + " must be a string, not " + v.type_name());
        metadata_.emplace(k, v.get<std::string>());
      }
      continue;
    }
    const std::string tensor = "tensor " + quote_text(name);
    if (!val.is_object()) fail(what_, tensor + ": entry is not a JSON object");

    const json& jdtype = member(val, "dtype", what_, tensor);
    if (!jdtype.is_string()) fail(what_, tensor + ": 'dtype' is not a string");
    const auto dtype = dtype_from_name(jdtype.get_ref<const std::string&>());
    if (!dtype)
      fail(what_, tensor + ": unsupported dtype " + quote_text(jdtype.get<std::string>()) +
                      " (supported: F32 F64 F16 BF16 BOOL I32 I64)");

    const json& jshape = member(val, "shape", what_, tensor);
    if (!jshape.is_array()) fail(what_, tensor + ": 'shape' is not an array");
    std::vector<std::int64_t> shape;
    shape.reserve(jshape.size());
    for (const json& d : jshape) {
      if (d.is_number_integer() && !d.is_number_unsigned())
        fail(what_, tensor + ": negative dimension " + json_text::excerpt(d) + " in 'shape'");
      shape.push_back(non_negative(d, what_, tensor + ": 'shape'"));
    }
    const std::size_t nbytes = checked_nbytes(shape, *dtype, what_ + ": " + tensor);

    const json& joff = member(val, "data_offsets", what_, tensor);
    if (!joff.is_array() || joff.size() != 2) fail(what_, tensor + ": 'data_offsets' must be an array [begin, end]");
    const auto begin = static_cast<std::uint64_t>(non_negative(joff[0], what_, tensor + ": 'data_offsets'"));
    const auto end = static_cast<std::uint64_t>(non_negative(joff[1], what_, tensor + ": 'data_offsets'"));
    const std::string offs = "data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) + "]";
    if (begin > end) fail(what_, tensor + ": " + offs + " has begin > end");
    if (end > data_size)
      fail(what_, tensor + ": " + offs + " end is beyond the data section (" + std::to_string(data_size) + " bytes)");
    if (end - begin != nbytes)
      fail(what_, tensor + ": " + offs + " span " + std::to_string(end - begin) + " bytes but shape " +
                      shape_to_string(shape) + " needs " + std::to_string(nbytes) + " bytes of " +
                      std::string(name_of(*dtype)));

    const auto [it, inserted] =
        entries_.emplace(name, Entry{*dtype, std::move(shape), data_start + static_cast<std::size_t>(begin),
                                     data_start + static_cast<std::size_t>(end)});
    if (!inserted) fail(what_, "duplicate tensor name " + quote_text(name));  // unreachable: see parse_header
    ranges.push_back({begin, end, &it->first});
  }

  // Overlaps: sorted by begin, each range must start at or after the furthest end seen so far.
  std::sort(ranges.begin(), ranges.end(),
            [](const Range& a, const Range& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  const Range* furthest = nullptr;
  for (const Range& r : ranges) {
    if (furthest && r.begin < furthest->end)
      fail(what_, "tensors " + quote_text(*furthest->name) + " [" + std::to_string(furthest->begin) + ", " +
                      std::to_string(furthest->end) + "] and " + quote_text(*r.name) + " [" + std::to_string(r.begin) +
                      ", " + std::to_string(r.end) + "] overlap");
    if (!furthest || r.end > furthest->end) furthest = &r;
  }
}

std::vector<std::string> SafetensorsFile::names() const {
  std::vector<std::string> out;
  out.reserve(entries_.size());
  for (const auto& kv : entries_) out.push_back(kv.first);
  return out;
}

bool SafetensorsFile::contains(std::string_view name) const { return entries_.find(name) != entries_.end(); }

const SafetensorsFile::Entry& SafetensorsFile::entry(std::string_view name) const {
  const auto it = entries_.find(name);
  if (it == entries_.end()) fail(what_, "no tensor named " + quote_text(name));
  return it->second;
}

TensorView SafetensorsFile::get(std::string_view name) const {
  const Entry& e = entry(name);
  return {e.dtype, e.shape, image().subspan(e.begin, e.end - e.begin)};
}

/// The file mapped once more, private and writable, for the windows (one mapping: the page cache's
/// 2 MiB folios are mapped whole inside it, where a mapping per tensor left those across its ends
/// in 4 KiB pages, 250 MB of a 1.9 GB checkpoint), and the entries that have had a window.
struct SafetensorsFile::Windows {
  Windows(std::byte* b, std::size_t n) : base(b), size(n) {}
  Windows(const Windows&) = delete;
  Windows& operator=(const Windows&) = delete;
  ~Windows() { ::munmap(base, size); }
  std::byte* base;
  std::size_t size;
  std::mutex mutex;
  std::set<std::size_t> used;  // Entry::begin of each
};

std::optional<NdArray> SafetensorsFile::window(const Entry& e) const {
  const std::size_t n = e.end - e.begin;
  if (!windows_ || n < kWindowBytes || e.dtype == DType::boolean || e.begin % dtype_size(e.dtype) != 0)
    return std::nullopt;
  {
    // One window an entry: a page of it that an earlier array wrote and shares with a neighbour
    // (so kept below) is never read again as the file's.
    const std::lock_guard lock(windows_->mutex);
    if (!windows_->used.insert(e.begin).second) return std::nullopt;
  }
  std::byte* data = windows_->base + e.begin;
  // When the array goes, its pages leave this process (the page cache keeps them; a page it
  // wrote is dropped with it): peak memory is what is alive, as with copies. Pages shared with a
  // neighbour stay.
  std::shared_ptr<void> keep(data, [w = windows_, n](void* p) { detail::advise(p, n, 4096, MADV_DONTNEED); });
  return NdArray{e.dtype, e.shape, Bytes::window(data, n, std::move(keep))};
}

NdArray SafetensorsFile::load(std::string_view name) const {
  if (std::optional<NdArray> w = window(entry(name))) return std::move(*w);
  const TensorView v = get(name);
  // One pass over the bytes, the copy's pages backed by huge pages where the kernel allows them
  // (transparent huge pages in "madvise" mode): a 442 MB checkpoint faulted in 4 KiB at a time
  // spent more time in the kernel's fault path than in the copy.
  using detail::advise, detail::kHugePageBytes;
  std::vector<std::byte> bytes = detail::reserved_bytes(v.data.size());
  bytes.insert(bytes.end(), v.data.begin(), v.data.end());
  // The mapping's pages of a copied tensor leave this process (they stay in the page cache, and a
  // later read faults them back in unchanged: the mapping is private, read-only and never
  // written): the checkpoint is not resident twice.
  if (map_ && v.data.size() >= kHugePageBytes) advise(v.data.data(), v.data.size(), 4096, MADV_DONTNEED);
  NdArray a{v.dtype, v.shape, std::move(bytes)};
  if (a.dtype == DType::boolean)
    for (std::byte& b : a.bytes) b = b != std::byte{0} ? std::byte{1} : std::byte{0};
  return a;
}

NdArray SafetensorsFile::load_as(std::string_view name, DType as) const {
  const TensorView v = get(name);
  if (v.dtype != DType::f32 || (as != DType::bf16 && as != DType::f16)) return load(name).converted(as);
  using detail::advise;
  NdArray out = NdArray::zeros(as, v.shape);
  auto* to = reinterpret_cast<std::uint16_t*>(out.bytes.data());
  const std::byte* from = v.data.data();  // f32 at any byte offset of the file: copied out, not cast
  const auto n = static_cast<std::size_t>(v.numel());
  // By chunks of 16 MB, each chunk's mapped pages released once converted: the f32 tensor is
  // never resident whole (the last weight of a checkpoint converted had its f32 pages beside
  // every converted weight).
  constexpr std::size_t kChunk = std::size_t{4} << 20;
  auto each = [&](auto convert) {  // one loop per conversion, no branch inside
    for (std::size_t c = 0; c < n; c += kChunk) {
      const std::size_t end = std::min(n, c + kChunk);
      for (std::size_t i = c; i < end; ++i) {
        float x;
        std::memcpy(&x, from + 4 * i, 4);
        to[i] = convert(x);
      }
      if (map_) advise(from + 4 * c, 4 * (end - c), 4096, MADV_DONTNEED);
    }
  };
  if (as == DType::bf16)
    each(f32_to_bf16);
  else
    each(f32_to_f16);
  if (map_) advise(v.data.data(), v.data.size(), 4096, MADV_DONTNEED);  // the pages chunks shared
  return out;
}

// --- writing -------------------------------------------------------------------------------------

std::vector<std::byte> serialize_safetensors(const std::map<std::string, NdArray>& tensors,
                                             const std::map<std::string, std::string>& metadata) {
  return serialize_impl(tensors, metadata, "serialize_safetensors");
}

void write_safetensors(const std::filesystem::path& path, const std::map<std::string, NdArray>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  write_file_atomic(path, serialize_impl(tensors, metadata, path.string()));
}

}  // namespace qkv
