// Lesson 10 — how the GPU backend would run a model, planned on a machine without a GPU.
//
// The CUDA backend (qkv/codegen/cuda/executor.hpp) turns a lowered graph into a plan: for every
// node a step — upload a feed, nothing for a view, launches of PTX kernels with their grids and
// arguments, or a host fallback with the reason. The plan is made without a GPU, so it can be
// read (and tested) anywhere; `qkv emit … --target nvptx` writes the same kernels as PTX.
//
// Three models: an encoder layer (every node has a GPU kernel); attention with a per-(batch,
// head) bias, which the fuse pass folds into the attention's mod expression (a load), so it is
// one launch of the PTX attention kernel; and the same bias added before the scale — (s + b)·c is
// not the kernel's form, the chain stays unfused and its softmax runs on the host. The plan says
// so, node by node.
//
//     ./build/examples/10_gpu_plan
#include <cstdlib>
#include <iomanip>
#include <iostream>

#include <qkv/codegen/cuda/executor.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

namespace {

const char* step_name(codegen::cuda::Step::Kind k) {
  switch (k) {
    case codegen::cuda::Step::Kind::upload:
      return "upload";
    case codegen::cuda::Step::Kind::view:
      return "view";
    case codegen::cuda::Step::Kind::weights:
      return "weights";
    case codegen::cuda::Step::Kind::gpu:
      return "gpu";
    case codegen::cuda::Step::Kind::host:
      return "host";
  }
  return "?";
}

/// Prints the plan of `g` under `sizes`; returns how many nodes fall back to the host.
int show_plan(const char* title, const Graph& g, const Bindings& sizes) {
  const Graph lowered = codegen::lower(g);
  const codegen::cuda::Plan plan = codegen::cuda::plan(lowered, sizes);
  std::cout << title << ": " << plan.launch_count() << " launches, " << plan.host_steps() << " host steps\n";
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id) {
    const auto& step = plan.steps[static_cast<std::size_t>(id)];
    std::cout << "  %" << std::left << std::setw(3) << id << std::setw(18) << op_name(lowered.node(id).op)
              << std::setw(18) << codegen::kernel_kind_name(codegen::select_kernel(lowered, id)) << std::setw(8)
              << step_name(step.kind);
    for (const auto& l : step.launches)
      std::cout << " " << codegen::nvptx::kernel_name(l.request) << " grid(" << l.grid.x << "," << l.grid.y << ","
                << l.grid.z << ")";
    if (step.kind == codegen::cuda::Step::Kind::host) std::cout << " (" << step.why << ")";
    std::cout << "\n";
  }
  std::cout << "\n";
  return plan.host_steps();
}

}  // namespace

int main() {
  Graph enc;
  {
    auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(enc, "x");
    output(EncoderLayer<64, 4, 128, Activation::gelu>::make(enc, "enc.")(x, causal_mask), "out");
  }
  Graph biased_attention;
  {
    auto q = input<Tensor<f32, Batch<dyn>, Heads<4>, Seq<dyn>, HeadDim<16>>>(biased_attention, "q");
    auto k = input<Tensor<f32, Batch<dyn>, Heads<4>, Key<dyn>, HeadDim<16>>>(biased_attention, "k");
    auto v = input<Tensor<f32, Batch<dyn>, Heads<4>, Key<dyn>, HeadDim<16>>>(biased_attention, "v");
    auto bias = input<Tensor<f32, Batch<dyn>, Heads<4>, Seq<dyn>, Key<dyn>>>(biased_attention, "bias");
    auto p = softmax<Key>(biased(scaled(contract<HeadDim>(q, k)), bias));
    output(contract<Key>(p, v), "out");
  }
  Graph unfused;
  {
    auto q = input<Tensor<f32, Batch<dyn>, Heads<4>, Seq<dyn>, HeadDim<16>>>(unfused, "q");
    auto k = input<Tensor<f32, Batch<dyn>, Heads<4>, Key<dyn>, HeadDim<16>>>(unfused, "k");
    auto v = input<Tensor<f32, Batch<dyn>, Heads<4>, Key<dyn>, HeadDim<16>>>(unfused, "v");
    auto bias = input<Tensor<f32, Batch<dyn>, Heads<4>, Seq<dyn>, Key<dyn>>>(unfused, "bias");
    auto p = softmax<Key>(scale(biased(unscaled(contract<HeadDim>(q, k)), bias), 0.25));
    output(contract<Key>(p, v), "out");
  }
  const Bindings sizes{{"Batch", 2}, {"Seq", 64}, {"Key", 64}};
  const int enc_host = show_plan("encoder layer [2, 128, 64]", enc, {{"Batch", 2}, {"Seq", 128}});
  const int bias_host = show_plan("attention with a per-(batch, head) bias", biased_attention, sizes);
  const int unfused_host = show_plan("the same bias added before the scale", unfused, sizes);
  // The lesson's claims: the encoder and the biased attention run wholly on the GPU; the
  // unfused chain needs the host.
  const bool ok = enc_host == 0 && bias_host == 0 && unfused_host > 0;
  std::cout << (ok ? "ok" : "FAILED") << "\n";
  return ok ? EXIT_SUCCESS : EXIT_FAILURE;
}
