// Lesson 09 — what the CPU backend does with a model: the passes, the kernel each node gets, and
// one compilation for every sequence length.
//
// A multi-head attention layer with a key-padding mask, every size but the head width dynamic,
// goes through the pass pipeline (qkv::codegen::lower): the attention pattern
// contract → scale → mask → softmax → contract becomes one fused_attention node, and the layout
// pass puts its operands in the order the kernel reads. The selection table
// (qkv/codegen/lowering/select.hpp) gives every node a kernel kind. The lowered graph is then
// compiled into ONE LLVM module whose loop bounds, strides and buffer offsets are computed from
// the sizes at run time, so running it at three sequence lengths compiles it once
// (codegen::jit_stats() counts the modules). Each run is checked against the reference
// interpreter.
//
//     ./build/examples/09_cpu_backend
//     ./build/tools/qkv/qkv shapes mha --batch 2 --heads 4 --seq 7 --embed-dim 32 --dump-after all
#include <cmath>
#include <cstdlib>
#include <iomanip>
#include <iostream>

#include <qkv/codegen/cpu/compiled_graph.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/jit.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>
#include <qkv/runtime/random_feeds.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto [out, weights] = MultiHeadAttention<32, 4>::make(g, "mha.")(x, keep);
  output(out, "out");
  (void)weights;  // not asked for: the fused kernel then never materialises the L×S matrix

  // 1. The passes. lower() is a straight line: verify, canonicalize, fuse-attention, layout,
  //    cleanup (codegen/passes). Here: the DSL's graph, then the lowered one.
  std::cout << "the DSL's graph (" << g.size() << " nodes):\n" << g.table() << "\n";
  const Graph lowered = codegen::lower(g);
  std::cout << "after the passes (" << lowered.size() << " nodes):\n" << lowered.table() << "\n";

  // 2. Which kernel runs each node: one table for every backend.
  std::cout << "kernel kinds:\n";
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    std::cout << "  %" << std::left << std::setw(3) << id << std::setw(18) << op_name(lowered.node(id).op)
              << codegen::kernel_kind_name(codegen::select_kernel(lowered, id)) << "\n";

  // 3. What the code is specialised on (the attention kernel's head widths and counts); the
  //    batch and the lengths are run-time arguments of the compiled module.
  const auto specialised = codegen::cpu::specialised_sizes(lowered);
  std::cout << "\nspecialised on:";
  for (const auto& s : specialised) std::cout << " " << s;
  if (specialised.empty()) std::cout << " nothing dynamic (the head widths are static here)";
  std::cout << "; every other size is a run-time argument\n\n";

  // 4. Run at three lengths: the first compiles, the others reuse the module.
  bool ok = true;
  for (std::int64_t seq : {5, 17, 64}) {
    Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", seq}, {"Key", seq}}, /*seed=*/9, 0.5f);
    feeds["keep"] = keep_first({seq, seq / 2 + 1}, seq);  // the second sequence is padded
    const std::int64_t before = codegen::jit_stats().modules;
    const auto got = codegen::cpu::run(g, feeds).outputs.at("out").to_f32();
    const std::int64_t compiled = codegen::jit_stats().modules - before;
    const auto want = interpret(g, feeds).outputs.at("out").to_f32();
    double worst = 0;
    for (std::size_t i = 0; i < want.size(); ++i)
      worst = std::max(worst, std::abs(double{got[i]} - want[i]) / std::max(1.0, std::abs(double{want[i]})));
    std::cout << "Seq " << std::setw(2) << seq << ": " << compiled << " module(s) compiled, max error vs interpreter "
              << worst << "\n";
    ok = ok && worst < 2e-5 && (seq == 5 || compiled == 0);
  }
  std::cout << "compile time so far: " << codegen::jit_stats().compile_ms << " ms\n" << (ok ? "ok" : "FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
