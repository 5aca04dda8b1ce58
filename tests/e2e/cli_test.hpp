// The fixture of the CLI's end-to-end tests: a fresh temporary directory per test, and ways to
// run the qkv binary (through the shell, or directly with limits: a timeout, RLIMIT_AS,
// RLIMIT_FSIZE) and look at what it printed and left behind. $QKV_CLI overrides the binary
// under test (e.g. to run the tests against an older build).
#pragma once

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/io/npy.hpp>
#include <qkv/runtime/io/safetensors.hpp>

namespace qkv::test {

namespace fs = std::filesystem;

/// True in a build with AddressSanitizer (where address-space limits cannot be tested: ASan
/// reserves terabytes of shadow memory at start-up).
constexpr bool kSanitized =
#if defined(__SANITIZE_ADDRESS__)
    true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    true;
#else
    false;
#endif
#else
    false;
#endif

struct Result {
  int code = -1;   // the exit code, or -1 when killed by a signal
  int signal = 0;  // the signal that ended it, or 0
  bool timed_out = false;
  double cpu_s = 0;  // user + system CPU time (run_argv only)
  std::string out, err;
};

struct Limits {
  double timeout_s = 300;
  std::uint64_t address_space = 0;  // RLIMIT_AS in bytes, 0: none
  std::uint64_t file_size = 0;      // RLIMIT_FSIZE in bytes, 0: none
};

/// A qkv process started by Cli::start.
struct Process {
  pid_t pid = -1;
  fs::path out, err;
  Limits limits;
};

inline std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_text(const fs::path& p, const std::string& text) { std::ofstream(p, std::ios::binary) << text; }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("qkv_e2e_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // Each test its own code cache (beside dir_, whose listing tests check): runs within a test
    // load what the first compiled, and no test sees another's objects or the user's.
    cache_ = dir_.string() + ".cache";
    fs::remove_all(cache_);
    ::setenv("XDG_CACHE_HOME", cache_.c_str(), 1);
    ::unsetenv("QKV_CACHE_DIR");
  }
  void TearDown() override {
    fs::remove_all(dir_);
    fs::remove_all(cache_);
  }

  static std::string cli() {
    const char* env = std::getenv("QKV_CLI");
    return env && *env ? env : QKV_CLI;
  }

  /// Runs `qkv <args>` through the shell (args may hold quotes).
  Result run(const std::string& args) const {
    const fs::path out = dir_ / "stdout.txt", err = dir_ / "stderr.txt";
    const std::string cmd = cli() + " " + args + " > '" + out.string() + "' 2> '" + err.string() + "'";
    const int status = std::system(cmd.c_str());
    Result r;
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    r.out = slurp(out);
    r.err = slurp(err);
    fs::remove(out);
    fs::remove(err);
    return r;
  }

  /// Starts qkv with exactly these arguments (no shell), its output in files of its own.
  Process start(const std::vector<std::string>& args, const Limits& limits = {}) const {
    static int counter = 0;
    Process p;
    p.limits = limits;
    const std::string id = std::to_string(++counter);
    p.out = dir_ / (".stdout." + id);
    p.err = dir_ / (".stderr." + id);
    std::vector<std::string> argv_store{cli()};
    argv_store.insert(argv_store.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (auto& a : argv_store) argv.push_back(a.data());
    argv.push_back(nullptr);
    p.pid = ::fork();
    if (p.pid == 0) {
      // qkv as a terminal would start it: a shell without job control starts background
      // commands with SIGINT and SIGQUIT ignored, and qkv (rightly) leaves ignored signals alone.
      for (const int sig : {SIGINT, SIGQUIT, SIGTERM, SIGHUP}) ::signal(sig, SIG_DFL);
      const int o = ::open(p.out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      const int e = ::open(p.err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(o, 1);
      ::dup2(e, 2);
      if (limits.address_space) {
        const rlimit r{limits.address_space, limits.address_space};
        ::setrlimit(RLIMIT_AS, &r);
      }
      if (limits.file_size) {
        const rlimit r{limits.file_size, limits.file_size};
        ::setrlimit(RLIMIT_FSIZE, &r);
      }
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    return p;
  }

  /// Waits for `p` (killing it after its timeout) and collects what it printed.
  static Result wait(const Process& p) {
    Result r;
    int status = 0;
    rusage usage{};
    // The child's pidfd becomes readable when it exits: poll it with the timeout (no sleeping),
    // then reap it; on a timeout it is killed first.
    const int fd = static_cast<int>(::syscall(SYS_pidfd_open, p.pid, 0));
    if (fd >= 0) {
      pollfd exited{fd, POLLIN, 0};
      int ready = 0;
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(p.limits.timeout_s);
      do {
        const auto left =
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
        ready = ::poll(&exited, 1, static_cast<int>(std::max<std::int64_t>(0, left.count())));
      } while (ready < 0 && errno == EINTR);
      ::close(fd);
      if (ready == 0) {
        ::kill(p.pid, SIGKILL);
        r.timed_out = true;
      }
    }
    ::wait4(p.pid, &status, 0, &usage);  // without pidfd_open (Linux < 5.3): no timeout, just wait
    auto seconds = [](const timeval& t) {
      return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec);
    };
    r.cpu_s = seconds(usage.ru_utime) + seconds(usage.ru_stime);
    if (WIFEXITED(status)) r.code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) r.signal = WTERMSIG(status);
    r.out = slurp(p.out);
    r.err = slurp(p.err);
    fs::remove(p.out);
    fs::remove(p.err);
    return r;
  }

  Result run_argv(const std::vector<std::string>& args, const Limits& limits = {}) const {
    return wait(start(args, limits));
  }

  [[nodiscard]] std::string tmp(const std::string& name) const { return (dir_ / name).string(); }
  static std::string fixture(const std::string& c, const std::string& file) {
    return (fs::path(QKV_FIXTURES_DIR) / c / file).string();
  }
  static nlohmann::json config(const std::string& c) {
    std::ifstream in(fs::path(QKV_FIXTURES_DIR) / c / "config.json");
    return nlohmann::json::parse(in);
  }
  /// Max |got - expected_f64|.
  static double error(const std::string& got, const std::string& expected) {
    const NdArray a = read_npy(got), e = read_npy(expected);
    EXPECT_EQ(a.shape, e.shape) << got;
    const auto av = a.to_f32();
    const auto ev = e.as<double>();
    double err = 0;
    for (std::size_t i = 0; i < av.size() && i < ev.size(); ++i) {
      if (av[i] == ev[i]) continue;  // the same infinity (an empty row's −inf log-sum-exp) included
      const double d = std::abs(av[i] - ev[i]);
      err = std::isnan(d) || std::isinf(d) ? std::numeric_limits<double>::infinity() : std::max(err, d);
    }
    return err;
  }
  /// A one-line error on stderr (plus at most a pointer to --help).
  static void expect_one_line_error(const Result& r) {
    EXPECT_THAT(r.err, ::testing::HasSubstr("error"));
    const auto lines = std::count(r.err.begin(), r.err.end(), '\n');
    EXPECT_LE(lines, 2) << r.err;
  }
  /// Exit 2 with "qkv: error: …" and the pointer to --help, nothing on stdout.
  static void expect_usage_error(const Result& r, const std::string& says, const std::string& what) {
    EXPECT_EQ(r.code, 2) << what << "\n" << r.err;
    EXPECT_THAT(r.err, ::testing::StartsWith("qkv: error: ")) << what;
    EXPECT_THAT(r.err, ::testing::HasSubstr(says)) << what;
    expect_one_line_error(r);
  }
  /// The names in the test's directory (to see that nothing was left behind).
  [[nodiscard]] std::vector<std::string> listing(const fs::path& in = {}) const {
    std::vector<std::string> names;
    for (const auto& e : fs::directory_iterator(in.empty() ? dir_ : in)) names.push_back(e.path().filename().string());
    std::sort(names.begin(), names.end());
    return names;
  }

  fs::path dir_;
  fs::path cache_;  // XDG_CACHE_HOME of the qkv processes the test starts
};

/// The flags `qkv run mha` needs for a PyTorch fixture.
inline std::string mha_flags(const nlohmann::json& c, const std::string& name) {
  std::string f = "--weights " + (fs::path(QKV_FIXTURES_DIR) / name / "weights.safetensors").string() + " --heads " +
                  std::to_string(c.at("num_heads").get<int>());
  for (const std::string in : c.at("inputs")) {
    const std::string flag = in == "key_padding_mask" ? "--key-padding-mask"
                             : in == "attn_mask"      ? "--attn-mask"
                                                      : "--" + in;
    if (c.at("self_attention").get<bool>() && (in == "key" || in == "value")) continue;
    f += " " + flag + " " + (fs::path(QKV_FIXTURES_DIR) / name / (in + ".npy")).string();
  }
  if (c.at("add_zero_attn").get<bool>()) f += " --add-zero-attn";
  return f;
}

/// A small sdpa problem [1, 2, L, 8] x [1, 2, S, 8], values depending on `salt`.
inline void write_sdpa_inputs(const fs::path& dir, std::int64_t L, std::int64_t S, float salt = 0.0f) {
  auto fill = [&](std::int64_t n, float f) {
    std::vector<float> v(static_cast<std::size_t>(n));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = std::sin(f * static_cast<float>(i) + salt);
    return v;
  };
  write_npy(dir / "q.npy", NdArray::from_f32(fill(2 * L * 8, 0.37f), {1, 2, L, 8}));
  write_npy(dir / "k.npy", NdArray::from_f32(fill(2 * S * 8, 0.11f), {1, 2, S, 8}));
  write_npy(dir / "v.npy", NdArray::from_f32(fill(2 * S * 8, 0.05f), {1, 2, S, 8}));
}

}  // namespace qkv::test
