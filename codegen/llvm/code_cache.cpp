// The on-disk object cache (code_cache.hpp): keys, entries, eviction.
//
// An entry is <dir>/<64 hex digits of the key>.o:
//   8 bytes   "QKVOBJ01"
//   8 bytes   the object's length (little-endian)
//   8 bytes   xxh3-64 of the object
//   64 bytes  the key again (hex)
//   the object file
#include "llvm/code_cache.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <optional>
#include <vector>

#include <llvm/Config/llvm-config.h>
#include <llvm/IR/Module.h>
#include <llvm/Support/MemoryBuffer.h>
#include <llvm/Support/SHA256.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Support/xxhash.h>

namespace qkv::codegen {

namespace fs = std::filesystem;

namespace {

std::mutex g_settings_mutex;
std::optional<CodeCacheSettings> g_settings;
std::atomic<std::int64_t> g_hits{0}, g_stores{0}, g_rejected{0}, g_evicted{0};

constexpr char kMagic[8] = {'Q', 'K', 'V', 'O', 'B', 'J', '0', '1'};
constexpr std::size_t kKeyChars = 64;  // SHA-256 in hex
constexpr std::size_t kHeader = 8 + 8 + 8 + kKeyChars;

/// A raw_ostream that feeds SHA-256 instead of memory: a decoder's module text is megabytes.
class HashStream final : public llvm::raw_ostream {
 public:
  llvm::SHA256 sha;
  HashStream() { SetBufferSize(1 << 16); }
  ~HashStream() override { flush(); }

 private:
  std::uint64_t pos_ = 0;
  void write_impl(const char* p, std::size_t n) override {
    sha.update(llvm::StringRef(p, n));
    pos_ += n;
  }
  [[nodiscard]] std::uint64_t current_pos() const override { return pos_; }
};

void anchor() {}

std::string hex(const std::uint8_t* p, std::size_t n) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (std::size_t k = 0; k < n; ++k) {
    s += kHex[p[k] >> 4];
    s += kHex[p[k] & 15];
  }
  return s;
}

/// The NT_GNU_BUILD_ID of the loaded object holding this function (the qkv executable, or the
/// shared library qkv's code generator was linked into), in hex; "" when it has none.
std::string build_id() {
  static const std::string id = [] {
    struct Search {
      std::uintptr_t address;
      std::string found;
    } search{reinterpret_cast<std::uintptr_t>(&anchor), {}};
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* data) -> int {
          auto* s = static_cast<Search*>(data);
          bool ours = false;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            const std::uintptr_t start = info->dlpi_addr + ph.p_vaddr;
            if (ph.p_type == PT_LOAD && s->address >= start && s->address < start + ph.p_memsz) ours = true;
          }
          if (!ours) return 0;
          for (int i = 0; i < info->dlpi_phnum; ++i) {
            const ElfW(Phdr)& ph = info->dlpi_phdr[i];
            if (ph.p_type != PT_NOTE) continue;
            const auto* p = reinterpret_cast<const unsigned char*>(info->dlpi_addr + ph.p_vaddr);
            const unsigned char* end = p + ph.p_memsz;
            while (p + sizeof(ElfW(Nhdr)) <= end) {
              ElfW(Nhdr) note{};
              std::memcpy(&note, p, sizeof note);
              const unsigned char* name = p + sizeof note;
              const unsigned char* desc = name + ((note.n_namesz + 3) & ~3u);
              if (desc + note.n_descsz > end) break;
              if (note.n_type == NT_GNU_BUILD_ID && note.n_namesz == 4 && std::memcmp(name, "GNU", 4) == 0) {
                s->found = hex(desc, note.n_descsz);
                return 1;
              }
              p = desc + ((note.n_descsz + 3) & ~3u);
            }
          }
          return 1;
        },
        &search);
    return search.found;
  }();
  return id;
}

void put_u64(char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}
std::uint64_t get_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<std::uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

bool read_all(int fd, char* p, std::size_t n, off_t at) {
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, n, at);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    p += got;
    n -= static_cast<std::size_t>(got);
    at += got;
  }
  return true;
}

bool write_all(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t put = ::write(fd, p, n);
    if (put < 0 && errno == EINTR) continue;
    if (put <= 0) return false;
    p += put;
    n -= static_cast<std::size_t>(put);
  }
  return true;
}

/// Removes the least recently used entries (by modification time: a hit touches it) until the
/// folder holds at most max_bytes, and temporary files a killed process left over an hour ago.
void evict(const CodeCacheSettings& settings) {
  struct Entry {
    fs::path path;
    std::uintmax_t size;
    fs::file_time_type time;
  };
  std::vector<Entry> entries;
  std::uintmax_t total = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(settings.dir, ec), end; !ec && it != end; it.increment(ec)) {
    const fs::path& p = it->path();
    const std::string name = p.filename().string();
    std::error_code e2;
    const auto time = fs::last_write_time(p, e2);
    if (e2) continue;
    if (name.starts_with(".tmp-")) {
      if (now - time > std::chrono::hours(1)) fs::remove(p, e2);
      continue;
    }
    if (p.extension() != ".o" || name.size() != 66) continue;
    const std::uintmax_t size = fs::file_size(p, e2);
    if (e2) continue;
    entries.push_back({p, size, time});
    total += size;
  }
  if (total <= settings.max_bytes) return;
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) { return a.time < b.time; });
  for (const Entry& e : entries) {
    if (total <= settings.max_bytes) break;
    std::error_code e2;
    if (fs::remove(e.path, e2)) ++g_evicted;
    total -= e.size;
  }
}

}  // namespace

std::optional<CodeCacheSettings> default_code_cache() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  CodeCacheSettings s;
  if (!env("QKV_CACHE_DIR").empty())
    s.dir = env("QKV_CACHE_DIR");
  else if (!env("XDG_CACHE_HOME").empty())
    s.dir = fs::path(env("XDG_CACHE_HOME")) / "qkv";
  else if (!env("HOME").empty())
    s.dir = fs::path(env("HOME")) / ".cache" / "qkv";
  else
    return std::nullopt;
  if (const std::string mb = env("QKV_CACHE_MAX_MB"); !mb.empty()) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(mb.c_str(), &end, 10);
    if (end && *end == '\0' && v < (std::uint64_t{1} << 40)) s.max_bytes = v << 20;
  }
  return s;
}

void set_code_cache(std::optional<CodeCacheSettings> settings) {
  std::lock_guard lock(g_settings_mutex);
  g_settings = std::move(settings);
}

std::optional<CodeCacheSettings> code_cache() {
  std::lock_guard lock(g_settings_mutex);
  return g_settings;
}

CodeCacheStats code_cache_stats() { return {g_hits.load(), g_stores.load(), g_rejected.load(), g_evicted.load()}; }

namespace disk_cache {

std::optional<std::string> key_of(const llvm::Module& module, const std::string& target_key) {
  const std::string& id = build_id();
  if (id.empty()) return std::nullopt;
  HashStream h;
  h << "qkv code cache 1\n" << id << "\n" << LLVM_VERSION_STRING << "\n" << target_key << "\n";
  module.print(h, nullptr);
  h.flush();
  const std::array<std::uint8_t, 32> digest = h.sha.final();
  return hex(digest.data(), digest.size());
}

std::string module_name(const std::string& key) { return "qkv-" + key; }

std::string part_key(const std::string& key, int part, int parts) {
  HashStream h;
  h << "qkv code cache part\n" << key << "\n" << part << " of " << parts << "\n";
  h.flush();
  const std::array<std::uint8_t, 32> digest = h.sha.final();
  return hex(digest.data(), digest.size());
}

std::optional<std::string> key_of_module(const llvm::Module& module) {
  const std::string& name = module.getModuleIdentifier();
  if (name.size() != 4 + kKeyChars || !name.starts_with("qkv-")) return std::nullopt;
  return name.substr(4);
}

std::unique_ptr<llvm::MemoryBuffer> load(const CodeCacheSettings& settings, const std::string& key) {
  const fs::path path = settings.dir / (key + ".o");
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return nullptr;
  std::unique_ptr<llvm::MemoryBuffer> result;
  struct stat st{};
  char header[kHeader];
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && static_cast<std::uint64_t>(st.st_size) >= kHeader &&
      read_all(fd, header, kHeader, 0) && std::memcmp(header, kMagic, 8) == 0 &&
      get_u64(header + 8) == static_cast<std::uint64_t>(st.st_size) - kHeader && key.size() == kKeyChars &&
      std::memcmp(header + 24, key.data(), kKeyChars) == 0) {
    const std::uint64_t length = get_u64(header + 8);
    auto buffer = llvm::WritableMemoryBuffer::getNewUninitMemBuffer(length, module_name(key));
    if (buffer && read_all(fd, buffer->getBufferStart(), length, kHeader) &&
        llvm::xxh3_64bits(llvm::ArrayRef<std::uint8_t>(reinterpret_cast<const std::uint8_t*>(buffer->getBufferStart()),
                                                       length)) == get_u64(header + 16)) {
      result = std::move(buffer);
      ::futimens(fd, nullptr);  // used now: the last to be evicted
    }
  }
  ::close(fd);
  if (result) {
    ++g_hits;
  } else {
    ++g_rejected;  // truncated, corrupt, or not ours: compiled again and replaced
    std::error_code ec;
    fs::remove(path, ec);
  }
  return result;
}

void store(const CodeCacheSettings& settings, const std::string& key, llvm::StringRef object) {
  std::error_code ec;
  fs::create_directories(settings.dir, ec);
  if (key.size() != kKeyChars) return;
  const std::string name = key + ".o";
  std::string tmp = (settings.dir / (".tmp-" + name + "-XXXXXX")).string();
  const int fd = ::mkstemp(tmp.data());
  if (fd < 0) return;
  char header[kHeader];
  std::memcpy(header, kMagic, 8);
  put_u64(header + 8, object.size());
  put_u64(header + 16, llvm::xxh3_64bits(llvm::ArrayRef<std::uint8_t>(
                           reinterpret_cast<const std::uint8_t*>(object.data()), object.size())));
  std::memcpy(header + 24, key.data(), kKeyChars);
  const bool written = write_all(fd, header, kHeader) && write_all(fd, object.data(), object.size());
  const bool closed = ::close(fd) == 0;
  if (!written || !closed || ::rename(tmp.c_str(), (settings.dir / name).c_str()) != 0) {
    ::unlink(tmp.c_str());
    return;
  }
  ++g_stores;
  evict(settings);
}

}  // namespace disk_cache
}  // namespace qkv::codegen
