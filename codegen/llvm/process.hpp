// codegen/llvm/process.hpp — the external programs the code generators run (ld.lld/cc for AOT
// shared libraries, ptxas for PTX checks): posix_spawn without a shell, stdin from /dev/null,
// stdout and stderr captured together. Private to codegen; no LLVM.
#pragma once

#include <string>
#include <vector>

namespace qkv::codegen::process {

struct Result {
  /// The exit status; -1 when the program could not be started or waited for, or was killed by
  /// a signal (`error` says which).
  int status = -1;
  std::string output;  // stdout and stderr
  std::string error;
};

/// Runs args[0] (a path; looked up on PATH when `search_path`) with args[1..].
Result run(const std::vector<std::string>& args, bool search_path);

/// A new empty file $TMPDIR/qkv-<tag>-XXXXXX<suffix> (or /tmp/…): its path, or "" on failure.
std::string temp_file(const std::string& tag, const std::string& suffix);

/// The whole file, or "" when it cannot be read.
std::string slurp(const std::string& path);

}  // namespace qkv::codegen::process
