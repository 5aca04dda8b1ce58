// f16 / bf16 storage (issue #16): the interpreter rounds every value to its dtype, the dtype
// legalizer converts around the kernels that compute in f32 without reading half values, the
// element-wise and row-wise kernels widen as they load and round as they store, and the CPU
// backend stores and moves the two-byte values bit for bit as the interpreter holds them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/cpu/tuning.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "backend_cases.hpp"
#include "cpu/module/module_builder.hpp"

using qkv::nn::cases::max_error;
using ::testing::HasSubstr;

namespace qkv {
namespace {

QKV_AXIS(Batch);
QKV_AXIS(Heads);
QKV_AXIS(Seq);
QKV_AXIS(Key);
QKV_AXIS(HeadDim);
QKV_AXIS(Model);
QKV_AXIS(Hidden);

int count_op(const Graph& g, Op op) {
  int c = 0;
  for (const auto& n : g.nodes()) c += n.op == op;
  return c;
}

TEST(Half, TheInterpreterHoldsEachValueAsItsDtypeCan) {
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<4>>>(g, "x");
  auto h = input<Tensor<bf16, Seq<dyn>, Model<4>>>(g, "h");  // fed f32: rounded on the way in
  output(convert<bf16>(x), "x_bf16");
  output(convert<f32>(convert<f16>(x)), "x_f16_f32");
  output(h, "h");
  output(convert<f32>(scale(h, 3.0)), "h_times_3");  // computed from the rounded h, then rounded
  static_assert(std::is_same_v<decltype(convert<bf16>(x))::dtype, bf16>);
  const std::vector<float> xs{1.0f, 1.00390625f, 1.01171875f, -65520.0f, 1e-8f, 3.14159265f, 0.1f, 70000.0f};
  const Feeds feeds{{"x", NdArray::from_f32(xs, {2, 4})}, {"h", NdArray::from_f32(xs, {2, 4})}};
  const RunResult r = interpret(g, feeds);
  ASSERT_EQ(r.outputs.at("x_bf16").dtype, DType::bf16);
  ASSERT_EQ(r.outputs.at("h").dtype, DType::bf16);
  ASSERT_EQ(r.outputs.at("x_f16_f32").dtype, DType::f32);
  const auto b = r.outputs.at("x_bf16").as<std::uint16_t>();
  const auto f = r.outputs.at("x_f16_f32").to_f32();
  const auto t = r.outputs.at("h_times_3").to_f32();
  for (std::size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(b[i], f32_to_bf16(xs[i])) << i;
    EXPECT_EQ(f[i], f16_to_f32(f32_to_f16(xs[i]))) << i;
    EXPECT_EQ(t[i], round_to_dtype(3.0f * round_to_dtype(xs[i], DType::bf16), DType::bf16)) << i;
  }
  EXPECT_EQ(r.outputs.at("h"), r.outputs.at("x_bf16"));
  EXPECT_EQ(b[1], 0x3F80);                                   // 1 + 2^-8: a tie, to even
  EXPECT_EQ(b[2], 0x3F82);                                   // 1 + 3·2^-8: a tie, to even (up)
  EXPECT_EQ(f[3], -std::numeric_limits<float>::infinity());  // past f16's largest finite
  EXPECT_EQ(f[7], std::numeric_limits<float>::infinity());
}

TEST(Half, ConvertsAndCopiesAreBitExactOnTheCpu) {
  Graph g;
  auto x = input<Tensor<bf16, Batch<dyn>, Seq<dyn>, Model<24>>>(g, "x");
  auto y = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<24>>>(g, "y");
  output(permute<Seq, Model, Batch>(x), "x_permuted");  // bf16 moved, not converted
  output(convert<f16>(x), "x_f16");
  output(convert<bf16>(y), "y_bf16");
  output(convert<f16>(y), "y_f16");
  output(convert<f32>(convert<f16>(y)), "y_f16_f32");
  Feeds feeds = random_feeds(g, {{"Batch", 3}, {"Seq", 37}}, 5, 4.0f);
  // The rounding's corner cases in y: ties, overflow, subnormals, signed zero, inf, NaN.
  auto yv = feeds.at("y").to_f32();
  const float corners[] = {1.00390625f,
                           1.01171875f,
                           65519.0f,
                           65520.0f,
                           -1e-7f,
                           3e-8f,
                           -0.0f,
                           std::numeric_limits<float>::infinity(),
                           std::numeric_limits<float>::quiet_NaN(),
                           5.96e-8f};
  for (std::size_t i = 0; i < std::size(corners); ++i) yv[i * 7] = corners[i];
  feeds["y"] = NdArray::from_f32(yv, feeds.at("y").shape);
  const RunResult want = interpret(g, feeds);
  const RunResult got = codegen::cpu::run(g, feeds, 2);
  for (const auto& [name, w] : want.outputs) {
    const NdArray& a = got.outputs.at(name);
    EXPECT_EQ(a.dtype, w.dtype) << name;
    EXPECT_EQ(a.shape, w.shape) << name;
    EXPECT_TRUE(a.bytes == w.bytes) << name;
  }
  // Nothing computed in f32 between them: no conversion added around the permute.
  const Graph lowered = codegen::lower(g);
  EXPECT_EQ(count_op(lowered, Op::convert), count_op(g, Op::convert));
}

/// The kinds whose kernels compute in f32 but read and write f16 / bf16 themselves, widening each
/// element as it is loaded and rounding the value as it is stored (storage.hpp's half_native).
bool widens_as_it_loads(codegen::KernelKind k) {
  using K = codegen::KernelKind;
  switch (k) {
    case K::unary:
    case K::add_same:
    case K::broadcast_binary:
    case K::layer_norm_rows:
    case K::layer_norm_strided:
    case K::softmax:
    case K::logsumexp:
    case K::argmax:
    case K::rms_norm:
    case K::rope:
    case K::causal:
    case K::dropout:
    case K::score_mod:
      return true;
    default:
      return false;
  }
}

/// `lowered` with every node of those kinds computed in f32 between conversions instead — its
/// half inputs converted to f32, its value computed as f32 and rounded by a convert after it —
/// written out independently of the legalizer.
Graph computed_between_conversions(const Graph& lowered) {
  auto is_half = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  Graph out;
  std::vector<int> at(lowered.size());
  std::map<int, int> as_f32;
  auto convert_to = [&](int id, DType t) {
    Node c;
    c.op = Op::convert;
    c.inputs = {id};
    c.axes = out.node(id).axes;
    c.dtype = t;
    return out.add(std::move(c));
  };
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id) {
    Node n = lowered.node(id);
    for (int& in : n.inputs) in = at[static_cast<std::size_t>(in)];
    if (widens_as_it_loads(codegen::select_kernel(lowered, id))) {
      for (int& in : n.inputs)
        if (is_half(out.node(in).dtype)) {
          auto it = as_f32.find(in);
          if (it == as_f32.end()) it = as_f32.emplace(in, convert_to(in, DType::f32)).first;
          in = it->second;
        }
      if (is_half(n.dtype)) {
        const DType stored = n.dtype;
        n.dtype = DType::f32;
        at[static_cast<std::size_t>(id)] = convert_to(out.add(std::move(n)), stored);
        continue;
      }
    }
    at[static_cast<std::size_t>(id)] = out.add(std::move(n));
  }
  for (const auto& o : lowered.outputs()) out.mark_output(at[static_cast<std::size_t>(o.node)], o.name);
  for (const auto& c : lowered.constraints()) out.require(c);
  return out;
}

TEST(Half, ElementwiseAndRowwiseKernelsReadAndWriteHalfValuesThemselves) {
  // Whole models moved to bf16 / f16: a tiny Llama (embedding, RMSNorm, RoPE, SiLU, the gated
  // product, residual adds, argmax), an encoder layer with cross-attention (layer norm, GELU,
  // adds), an unfused attention with a per-head bias (broadcast add, softmax), dropout on the
  // weights. The kernels of those ops widen as they load and round as they store: no conversion
  // is left around them in the lowered graph (only around the GEMM — its bias widened, its f32
  // value rounded — and the kernels that compute f16 in f32), and every output is bit for bit
  // what the same kernels give computing in f32 between conversions.
  const std::vector<std::pair<std::string, nn::cases::GraphCase>> cases{
      {"tiny llama", nn::cases::tiny_llama()},
      {"encoder + cross", nn::cases::encoder_layer_then_cross_attention()},
      {"per-head bias", nn::cases::mha_with_per_head_bias()},
      {"dropout", nn::cases::dropout_with_weights()}};
  std::map<DType, int> native;  // nodes of those kinds that hold a half value
  for (const DType dt : {DType::bf16, DType::f16}) {
    for (const auto& [name, c] : cases) {
      SCOPED_TRACE(name + " " + std::string(dtype_name(dt)));
      const Graph g = with_float_dtype(c.graph, dt);
      Feeds feeds;
      for (const auto& [input, a] : c.feeds) feeds[input] = a.dtype == DType::f32 ? a.converted(dt) : a;
      const Graph lowered = codegen::lower(g);
      auto widening = [&](int id) { return widens_as_it_loads(codegen::select_kernel(lowered, id)); };
      for (int id = 0; id < static_cast<int>(lowered.size()); ++id) {
        const Node& n = lowered.node(id);
        native[dt] += widening(id) && n.dtype == dt;
        if (n.op != Op::convert) continue;
        if (n.dtype != DType::f32) {  // a rounding: the GEMM's, not a widening kernel's
          EXPECT_FALSE(widening(n.inputs[0])) << "node " << n.inputs[0] << " computed in f32, then rounded";
          continue;
        }
        for (int r = id + 1; r < static_cast<int>(lowered.size()); ++r)
          for (int in : lowered.node(r).inputs)
            EXPECT_FALSE(in == id && widening(r)) << "node " << r << " reads a value widened for it";
      }
      const RunResult got = codegen::cpu::run(g, feeds, 2);
      const RunResult want = codegen::cpu::run(computed_between_conversions(lowered), feeds, 2);
      for (const auto& [out, w] : want.outputs) {
        const NdArray& a = got.outputs.at(out);
        EXPECT_EQ(a.dtype, w.dtype) << out;
        EXPECT_TRUE(a.bytes == w.bytes) << out << ": max difference " << max_error(a, w);
      }
    }
    EXPECT_GE(native[dt], 20) << dtype_name(dt);
  }
}

TEST(Half, AMixOfDtypesIsReadAsStoredAndMatchesTheInterpreter) {
  Graph g;
  auto x = input<Tensor<bf16, Batch<dyn>, Seq<dyn>, Model<16>>>(g, "x");
  output(rms_norm(gelu(x), rms_norm_params<Model<16>>(g, "norm")), "out");  // the norm's weight is f32
  const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 5}}, 9, 1.0f);
  // gelu reads and writes bf16; rms_norm reads its bf16 x and f32 weight as they are stored.
  const Graph lowered = codegen::lower(g);
  EXPECT_EQ(count_op(lowered, Op::convert), 0);
  for (const auto& n : lowered.nodes()) {
    if (n.op == Op::gelu || n.op == Op::rms_norm) {
      EXPECT_EQ(n.dtype, DType::bf16);
    }
  }
  const RunResult want = interpret(g, feeds);
  const RunResult got = codegen::cpu::run(g, feeds, 2);
  ASSERT_EQ(got.outputs.at("out").dtype, DType::bf16);
  // Both round gelu's value and the output to bf16; their f32 arithmetic may differ by an ulp
  // before a rounding, which then moves by one bf16 ulp (2^-8 relative).
  EXPECT_LE(max_error(got.outputs.at("out"), want.outputs.at("out")), 1.0 / 128);
}

TEST(Half, Bf16AttentionMatchesTheInterpreter) {
  Graph g;
  auto q = input<Tensor<bf16, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<32>>>(g, "q");
  auto k = input<Tensor<bf16, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<32>>>(g, "k");
  auto v = input<Tensor<bf16, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<32>>>(g, "v");
  output(contract<Key>(softmax<Key>(scaled(contract<HeadDim>(q, k))), v), "out");
  EXPECT_EQ(codegen::cpu::fused_attention_count(g), 1);
  for (const std::int64_t s : {1, 19, 130}) {
    const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 7}, {"Key", s}}, static_cast<std::uint64_t>(s), 1.0f);
    const RunResult want = interpret(g, feeds);  // rounds the scores and the weights to bf16 too
    const RunResult got = codegen::cpu::run(g, feeds, 2);
    ASSERT_EQ(got.outputs.at("out").dtype, DType::bf16);
    EXPECT_LE(max_error(got.outputs.at("out"), want.outputs.at("out")), 2e-2) << s;
  }
}

TEST(Half, HalfLinearLayersReadTheirHalfOperandsThemselves) {
  // An f32 model moved to bf16 or f16 as a whole (PyTorch's model.to(torch.bfloat16)): K = 37 is
  // odd, so the last pair of K is half padding; N = 40 leaves a partial panel. bf16 runs on
  // vdpbf16ps where the host has it; f16 (and bf16 elsewhere) is widened as it is loaded.
  for (const DType dt : {DType::bf16, DType::f16}) {
    SCOPED_TRACE(dtype_name(dt));
    Graph model;
    auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<37>>>(model, "x");
    output(linear(x, linear_params<Model<37>, Hidden<40>>(model, "fc")), "out");
    const Graph g = with_float_dtype(model, dt);
    for (const auto& n : g.nodes()) EXPECT_EQ(n.dtype, dt) << n.name;
    const Graph lowered = codegen::lower(g);
    for (int id = 0; id < static_cast<int>(lowered.size()); ++id) {
      const Node& n = lowered.node(id);
      if (n.op != Op::linear) continue;
      EXPECT_EQ(n.dtype, DType::f32);                  // rounded after it: the K blocks' partial sums stay f32
      EXPECT_EQ(lowered.node(n.inputs[0]).dtype, dt);  // x and W read as they are stored
      EXPECT_EQ(lowered.node(n.inputs[1]).dtype, dt);
      EXPECT_EQ(lowered.node(n.inputs[2]).dtype, DType::f32);  // the bias widened
    }
    // Rows 1, 2, 3 run the GEMV; more the GEMM. Both round only the output, as the interpreter
    // does, from sums that differ in their order: at most one ulp of the dtype apart (outputs
    // below 2: bf16's 2^-7, f16's 2^-10).
    const double ulp = dt == DType::bf16 ? 1.0 / 128 : 1.0 / 1024;
    const codegen::cpu::BoundRunner bound(2);  // its weights packed once, in the prepared handle
    Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 1}}, 1, 1.0f);  // the weights: one set, one address
    for (const std::int64_t seq : {1, 2, 3, 5, 29}) {
      feeds["x"] = random_feeds(g, {{"Batch", 2}, {"Seq", seq}}, static_cast<std::uint64_t>(seq), 1.0f).at("x");
      const RunResult want = interpret(g, feeds);
      for (const RunResult& got : {codegen::cpu::run(g, feeds, 2), bound(g, feeds)}) {
        ASSERT_EQ(got.outputs.at("out").dtype, dt);
        EXPECT_LE(max_error(got.outputs.at("out"), want.outputs.at("out")), ulp) << seq;
      }
    }
    EXPECT_EQ(bound.prepared(), 1);
  }
}

TEST(Half, Bf16WeightsArePackedInHalfTheBytes) {
  // The GEMM's packed Bᵀ (the arena's panels, and a prepared handle's): f32 panels for an f32
  // linear; for a bf16 one pairs of K in bf16 where the host runs vdpbf16ps (K = 37 rounds up to
  // 19 pairs), f32 panels where it widens them as it packs.
  Graph model;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<37>>>(model, "x");
  output(linear(x, linear_params<Model<37>, Hidden<40>>(model, "fc")), "out");
  const codegen::HostTarget host = codegen::host_target();
  auto panel_bytes = [&](DType dt) -> std::int64_t {
    const Graph lowered = codegen::lower(with_float_dtype(model, dt));
    const codegen::cpu::ModulePlan plan = codegen::cpu::plan_module(lowered, {{"Batch", 2}, {"Seq", 64}}, host);
    auto fixed = [&](const Extent& e) { return *e.resolve(plan.fixed); };
    for (const auto& a : plan.allocs)
      if (a.kind == codegen::cpu::ModulePlan::Block::gemm_panels)
        return codegen::cpu::block_bytes<std::int64_t>(lowered, plan, a, fixed);
    ADD_FAILURE() << "no panels planned";
    return 0;
  };
  const std::int64_t cols = codegen::cpu::choose_gemm_config({}, host).cols();
  const std::int64_t padded = (40 + cols - 1) / cols * cols;
  EXPECT_EQ(panel_bytes(DType::f32), padded * 37 * 4);
  const bool pairs = codegen::cpu::bf16_dot_products(host, std::max(host.vector_floats, 4));
  EXPECT_EQ(panel_bytes(DType::bf16), pairs ? padded * 19 * 2 * 2 : padded * 37 * 4);
}

TEST(Half, TheAotHeaderTakesTheBitsOfHalfArraysAsUint16) {
  Graph g;
  auto x = input<Tensor<bf16, Seq<dyn>, Model<8>>>(g, "x");
  auto y = input<Tensor<f16, Seq<dyn>, Model<8>>>(g, "y");
  output(convert<f32>(x), "x32");
  output(convert<f16>(convert<f32>(y)), "y16");
  codegen::AotOptions o;
  o.function = "half_io";
  o.dynamic = {"Seq"};
  const std::string h = codegen::aot_header(g, {}, o);
  EXPECT_THAT(h, HasSubstr("const uint16_t* x"));
  EXPECT_THAT(h, HasSubstr("const uint16_t* y"));
  EXPECT_THAT(h, HasSubstr("uint16_t* y16"));
  EXPECT_THAT(h, HasSubstr("float* x32"));
  EXPECT_THAT(h, HasSubstr("x: input bf16 [Seq=Seq?, Model=8] (bfloat16 bits: the top half of the f32)"));
  EXPECT_THAT(h, HasSubstr("y: input f16 [Seq=Seq?, Model=8] (IEEE 754 binary16 bits)"));
}

}  // namespace
}  // namespace qkv
