// qkv/codegen/target.hpp — what the code generators know about the machine they target.
// LLVM stays behind this header: it is only included by codegen's .cpp files.
#pragma once

#include <string>
#include <vector>

namespace qkv::codegen {

struct HostTarget {
  std::string triple;                 // e.g. x86_64-pc-linux-gnu
  std::string cpu;                    // LLVM's name for the host CPU, e.g. znver4
  std::vector<std::string> features;  // enabled features, e.g. +avx2, +avx512f, +fma
  int vector_floats = 1;              // f32 lanes of the widest usable vector: 16 (AVX-512), 8 (AVX2), 4 (SSE)
  bool has_fma = false;
};

/// The host as LLVM sees it (sys::getHostCPUName / getHostCPUFeatures).
HostTarget host_target();

/// Targets compiled into the linked LLVM that qkv can emit for (e.g. "x86-64", "nvptx64").
std::vector<std::string> available_backends();

}  // namespace qkv::codegen
