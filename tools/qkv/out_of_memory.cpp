#include "out_of_memory.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <new>
#include <system_error>

#include <llvm/Support/ErrorHandling.h>

#include <qkv/runtime/io/files.hpp>

namespace qkv::cli {

namespace {

std::atomic<const char*> g_activity{"starting"};
std::atomic<bool> g_exiting{false};

/// " (ulimit -v: N MiB)" when an address-space limit is set, else "".
void limit_note(char* buf, std::size_t size) {
  rlimit r{};
  buf[0] = '\0';
  if (getrlimit(RLIMIT_AS, &r) == 0 && r.rlim_cur != RLIM_INFINITY)
    std::snprintf(buf, size, " (ulimit -v: %llu MiB)", static_cast<unsigned long long>(r.rlim_cur >> 20));
}

/// Writes "qkv: error: <text>" as one line to stderr, removes the staged outputs and exits 1 —
/// without allocating (the heap may be exhausted) and without unwinding.
[[noreturn]] void die(const char* prefix, const char* detail) noexcept {
  if (g_exiting.exchange(true)) {  // another thread is already on its way out
    for (;;) pause();
  }
  static char line[1024];
  char note[64];
  limit_note(note, sizeof note);
  const int n = std::snprintf(line, sizeof line, "qkv: error: %s%s%s%s", prefix, g_activity.load(), detail, note);
  std::size_t len = n < 0 ? 0 : std::min(static_cast<std::size_t>(n), sizeof line - 2);
  for (std::size_t i = 0; i < len; ++i)
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  line[len++] = '\n';
  if (::write(STDERR_FILENO, line, len) < 0) {
    // nothing left to report it with
  }
  abandon_staged_outputs();
  _exit(1);
}

void on_new_failure() { die("out of memory while ", ""); }

void on_bus_error(int) {
  die("a file mapped into memory was truncated by another process (SIGBUS) while ",
      " (a checkpoint's weights are read where it is mapped: leave it unchanged while qkv runs; generate's --no-mmap "
      "copies them)");
}

void on_llvm_bad_alloc(void*, const char*, bool) { die("out of memory while ", ""); }

void on_llvm_fatal_error(void*, const char* reason, bool) {
  static char detail[512];
  const bool oom = std::strstr(reason, "out of memory") || std::strstr(reason, "Allocation failed");
  if (oom) die("out of memory while ", "");
  std::snprintf(detail, sizeof detail, ": LLVM: %s", reason);
  die("internal error while ", detail);
}

void on_terminate() {
  static char detail[512];
  if (const std::exception_ptr e = std::current_exception()) {
    try {
      std::rethrow_exception(e);
    } catch (const std::bad_alloc&) {
      die("out of memory while ", "");
    } catch (const std::exception& x) {
      std::snprintf(detail, sizeof detail, ": %s", x.what());
    } catch (...) {
      std::snprintf(detail, sizeof detail, ": an unknown exception");
    }
  }
  die("internal error while ", detail);
}

/// SIGINT, SIGTERM, SIGHUP, SIGQUIT: what the output groups staged is removed, then the signal
/// ends the process as it would have (the shell sees the signal); during a group's renames the
/// signal waits for them (abandon_staged_outputs_for_signal).
void on_ending_signal(int signal) {
  if (!abandon_staged_outputs_for_signal(signal)) return;  // raised again after the renames
  std::signal(signal, SIG_DFL);
  std::raise(signal);
}

}  // namespace

void install_allocation_handlers() noexcept {
  std::set_new_handler(on_new_failure);
  std::set_terminate(on_terminate);
  // LLVM's handler lives in a plain pointer behind a constant-initialised std::mutex, so it can be
  // set before libLLVM's own static constructors run — and those allocate (cl::opt's registry):
  // under a tight `ulimit -v` they were a SIGABRT before main.
  llvm::install_bad_alloc_error_handler(on_llvm_bad_alloc, nullptr);
}

void install_out_of_memory_handlers() {
  llvm::install_fatal_error_handler(on_llvm_fatal_error, nullptr);
  std::signal(SIGXFSZ, SIG_IGN);
  struct sigaction bus{};
  bus.sa_handler = on_bus_error;
  sigemptyset(&bus.sa_mask);
  sigaction(SIGBUS, &bus, nullptr);
  for (const int signal : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) {
    struct sigaction now{};
    if (sigaction(signal, nullptr, &now) == 0 && now.sa_handler == SIG_IGN) continue;  // nohup, `cmd &`
    struct sigaction on{};
    on.sa_handler = on_ending_signal;
    sigemptyset(&on.sa_mask);
    sigaction(signal, &on, nullptr);
  }
}

Activity::Activity(const char* what) : previous_(g_activity.exchange(what)), uncaught_(std::uncaught_exceptions()) {}
Activity::~Activity() {
  if (std::uncaught_exceptions() == uncaught_) g_activity.store(previous_);
}

std::optional<std::string> describe_out_of_memory(const std::exception& e) {
  char note[64];
  limit_note(note, sizeof note);
  const std::string head = std::string("out of memory while ") + g_activity.load();
  if (dynamic_cast<const std::bad_alloc*>(&e)) return head + note;
  if (const auto* s = dynamic_cast<const std::system_error*>(&e)) {
    const int code = s->code().value();
    if (s->code().category() == std::generic_category() || s->code().category() == std::system_category())
      if (code == ENOMEM || code == EAGAIN) return head + " (a thread could not start: " + s->what() + ")" + note;
  }
  return std::nullopt;
}

}  // namespace qkv::cli
