#include <qkv/codegen/target.hpp>

#include <algorithm>

#include <llvm/ADT/StringMap.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/TargetParser/Host.h>

namespace qkv::codegen {

HostTarget host_target() {
  HostTarget t;
  t.triple = llvm::sys::getDefaultTargetTriple();
  t.cpu = llvm::sys::getHostCPUName().str();
  const llvm::StringMap<bool> features = llvm::sys::getHostCPUFeatures();
  for (const auto& f : features)
    if (f.getValue()) t.features.push_back("+" + f.getKey().str());
  std::sort(t.features.begin(), t.features.end());
  auto has = [&](const char* name) {
    auto it = features.find(name);
    return it != features.end() && it->getValue();
  };
  t.has_fma = has("fma");
  t.vector_floats = has("avx512f") ? 16 : has("avx2") || has("avx") ? 8 : 4;
  return t;
}

std::vector<std::string> available_backends() {
  llvm::InitializeAllTargetInfos();
  std::vector<std::string> names;
  for (const auto& target : llvm::TargetRegistry::targets()) names.emplace_back(target.getName());
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace qkv::codegen
