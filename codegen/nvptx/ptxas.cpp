// run_ptxas: assemble a PTX module with the CUDA toolkit's ptxas and parse `ptxas -v`.
// posix_spawn (no shell), output to a temporary file; no LLVM here.
#include <fcntl.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include <qkv/codegen/nvptx.hpp>

extern char** environ;

namespace qkv::codegen::nvptx {

namespace {

bool executable(const std::string& path) {
  struct stat st{};
  return !path.empty() && ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(path.c_str(), X_OK) == 0;
}

/// A temporary file /tmp/qkv-<tag>-XXXXXX<suffix>, created (closed) — its path, or "" on failure.
std::string temp_file(const char* tag, const char* suffix) {
  const char* dir = std::getenv("TMPDIR");
  std::string pattern = std::string(dir && *dir ? dir : "/tmp") + "/qkv-" + tag + "-XXXXXX" + suffix;
  std::vector<char> buf(pattern.begin(), pattern.end());
  buf.push_back('\0');
  const int fd = ::mkstemps(buf.data(), static_cast<int>(std::strlen(suffix)));
  if (fd < 0) return {};
  ::close(fd);
  return buf.data();
}

bool fail(std::string* error, std::string message) {
  if (error) *error = std::move(message);
  return false;
}

/// Runs argv[0] with stdout and stderr into `log_path`; returns its exit status (or -1).
int run(const std::vector<std::string>& args, const std::string& log_path, std::string* error) {
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, log_path.c_str(), O_WRONLY | O_TRUNC | O_CREAT, 0600);
  posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = 0;
  const int rc = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) {
    fail(error, "run_ptxas: cannot start " + args[0] + ": " + std::strerror(rc));
    return -1;
  }
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) {
      fail(error, std::string("run_ptxas: waitpid: ") + std::strerror(errno));
      return -1;
    }
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  fail(error, "run_ptxas: " + args[0] + " was terminated by signal " + std::to_string(WTERMSIG(status)));
  return -1;
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
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
  const std::string in = temp_file("ptx", ".ptx"), out = temp_file("ptx", ".cubin"), log = temp_file("ptxas", ".log");
  auto cleanup = [&] {
    for (const auto* p : {&in, &out, &log})
      if (!p->empty()) ::unlink(p->c_str());
  };
  if (in.empty() || out.empty() || log.empty()) {
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
  const int rc = run({*ptxas, "-v", "-arch=sm_" + std::to_string(sm), in, "-o", out}, log, error);
  const std::string text = slurp(log);
  cleanup();
  if (rc < 0) return std::nullopt;
  if (rc != 0) {
    fail(error, "run_ptxas: " + *ptxas + " -arch=sm_" + std::to_string(sm) + " failed (exit " + std::to_string(rc) +
                    "):\n" + text);
    return std::nullopt;
  }
  PtxasReport report;
  report.log = text;
  parse(text, report);
  return report;
}

}  // namespace qkv::codegen::nvptx
