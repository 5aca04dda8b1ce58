// emit_ptx / nvptx_ir: one module per kernel, verified, optimised with the -O3 pipeline of a
// PassBuilder that knows the NVPTX target machine, then printed as PTX by the NVPTX AsmPrinter.
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <type_traits>

#include <llvm/ADT/SmallString.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/LegacyPassManager.h>
#include <llvm/IR/Module.h>
#include <llvm/IR/Verifier.h>
#include <llvm/MC/TargetRegistry.h>
#include <llvm/Support/TargetSelect.h>
#include <llvm/Support/raw_ostream.h>
#include <llvm/Target/TargetMachine.h>
#include <llvm/Target/TargetOptions.h>
#include <llvm/TargetParser/Triple.h>

#include "llvm/optimize.hpp"
#include "nvptx/geometry.hpp"
#include "nvptx/kernel_builder.hpp"

namespace qkv::codegen::nvptx {

namespace {

constexpr const char* kTriple = "nvptx64-nvidia-cuda";

[[noreturn]] void fail(const std::string& message) { throw std::runtime_error("nvptx: " + message); }

const llvm::Target& nvptx_target() {
  static const llvm::Target* target = [] {
    LLVMInitializeNVPTXTargetInfo();
    LLVMInitializeNVPTXTarget();
    LLVMInitializeNVPTXTargetMC();
    LLVMInitializeNVPTXAsmPrinter();
    std::string error;
    return llvm::TargetRegistry::lookupTarget(kTriple, error);
  }();
  if (!target) fail("the linked LLVM has no NVPTX backend");
  return *target;
}

std::unique_ptr<llvm::TargetMachine> make_machine(int sm) {
  detail::check_sm(sm);
  llvm::TargetOptions options;
  std::unique_ptr<llvm::TargetMachine> tm(nvptx_target().createTargetMachine(
      kTriple, "sm_" + std::to_string(sm), "", options, std::nullopt, std::nullopt, llvm::CodeGenOptLevel::Aggressive));
  if (!tm) fail("cannot create an NVPTX target machine for sm_" + std::to_string(sm));
  return tm;
}

/// Fills a fresh module with the request's kernel.
detail::KernelInfo build(llvm::Module& module, const KernelRequest& request) {
  return std::visit(
      [&](const auto& r) -> detail::KernelInfo {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, AttentionKernel>) return detail::build_attention(module, r);
        if constexpr (std::is_same_v<T, LinearKernel>) return detail::build_linear(module, r);
        if constexpr (std::is_same_v<T, LayerNormKernel>) return detail::build_layer_norm(module, r);
        if constexpr (std::is_same_v<T, ElementwiseKernel>) return detail::build_elementwise(module, r);
        if constexpr (std::is_same_v<T, StridedCopyKernel>) return detail::build_strided_copy(module, r);
        if constexpr (std::is_same_v<T, DecodeAttentionKernel>) return detail::build_decode_attention(module, r);
        if constexpr (std::is_same_v<T, DecodeMergeKernel>) return detail::build_decode_merge(module, r);
        if constexpr (std::is_same_v<T, AttentionBackwardKernel>) return detail::build_attention_backward(module, r);
      },
      request);
}

void prepare(llvm::Module& module, llvm::TargetMachine& tm) {
  module.setTargetTriple(kTriple);
  module.setDataLayout(tm.createDataLayout());
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(module, &os)) fail("module '" + module.getName().str() + "' does not verify:\n" + problems);
}

void optimize(llvm::Module& module, llvm::TargetMachine& tm) {
  std::string error;
  if (!optimize_module(module, tm, "-O3", &error)) fail(error);
  std::string problems;
  llvm::raw_string_ostream os(problems);
  if (llvm::verifyModule(module, &os)) fail("module '" + module.getName().str() + "' broke in -O3:\n" + problems);
}

std::string print(const llvm::Module& module) {
  std::string text;
  llvm::raw_string_ostream os(text);
  module.print(os, nullptr);
  return text;
}

/// The backend is not known to be thread-safe across target machines in every version; the
/// generators are cheap next to a GPU launch, so one emission at a time.
std::mutex& emit_mutex() {
  static std::mutex m;
  return m;
}

}  // namespace

namespace detail {
KernelInfo build_emulation(llvm::Module& module, const KernelRequest& request, const HostEmulation& emulation) {
  return std::visit(
      [&](const auto& r) -> KernelInfo {
        using T = std::decay_t<decltype(r)>;
        if constexpr (std::is_same_v<T, AttentionKernel>) return build_attention(module, r, &emulation);
        if constexpr (std::is_same_v<T, LinearKernel>) return build_linear(module, r, &emulation);
        if constexpr (std::is_same_v<T, LayerNormKernel>) return build_layer_norm(module, r, &emulation);
        if constexpr (std::is_same_v<T, ElementwiseKernel>) return build_elementwise(module, r, &emulation);
        if constexpr (std::is_same_v<T, StridedCopyKernel>) return build_strided_copy(module, r, &emulation);
        if constexpr (std::is_same_v<T, DecodeAttentionKernel>) return build_decode_attention(module, r, &emulation);
        if constexpr (std::is_same_v<T, DecodeMergeKernel>) return build_decode_merge(module, r, &emulation);
        if constexpr (std::is_same_v<T, AttentionBackwardKernel>)
          return build_attention_backward(module, r, &emulation);
      },
      request);
}
}  // namespace detail

PtxKernel emit_ptx(const KernelRequest& request, int sm) {
  auto tm = make_machine(sm);
  llvm::LLVMContext context;
  auto module = std::make_unique<llvm::Module>(kernel_name(request), context);
  const detail::KernelInfo info = build(*module, request);
  if (info.shared_bytes > detail::max_shared_bytes(sm))
    fail(info.name + " needs " + std::to_string(info.shared_bytes) + " bytes of shared memory; sm_" +
         std::to_string(sm) + " allows " + std::to_string(detail::max_shared_bytes(sm)));

  llvm::SmallString<0> ptx;
  {
    std::lock_guard<std::mutex> lock(emit_mutex());
    prepare(*module, *tm);
    optimize(*module, *tm);
    llvm::raw_svector_ostream os(ptx);
    llvm::legacy::PassManager pm;
    if (tm->addPassesToEmitFile(pm, os, nullptr, llvm::CodeGenFileType::AssemblyFile))
      fail("the NVPTX target cannot emit assembly for " + info.name);
    pm.run(*module);
  }

  PtxKernel k;
  k.name = info.name;
  k.signature = info.name + "(" + info.signature + ")";
  k.grid_rule = info.grid_rule;
  k.sm = sm;
  k.block_x = info.block_x;
  k.block_y = info.block_y;
  k.block_z = info.block_z;
  k.shared_bytes = info.shared_bytes;
  k.static_shared_bytes = info.static_shared_bytes;
  k.ptx = "// qkv kernel: " + k.signature + "\n// launch: grid " + k.grid_rule + " block (" +
          std::to_string(k.block_x) + "," + std::to_string(k.block_y) + "," + std::to_string(k.block_z) +
          ") dynamic shared " + std::to_string(k.shared_bytes) + " B (static " + std::to_string(k.static_shared_bytes) +
          " B)\n" + std::string(ptx.str());
  return k;
}

std::string nvptx_ir(const KernelRequest& request, int sm, bool optimized) {
  auto tm = make_machine(sm);
  llvm::LLVMContext context;
  auto module = std::make_unique<llvm::Module>(kernel_name(request), context);
  build(*module, request);
  std::lock_guard<std::mutex> lock(emit_mutex());
  prepare(*module, *tm);
  if (optimized) optimize(*module, *tm);
  return print(*module);
}

}  // namespace qkv::codegen::nvptx
