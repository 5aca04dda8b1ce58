// Reverse mode (qkv/ir/grad.hpp, qkv/dsl/grad.hpp) against finite differences on the reference
// interpreter, and the CPU backend against the interpreter on the same backward graphs.
//
// Each case builds a forward graph with one output y; the test appends a probe input r of y's
// axes and the loss L = Σ y ⊙ r (so every entry of y matters, with its own weight), asks for the
// gradients of L by the named inputs and parameters, and compares every entry of each gradient
// (at most 32 spread over each) with the central difference (L(x + h) − L(x − h)) / 2h of the
// interpreter (fp32 storage, fp64 sums): |analytic − fd| ≤ 2e-3 + 1e-2 · |fd| (h = 1e-3; the difference's own rounding
// is about 1e-4 at these sizes, a wrong rule is off by O(1)). Then the CPU backend runs the same graph: its gradients
// within 1e-4 (relative to the largest) of the interpreter's.
#include <gtest/gtest.h>

#include <functional>
#include <map>
#include <random>

#include <qkv/codegen/cpu/executor.hpp>
#include <qkv/dsl/grad.hpp>
#include <qkv/qkv.hpp>
#include <qkv/runtime/interpreter.hpp>

namespace qkv::nn {
namespace {

struct Case {
  Graph g;
  Feeds feeds;
  std::vector<std::string> wrt;  // input / param names
};

NdArray random_array(const std::vector<std::int64_t>& shape, std::mt19937& rng, float lo = -1, float hi = 1) {
  std::uniform_real_distribution<float> u(lo, hi);
  std::int64_t n = 1;
  for (auto s : shape) n *= s;
  std::vector<float> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return NdArray::from_f32(std::move(v), shape);
}

int node_named(const Graph& g, const std::string& name) {
  for (std::size_t i = 0; i < g.nodes().size(); ++i)
    if (is_array_leaf(g.node(static_cast<int>(i))) && g.node(static_cast<int>(i)).name == name)
      return static_cast<int>(i);
  ADD_FAILURE() << "no input or parameter " << name;
  return -1;
}

double loss_of(const Graph& g, const Feeds& f) { return interpret(g, f).outputs.at("loss").to_f32()[0]; }

/// Appends the probe and the loss to c's graph (output "y" before), the gradients as outputs
/// "d<name>", then checks them as the file's comment says.
void check(Case c, std::size_t entries = 32, std::uint32_t seed = 1) {
  std::mt19937 rng(seed);
  Graph& g = c.g;
  int y = -1;
  for (const auto& o : g.outputs())
    if (o.name == "y") y = o.node;
  ASSERT_GE(y, 0);
  // The probe r over y's axes, fed with y's shape (from a forward run).
  const NdArray y0 = interpret(g, c.feeds).outputs.at("y");
  Node probe;
  probe.op = Op::input;
  probe.name = "probe";
  probe.axes = g.node(y).axes;
  const int r = g.add(std::move(probe));
  c.feeds["probe"] = random_array(y0.shape, rng);
  grad_detail::Builder b(g);
  std::vector<std::string> all;
  for (const auto& a : g.node(y).axes) all.push_back(a.name);
  const int loss = b.sum_over(b.binary(Op::mul, y, r), all);
  g.mark_output(loss, "loss");
  std::vector<int> wrt;
  for (const auto& n : c.wrt) wrt.push_back(node_named(g, n));
  const std::vector<int> grads = append_gradients(g, loss, wrt);
  for (std::size_t k = 0; k < grads.size(); ++k) g.mark_output(grads[k], "d" + c.wrt[k]);

  const RunResult ref = interpret(g, c.feeds);
  const RunResult cpu = codegen::cpu::run(g, c.feeds);
  for (const auto& name : c.wrt) {
    const std::vector<float> an = ref.outputs.at("d" + name).to_f32();
    ASSERT_EQ(ref.outputs.at("d" + name).shape, c.feeds.at(name).shape) << name;
    // Finite differences, entry by entry.
    const double h = 1e-3;
    // At most `entries` entries of each tensor, spread over it (every entry of the small ones).
    const std::size_t stride = std::max<std::size_t>(1, an.size() / entries);
    for (std::size_t i = 0; i < an.size(); i += stride) {
      Feeds f = c.feeds;
      auto x = f.at(name).as<float>();
      const float x0 = x[i];
      x[i] = static_cast<float>(x0 + h);
      const double up = loss_of(g, f);
      x[i] = static_cast<float>(x0 - h);
      const double down = loss_of(g, f);
      const double fd = (up - down) / (static_cast<double>(x0 + h) - static_cast<double>(static_cast<float>(x0 - h)));
      const double err = std::abs(an[i] - fd);
      EXPECT_LE(err, 2e-3 + 1e-2 * std::abs(fd)) << "d" << name << "[" << i << "]: analytic " << an[i] << ", fd " << fd;
      if (err > 2e-3 + 1e-2 * std::abs(fd)) return;  // one report per case is enough
    }
    // The CPU backend on the same backward graph.
    const std::vector<float> got = cpu.outputs.at("d" + name).to_f32();
    double scale = 1e-6, diff = 0;
    for (std::size_t i = 0; i < an.size(); ++i) {
      scale = std::max(scale, static_cast<double>(std::abs(an[i])));
      diff = std::max(diff, static_cast<double>(std::abs(got[i] - an[i])));
    }
    EXPECT_LE(diff, 1e-4 * scale) << "d" << name << " on the cpu backend";
  }
}

using X = Tensor<f32, Batch<dyn>, Seq<dyn>, Model<8>>;

TEST(Grad, LinearGeluLayerNorm) {
  Case c;
  std::mt19937 rng(7);
  auto x = input<X>(c.g, "x");
  auto l = linear_params<Model<8>, Hidden<6>>(c.g, "fc");
  auto ln = layer_norm_params<Hidden<6>>(c.g, "ln");
  output(layer_norm(gelu(linear(x, l)), ln), "y");
  c.feeds = {{"x", random_array({2, 3, 8}, rng)},
             {"fc.weight", random_array({6, 8}, rng)},
             {"fc.bias", random_array({6}, rng)},
             {"ln.weight", random_array({6}, rng, 0.5f, 1.5f)},
             {"ln.bias", random_array({6}, rng)}};
  c.wrt = {"x", "fc.weight", "fc.bias", "ln.weight", "ln.bias"};
  check(std::move(c));
}

TEST(Grad, AttentionWithCausalAndPaddingMasks) {
  Case c;
  std::mt19937 rng(8);
  using Q = Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<4>>;
  using K = Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<4>>;
  auto q = input<Q>(c.g, "q");
  auto k = input<K>(c.g, "k");
  auto v = input<K>(c.g, "v");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(c.g, "keep");
  auto s = masked(causal<Seq, Key>(scaled(contract<HeadDim>(q, k)), bottom_right), keep);
  output(contract<Key>(softmax<Key>(s), v), "y");
  NdArray m = NdArray::zeros(DType::boolean, {2, 5});
  for (std::size_t i = 0; i < 10; ++i) m.as<bool>()[i] = !(i >= 5 && i % 5 >= 3);  // sequence 1: 3 keys
  c.feeds = {{"q", random_array({2, 2, 4, 4}, rng)},
             {"k", random_array({2, 2, 5, 4}, rng)},
             {"v", random_array({2, 2, 5, 4}, rng)},
             {"keep", m}};
  c.wrt = {"q", "k", "v"};
  check(std::move(c));
}

TEST(Grad, ElementwiseExpressionsAndBroadcasting) {
  Case c;
  std::mt19937 rng(9);
  auto x = input<X>(c.g, "x");
  auto b = input<Tensor<f32, Model<8>>>(c.g, "b");
  auto cond = input<Tensor<boolean, Seq<dyn>, Model<8>>>(c.g, "cond");
  auto e = tanh(x * 0.5) * sigmoid(x + b) + pow(abs(x) + 1.0, 1.5) / 4.0 - exp(min(x, b)) + clamp(x, -0.5, 0.5);
  output(where(cond, e, sqrt(x * x + 1.0)), "y");
  NdArray m = NdArray::zeros(DType::boolean, {3, 8});
  for (std::size_t i = 0; i < 24; ++i) m.as<bool>()[i] = i % 3 != 0;
  c.feeds = {{"x", random_array({2, 3, 8}, rng)}, {"b", random_array({8}, rng)}, {"cond", m}};
  c.wrt = {"x", "b"};
  check(std::move(c));
}

TEST(Grad, RmsNormSwiGluAndRope) {
  Case c;
  std::mt19937 rng(10);
  auto x = input<X>(c.g, "x");
  auto pos = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(c.g, "pos");
  auto norm = rms_norm_params<Model<8>>(c.g, "norm", 1e-5);
  auto gate = linear_params<Model<8>, Hidden<6>>(c.g, "gate", false);
  auto up = linear_params<Model<8>, Hidden<6>>(c.g, "up", false);
  auto h = rms_norm(x, norm);
  auto mlp = mul(silu(linear(h, gate)), linear(h, up));
  auto heads = split<Hidden, Heads<2>, HeadDim<3>>(mlp);
  (void)heads;
  auto r = rope<HeadDim, Seq>(split<Model, Heads<2>, HeadDim<4>>(h), pos, RopeConfig{});
  output(add(merge<Heads, HeadDim, Model>(r), linear(mlp, linear_params<Hidden<6>, Model<8>>(c.g, "down", false))),
         "y");
  NdArray p = NdArray::zeros(DType::i64, {2, 3});
  for (std::size_t i = 0; i < 6; ++i) p.as<std::int64_t>()[i] = static_cast<std::int64_t>(i % 3 + 2 * (i / 3));
  c.feeds = {{"x", random_array({2, 3, 8}, rng)},
             {"pos", p},
             {"norm.weight", random_array({8}, rng, 0.5f, 1.5f)},
             {"gate.weight", random_array({6, 8}, rng)},
             {"up.weight", random_array({6, 8}, rng)},
             {"down.weight", random_array({8, 6}, rng)}};
  c.wrt = {"x", "norm.weight", "gate.weight", "up.weight", "down.weight"};
  check(std::move(c));
}

TEST(Grad, EmbeddingLogsumexpAndTiedHead) {
  Case c;
  std::mt19937 rng(11);
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(c.g, "ids");
  auto table = embedding_params<Vocab<7>, Model<8>>(c.g, "wte");
  auto logits = linear(embedding(table, ids), tied_linear(table));
  output(logsumexp<Vocab>(logits), "y");
  NdArray t = NdArray::zeros(DType::i64, {2, 3});
  for (std::size_t i = 0; i < 6; ++i) t.as<std::int64_t>()[i] = static_cast<std::int64_t>((i * 3) % 7);
  c.feeds = {{"ids", t}, {"wte.weight", random_array({7, 8}, rng)}};
  c.wrt = {"wte.weight"};
  check(std::move(c));
}

TEST(Grad, AnEmbeddingsGradientScattersDyIntoItsRowsWithoutAOneHot) {
  // A 50 000-row table: the gradient is one embedding_grad node (no [tokens, rows] one-hot, no
  // contraction over the tokens), row r the sum of dy's rows whose id is r — repeated ids, the
  // first and the last row — on the interpreter and the CPU backend, 1 and 4 threads bit for bit.
  Graph g;
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "ids");
  auto table = embedding_params<Vocab<50000>, Model<48>>(g, "wte");
  auto probe = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<48>>>(g, "probe");
  const auto dtable = grad(sum_all(mul(embedding(table, ids), probe)), table);
  g.mark_output(dtable.weight, "dtable");
  int scatters = 0;
  for (const Node& n : g.nodes()) {
    scatters += n.op == Op::embedding_grad;
    bool seq = false, vocab = false;
    for (const Axis& a : n.axes) {
      seq = seq || a.name == "Seq";
      vocab = vocab || a.name == "Vocab";
    }
    EXPECT_FALSE(seq && vocab) << op_name(n.op) << " holds [tokens, rows]";
  }
  EXPECT_EQ(scatters, 1);
  std::mt19937 rng(21);
  const std::vector<std::int64_t> id_values{7, 49999, 0, 7, 123, 7, 49999, 4000, 0, 31, 7, 2};
  NdArray t = NdArray::zeros(DType::i64, {2, 6});
  for (std::size_t i = 0; i < id_values.size(); ++i) t.as<std::int64_t>()[i] = id_values[i];
  const Feeds feeds{
      {"ids", t}, {"wte.weight", random_array({50000, 48}, rng)}, {"probe", random_array({2, 6, 48}, rng)}};
  std::vector<double> want(50000 * 48, 0.0);
  const auto p = feeds.at("probe").to_f32();
  for (std::size_t k = 0; k < id_values.size(); ++k)
    for (std::size_t f = 0; f < 48; ++f) want[static_cast<std::size_t>(id_values[k]) * 48 + f] += p[k * 48 + f];
  const auto ref = interpret(g, feeds).outputs.at("dtable").to_f32();
  const RunResult one = codegen::cpu::run(g, feeds, 1), four = codegen::cpu::run(g, feeds, 4);
  EXPECT_EQ(one.outputs.at("dtable"), four.outputs.at("dtable"));
  const auto cpu = one.outputs.at("dtable").to_f32();
  ASSERT_EQ(ref.size(), want.size());
  double worst_ref = 0, worst_cpu = 0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    worst_ref = std::max(worst_ref, std::abs(ref[i] - want[i]));
    worst_cpu = std::max(worst_cpu, std::abs(cpu[i] - want[i]));
  }
  EXPECT_LE(worst_ref, 1e-6);  // at most four f32 terms a row: within a few f32 roundings of the sum
  EXPECT_LE(worst_cpu, 1e-6);
  // An id outside the rows adds to none (the forward embedding rejects one; the node alone does not).
  Graph h;
  Node dy, hi, s;
  dy.op = hi.op = Op::input;
  dy.name = "dy";
  dy.axes = {Axis{"Tok", Extent::fixed(4)}, Axis{"F", Extent::fixed(3)}};
  hi.name = "ids";
  hi.dtype = DType::i64;
  hi.axes = {Axis{"Tok", Extent::fixed(4)}};
  s.op = Op::embedding_grad;
  s.inputs = {h.add(dy), h.add(hi)};
  s.axes = {Axis{"Row", Extent::fixed(2)}, Axis{"F", Extent::fixed(3)}};
  s.attr_axes = {"Row", "F"};
  h.mark_output(h.add(s), "d");
  NdArray hid = NdArray::zeros(DType::i64, {4});
  const std::int64_t hv[] = {1, -1, 2, 1};
  for (std::size_t i = 0; i < 4; ++i) hid.as<std::int64_t>()[i] = hv[i];
  const Feeds hf{{"dy", NdArray::from_f32({1, 2, 3, 10, 20, 30, 100, 200, 300, 4, 5, 6}, {4, 3})}, {"ids", hid}};
  const std::vector<float> hwant{0, 0, 0, 5, 7, 9};
  EXPECT_EQ(interpret(h, hf).outputs.at("d").to_f32(), hwant);
  EXPECT_EQ(codegen::cpu::run(h, hf, 2).outputs.at("d").to_f32(), hwant);
}

TEST(Grad, StructureOps) {
  Case c;
  std::mt19937 rng(12);
  auto x = input<Tensor<f32, Batch<2>, Seq<4>, Model<8>>>(c.g, "x");
  auto cls = input<Tensor<f32, Seq<1>, Model<8>>>(c.g, "cls");
  auto joined = prepend<Seq>(x, cls);    // [2, 5, 8]
  auto part = slice<Seq, 1, 3>(joined);  // [2, 3, 8]
  auto heads = permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<4>>(part));
  auto back = merge<Heads, HeadDim, Model>(permute<Batch, Seq, Heads, HeadDim>(heads));
  auto first = select<Seq, 0>(joined);  // [2, 8]
  output(add(rename<Model, Hidden>(back), rename<Model, Hidden>(broadcast_like(first, back))), "y");
  c.feeds = {{"x", random_array({2, 4, 8}, rng)}, {"cls", random_array({1, 8}, rng)}};
  c.wrt = {"x", "cls"};
  check(std::move(c));
}

TEST(Grad, TheGradientsOfPartsThatTileATensorAreOneConcat) {
  // x [.., 12] cut into [0, 4), [4, 10), [10, 12) (out of order, as a fused projection's q, k, v
  // are read): its gradient is the three parts' gradients side by side, one concat without
  // zeros; run-time parts (chunk of a dynamic axis) alike. w's slices [0, 4) and [6, 8) leave
  // gaps: each part's gradient between zeros, added.
  Case c;
  std::mt19937 rng(15);
  auto x = input<Tensor<f32, Batch<2>, Seq<3>, Model<12>>>(c.g, "x");
  auto w = input<Tensor<f32, Batch<2>, Seq<3>, Model<12>>>(c.g, "w");
  auto d = input<Tensor<f32, Batch<2>, Seq<3>, QkvProj<dyn>>>(c.g, "d");
  auto tail = slice<Model, 10, 2>(x);
  auto head = slice<Model, 0, 4>(x);
  auto middle = slice<Model, 4, 6>(x);
  auto [dq, dk, dv] = chunk<QkvProj, 3, QProj>(d);
  auto y4 = mul(head, slice<Model, 0, 4>(w));
  auto rest = add(add(sum<Model>(mul(middle, middle)), sum<Model>(mul(tail, slice<Model, 6, 2>(w)))),
                  sum<QProj>(add(mul(dq, dk), dv)));  // [Batch, Seq]
  output(add(y4, broadcast_like(rest, y4)), "y");
  c.feeds = {
      {"x", random_array({2, 3, 12}, rng)}, {"w", random_array({2, 3, 12}, rng)}, {"d", random_array({2, 3, 9}, rng)}};
  c.wrt = {"x", "w", "d"};

  Graph g = c.g;
  grad_detail::Builder b(g);
  const int loss = b.sum_over(g.outputs()[0].node, {"Batch", "Seq", "Model"});
  const std::size_t before = g.size();
  const std::vector<int> grads =
      append_gradients(g, loss, {node_named(g, "x"), node_named(g, "w"), node_named(g, "d")});
  // The concat each gradient is made of (through renames and permutes), and what it joins.
  auto concat_of = [&](int id) {
    while (g.node(id).op != Op::concat && g.node(id).inputs.size() == 1) id = g.node(id).inputs[0];
    return g.node(id);
  };
  for (int k : {0, 2}) {
    const Node joined = concat_of(grads[static_cast<std::size_t>(k)]);
    ASSERT_EQ(joined.op, Op::concat) << "gradient " << k;
    EXPECT_EQ(joined.inputs.size(), 3u);
    for (int in : joined.inputs) EXPECT_NE(g.node(in).op, Op::fill) << "gradient " << k << ": no zeros";
  }
  // w's gradient: its two parts, each between zeros (3 fills: [4, 12) after [0, 4); [0, 6) and
  // [8, 12) around [6, 8)), added.
  int zero_fills = 0;
  for (std::size_t i = before; i < g.size(); ++i)
    zero_fills += g.node(static_cast<int>(i)).op == Op::fill && g.node(static_cast<int>(i)).scalar == 0.0;
  EXPECT_EQ(zero_fills, 3);
  check(std::move(c));
}

TEST(Grad, TheLastPositionOfARunTimeLength) {
  // last<Seq> on a dynamic axis slices from Seq - 1, bound at run time: zeros before the row.
  Case c;
  std::mt19937 rng(14);
  auto x = input<Tensor<f32, Batch<2>, Seq<dyn>, Model<4>>>(c.g, "x");
  auto row = last<Seq>(x);  // [2, 1, 4]
  output(add(mul(row, row), row), "y");
  c.feeds = {{"x", random_array({2, 5, 4}, rng)}};
  c.wrt = {"x"};
  check(std::move(c));
}

TEST(Grad, ScoreModsAndTheirCapturedSlopes) {
  Case c;
  std::mt19937 rng(13);
  using Q = Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<4>>;
  auto q = input<Q>(c.g, "q");
  auto k = rename<Seq, Key>(input<Q>(c.g, "k"));
  auto slopes = input<Tensor<f32, Heads<2>>>(c.g, "slopes");
  auto s = scaled(contract<HeadDim>(q, k));
  s = decltype(s)(c.g, modded(s, mods::alibi(slopes, top_left)).id());
  s = decltype(s)(c.g, modded(s, mods::softcap(2.0)).id());
  s = decltype(s)(c.g, modded(s, mods::sliding_window(2, 0, top_left)).id());
  output(softmax<Key>(s), "y");
  c.feeds = {{"q", random_array({1, 2, 4, 4}, rng)},
             {"k", random_array({1, 2, 4, 4}, rng)},
             {"slopes", random_array({2}, rng, 0.1f, 1.0f)}};
  c.wrt = {"q", "k", "slopes"};
  check(std::move(c));
}

TEST(Grad, Gpt2BlockAllParameters) {
  Case c;
  std::mt19937 rng(14);
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<8>>>(c.g, "x");
  auto block = Gpt2Block<8>::make(c.g, "h.0.", Gpt2Config{.layers = 1, .heads = 2, .head_dim = 4});
  output(block(x), "y");
  c.feeds["x"] = random_array({1, 3, 8}, rng);
  for (const auto& n : c.g.nodes())
    if (n.op == Op::param) {
      std::vector<std::int64_t> shape;
      for (const auto& a : n.axes) {
        const std::map<std::string, std::int64_t> sizes{{"QkvProj", 24}, {"QProj", 8}, {"Hidden", 16}};
        shape.push_back(a.extent.is_static() ? a.extent.value : sizes.at(a.extent.symbol));
      }
      c.feeds[n.name] = random_array(shape, rng, -0.5f, 0.5f);
      c.wrt.push_back(n.name);
    }
  c.wrt.push_back("x");
  check(std::move(c), 6);  // 14 tensors: 6 entries each by finite differences, all on the cpu
}

TEST(Grad, TheCpuBackwardIsTheSameOnOneThreadAndOnFour) {
  // Deterministic by construction: every entry of every gradient is summed in one order whatever
  // the thread count (bit for bit). The typed API: parameter groups differentiate as groups.
  Graph g;
  std::mt19937 rng(15);
  auto x = input<X>(g, "x");
  auto fc = linear_params<Model<8>, Hidden<16>>(g, "fc");
  auto ln = layer_norm_params<Hidden<16>>(g, "ln");
  auto y = layer_norm(gelu(linear(x, fc)), ln);
  auto [dx, dfc, dln] = grad(mean_all(mul(y, y)), x, fc, ln);
  static_assert(std::is_same_v<decltype(dfc), decltype(fc)> && std::is_same_v<decltype(dln), decltype(ln)>);
  output(dx, "dx");
  g.mark_output(dfc.weight, "dfc.weight");
  g.mark_output(dln.gamma, "dln.weight");
  // 4 × 33 rows: every loop on one thread; 32 × 1024 rows: the element-wise, row-wise and
  // contraction loops split into tasks (past kParallelMinFlops), run on one thread and on four.
  for (const std::int64_t batch : {4, 32}) {
    const std::int64_t seq = batch == 4 ? 33 : 1024;
    const Feeds feeds{{"x", random_array({batch, seq, 8}, rng)},
                      {"fc.weight", random_array({16, 8}, rng)},
                      {"fc.bias", random_array({16}, rng)},
                      {"ln.weight", random_array({16}, rng)},
                      {"ln.bias", random_array({16}, rng)}};
    const RunResult one = codegen::cpu::run(g, feeds, 1), four = codegen::cpu::run(g, feeds, 4);
    for (const char* name : {"dx", "dfc.weight", "dln.weight"})
      EXPECT_EQ(one.outputs.at(name), four.outputs.at(name)) << name << " at batch " << batch;
    // and they are the interpreter's
    const RunResult ref = interpret(g, feeds);
    for (const char* name : {"dx", "dfc.weight", "dln.weight"}) {
      const auto a = ref.outputs.at(name).to_f32(), c = one.outputs.at(name).to_f32();
      double worst = 0;
      for (std::size_t i = 0; i < a.size(); ++i)
        worst = std::max(worst, std::abs(static_cast<double>(a[i]) - c[i]) / (1 + std::abs(a[i])));
      EXPECT_LE(worst, 1e-5) << name << " at batch " << batch;
    }
  }
}

TEST(Grad, ErrorsNameTheNode) {
  Graph g;
  auto x = input<X>(g, "x");
  auto y = linear(x, linear_params<Model<8>, Hidden<6>>(g, "fc"));
  EXPECT_THROW(append_gradients(g, y.id(), {x.id()}), GradError);  // not a scalar
  auto ids = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(g, "ids");
  try {
    append_gradients(g, sum_all(y).id(), {ids.id()});
    ADD_FAILURE() << "a gradient by integers";
  } catch (const GradError& e) {
    EXPECT_NE(std::string(e.what()).find("integers and masks have no gradient"), std::string::npos) << e.what();
  }
  // d loss / d something the loss does not depend on: zeros of its shape.
  auto other = input<X>(g, "other");
  const auto d = append_gradients(g, sum_all(y).id(), {other.id()});
  EXPECT_EQ(g.node(d[0]).op, Op::fill);
}

}  // namespace
}  // namespace qkv::nn
