// run_ptxas: assemble a PTX module with the CUDA toolkit's ptxas and parse `ptxas -v`.
// ptxas runs through codegen/llvm/process.hpp (posix_spawn, no shell); no LLVM here.
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include <qkv/codegen/nvptx.hpp>

#include "llvm/process.hpp"

namespace qkv::codegen::nvptx {

namespace {

bool executable(const std::string& path) {
  struct stat st{};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

int to_int(const std::string& s) { return static_cast<int>(std::strtol(s.c_str(), nullptr, 10)); }

/// Fills the report from the first entry function of ptxas' -v output.
void parse(const std::string& log, PtxasReport& r) {
  static const std::regex entry(R"(Compiling entry function '([^']+)')");
  static const std::regex frame(R"((\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads)");
  static const std::regex regs(R"(Used (\d+) registers)");
  static const std::regex smem(R"((\d+) bytes smem)");
  // Cut the log at the second entry: the report is about the first one.
  std::string first = log;
  std::smatch m;
  if (std::regex_search(log, m, entry)) {
    r.function = m[1].str();
    const auto rest = static_cast<std::size_t>(m.position(0) + m.length(0));
    const auto next = log.find("Compiling entry function", rest);
    first = log.substr(0, next);
  }
  if (std::regex_search(first, m, frame)) {
    r.stack_bytes = to_int(m[1].str());
    r.spill_stores = to_int(m[2].str());
    r.spill_loads = to_int(m[3].str());
  }
  if (std::regex_search(first, m, regs)) r.registers = to_int(m[1].str());
  if (std::regex_search(first, m, smem)) r.shared_bytes = to_int(m[1].str());
}

}  // namespace

std::optional<std::string> find_ptxas() {
  if (const char* env = std::getenv("QKV_PTXAS"); env && *env) {
    if (executable(env)) return std::string(env);
    return std::nullopt;  // an explicit choice that does not exist: do not fall back silently
  }
  if (const char* path = std::getenv("PATH")) {
    std::string dirs = path;
    std::size_t start = 0;
    while (start <= dirs.size()) {
      const std::size_t end = dirs.find(':', start);
      std::string dir = dirs.substr(start, end == std::string::npos ? std::string::npos : end - start);
      if (!dir.empty() && executable(dir + "/ptxas")) return dir + "/ptxas";
      if (end == std::string::npos) break;
      start = end + 1;
    }
  }
  if (executable("/usr/local/cuda/bin/ptxas")) return std::string("/usr/local/cuda/bin/ptxas");
  return std::nullopt;
}

std::optional<PtxasReport> run_ptxas(const std::string& ptx, int sm, std::string* error) {
  const auto ptxas = find_ptxas();
  if (!ptxas) {
    const char* env = std::getenv("QKV_PTXAS");
    fail(error, env && *env ? std::string("run_ptxas: QKV_PTXAS=") + env + " is not an executable file"
                            : "run_ptxas: no ptxas (QKV_PTXAS unset, none on PATH, no /usr/local/cuda/bin/ptxas)");
    return std::nullopt;
  }
  const std::string in = process::temp_file("ptx", ".ptx"), out = process::temp_file("ptx", ".cubin");
  auto cleanup = [&] {
    for (const auto* p : {&in, &out})
      if (!p->empty()) ::unlink(p->c_str());
  };
  if (in.empty() || out.empty()) {
    cleanup();
    fail(error, std::string("run_ptxas: cannot create a temporary file: ") + std::strerror(errno));
    return std::nullopt;
  }
  {
    std::ofstream f(in, std::ios::binary);
    f << ptx;
    if (!f) {
      cleanup();
      fail(error, "run_ptxas: cannot write " + in);
      return std::nullopt;
    }
  }
  const process::Result rc = process::run({*ptxas, "-v", "-arch=sm_" + std::to_string(sm), in, "-o", out}, false);
  const std::string& text = rc.output;
  cleanup();
  if (rc.status < 0) {
    fail(error, "run_ptxas: " + rc.error);
    return std::nullopt;
  }
  if (rc.status != 0) {
    fail(error, "run_ptxas: " + *ptxas + " -arch=sm_" + std::to_string(sm) + " failed (exit " +
                    std::to_string(rc.status) + "):\n" + text);
    return std::nullopt;
  }
  PtxasReport report;
  report.log = text;
  parse(text, report);
  return report;
}

}  // namespace qkv::codegen::nvptx
