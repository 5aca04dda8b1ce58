#include "memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>

#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/codegen/passes/pipeline.hpp>

namespace qkv::cli {

namespace {

constexpr std::uint64_t kUnlimited = std::numeric_limits<std::uint64_t>::max();
constexpr std::uint64_t kMaxBytes = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());

/// The "<key>: N kB" line of /proc/meminfo, in bytes; nullopt if absent.
std::optional<std::uint64_t> meminfo(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string k; in >> k;) {
    std::uint64_t kb = 0;
    in >> kb;
    if (k == key + ":") return kb * 1024;
    in.ignore(std::numeric_limits<std::streamsize>::max(), '\n');
  }
  return std::nullopt;
}

/// The cgroup (v2) limit left: memory.max − memory.current of this process's cgroup.
std::uint64_t cgroup_left() {
  std::ifstream self("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(self, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty()) return kUnlimited;
  auto read = [&](const char* file) -> std::optional<std::uint64_t> {
    std::ifstream in("/sys/fs/cgroup" + path + "/" + file);
    std::string v;
    if (!(in >> v) || v == "max") return std::nullopt;
    try {
      return std::stoull(v);
    } catch (const std::exception&) {
      return std::nullopt;
    }
  };
  const auto max = read("memory.max"), current = read("memory.current");
  if (!max) return kUnlimited;
  return current && *current < *max ? *max - *current : 0;
}

/// A resource limit minus what is in use, or kUnlimited.
std::uint64_t rlimit_left(int resource, std::uint64_t used) {
  rlimit r{};
  if (getrlimit(resource, &r) != 0 || r.rlim_cur == RLIM_INFINITY) return kUnlimited;
  return r.rlim_cur > used ? r.rlim_cur - used : 0;
}

std::string gib(std::uint64_t bytes) {
  char buf[64];
  const double g = static_cast<double>(bytes) / (1024.0 * 1024.0 * 1024.0);
  if (g >= 0.1)
    std::snprintf(buf, sizeof buf, "%.1f GiB", g);
  else
    std::snprintf(buf, sizeof buf, "%.0f MiB", g * 1024.0);
  return buf;
}

std::uint64_t add(std::uint64_t a, std::uint64_t b) {
  return a > kMaxBytes - std::min(b, kMaxBytes) ? kMaxBytes : a + b;
}

std::uint64_t outputs_bytes(const Graph& g, const std::vector<std::uint64_t>& bytes) {
  std::uint64_t total = 0;
  for (const auto& o : g.outputs()) total = add(total, bytes.at(static_cast<std::size_t>(o.node)));
  return total;
}

}  // namespace

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_maxrss) / 1024.0;  // KiB on Linux
}

std::uint64_t memory_available() {
  std::uint64_t avail = kUnlimited;
  if (const auto m = meminfo("MemAvailable")) avail = *m + meminfo("SwapFree").value_or(0);
  avail = std::min(avail, cgroup_left());
  // /proc/self/statm: size resident shared text lib data dt, in pages.
  std::ifstream statm("/proc/self/statm");
  std::uint64_t size = 0, resident = 0, shared = 0, text = 0, lib = 0, data = 0;
  if (statm >> size >> resident >> shared >> text >> lib >> data) {
    const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    avail = std::min({avail, rlimit_left(RLIMIT_AS, size * page), rlimit_left(RLIMIT_DATA, data * page)});
  }
  return avail;
}

void require_memory(std::uint64_t bytes, const std::string& what) {
  const std::uint64_t avail = memory_available();
  if (bytes > avail)
    throw std::runtime_error(what + " needs about " + gib(bytes) + ", more than the " + gib(avail) + " available");
}

std::int64_t checked_mul(std::int64_t a, std::int64_t b, const std::string& what) {
  std::int64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r))
    throw UsageError(what + ": " + std::to_string(a) + " x " + std::to_string(b) + " overflows a 64-bit size");
  return r;
}

std::vector<std::uint64_t> value_bytes(const Graph& g, const Bindings& sizes) {
  std::vector<std::uint64_t> bytes(g.size(), 0);
  for (int id = 0; id < static_cast<int>(g.size()); ++id) {
    const Node& n = g.node(id);
    std::uint64_t b = dtype_size(n.dtype);
    bool bound = true;
    for (const Axis& a : n.axes) {
      const auto v = a.extent.resolve(sizes);
      if (!v) {
        bound = false;
        break;
      }
      if (*v != 0 && b > kMaxBytes / static_cast<std::uint64_t>(*v))
        throw UsageError("the sizes overflow: a " + std::string(op_name(n.op)) +
                         " value would hold more than 2^63 bytes");
      b *= static_cast<std::uint64_t>(*v);
    }
    if (!bound) {
      b = 0;
      for (int in : n.inputs) b = std::max(b, bytes[static_cast<std::size_t>(in)]);
    }
    bytes[static_cast<std::size_t>(id)] = b;
  }
  return bytes;
}

std::uint64_t feed_bytes(const Graph& g, const Bindings& sizes) {
  const auto bytes = value_bytes(g, sizes);
  std::uint64_t total = 0;
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    if (g.node(id).op == Op::input || g.node(id).op == Op::param)
      total = add(total, bytes[static_cast<std::size_t>(id)]);
  return total;
}

std::uint64_t run_bytes(const Graph& g, const Bindings& sizes, Backend backend) {
  const auto bytes = value_bytes(g, sizes);
  const std::uint64_t feeds = feed_bytes(g, sizes), outputs = outputs_bytes(g, bytes);
  if (backend == Backend::reference) {  // the interpreter keeps every value until it returns
    std::uint64_t total = outputs;
    for (std::uint64_t b : bytes) total = add(total, b);
    return total;
  }
  // The executors copy the feeds, free each value after its last use and return the outputs.
  const std::shared_ptr<const Graph> lowered = codegen::lower_cached(g);
  try {
    return add(add(feeds, outputs), codegen::plan_buffers(*lowered, sizes).peak_bytes);
  } catch (const ShapeError&) {  // a symbol the lowered graph introduced: every value at once
    std::uint64_t total = add(feeds, outputs);
    for (std::uint64_t b : value_bytes(*lowered, sizes)) total = add(total, b);
    return total;
  }
}

}  // namespace qkv::cli
