// Targets: the host as it reports itself, named CPUs from LLVM's processor tables, the features
// their code needs and the table the CPU check reads them with (llvm/cpu_features.hpp).
#include <qkv/codegen/target.hpp>

#include <algorithm>
#include <memory>
#include <stdexcept>

#include <llvm/ADT/StringMap.h>
#include <llvm/MC/MCSubtargetInfo.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/TargetParser/Host.h>
#include <llvm/TargetParser/Triple.h>

#include "llvm/cpu_features.hpp"

namespace qkv::codegen {

namespace cpu_features {

namespace {
constexpr std::uint64_t bit(int b) { return std::uint64_t{1} << b; }
constexpr std::uint64_t kYmmState = 0x6;   // XCR0: SSE and AVX state
constexpr std::uint64_t kZmmState = 0xE6;  // ... and opmask, ZMM0-15 upper halves, ZMM16-31

// clang-format off
constexpr Checked kX86[] = {
    {"sse", Word::leaf1_edx, bit(25)},
    {"sse2", Word::leaf1_edx, bit(26)},
    {"sse3", Word::leaf1_ecx, bit(0)},
    {"ssse3", Word::leaf1_ecx, bit(9)},
    {"fma", Word::leaf1_ecx, bit(12), Word::xcr0, kYmmState},
    {"cx16", Word::leaf1_ecx, bit(13)},
    {"sse4.1", Word::leaf1_ecx, bit(19)},
    {"sse4.2", Word::leaf1_ecx, bit(20)},
    {"movbe", Word::leaf1_ecx, bit(22)},
    {"popcnt", Word::leaf1_ecx, bit(23)},
    {"avx", Word::leaf1_ecx, bit(28), Word::xcr0, kYmmState},
    {"f16c", Word::leaf1_ecx, bit(29), Word::xcr0, kYmmState},
    {"bmi", Word::leaf7_ebx, bit(3)},
    {"avx2", Word::leaf7_ebx, bit(5), Word::xcr0, kYmmState},
    {"bmi2", Word::leaf7_ebx, bit(8)},
    {"avx512f", Word::leaf7_ebx, bit(16), Word::xcr0, kZmmState},
    {"avx512dq", Word::leaf7_ebx, bit(17), Word::xcr0, kZmmState},
    {"adx", Word::leaf7_ebx, bit(19)},
    {"avx512ifma", Word::leaf7_ebx, bit(21), Word::xcr0, kZmmState},
    {"avx512cd", Word::leaf7_ebx, bit(28), Word::xcr0, kZmmState},
    {"avx512bw", Word::leaf7_ebx, bit(30), Word::xcr0, kZmmState},
    {"avx512vl", Word::leaf7_ebx, bit(31), Word::xcr0, kZmmState},
    {"avx512vbmi", Word::leaf7_ecx, bit(1), Word::xcr0, kZmmState},
    {"avx512vbmi2", Word::leaf7_ecx, bit(6), Word::xcr0, kZmmState},
    {"gfni", Word::leaf7_ecx, bit(8)},
    {"avx512vnni", Word::leaf7_ecx, bit(11), Word::xcr0, kZmmState},
    {"avx512bitalg", Word::leaf7_ecx, bit(12), Word::xcr0, kZmmState},
    {"avx512vpopcntdq", Word::leaf7_ecx, bit(14), Word::xcr0, kZmmState},
    {"avx512vp2intersect", Word::leaf7_edx, bit(8), Word::xcr0, kZmmState},
    {"avx512fp16", Word::leaf7_edx, bit(23), Word::xcr0, kZmmState},
    {"avxvnni", Word::leaf7s1_eax, bit(4), Word::xcr0, kYmmState},
    {"avx512bf16", Word::leaf7s1_eax, bit(5), Word::xcr0, kZmmState},
    {"avxneconvert", Word::leaf7s1_edx, bit(5), Word::xcr0, kYmmState},
    {"sahf", Word::ext1_ecx, bit(0)},
    {"lzcnt", Word::ext1_ecx, bit(5)},
    {"sse4a", Word::ext1_ecx, bit(6)},
    {"prfchw", Word::ext1_ecx, bit(8)},
    {"xop", Word::ext1_ecx, bit(11), Word::xcr0, kYmmState},
    {"fma4", Word::ext1_ecx, bit(16), Word::xcr0, kYmmState},
    {"tbm", Word::ext1_ecx, bit(21)},
};
// Linux's AT_HWCAP / AT_HWCAP2 bits (asm/hwcap.h).
constexpr Checked kAArch64[] = {
    {"fp-armv8", Word::hwcap, bit(0)},
    {"neon", Word::hwcap, bit(1)},
    {"lse", Word::hwcap, bit(8)},
    {"fullfp16", Word::hwcap, bit(9) | bit(10)},
    {"rdm", Word::hwcap, bit(12)},
    {"complxnum", Word::hwcap, bit(14)},
    {"rcpc", Word::hwcap, bit(15)},
    {"dotprod", Word::hwcap, bit(20)},
    {"sve", Word::hwcap, bit(22)},
    {"fp16fml", Word::hwcap, bit(23)},
    {"sve2", Word::hwcap2, bit(1)},
    {"i8mm", Word::hwcap2, bit(13)},
    {"bf16", Word::hwcap2, bit(14)},
};
// clang-format on
}  // namespace

std::span<const Checked> checked(std::string_view arch) {
  if (arch == "x86_64") return kX86;
  if (arch == "aarch64") return kAArch64;
  return {};
}

}  // namespace cpu_features

namespace {

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

void init_all_targets() {
  static const bool done = [] {
    llvm::InitializeAllTargetInfos();
    llvm::InitializeAllTargetMCs();
    return true;
  }();
  (void)done;
}

bool enabled(const HostTarget& t, std::string_view name) {
  const std::string flag = "+" + std::string(name);
  return std::find(t.features.begin(), t.features.end(), flag) != t.features.end();
}

/// vector_floats and has_fma from the feature list (never from the CPU name).
void derive_widths(HostTarget& t) {
  const std::string arch = target_arch(t.triple);
  if (arch == "x86_64") {
    t.vector_floats = enabled(t, "avx512f") ? 16 : enabled(t, "avx") ? 8 : 4;
    t.has_fma = enabled(t, "fma");
  } else if (arch == "aarch64") {
    t.vector_floats = 4;  // NEON's 128 bits (SVE's scalable vectors are not used)
    t.has_fma = enabled(t, "neon");
  } else {
    t.vector_floats = 4;
    t.has_fma = false;
  }
}

std::string normalized_triple(const std::string& triple) {
  if (triple.empty()) return llvm::sys::getDefaultTargetTriple();
  if (triple == "x86_64" || triple == "x86-64") return "x86_64-unknown-linux-gnu";
  if (triple == "aarch64" || triple == "arm64") return "aarch64-unknown-linux-gnu";
  return llvm::Triple::normalize(triple);
}

}  // namespace

std::vector<std::string> feature_flags(const std::map<std::string, bool>& features) {
  std::vector<std::string> flags;
  flags.reserve(features.size());
  for (const auto& [name, on] : features) flags.push_back((on ? "+" : "-") + name);  // std::map: sorted by name
  return flags;
}

std::string target_arch(const std::string& triple) {
  const llvm::Triple t(triple);
  switch (t.getArch()) {
    case llvm::Triple::x86_64:
      return "x86_64";
    case llvm::Triple::aarch64:
      return "aarch64";
    default:
      return t.getArchName().str();
  }
}

HostTarget host_target() {
  HostTarget t;
  t.triple = llvm::sys::getDefaultTargetTriple();
  t.cpu = llvm::sys::getHostCPUName().str();
  std::map<std::string, bool> features;
  for (const auto& f : llvm::sys::getHostCPUFeatures()) features[f.getKey().str()] = f.getValue();
  t.features = feature_flags(features);
  derive_widths(t);
  return t;
}

HostTarget make_target(const std::string& triple_in, const std::string& cpu_in, const std::string& overrides) {
  init_all_targets();
  HostTarget t;
  t.triple = normalized_triple(triple_in);
  const bool native = cpu_in.empty() || cpu_in == "native";
  const HostTarget host = native ? host_target() : HostTarget{};
  if (native && target_arch(t.triple) != target_arch(host.triple))
    invalid("--cpu native means this host (" + target_arch(host.triple) + "); name a CPU for " + target_arch(t.triple) +
            " (e.g. generic)");
  t.cpu = native ? host.cpu : cpu_in;
  std::string error;
  const llvm::Target* target = llvm::TargetRegistry::lookupTarget(t.triple, error);
  if (!target) invalid("no LLVM target for " + t.triple + ": " + error);
  std::unique_ptr<llvm::MCSubtargetInfo> probe(target->createMCSubtargetInfo(t.triple, "", ""));
  if (!probe || !probe->isCPUStringValid(t.cpu))
    invalid("unknown CPU '" + cpu_in + "' for " + target_arch(t.triple) +
            (target_arch(t.triple) == "x86_64"
                 ? " (use native, x86-64, x86-64-v2, x86-64-v3, x86-64-v4 or a CPU name LLVM knows)"
                 : " (use generic or a CPU name LLVM knows, e.g. neoverse-n1, neoverse-v1)"));
  // Check the overrides' names: LLVM only warns about an unknown one.
  std::string fs = native ? joined_features(host) : "";
  std::size_t start = 0;
  while (start < overrides.size()) {
    const std::size_t comma = std::min(overrides.find(',', start), overrides.size());
    const std::string f = overrides.substr(start, comma - start);
    start = comma + 1;
    if (f.empty()) continue;
    if ((f[0] != '+' && f[0] != '-') || f.size() < 2) invalid("feature '" + f + "' must be +name or -name");
    bool known = false;
    for (const auto& kv : probe->getAllProcessorFeatures()) known = known || f.substr(1) == kv.Key;
    if (!known) invalid("unknown feature '" + f.substr(1) + "' for " + target_arch(t.triple));
    fs += (fs.empty() ? "" : ",") + f;
  }
  std::unique_ptr<llvm::MCSubtargetInfo> sti(target->createMCSubtargetInfo(t.triple, t.cpu, fs));
  if (!sti) invalid("cannot describe CPU '" + t.cpu + "' for " + t.triple);
  std::map<std::string, bool> features;
  for (const auto& kv : sti->getAllProcessorFeatures()) {
    const std::string name = kv.Key;
    if (name.find("bit-mode") != std::string::npos) continue;  // x86's 16/32/64-bit modes come from the triple
    features[name] = sti->checkFeatures("+" + name);
  }
  t.features = feature_flags(features);
  derive_widths(t);
  return t;
}

std::vector<std::string> required_features(const HostTarget& target) {
  std::vector<std::string> out;
  for (const auto& c : cpu_features::checked(target_arch(target.triple)))
    if (enabled(target, c.name)) out.emplace_back(c.name);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<std::string> missing_features(const HostTarget& target, const HostTarget& host) {
  const bool same_arch = target_arch(target.triple) == target_arch(host.triple);
  std::vector<std::string> missing;
  for (const auto& f : required_features(target))
    if (!same_arch || !enabled(host, f)) missing.push_back(f);
  return missing;
}

std::string cpu_error(const HostTarget& target, const std::vector<std::string>& missing) {
  auto list = [](const std::vector<std::string>& v) {
    std::string s;
    for (const auto& f : v) s += (s.empty() ? "" : ", ") + f;
    return s;
  };
  return "code for " + target.cpu + " needs " + list(required_features(target)) + "; this CPU lacks " + list(missing);
}

std::string joined_features(const HostTarget& target) {
  std::string s;
  for (const auto& f : target.features) s += (s.empty() ? "" : ",") + f;
  return s;
}

std::vector<std::string> available_backends() {
  llvm::InitializeAllTargetInfos();
  std::vector<std::string> names;
  for (const auto& target : llvm::TargetRegistry::targets()) names.emplace_back(target.getName());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace qkv::codegen
