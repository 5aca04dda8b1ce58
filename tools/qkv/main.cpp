// qkv — the command-line tool: PyTorch's attention modules on .npy/safetensors files, models by
// shape for shape tables and benchmarks, attention heatmaps, ahead-of-time compilation. The
// command line itself is cli.cpp; here the process is made to end with one line and exit 1,
// never a signal, when memory runs out (out_of_memory.hpp).
#include "commands.hpp"
#include "out_of_memory.hpp"

namespace {
// Before the shared libraries' static constructors (LLVM's allocate): .preinit_array runs first.
void install_early(int, char**, char**) { qkv::cli::install_allocation_handlers(); }
}  // namespace
__attribute__((section(".preinit_array"), used)) static void (*const qkv_preinit)(int, char**, char**) = install_early;

int main(int argc, char** argv) {
  qkv::cli::install_out_of_memory_handlers();
  return qkv::cli::run_cli(argc, argv);
}
