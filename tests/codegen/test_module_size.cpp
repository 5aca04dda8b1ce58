// test_module_size.cpp — a decoder's module does not grow with its depth: every node's code is
// outlined into a function whose arguments are what it reads (its buffers, the sizes, the
// handle's slots), and the functions of the same node in every layer are one
// (outline_node_regions, merge_identical_functions). Compile time follows the module's code, so
// a 32-layer checkpoint compiles in about the time of a 2-layer one (docs/performance.md).
#include <gtest/gtest.h>

#include <cstddef>
#include <memory>
#include <string>

#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/qkv.hpp>

#include "backend_cases.hpp"
#include "cpu/module/module_builder.hpp"

namespace qkv::nn {
namespace {

struct ModuleSize {
  std::size_t functions = 0, instructions = 0;
  std::size_t entry = 0;  // the entry function's own instructions
};

/// The CPU module of tiny_llama_config's step graph (declare_cached_step) with `layers` layers.
ModuleSize step_module(std::int64_t layers) {
  LlamaConfig cfg = cases::tiny_llama_config();
  cfg.layers = layers;
  cfg.windowed.assign(static_cast<std::size_t>(layers), false);
  for (std::int64_t i = 1; i < layers; i += 2) cfg.windowed[static_cast<std::size_t>(i)] = true;
  Graph g;
  declare_cached_step(g, CausalLm<32>::make(g, cfg));
  const Graph lowered = codegen::lower(g);
  const codegen::HostTarget target = codegen::host_target();
  // The sizes the executor fixes (those the attention kernels are specialised on).
  const Bindings sizes{{"Vocab", 50},  {"Hidden", 64}, {"QProj", 32},  {"KvProj", 16}, {"Heads", 4},
                       {"KvHeads", 2}, {"Group", 2},   {"HeadDim", 8}, {"ValueDim", 8}};
  Bindings fixed;
  for (const std::string& s : codegen::cpu::specialised_sizes(lowered)) fixed[s] = sizes.at(s);
  const auto plan = codegen::cpu::plan_module(lowered, fixed, target);
  const auto sig = codegen::cpu::module_signature(lowered, codegen::AotOptions{.function = "step"}, plan);
  llvm::LLVMContext context;
  const auto module = codegen::cpu::build_graph_module(context, lowered, sig, plan, target, "step", false);
  ModuleSize size;
  for (const llvm::Function& f : *module) {
    if (f.isDeclaration()) continue;
    ++size.functions;
    size.instructions += f.getInstructionCount();
    if (f.getName() == "step_entry") size.entry = f.getInstructionCount();
  }
  return size;
}

TEST(ModuleSize, ADecodersModuleHasTheSameFunctionsAtAnyDepth) {
  const ModuleSize two = step_module(2), eight = step_module(8);
  EXPECT_EQ(eight.functions, two.functions) << "a layer's nodes should outline to the functions of the first layer's";
  // What grows is the entry: per node a call and its buffers' addresses (about 800 instructions
  // a layer of this model). Without the merge, 8 layers made 3.5 times the code of 2; now 1.6.
  EXPECT_LT(static_cast<double>(eight.instructions), 2.0 * static_cast<double>(two.instructions))
      << two.instructions << " instructions with 2 layers, " << eight.instructions << " with 8 (the entry " << two.entry
      << " and " << eight.entry << ")";
}

}  // namespace
}  // namespace qkv::nn
