// Running out of memory, anywhere in the process, ends qkv with one line and exit code 1:
//
//   qkv: error: out of memory while compiling the model (ulimit -v: 200 MiB)
//
// never with a signal or a half-written output. operator new, LLVM's allocators and LLVM's fatal
// errors all end in the same handler, which removes what the output groups have staged
// (abandon_staged_outputs) and calls _exit(1) without unwinding: an exception must not unwind
// through LLVM, which is built without exceptions (that is how a bad_alloc in the optimiser
// became a SIGSEGV). Exceptions that still say "no memory" (an explicit std::bad_alloc, a
// thread that cannot start) are turned into the same line by describe_out_of_memory().
#pragma once

#include <exception>
#include <optional>
#include <string>

namespace qkv::cli {

/// Installs the handlers of operator new, std::terminate and LLVM's bad-alloc error: safe before
/// any static constructor has run, and called once, from .preinit_array (main.cpp), because
/// libLLVM's static constructors allocate.
void install_allocation_handlers() noexcept;

/// The rest, from main: LLVM's fatal-error handler, SIGXFSZ ignored, so that a file-size limit is
/// a write error naming the file instead of a signal, and SIGINT, SIGTERM, SIGHUP and SIGQUIT
/// handled: the staged outputs are removed, then the signal ends the process (not while a group
/// renames its outputs into place: the signal waits for that). SIGBUS — a mapped file's page past
/// its end, when another process truncates a checkpoint whose weights are read in place — is one
/// line and exit 1, the staged outputs removed, not a core dump.
void install_out_of_memory_handlers();

/// What the process is doing, for the out-of-memory line ("reading the inputs"); the previous
/// activity comes back when this one ends normally, but not when an exception ends it (the line
/// is printed after the unwinding and names the activity that failed). `what` must outlive the
/// scope (a string literal).
class Activity {
 public:
  explicit Activity(const char* what);
  ~Activity();
  Activity(const Activity&) = delete;
  Activity& operator=(const Activity&) = delete;

 private:
  const char* previous_;
  int uncaught_;
};

/// The one-line message for an exception that means the process ran out of memory (std::bad_alloc,
/// a std::system_error with ENOMEM or EAGAIN from starting a thread), or nullopt for any other.
std::optional<std::string> describe_out_of_memory(const std::exception& e);

}  // namespace qkv::cli
