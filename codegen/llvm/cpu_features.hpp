// codegen/llvm/cpu_features.hpp — how a CPU feature is read off the CPU that runs the code: the
// one table behind required_features (target.hpp) and the CPU check every emitted library runs
// before its first kernel (cpu_check.cpp). No LLVM here.
//
// x86-64: words are registers of cpuid leaves (1, 7.0, 7.1, 0x80000001) and XCR0, the state the
// OS saves (xgetbv 0; AVX needs YMM state, AVX-512 the opmask and ZMM state too: a CPU with the
// instructions under an OS that does not save their registers cannot run them). aarch64: words
// are Linux's AT_HWCAP and AT_HWCAP2.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

namespace qkv::codegen::cpu_features {

enum class Word : std::uint8_t {
  // x86-64
  leaf1_ecx,
  leaf1_edx,
  leaf7_ebx,
  leaf7_ecx,
  leaf7_edx,
  leaf7s1_eax,
  leaf7s1_edx,
  ext1_ecx,  // leaf 0x80000001
  xcr0,      // xgetbv(0), read only when leaf 1's ECX says OSXSAVE
  // aarch64 (Linux)
  hwcap,
  hwcap2,
};
inline constexpr int kWords = 11;

/// A feature's bits: all of `mask` set in `word`, and all of `also` in `also_word` (when also != 0).
struct Checked {
  std::string_view name;  // LLVM's feature name
  Word word;
  std::uint64_t mask;
  Word also_word = Word::leaf1_ecx;
  std::uint64_t also = 0;
};

/// The features the CPU check knows for an architecture ("x86_64", "aarch64"); empty for others.
std::span<const Checked> checked(std::string_view arch);

}  // namespace qkv::codegen::cpu_features
