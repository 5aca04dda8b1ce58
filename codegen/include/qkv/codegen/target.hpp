// qkv/codegen/target.hpp — what the code generators know about the machine they target.
// LLVM stays behind this header: it is only included by codegen's .cpp files.
//
// A target is a triple, a CPU name and an explicit feature list. The list names every feature
// LLVM knows for the architecture, enabled ("+avx2") or disabled ("-avx512f"): code is built for
// that feature set, never for what the CPU name implies. (A cloud VM may report an AVX-512 CPU
// — LLVM's host name `znver4` — whose hypervisor hides AVX-512; passing only the enabled features
// let the name's defaults back in, and the code raised SIGILL.)
//
// Every library qkv emits records the features its code needs (required_features) and checks
// them before it runs (cpuid / xgetbv on x86-64, AT_HWCAP on aarch64): docs/aot.md, "Portability".
#pragma once

#include <map>
#include <string>
#include <vector>

namespace qkv::codegen {

struct HostTarget {
  std::string triple;                 // e.g. x86_64-pc-linux-gnu, aarch64-unknown-linux-gnu
  std::string cpu;                    // LLVM's CPU name, e.g. znver4, x86-64-v3, neoverse-n1
  std::vector<std::string> features;  // every feature, "+name" or "-name", sorted by name
  int vector_floats = 1;              // f32 lanes of the widest usable vector: 16 (AVX-512), 8 (AVX2), 4 (SSE, NEON)
  bool has_fma = false;
};

/// "+name" for every enabled and "-name" for every disabled feature of `features` (LLVM's names,
/// as sys::getHostCPUFeatures reports them), sorted by name: the list handed to LLVM.
std::vector<std::string> feature_flags(const std::map<std::string, bool>& features);

/// The host as LLVM sees it (sys::getHostCPUName), with its features exactly as the host reports
/// them (sys::getHostCPUFeatures: cpuid and the OS's saved state), enabled and disabled.
HostTarget host_target();

/// A target for `cpu` on `triple` (empty: the host's triple) with LLVM's processor table's
/// features for that CPU, then `overrides` applied ("-avx512f,+fma": LLVM's -mattr syntax;
/// disabling a feature disables those built on it), every feature explicit. "native" is the host
/// (host_target(), then the overrides); it needs the host's architecture. Throws
/// std::invalid_argument for an unknown CPU, feature or triple.
HostTarget make_target(const std::string& triple, const std::string& cpu, const std::string& overrides = "");

/// The architecture of a triple, as a user names it: "x86_64", "aarch64", or the triple's own.
std::string target_arch(const std::string& triple);

/// The features of `target` that a CPU must have to run its code, as the generated CPU check
/// tests them (x86-64: cpuid leaves 1, 7, 7.1 and 0x80000001 and the OS's XCR0 state; aarch64:
/// AT_HWCAP / AT_HWCAP2), sorted. Instruction-set extensions only: features that change no
/// instruction the code generator may pick (tuning flags, crypto instructions qkv never asks
/// for) are not required.
std::vector<std::string> required_features(const HostTarget& target);

/// The features of required_features(target) that `host` lacks; empty when code built for
/// `target` runs on `host` (which must have the same architecture, or all are missing).
std::vector<std::string> missing_features(const HostTarget& target, const HostTarget& host);

/// The line the JIT and an emitted library give when the CPU lacks features: "code for <cpu>
/// needs a, b, c; this CPU lacks b".
std::string cpu_error(const HostTarget& target, const std::vector<std::string>& missing);

/// Comma-joined features, as LLVM's "target-features" attribute and TargetMachine take them.
std::string joined_features(const HostTarget& target);

/// Targets compiled into the linked LLVM that qkv can emit for (e.g. "x86-64", "nvptx64").
std::vector<std::string> available_backends();

}  // namespace qkv::codegen
