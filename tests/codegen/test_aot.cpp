// The AOT compiler (qkv/codegen/aot.hpp): whole graphs compiled into one function, run in-process
// through AotModel and compared with the reference interpreter; the files emit_aot writes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include <dlfcn.h>
#include <unistd.h>

#include <qkv/codegen/aot.hpp>
#include <qkv/codegen/aot_main.hpp>
#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/random_feeds.hpp>

#include "backend_cases.hpp"

using ::testing::HasSubstr;

namespace qkv::nn {
namespace {

QKV_AXIS(Feat);
QKV_AXIS(Rows);

/// Runs the AOT-compiled function on `feeds` and returns its outputs by name.
std::map<std::string, std::vector<float>> run_aot(const Graph& g, const Feeds& feeds) {
  const Bindings sizes = bind_extents(g, feeds);
  auto model = codegen::AotModel::compile(g, sizes);
  const auto& sig = model->signature();
  std::vector<std::vector<float>> f32(sig.args.size());
  std::vector<std::vector<std::uint8_t>> bytes(sig.args.size());
  std::vector<std::vector<std::int64_t>> i64(sig.args.size());
  std::vector<std::vector<std::int32_t>> i32(sig.args.size());
  std::vector<void*> args;
  for (std::size_t k = 0; k < sig.args.size(); ++k) {
    const auto& a = sig.args[k];
    if (a.output) {
      if (a.dtype == DType::boolean) {
        bytes[k].assign(static_cast<std::size_t>(a.numel), 0xAB);
        args.push_back(bytes[k].data());
      } else {
        f32[k].assign(static_cast<std::size_t>(a.numel), std::nanf(""));  // every element must be written
        args.push_back(f32[k].data());
      }
      continue;
    }
    const NdArray& in = feeds.at(a.name);
    EXPECT_EQ(in.numel(), a.numel) << a.name;
    if (a.dtype == DType::boolean) {
      for (float v : in.to_f32()) bytes[k].push_back(v != 0.0f ? 1 : 0);
      args.push_back(bytes[k].data());
    } else if (a.dtype == DType::i64) {  // token ids as the integers they are
      for (float v : in.to_f32()) i64[k].push_back(static_cast<std::int64_t>(v));
      args.push_back(i64[k].data());
    } else if (a.dtype == DType::i32) {
      for (float v : in.to_f32()) i32[k].push_back(static_cast<std::int32_t>(v));
      args.push_back(i32[k].data());
    } else {
      f32[k] = in.to_f32();
      args.push_back(f32[k].data());
    }
  }
  EXPECT_EQ(model->run(args.data()), 0);
  std::map<std::string, std::vector<float>> out;
  for (std::size_t k = 0; k < sig.args.size(); ++k)
    if (sig.args[k].output) out[sig.args[k].name] = f32[k];
  return out;
}

/// Every output against the interpreter: max |a - b| / max(1, |b|) <= tol; infinities exact.
void expect_aot_agrees(const Graph& g, const Feeds& feeds, double tol = 2e-5) {
  const RunResult want = interpret(g, feeds);
  const auto got = run_aot(g, feeds);
  ASSERT_EQ(got.size(), want.outputs.size());
  for (const auto& [name, w] : want.outputs) {
    const auto& a = got.at(name);
    const auto wv = w.to_f32();
    ASSERT_EQ(a.size(), wv.size()) << name;
    double err = 0;
    for (std::size_t i = 0; i < wv.size(); ++i) {
      if (std::isinf(wv[i])) {
        EXPECT_EQ(a[i], wv[i]) << name << "[" << i << "]";
        continue;
      }
      ASSERT_FALSE(std::isnan(a[i])) << name << "[" << i << "] was not written (or is NaN)";
      err = std::max(err,
                     std::abs(static_cast<double>(a[i]) - wv[i]) / std::max(1.0, std::abs(static_cast<double>(wv[i]))));
    }
    EXPECT_LE(err, tol) << name;
  }
}

TEST(Aot, MultiHeadAttentionWithPaddingAndWeights) {
  const auto c = cases::mha_with_padding_and_weights({33, 7, 0});  // the last sequence sees no key
  expect_aot_agrees(c.graph, c.feeds);
}

TEST(Aot, CausalBottomRightOnUnequalLengthsWithWiderValues) {
  const auto c = cases::causal_bottom_right_on_unequal_lengths();
  expect_aot_agrees(c.graph, c.feeds);
}

TEST(Aot, GroupedQueryAttentionCausal) {
  const auto c = cases::grouped_query_causal();
  expect_aot_agrees(c.graph, c.feeds);
}

TEST(Aot, DecodeShapedAttentionRunsTheSplitKvKernelAndItsMerge) {
  // Two query rows against 300 keys, GQA 4 over 2, head width 32, causal bottom-right: in the
  // object, the split-KV decode kernel, its chunks and their merge.
  Graph g;
  auto q = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Group<2>, Seq<dyn>, HeadDim<32>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Key<dyn>, HeadDim<32>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<2>, Key<dyn>, ValueDim<32>>>(g, "v");
  auto s = causal<Seq, Key>(scaled(contract<HeadDim>(q, k)), bottom_right);
  output(contract<Key>(softmax<Key>(s), v), "out");
  expect_aot_agrees(g, random_feeds(g, {{"Batch", 2}, {"Seq", 2}, {"Key", 300}}, 14, 1.0f));
}

TEST(Aot, DropoutMasksEqualTheInterpreters) {
  const auto c = cases::dropout_with_weights();
  const auto want = interpret(c.graph, c.feeds).outputs.at("weights").to_f32();
  const auto got = run_aot(c.graph, c.feeds).at("weights");
  int dropped = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(want[i] == 0.0f, got[i] == 0.0f) << i;
    dropped += want[i] == 0.0f;
  }
  EXPECT_GT(dropped, 0);
  expect_aot_agrees(c.graph, c.feeds);
}

TEST(Aot, TinyLlamaWithRopeRmsNormSwiGluAndArgmax) {
  const auto c = cases::tiny_llama();
  expect_aot_agrees(c.graph, c.feeds, 5e-5);
}

TEST(Aot, AnEmbeddingIdOutsideTheTableReturnsThree) {
  Graph g;
  auto table = embedding_params<Vocab<dyn>, Model<8>>(g, "embed");
  auto ids = input<Tensor<i32, Seq<dyn>>>(g, "tokens");
  output(embedding(table, ids), "out");
  auto model = codegen::AotModel::compile(g, {{"Vocab", 10}, {"Seq", 3}});
  std::vector<float> t(80, 1.0f), out(24);
  std::vector<std::int32_t> id{1, -1, 2};
  std::vector<void*> args{t.data(), id.data(), out.data()};
  EXPECT_EQ(model->run(args.data()), 3);
  id[1] = 10;
  EXPECT_EQ(model->run(args.data()), 3);
  id[1] = 9;
  EXPECT_EQ(model->run(args.data()), 0);
}

// Token ids and positions are int64_t / int32_t arrays in the C signature and read as integers:
// an id of 2^24 + 1 (no float holds it) picks its own row.
TEST(Aot, IntegerInputsAreIntegersInTheSignatureAndInTheCode) {
  Graph g;
  auto table = embedding_params<Vocab<dyn>, Model<4>>(g, "embed");
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "ids");
  auto pos = input<Tensor<i32, Seq<dyn>>>(g, "pos");
  auto x = embedding(table, ids);                                       // [Batch, Seq, Model]
  output(x + embedding(table, broadcast_like(pos, ids)) * 0.5, "out");  // positions copied over Batch
  output(rename<Seq, Rows>(ids), "ids_back");                           // an integer output
  const Bindings sizes{{"Vocab", (1 << 24) + 2}, {"Batch", 2}, {"Seq", 3}};
  codegen::AotOptions opt;
  opt.function = "lm";
  opt.cpu = "x86-64-v2";
  const std::string h = codegen::aot_header(g, sizes, opt);
  EXPECT_THAT(h,
              HasSubstr("int lm(\n    const float* embed_weight,\n    const int64_t* ids,\n    const int32_t* pos,\n"));
  EXPECT_THAT(
      h, HasSubstr("int lm_run(void* handle, const int64_t* ids, const int32_t* pos, float* out, float* ids_back);"));
  EXPECT_THAT(h, HasSubstr("ids: input i64 [Batch=2, Seq=3]\n"));
  EXPECT_THAT(h, HasSubstr("ids_back: output f32 [Batch=2, Rows=3] (integer values as floats"));

  // The interpreter on a small table; the compiled function on the same ids.
  const Bindings small{{"Vocab", 7}, {"Batch", 2}, {"Seq", 3}};
  Feeds feeds = random_feeds(g, small, /*seed=*/5);
  NdArray id = NdArray::zeros(DType::i64, {2, 3});
  NdArray p = NdArray::zeros(DType::i32, {3});
  for (std::int64_t k = 0; k < 6; ++k) id.as<std::int64_t>()[static_cast<std::size_t>(k)] = (k * 3 + 1) % 7;
  for (std::int32_t k = 0; k < 3; ++k) p.as<std::int32_t>()[static_cast<std::size_t>(k)] = 6 - k;
  feeds["ids"] = id;
  feeds["pos"] = p;
  expect_aot_agrees(g, feeds, 1e-6);
  EXPECT_THAT(codegen::cpu::run(g, feeds).outputs.at("out").to_f32(),  // the executor, integer feeds
              ::testing::Pointwise(::testing::FloatNear(1e-6f), interpret(g, feeds).outputs.at("out").to_f32()));

  // Row 2^24 + 1 of a table whose rows hold their own index: a float id would read row 2^24.
  Graph one;
  auto wide = embedding_params<Vocab<dyn>, Model<1>>(one, "embed");
  output(embedding(wide, input<Tensor<i64, Seq<dyn>>>(one, "ids")), "out");
  auto model = codegen::AotModel::compile(one, {{"Vocab", (1 << 24) + 2}, {"Seq", 2}});
  std::vector<float> t((1 << 24) + 2);
  for (std::size_t r = 0; r < t.size(); ++r) t[r] = static_cast<float>(r % 1000);
  std::vector<std::int64_t> big{(1 << 24) + 1, 3};
  std::vector<float> got(2);
  std::vector<void*> args{t.data(), big.data(), got.data()};
  ASSERT_EQ(model->run(args.data()), 0);
  EXPECT_EQ(got[0], static_cast<float>(((1 << 24) + 1) % 1000));
  EXPECT_EQ(got[1], 3.0f);
  big[0] = (1 << 24) + 2;  // one past the table
  EXPECT_EQ(model->run(args.data()), 3);
}

TEST(Aot, EncoderLayerThenCrossAttention) {
  const auto c = cases::encoder_layer_then_cross_attention();
  expect_aot_agrees(c.graph, c.feeds);
}

TEST(Aot, PostNormReluEncoderWithHeadsAsModules) {
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<24>>>(g, "x");
  auto enc = EncoderLayer<24, 3, 40, Activation::relu>::make(g, "enc.", NormPlacement::post);
  auto heads = HeadsAsModules<24, 3>::make(g, "mods.");
  output(heads(enc(x)), "out");
  expect_aot_agrees(g, random_feeds(g, {{"Batch", 2}, {"Seq", 5}}, 11, 0.5f));
}

TEST(Aot, UnfusedChainsRunAsLoopNests) {
  // A bias added before the scale ((s + b) * c is not the kernel's scale * s + mod) keeps the
  // chain unfused: contract, bias, scale, softmax, contract and the permutes become loops.
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<8>>>(g, "x");
  auto b = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, Key<dyn>>>(g, "b");
  auto k = rename<Seq, Key>(x);
  auto p = softmax<Key>(scale(biased(unscaled(contract<HeadDim>(x, k)), b), 0.5));
  output(permute<Batch, Seq, Heads, HeadDim>(contract<Key>(p, k)), "out");
  ASSERT_EQ(codegen::cpu::fused_attention_count(g), 0);
  expect_aot_agrees(g, random_feeds(g, {{"Batch", 2}, {"Seq", 5}, {"Key", 5}}, 12));
}

TEST(Aot, BuiltInAndHandWrittenModsMatchTheInterpreter) {
  for (const auto& c : {cases::mods<4, 2, 32>(2, 37, 37, true), cases::mods<2, 2, 64>(1, 29, 71, false)}) {
    ASSERT_EQ(codegen::cpu::fused_attention_count(c.graph), 1) << c.graph.table();
    expect_aot_agrees(c.graph, c.feeds, 5e-5);
  }
}

TEST(Aot, APerHeadBiasIsALoadOfTheFusedKernel) {
  const auto c = cases::mha_with_per_head_bias();
  ASSERT_EQ(codegen::cpu::fused_attention_count(c.graph), 1);
  expect_aot_agrees(c.graph, c.feeds);
}

TEST(Aot, OpsOverANonContiguousAxis) {
  // softmax, layer norm and linear over the first (strided) axis, then a broadcasting mul.
  Graph g;
  auto x = input<Tensor<f32, Feat<12>, Seq<dyn>>>(g, "x");
  auto s = input<Tensor<f32, Seq<dyn>>>(g, "s");
  auto ln = layer_norm_params<Feat<12>>(g, "ln");
  auto lin = linear_params<Feat<12>, Hidden<7>>(g, "lin");
  auto y = linear(layer_norm(softmax<Feat>(x), ln), lin);
  output(mul(y, s), "out");
  expect_aot_agrees(g, random_feeds(g, {{"Seq", 9}}, 12));
}

TEST(Aot, ThreadCountDoesNotChangeTheResult) {
  // Big enough that the attention, the GEMMs and the GELU take the threaded path.
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(g, "x");
  output(EncoderLayer<64, 4, 256, Activation::gelu>::make(g, "enc.")(x, causal_mask), "out");
  const Feeds feeds = random_feeds(g, {{"Batch", 2}, {"Seq", 150}}, 13, 0.5f);
  expect_aot_agrees(g, feeds, 5e-5);

  auto model = codegen::AotModel::compile(g, bind_extents(g, feeds));
  std::vector<std::vector<float>> data;
  std::vector<void*> args;
  for (const auto& a : model->signature().args) {
    data.push_back(a.output ? std::vector<float>(static_cast<std::size_t>(a.numel)) : feeds.at(a.name).to_f32());
    args.push_back(data.back().data());
  }
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3, 7, 0}) {
    model->set_threads(threads);
    std::fill(data.back().begin(), data.back().end(), std::nanf(""));
    ASSERT_EQ(model->run(args.data()), 0);
    results.push_back(data.back());
  }
  for (std::size_t r = 1; r < results.size(); ++r)
    EXPECT_EQ(std::memcmp(results[r].data(), results[0].data(), results[0].size() * sizeof(float)), 0) << r;
  EXPECT_THROW(model->set_threads(-1), std::invalid_argument);
}

TEST(Aot, DynamicSizesAreArgumentsOfOneFunction) {
  // An encoder layer compiled once with Batch and Seq left as run-time sizes, run at several
  // lengths against the interpreter; invalid sizes are refused with 2.
  Graph g;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(g, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  output(EncoderLayer<32, 4, 64, Activation::relu>::make(g, "enc.")(x, keep), "out");
  codegen::AotOptions opt;
  opt.function = "enc";
  opt.dynamic = {"Batch", "Seq", "Key"};
  auto model = codegen::AotModel::compile(g, {}, opt);
  const auto& sig = model->signature();
  ASSERT_EQ(sig.sizes.size(), 3u);  // in the symbols' order
  EXPECT_EQ(sig.sizes[0].symbol, "Batch");
  EXPECT_EQ(sig.sizes[1].symbol, "Key");
  EXPECT_EQ(sig.sizes[2].symbol, "Seq");
  EXPECT_EQ(sig.args.front().numel, -1);  // x depends on the run-time sizes
  for (std::int64_t seq : {1, 5, 31, 70}) {
    const Feeds feeds =
        random_feeds(g, {{"Batch", 2}, {"Seq", seq}, {"Key", seq}}, static_cast<std::uint64_t>(seq), 0.5f);
    const auto want = interpret(g, feeds).outputs.at("out").to_f32();
    std::vector<std::vector<float>> f32;
    std::vector<std::vector<std::uint8_t>> bytes;
    f32.reserve(sig.args.size());
    bytes.reserve(sig.args.size());
    std::vector<void*> args;
    for (const auto& a : sig.args) {
      if (a.output) {
        args.push_back(f32.emplace_back(want.size(), std::nanf("")).data());
      } else if (a.dtype == DType::boolean) {
        auto& b = bytes.emplace_back();
        for (float v : feeds.at(a.name).to_f32()) b.push_back(v != 0.0f ? 1 : 0);
        args.push_back(b.data());
      } else {
        args.push_back(f32.emplace_back(feeds.at(a.name).to_f32()).data());
      }
    }
    const std::int64_t sizes[] = {2, seq, seq};
    ASSERT_EQ(model->run(sizes, args.data()), 0) << seq;
    const auto& got = f32.back();
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(got[i], want[i], 5e-5 * std::max(1.0f, std::abs(want[i]))) << "Seq " << seq << " [" << i << "]";
    const std::int64_t negative[] = {2, -seq, -seq}, unequal[] = {2, seq + 1, seq};  // Key == Seq is a shape check
    EXPECT_EQ(model->run(negative, args.data()), 2);
    EXPECT_EQ(model->run(unequal, args.data()), 2);
  }
  {  // Sizes whose products overflow int64 (issue #28, item 4: these segfaulted): refused with 2,
     // nothing read or written; on the prepared handle too.
    std::vector<float> dummy(16, 0.0f);
    std::vector<void*> args(sig.args.size(), dummy.data());
    constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
    const std::int64_t p62 = std::int64_t{1} << 62, p40 = std::int64_t{1} << 40, p20 = std::int64_t{1} << 20;
    for (const auto& sizes : std::vector<std::array<std::int64_t, 3>>{
             {1, p62, p62}, {p40, p20, p20}, {kMax, kMax, kMax}, {2, std::int64_t{1} << 31, std::int64_t{1} << 31}}) {
      EXPECT_EQ(model->run(sizes.data(), args.data()), 2) << sizes[0] << " " << sizes[1];
    }
  }
  const std::string h = codegen::aot_header(g, {}, opt);
  EXPECT_THAT(h, HasSubstr("int enc(\n    int64_t Batch,\n    int64_t Key,\n    int64_t Seq,\n    const float* x,"));
  EXPECT_THAT(h, HasSubstr("int enc_packed(const int64_t* sizes, void* const* args);"));
  EXPECT_THAT(h, HasSubstr("x: input f32 [Batch=Batch?, Seq=Seq?, Model=32]"));
  opt.dynamic = {"Model"};
  EXPECT_THROW(codegen::aot_header(g, {{"Batch", 1}, {"Seq", 2}, {"Key", 2}}, opt), std::invalid_argument);  // static
}

TEST(Aot, AnLmHeadOfALlamaWithHidden1024IsNotRefusedAsOverflowing) {
  // The size check counted a linear layer's weight [out, in] as two more axes beside x's and the
  // output's: for a Llama's LM head, Seq × Model × Vocab × out × in = 16 × 1024² × 32000² × 8
  // bytes > 2^56, and every decoder with hidden size 1024 and a 32000-token vocabulary was
  // refused (code 2) by run causal-lm and generate. Its loops are Seq × Model × Vocab.
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<dyn>>>(g, "x");
  output(linear(x, linear_params<Model<dyn>, Vocab<dyn>>(g, "lm_head", /*bias=*/false)), "y");
  codegen::AotOptions opt;
  opt.function = "head";
  opt.dynamic = {"Seq", "Model", "Vocab"};
  auto model = codegen::AotModel::compile(g, {}, opt);
  const auto& sig = model->signature();
  std::map<std::string, std::int64_t> at{{"Seq", 16}, {"Model", 1024}, {"Vocab", 32000}};
  std::vector<std::int64_t> sizes;
  for (const auto& s : sig.sizes) sizes.push_back(at.at(s.symbol));
  const std::size_t L = 16, D = 1024, V = 32000;
  std::vector<float> xs(L * D), w(V * D), y(L * V, std::nanf(""));
  for (std::size_t i = 0; i < xs.size(); ++i) xs[i] = static_cast<float>(static_cast<int>(i % 13) - 6) * 0.125f;
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(static_cast<int>(i % 11) - 5) * 0.0625f;
  std::vector<void*> args;
  for (const auto& a : sig.args) args.push_back(a.output ? y.data() : a.name == "x" ? xs.data() : w.data());
  ASSERT_EQ(model->run(sizes.data(), args.data()), 0);
  for (const auto& [t, v] : std::vector<std::pair<std::size_t, std::size_t>>{{0, 0}, {5, 12345}, {15, 31999}}) {
    double want = 0;  // exact: multiples of 1/128 summed over 1024 terms
    for (std::size_t k = 0; k < D; ++k) want += static_cast<double>(xs[t * D + k]) * w[v * D + k];
    EXPECT_NEAR(y[t * V + v], want, 1e-3) << t << ", " << v;
  }
  // What does overflow is still refused: Seq × Model × Vocab = 2^60 elements.
  at = {{"Seq", std::int64_t{1} << 20}, {"Model", std::int64_t{1} << 20}, {"Vocab", std::int64_t{1} << 20}};
  for (std::size_t k = 0; k < sizes.size(); ++k) sizes[k] = at.at(sig.sizes[k].symbol);
  EXPECT_EQ(model->run(sizes.data(), args.data()), 2);
}

TEST(Aot, APreparedHandleBindsTheWeightsOnceThroughTheCInterface) {
  // Two linear layers (one with a bias) around a gelu, Seq a run-time size, emitted as a shared
  // library and called through its C functions: <f>_prepare binds the weights (packed once),
  // <f>_run takes the other arrays. 2 rows take the GEMV (W in place), 9 the GEMM on the packed
  // panels; both equal the unprepared call bit for bit and the interpreter within 2e-5.
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<40>>>(g, "x");
  auto h = gelu(linear(x, linear_params<Model<40>, Hidden<48>>(g, "up")));
  output(linear(h, linear_params<Hidden<48>, Model<40>>(g, "down", /*bias=*/false)), "y");
  codegen::AotOptions opt;
  opt.function = "mlp";
  opt.dynamic = {"Seq"};
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_aot_prepared_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string so = (dir / "libmlp.so").string();
  codegen::emit_aot(g, {}, opt, codegen::AotFormat::shared, so);
  const std::string header = codegen::aot_header(g, {}, opt);
  EXPECT_THAT(header, HasSubstr("void* mlp_prepare(\n    int64_t Seq,\n    const float* up_weight,\n    const float* "
                                "up_bias,\n    const float* down_weight);"));
  EXPECT_THAT(header, HasSubstr("int mlp_run(void* handle, int64_t Seq, const float* x, float* y);"));
  EXPECT_THAT(header, HasSubstr("void mlp_release(void* handle);"));
  void* lib = ::dlopen(so.c_str(), RTLD_NOW | RTLD_LOCAL);
  ASSERT_NE(lib, nullptr) << ::dlerror();
  using Packed = int(const std::int64_t*, void* const*);
  using PreparePacked = void*(const std::int64_t*, void* const*);
  using RunPacked = int(void*, const std::int64_t*, void* const*);
  using Prepare = void*(std::int64_t, const float*, const float*, const float*);
  using Run = int(void*, std::int64_t, const float*, float*);
  using Release = void(void*);
  auto* packed = reinterpret_cast<Packed*>(::dlsym(lib, "mlp_packed"));
  auto* prepare_packed = reinterpret_cast<PreparePacked*>(::dlsym(lib, "mlp_prepare_packed"));
  auto* run_packed = reinterpret_cast<RunPacked*>(::dlsym(lib, "mlp_run_packed"));
  auto* prepare = reinterpret_cast<Prepare*>(::dlsym(lib, "mlp_prepare"));
  auto* run = reinterpret_cast<Run*>(::dlsym(lib, "mlp_run"));
  auto* release = reinterpret_cast<Release*>(::dlsym(lib, "mlp_release"));
  ASSERT_TRUE(packed && prepare_packed && run_packed && prepare && run && release);

  const Feeds weights = random_feeds(g, {{"Seq", 1}}, 77, 0.5f);
  auto data = [&](const char* name) { return weights.at(name).as<float>().data(); };
  float* up_w = const_cast<float*>(data("up.weight"));
  float* up_b = const_cast<float*>(data("up.bias"));
  float* down_w = const_cast<float*>(data("down.weight"));
  const std::int64_t none[] = {0};  // no parameter has Seq: prepare does not read it
  void* params[] = {up_w, up_b, down_w};
  void* handle = prepare_packed(none, params);
  void* direct = prepare(0, up_w, up_b, down_w);
  ASSERT_NE(handle, nullptr);
  ASSERT_NE(direct, nullptr);
  for (std::int64_t seq : {2, 9, 2, 9}) {  // twice each: the handle's arena reused
    SCOPED_TRACE("Seq " + std::to_string(seq));
    Feeds f = weights;
    f["x"] = random_feeds(g, {{"Seq", seq}}, 5 + static_cast<std::uint64_t>(seq), 1.0f).at("x");
    const std::vector<float> want = interpret(g, f).outputs.at("y").to_f32();
    std::vector<float> xs = f.at("x").to_f32(), plain(want.size(), std::nanf("")), bound = plain, typed = plain;
    const std::int64_t sizes[] = {seq};
    void* all[] = {xs.data(), up_w, up_b, down_w, plain.data()};  // graph order: x, then the params
    ASSERT_EQ(packed(sizes, all), 0);
    void* others[] = {xs.data(), bound.data()};
    ASSERT_EQ(run_packed(handle, sizes, others), 0);
    ASSERT_EQ(run(direct, seq, xs.data(), typed.data()), 0);
    EXPECT_EQ(std::memcmp(plain.data(), bound.data(), plain.size() * 4), 0) << "prepared == unprepared";
    EXPECT_EQ(std::memcmp(plain.data(), typed.data(), plain.size() * 4), 0);
    for (std::size_t i = 0; i < want.size(); ++i)
      ASSERT_NEAR(bound[i], want[i], 2e-5 * std::max(1.0f, std::abs(want[i]))) << i;
  }
  std::vector<float> xs(40, 0.0f), ys(40);
  void* others[] = {xs.data(), ys.data()};
  const std::int64_t one[] = {1};
  EXPECT_EQ(run_packed(nullptr, one, others), 5) << "a failed prepare's NULL is refused";
  release(handle);
  release(direct);
  release(nullptr);
  ::dlclose(lib);
  std::filesystem::remove_all(dir);
}

TEST(Aot, AttentionHeadWidthsCannotBeDynamic) {
  Graph g;
  auto q = input<Tensor<f32, Heads<2>, Seq<dyn>, HeadDim<dyn>>>(g, "q");
  auto k = input<Tensor<f32, Heads<2>, Key<dyn>, HeadDim<dyn>>>(g, "k");
  auto v = input<Tensor<f32, Heads<2>, Key<dyn>, HeadDim<dyn>>>(g, "v");
  output(attention(q, k, v).first, "out");
  codegen::AotOptions opt;
  opt.dynamic = {"HeadDim"};
  try {
    (void)codegen::aot_signature(g, {{"Seq", 3}, {"Key", 3}, {"HeadDim", 8}}, opt);
    ADD_FAILURE() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(e.what(), HasSubstr("specialised on HeadDim"));
  }
  opt.dynamic = {"Seq", "Key"};
  const auto sig = codegen::aot_signature(g, {{"HeadDim", 8}}, opt);
  EXPECT_EQ(sig.sizes.size(), 2u);
}

TEST(Aot, SignatureHeaderAndArenaReuse) {
  Graph g;
  auto x = input<Tensor<f32, Seq<dyn>, Model<64>>>(g, "x.in");
  output(relu(relu(relu(relu(x)))), "y");
  const Bindings sizes{{"Seq", 10}};
  const auto sig = codegen::aot_signature(g, sizes);
  ASSERT_EQ(sig.args.size(), 2u);
  EXPECT_EQ(sig.args[0].c_name, "x_in");
  EXPECT_FALSE(sig.args[0].output);
  EXPECT_EQ(sig.args[0].numel, 640);
  EXPECT_TRUE(sig.args[1].output);
  EXPECT_EQ(sig.arena_bytes, 2u * 10 * 64 * 4);  // four relus ping-pong in two buffers

  codegen::AotOptions opt;
  opt.function = "tiny";
  opt.cpu = "x86-64-v3";
  const std::string h = codegen::aot_header(g, sizes, opt);
  EXPECT_THAT(h, HasSubstr("int tiny(const float* x_in, float* y);"));
  EXPECT_THAT(h, HasSubstr("int tiny_packed(void* const* args);"));
  EXPECT_THAT(h, HasSubstr("int tiny_set_threads(int n);"));
  EXPECT_THAT(h, HasSubstr("#define TINY_X_IN_NUMEL 640"));
  EXPECT_THAT(h, HasSubstr("x_in (x.in): input f32 [Seq=10, Model=64]"));

  opt.function = "not an identifier";
  EXPECT_THROW(codegen::aot_header(g, sizes, opt), std::invalid_argument);
  opt.function = "tiny";
  opt.cpu = "no-such-cpu";
  EXPECT_THROW(codegen::aot_header(g, sizes, opt), std::invalid_argument);
  EXPECT_THROW(codegen::aot_signature(g, {}), ShapeError);  // Seq is not bound
}

TEST(Aot, EmitsIrAssemblyObjectAndSharedLibrary) {
  Graph g;
  auto q = input<Tensor<f32, Heads<2>, Seq<dyn>, HeadDim<16>>>(g, "q");
  auto k = input<Tensor<f32, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "k");
  auto v = input<Tensor<f32, Heads<2>, Key<dyn>, HeadDim<16>>>(g, "v");
  output(attention(q, k, v).first, "out");
  const Bindings sizes{{"Seq", 8}, {"Key", 8}};
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_aot_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  auto read = [](const std::filesystem::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  };
  codegen::AotOptions opt;
  opt.function = "sdpa8";
  for (const char* cpu : {"native", "x86-64-v2", "x86-64-v3", "x86-64-v4"}) {
    opt.cpu = cpu;
    const auto s = codegen::emit_aot(g, sizes, opt, codegen::AotFormat::assembly, (dir / "k.s").string());
    ASSERT_EQ(s.size(), 1u);
    const std::string text = read(dir / "k.s");
    EXPECT_NE(text.find("sdpa8_packed:"), std::string::npos) << cpu;
    if (std::string(cpu) == "x86-64-v4") {
      EXPECT_NE(text.find("zmm"), std::string::npos) << "AVX-512 code for v4";
    }
    if (std::string(cpu) == "x86-64-v3") {
      EXPECT_NE(text.find("ymm"), std::string::npos) << "AVX2 code for v3";
      EXPECT_EQ(text.find("zmm"), std::string::npos) << "no AVX-512 for v3";
    }
  }
  opt.cpu = "native";
  codegen::emit_aot(g, sizes, opt, codegen::AotFormat::ll, (dir / "k.ll").string());
  const std::string ir = read(dir / "k.ll");
  // (not EXPECT_THAT: a failure would print the whole module)
  EXPECT_NE(ir.find("i32 @sdpa8(ptr"), std::string::npos);
  EXPECT_NE(ir.find("i32 @sdpa8_packed(ptr"), std::string::npos);
  // Only the entry points are visible: every kernel and helper is internal.
  std::vector<std::string> exported;
  std::istringstream lines(ir);
  for (std::string line; std::getline(lines, line);)
    if (line.rfind("define ", 0) == 0 && line.find(" internal ") == std::string::npos) {
      const std::size_t at = line.find('@');
      exported.push_back(line.substr(at, line.find('(', at) - at));
    }
  EXPECT_THAT(exported, ::testing::UnorderedElementsAre(
                            "@sdpa8", "@sdpa8_packed", "@sdpa8_set_threads", "@sdpa8_prepare", "@sdpa8_prepare_packed",
                            "@sdpa8_run", "@sdpa8_run_packed", "@sdpa8_release", "@sdpa8_required_features",
                            "@sdpa8_check_cpu", "@sdpa8_set_parallel"));

  auto files = codegen::emit_aot(g, sizes, opt, codegen::AotFormat::object, (dir / "k.o").string());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(read(dir / "k.o").substr(1, 3), "ELF");
  EXPECT_THAT(read(dir / "k.h"), HasSubstr("int sdpa8(const float* q, const float* k, const float* v, float* out);"));
  files = codegen::emit_aot(g, sizes, opt, codegen::AotFormat::shared, (dir / "libk.so").string());
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(read(dir / "libk.so").substr(1, 3), "ELF");
  EXPECT_FALSE(std::filesystem::exists(dir / "libk.so.o.tmp"));
  std::filesystem::remove_all(dir);
}

TEST(Aot, AGeneratorMainWritesTheLibraryAndHeaderItsCommandLineAsks) {
  auto build = [] {
    Graph g;
    auto x = input<Tensor<f32, Seq<dyn>, Model<4>>>(g, "x");
    output(relu(x), "y");
    return g;
  };
  const auto dir = std::filesystem::temp_directory_path() / ("qkv_aot_main_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string obj = (dir / "m.o").string(), header = (dir / "include" / "m.h").string();
  std::filesystem::create_directories(dir / "include");
  auto main_with = [&](std::vector<std::string> args) {
    args.insert(args.begin(), "gen");
    std::vector<const char*> argv;
    for (const auto& a : args) argv.push_back(a.c_str());
    return codegen::aot_main(static_cast<int>(argv.size()), argv.data(), build);
  };
  EXPECT_EQ(main_with({"-o", obj, "--header", header, "--function", "m", "--cpu", "x86-64-v2", "--sizes", "Seq=3"}), 0);
  EXPECT_TRUE(std::filesystem::exists(obj));
  EXPECT_FALSE(std::filesystem::exists(dir / "m.h"));  // moved to --header, its first line naming it
  std::ifstream in(header);
  std::stringstream h;
  h << in.rdbuf();
  EXPECT_EQ(h.str().rfind("/* m.h: generated", 0), 0u);
  EXPECT_THAT(h.str(), HasSubstr("int m(const float* x, float* y);"));
  EXPECT_EQ(main_with({"-o", (dir / "d.o").string(), "--function", "d", "--dynamic", "Seq"}), 0);
  std::ifstream din(dir / "d.h");
  std::stringstream dh;
  dh << din.rdbuf();
  EXPECT_THAT(dh.str(), HasSubstr("int d(int64_t Seq, const float* x, float* y);"));
  // Usage errors exit 2; a graph that cannot be compiled as asked (Seq neither sized nor dynamic) 1.
  EXPECT_EQ(main_with({"--function", "m"}), 2);
  EXPECT_EQ(main_with({"-o", obj, "--function", "m", "--sizes", "Seq"}), 2);
  EXPECT_EQ(main_with({"-o", (dir / "m.a").string(), "--function", "m"}), 2);
  EXPECT_EQ(main_with({"-o", obj, "--function", "m", "--bogus", "1"}), 2);
  EXPECT_EQ(main_with({"-o", obj, "--function", "m"}), 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace qkv::nn
