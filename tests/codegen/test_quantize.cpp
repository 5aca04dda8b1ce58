// Weight-only quantization (issue #30): quantize_weight rounds each group of 32 to its f16 scale
// (q8: Q8_0's absmax; q4: Q4_0's, two entries a byte in its order), the interpreter dequantizes
// (the reference), and the CPU backend's linear layers read the 8-bit or 4-bit weights and their
// scales as stored — GEMV rows 1 to 4 and the GEMM's panels packed from q — and agree with the
// reference; a dequantize read by anything else is written out exactly. A quantized weight's
// linear reads its input rounded to 8 bits per group (Q8_0's activations): the interpreter does,
// and so does every CPU target's kernel (the f32 GEMM, and vpdpbusd's integer one with VNNI).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/passes/pipeline.hpp>
#include <qkv/codegen/target.hpp>
#include <qkv/ir/float_dtype.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/quantize.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "backend_cases.hpp"

using qkv::nn::cases::max_error;
using ::testing::HasSubstr;

namespace qkv {
namespace {

QKV_AXIS(Batch);
QKV_AXIS(Seq);
QKV_AXIS(Model);
QKV_AXIS(Hidden);

TEST(Quantize, Q8RoundsEachGroupToItsF16Scale) {
  // 3 rows of K = 70: groups of 32, 32 and 6; row 1's second group all zeros.
  std::vector<float> w(3 * 70);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::sin(0.37f * static_cast<float>(i)) * (1.0f + i % 7);
  for (std::size_t i = 70 + 32; i < 70 + 64; ++i) w[i] = 0.0f;
  const QuantizedWeight qw = quantize_weight(NdArray::from_f32(w, {3, 70}), Quant::q8, 32, "w");
  ASSERT_EQ(qw.q.shape, (std::vector<std::int64_t>{3, 70}));
  ASSERT_EQ(qw.scales.shape, (std::vector<std::int64_t>{3, 3}));
  ASSERT_EQ(qw.scales.dtype, DType::f16);
  const auto q = qw.q.as<std::int8_t>();
  const auto s = qw.scales.as<std::uint16_t>();
  for (std::int64_t r = 0; r < 3; ++r)
    for (std::int64_t g = 0; g < 3; ++g) {
      float amax = 0.0f;
      for (std::int64_t k = g * 32; k < std::min<std::int64_t>(70, (g + 1) * 32); ++k)
        amax = std::max(amax, std::fabs(w[static_cast<std::size_t>(r * 70 + k)]));
      const float scale = f16_to_f32(s[static_cast<std::size_t>(r * 3 + g)]);
      EXPECT_EQ(s[static_cast<std::size_t>(r * 3 + g)], f32_to_f16(amax / 127.0f)) << r << "," << g;
      for (std::int64_t k = g * 32; k < std::min<std::int64_t>(70, (g + 1) * 32); ++k) {
        const auto i = static_cast<std::size_t>(r * 70 + k);
        EXPECT_LE(std::abs(q[i]), 127);
        // The nearest multiple of the stored scale (the largest entry may clamp at 127).
        EXPECT_LE(std::fabs(w[i] - static_cast<float>(q[i]) * scale), 0.5f * scale * 1.01f + 1e-12f) << i;
      }
    }
  EXPECT_EQ(s[1 * 3 + 1], 0);  // a group of zeros: scale 0, q 0
  for (std::size_t i = 70 + 32; i < 70 + 64; ++i) EXPECT_EQ(q[i], 0);

  w[75] = std::numeric_limits<float>::quiet_NaN();
  try {
    (void)quantize_weight(NdArray::from_f32(w, {3, 70}), Quant::q8, 32, "`fc.weight`");
    ADD_FAILURE() << "a NaN weight was quantized";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("`fc.weight` has a non-finite value at [1, 5]"));
  }
}

TEST(Quantize, Q4RoundsEachGroupToItsF16ScaleInQ4_0sOrder) {
  // 3 rows of K = 96: three groups a row; row 1's second group all zeros, row 2's largest entry positive.
  const std::int64_t K = 96;
  std::vector<float> w(3 * K);
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::cos(0.41f * static_cast<float>(i)) * (1.0f + i % 5);
  for (std::size_t i = K + 32; i < K + 64; ++i) w[i] = 0.0f;
  w[2 * K + 40] = 9.0f;
  const QuantizedWeight qw = quantize_weight(NdArray::from_f32(w, {3, K}), Quant::q4, 32, "w");
  ASSERT_EQ(qw.format, Quant::q4);
  ASSERT_EQ(qw.q.shape, (std::vector<std::int64_t>{3, K / 2}));
  ASSERT_EQ(qw.scales.shape, (std::vector<std::int64_t>{3, 3}));
  EXPECT_EQ(qw.columns(), K);
  const auto q = qw.q.as<std::int8_t>();
  const auto s = qw.scales.as<std::uint16_t>();
  // Q4_0's order, written out: entry j of group g is byte g·16 + j % 16 of the row, its low four
  // bits for j < 16 and its high four for j >= 16.
  auto nibble = [&](std::int64_t r, std::int64_t col) {
    const std::int64_t g = col / 32, j = col % 32;
    const auto byte = static_cast<std::uint8_t>(q[static_cast<std::size_t>(r * (K / 2) + g * 16 + j % 16)]);
    return j < 16 ? byte & 0x0F : byte >> 4;
  };
  const std::vector<float> back = dequantize_weight(qw, 32).to_f32();
  for (std::int64_t r = 0; r < 3; ++r)
    for (std::int64_t g = 0; g < 3; ++g) {
      float largest = 0.0f;
      for (std::int64_t k = g * 32; k < (g + 1) * 32; ++k) {
        const float x = w[static_cast<std::size_t>(r * K + k)];
        if (std::fabs(x) > std::fabs(largest)) largest = x;
      }
      const std::uint16_t bits = s[static_cast<std::size_t>(r * 3 + g)];
      EXPECT_EQ(bits, largest == 0.0f ? 0 : f32_to_f16(largest / -8.0f)) << r << "," << g;
      const float scale = f16_to_f32(bits);
      for (std::int64_t k = g * 32; k < (g + 1) * 32; ++k) {
        const auto i = static_cast<std::size_t>(r * K + k);
        const int v = nibble(r, k) - 8;
        EXPECT_EQ(back[i], static_cast<float>(v) * scale) << i;
        if (w[i] == largest && scale != 0.0f) {
          EXPECT_EQ(v, -8) << i;  // the largest is −8 · scale
        }
        // The nearest multiple of the stored scale, or 7 (its nearest, −8 · scale, has the
        // other sign's bound): at most one scale off then.
        const float err = std::fabs(w[i] - static_cast<float>(v) * scale);
        EXPECT_LE(err, (v == 7 ? 1.0f : 0.5f) * std::fabs(scale) * 1.01f + 1e-12f) << i;
      }
    }
  EXPECT_EQ(s[1 * 3 + 1], 0);  // a group of zeros: scale 0, every entry 0 (nibble 8)
  for (std::int64_t k = 32; k < 64; ++k) EXPECT_EQ(nibble(1, k), 8);
  EXPECT_LT(f16_to_f32(s[2 * 3 + 1]), 0.0f);  // a positive largest entry: a negative scale
  try {
    (void)quantize_weight(NdArray::from_f32(std::vector<float>(3 * 70, 1.0f), {3, 70}), Quant::q4, 32, "`fc.weight`");
    ADD_FAILURE() << "rows of 70 were quantized to q4";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("`fc.weight` has rows of 70, not a multiple of 32 that q4 needs"));
  }
}

/// y = x·Wᵀ + b over Model<K> → Hidden<40> (a partial panel), quantized.
template <std::int64_t K>
Graph linear_model(DType dtype) {
  Graph model;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<K>>>(model, "x");
  output(linear(x, linear_params<Model<K>, Hidden<40>>(model, "fc")), "out");
  return with_float_dtype(model, dtype);
}

template <std::int64_t K>
void check_quantized_linear(DType dtype, Quant format = Quant::q8) {
  // q4 where K is whole groups, else q8.
  const Quant stored = K % 32 == 0 ? format : Quant::q8;
  SCOPED_TRACE("K = " + std::to_string(K) + ", " + std::string(dtype_name(dtype)) + ", " +
               std::string(quant_name(stored)));
  const Graph model = linear_model<K>(dtype);
  Feeds feeds = random_feeds(model, {{"Batch", 2}, {"Seq", 1}}, 7, 1.0f);
  const QuantizedModel qm = quantize_linear_weights(model, feeds, format);
  ASSERT_EQ(qm.weights, (std::vector<std::string>{"fc.weight"}));
  ASSERT_EQ(qm.formats, (std::vector<Quant>{stored}));
  EXPECT_FALSE(feeds.count("fc.weight"));
  EXPECT_EQ(feeds.at("fc.weight" + quant_suffix(stored)).dtype, DType::i8);
  EXPECT_EQ(qm.bytes_after, 40 * K / (stored == Quant::q4 ? 2 : 1) + 40 * ((K + 31) / 32) * 2);
  const Graph& g = qm.graph;
  const Graph lowered = codegen::lower(g);
  int read_in_place = 0;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    read_in_place += codegen::select_kernel(lowered, id) == codegen::KernelKind::dequantize_in_linear;
  EXPECT_EQ(read_in_place, 1);
  // Rows 1 to 4 run the GEMV; 5 to 32 the GEMV 4 rows at a time (5, 29: a last chunk of 1), or
  // with VNNI and whole groups of 32 the batch's integer GEMV (x's rows in the lanes: 22 and 29 a
  // partial last panel); more the GEMM on panels packed from q: the same products (q · scale is
  // exact in f32), summed in another order.
  const codegen::cpu::BoundRunner bound(2);
  for (const std::int64_t seq : {1, 2, 3, 5, 16, 22, 29, 37}) {
    feeds["x"] = random_feeds(g, {{"Batch", 1}, {"Seq", seq}}, static_cast<std::uint64_t>(seq), 1.0f).at("x");
    const RunResult want = interpret(g, feeds);
    for (const RunResult& got : {codegen::cpu::run(g, feeds, 1), codegen::cpu::run(g, feeds, 3), bound(g, feeds)})
      EXPECT_LE(max_error(got.outputs.at("out"), want.outputs.at("out")), dtype == DType::f32 ? 2e-5 : 1.0 / 128)
          << seq;
  }
}

TEST(Quantize, LinearLayersReadQ8WeightsAsTheInterpreterDequantizesThem) {
  check_quantized_linear<64>(DType::f32);   // whole groups
  check_quantized_linear<80>(DType::f32);   // a last group of 16: whole vectors
  check_quantized_linear<70>(DType::f32);   // a last group of 6: a masked vector
  check_quantized_linear<7>(DType::f32);    // one partial group
  check_quantized_linear<70>(DType::bf16);  // bf16 x read against f32 weights
}

TEST(Quantize, LinearLayersReadQ4WeightsAsTheInterpreterDequantizesThem) {
  check_quantized_linear<32>(DType::f32, Quant::q4);   // one group
  check_quantized_linear<96>(DType::f32, Quant::q4);   // three
  check_quantized_linear<64>(DType::bf16, Quant::q4);  // bf16 x read against f32 weights
  check_quantized_linear<70>(DType::f32, Quant::q4);   // rows not whole groups: q8
}

// A decoder's widths are run-time sizes (bound when it compiles): its q4 weights are still read
// in place (q's bytes a row are static), and a width that is not the stored weight's is refused.
TEST(Quantize, AWeightOfRunTimeWidthIsReadInPlaceAndItsWidthChecked) {
  Graph model;
  auto x = input<Tensor<f32, Seq<dyn>, Model<dyn>>>(model, "x");
  output(linear(x, linear_params<Model<dyn>, Hidden<40>>(model, "fc")), "out");
  Feeds feeds = random_feeds(model, {{"Seq", 5}, {"Model", 64}}, 11, 1.0f);
  const Graph g = quantize_linear_weights(model, feeds, Quant::q4).graph;
  const Graph lowered = codegen::lower(g);
  int read_in_place = 0;
  for (int id = 0; id < static_cast<int>(lowered.size()); ++id)
    read_in_place += codegen::select_kernel(lowered, id) == codegen::KernelKind::dequantize_in_linear;
  EXPECT_EQ(read_in_place, 1);
  EXPECT_LE(max_error(codegen::cpu::run(g, feeds, 2).outputs.at("out"), interpret(g, feeds).outputs.at("out")), 2e-5);
  feeds["x"] = NdArray::zeros(DType::f32, {5, 96});
  for (const bool cpu : {true, false}) {
    try {
      (void)(cpu ? codegen::cpu::run(g, feeds, 2) : interpret(g, feeds));
      ADD_FAILURE() << "a width of 96 ran against a weight stored with 64 columns";
    } catch (const std::exception& e) {
      EXPECT_THAT(e.what(), HasSubstr("`fc.weight` is stored with 64 columns, `Model` is 96")) << cpu;
    }
  }
}

TEST(Quantize, WeightsQuantizedAsTheyAreLoadedAreTakenAsTheyAre) {
  const Graph model = linear_model<70>(DType::f32);
  ASSERT_EQ(quantizable_linear_weights(model), (std::vector<std::string>{"fc.weight"}));
  Feeds in_memory = random_feeds(model, {{"Batch", 1}, {"Seq", 3}}, 5, 1.0f);
  Feeds streamed = in_memory;
  add_quantized_feeds(streamed, "fc.weight", streamed.at("fc.weight"), Quant::q8);  // as the CLI's loader does
  streamed.erase("fc.weight");
  const QuantizedModel a = quantize_linear_weights(model, in_memory), b = quantize_linear_weights(model, streamed);
  EXPECT_EQ(a.graph, b.graph);
  EXPECT_EQ(in_memory, streamed);
  EXPECT_EQ(b.bytes_before, 40 * 70 * 4);
  streamed["fc.weight.q8_scale"] = NdArray::zeros(DType::f16, {40, 2});  // 70 inputs need 3 groups
  try {
    (void)quantize_linear_weights(model, streamed);
    ADD_FAILURE() << "scales of the wrong shape were taken";
  } catch (const InputError& e) {
    EXPECT_THAT(e.what(), HasSubstr("`fc.weight.q8_scale` (f16 (40, 2))"));
  }
}

/// A q8 or q4 weight that is also a graph output: written out (as the interpreter dequantizes it,
/// and as dequantize_weight, the quantizer's own inverse, does), and the linear reads that.
template <std::int64_t K>
void check_dequantize_written_out(Quant format) {
  Graph model;
  auto x = input<Tensor<f32, Seq<dyn>, Model<K>>>(model, "x");
  output(linear(x, linear_params<Model<K>, Hidden<40>>(model, "fc")), "out");
  Feeds feeds = random_feeds(model, {{"Seq", 3}}, 3, 1.0f);
  Graph g = quantize_linear_weights(model, feeds, format).graph;
  int deq = -1;
  for (int id = 0; id < static_cast<int>(g.size()); ++id)
    if (g.node(id).op == Op::dequantize) deq = id;
  ASSERT_GE(deq, 0);
  g.mark_output(deq, "weight");
  EXPECT_EQ(codegen::select_kernel(codegen::lower(g), deq), codegen::KernelKind::dequantize);
  const RunResult want = interpret(g, feeds);
  const RunResult got = codegen::cpu::run(g, feeds, 2);
  EXPECT_EQ(got.outputs.at("weight"), want.outputs.at("weight"));
  EXPECT_EQ(want.outputs.at("weight"), dequantize_weight({feeds.at("fc.weight" + quant_suffix(format)),
                                                          feeds.at("fc.weight" + quant_scale_suffix(format)), format},
                                                         32));
  EXPECT_LE(max_error(got.outputs.at("out"), want.outputs.at("out")), 2e-5);
}

TEST(Quantize, ADequantizeReadOtherwiseIsWrittenOutExactly) {
  check_dequantize_written_out<70>(Quant::q8);  // a partial last group
  check_dequantize_written_out<64>(Quant::q4);
}

/// x rounded as docs/semantics.md pins it, written here from the definition (in double, and not
/// through the runtime's round_activations): per group of 32, q = round(x / (max |x| / 127)), x = q · that.
std::vector<double> rounded_by_hand(const std::vector<float>& x, std::int64_t k) {
  std::vector<double> out(x.size());
  for (std::size_t row = 0; row < x.size() / static_cast<std::size_t>(k); ++row)
    for (std::int64_t k0 = 0; k0 < k; k0 += 32) {
      const std::size_t at = row * static_cast<std::size_t>(k);
      double amax = 0;
      for (std::int64_t i = k0; i < std::min(k, k0 + 32); ++i) amax = std::max(amax, std::fabs(double{x[at + i]}));
      for (std::int64_t i = k0; i < std::min(k, k0 + 32); ++i)
        out[at + i] = amax > 0 ? std::round(x[at + i] / (amax / 127)) * (amax / 127) : 0.0;
    }
  return out;
}

TEST(Quantize, ALinearOnAQuantizedWeightReadsItsInputRoundedTo8BitsAGroup) {
  const Graph model = linear_model<70>(DType::f32);
  Feeds feeds = random_feeds(model, {{"Batch", 1}, {"Seq", 3}}, 21, 1.0f);
  std::vector<float> x = feeds.at("x").to_f32();
  for (std::int64_t i = 0; i < 70; ++i) x[static_cast<std::size_t>(70 + i)] = 0.0f;  // row 1: zeros
  x[2 * 70 + 65] = std::numeric_limits<float>::quiet_NaN();                          // row 2's last group: a NaN
  feeds["x"] = NdArray::from_f32(x, {1, 3, 70});
  const NdArray w = feeds.at("fc.weight"), bias = feeds.at("fc.bias");
  const QuantizedModel qm = quantize_linear_weights(model, feeds, Quant::q8);
  const std::vector<float> deq =
      dequantize_weight({feeds.at("fc.weight.q8"), feeds.at("fc.weight.q8_scale"), Quant::q8}, 32).to_f32();
  const std::vector<double> xr = rounded_by_hand(x, 70);
  const std::vector<float> b = bias.to_f32();
  const std::vector<float> y = interpret(qm.graph, feeds).outputs.at("out").to_f32();
  double rounding_moved = 0;
  for (int row = 0; row < 3; ++row)
    for (int o = 0; o < 40; ++o) {
      double want = b[static_cast<std::size_t>(o)], unrounded = want;
      for (int i = 0; i < 70; ++i) {
        const auto xi = static_cast<std::size_t>(row * 70 + i);
        want += xr[xi] * deq[static_cast<std::size_t>(o * 70 + i)];
        unrounded += double{x[xi]} * deq[static_cast<std::size_t>(o * 70 + i)];
      }
      const float got = y[static_cast<std::size_t>(row * 40 + o)];
      if (row == 2) {  // a NaN in a group makes the whole output NaN
        EXPECT_TRUE(std::isnan(got)) << o;
        continue;
      }
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want))) << row << "," << o;
      if (row == 1) {
        EXPECT_EQ(got, b[static_cast<std::size_t>(o)]) << o;  // zeros stay zeros
      }
      rounding_moved = std::max(rounding_moved, std::fabs(unrounded - want));
    }
  EXPECT_GT(rounding_moved, 1e-4);  // the rounding is visible: this test tells it from none
}

/// The quantized linear compiled ahead of time for `cpu` (+ `features`): its assembly, and (when
/// this host runs that code) its outputs against the interpreter's.
void check_target(const std::string& cpu, const std::string& features, bool int8_dot, bool runs_here) {
  SCOPED_TRACE(cpu + " " + features);
  for (const Quant format : {Quant::q8, Quant::q4}) {
    // q8 with a short last group; q4 with whole groups (and a q4 weight's rows must be).
    const Graph model = format == Quant::q8 ? linear_model<80>(DType::f32) : linear_model<96>(DType::f32);
    Feeds feeds = random_feeds(model, {{"Batch", 1}, {"Seq", 37}}, 9, 1.0f);  // 37 rows: the GEMM
    const Graph g = quantize_linear_weights(model, feeds, format).graph;
    // 13 rows: a batch's integer GEMV (two panels of 8 lanes, or one of 16), for q4's whole groups.
    Feeds batch = feeds;
    batch["x"] = random_feeds(g, {{"Batch", 1}, {"Seq", 13}}, 10, 1.0f).at("x");
    codegen::AotOptions opt;
    opt.function = "qlinear";
    opt.cpu = cpu;
    opt.features = features;
    const Bindings sizes = bind_extents(g, feeds);
    const auto dir = std::filesystem::temp_directory_path() / ("qkv_quant_" + std::to_string(::getpid()));
    std::filesystem::create_directories(dir);
    codegen::emit_aot(g, sizes, opt, codegen::AotFormat::assembly, (dir / "q.s").string());
    std::stringstream text;
    text << std::ifstream(dir / "q.s").rdbuf();
    std::filesystem::remove_all(dir);
    EXPECT_EQ(text.str().find("vpdpbusd") != std::string::npos, int8_dot) << quant_name(format);
    if (!runs_here) continue;
    for (const Feeds* f : {&feeds, &batch}) {
      const std::int64_t rows = f->at("x").shape[1];
      auto compiled = codegen::AotModel::compile(g, bind_extents(g, *f), opt);
      std::vector<float> out(static_cast<std::size_t>(rows * 40), std::nanf(""));
      std::vector<void*> args;
      for (const auto& a : compiled->signature().args)
        args.push_back(a.output ? static_cast<void*>(out.data()) : const_cast<std::byte*>(f->at(a.name).bytes.data()));
      ASSERT_EQ(compiled->run(args.data()), 0);
      const NdArray got = NdArray::from_f32(out, {1, rows, 40});
      EXPECT_LE(max_error(got, interpret(g, *f).outputs.at("out")), 2e-5)
          << quant_name(format) << ", " << rows << " rows";
    }
  }
}

TEST(Quantize, EveryCpuTargetsGemmRoundsTheInputAsTheInterpreterDoes) {
  const codegen::HostTarget host = codegen::host_target();
  auto has = [&](const char* f) {
    return std::find(host.features.begin(), host.features.end(), f) != host.features.end();
  };
  const bool avx2 = has("+avx2") && has("+fma");
  check_target("x86-64-v3", "", /*int8_dot=*/false, avx2);                            // f32 panels, x rounded in f32
  check_target("x86-64-v3", "+avxvnni", /*int8_dot=*/true, avx2 && has("+avxvnni"));  // 8 lanes
  check_target("x86-64-v4", "+avx512vnni", /*int8_dot=*/true, has("+avx512f") && has("+avx512vnni"));  // 16
}

}  // namespace
}  // namespace qkv
