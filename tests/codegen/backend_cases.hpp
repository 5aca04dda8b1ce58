// Graphs that every CPU execution path is checked on against the reference interpreter — the
// in-process executor (test_pipeline.cpp) and the AOT-compiled function (test_aot.cpp) — with
// their seeded inputs. Each has outputs "out" and, where it says, "weights".
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <qkv/qkv.hpp>
#include <qkv/runtime/random_feeds.hpp>

namespace qkv::nn::cases {

/// max |a − b| / max(1, |b|) over two arrays of one shape (any float dtypes); NaN counts as inf.
inline double max_error(const NdArray& a, const NdArray& b) {
  EXPECT_EQ(a.shape, b.shape);
  const auto av = a.to_f32(), bv = b.to_f32();
  double err = 0;
  for (std::size_t i = 0; i < bv.size(); ++i) {
    const double e = std::abs(static_cast<double>(av[i]) - bv[i]) / std::max(1.0, std::abs(static_cast<double>(bv[i])));
    err = std::isnan(e) ? std::numeric_limits<double>::infinity() : std::max(err, e);
  }
  return err;
}

struct GraphCase {
  Graph graph;
  Feeds feeds;
};

/// nn.MultiheadAttention(64, 4) with a key-padding mask (sequence b keeps its first
/// lengths[b] of 33 keys) and the weights: batch 3, 33 tokens.
inline GraphCase mha_with_padding_and_weights(const std::vector<std::int64_t>& lengths) {
  GraphCase c;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(c.graph, "x");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(c.graph, "keep");
  auto [out, w] = MultiHeadAttention<64, 4>::make(c.graph)(x, keep);
  output(out, "out");
  output(w, "weights");
  c.feeds = random_feeds(c.graph, {{"Batch", 3}, {"Seq", 33}, {"Key", 33}}, 5, 0.5f);
  c.feeds["keep"] = keep_first(lengths, 33);
  return c;
}

/// Causal attention aligned bottom-right, 7 queries over 19 keys, d_v (48) wider than d_k (32);
/// with the weights.
inline GraphCase causal_bottom_right_on_unequal_lengths() {
  GraphCase c;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<32>>>(c.graph, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<32>>>(c.graph, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, ValueDim<48>>>(c.graph, "v");
  auto [out, w] = attention(q, k, v, causal_bottom_right);
  output(out, "out");
  output(w, "weights");
  c.feeds = random_feeds(c.graph, {{"Batch", 2}, {"Seq", 7}, {"Key", 19}}, 6);
  return c;
}

/// Grouped-query attention, 8 query heads over 2 key/value heads, causal.
inline GraphCase grouped_query_causal() {
  GraphCase c;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<64>>>(c.graph, "x");
  output(GroupedQueryAttention<64, 8, 2>::make(c.graph)(x, causal_mask).first, "out");
  c.feeds = random_feeds(c.graph, {{"Batch", 2}, {"Seq", 17}}, 7, 0.5f);
  return c;
}

/// Attention with dropout 0.3 (seed 99) on the weights; the dropped weights are an output.
inline GraphCase dropout_with_weights() {
  GraphCase c;
  auto q = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, HeadDim<16>>>(c.graph, "q");
  auto k = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<16>>>(c.graph, "k");
  auto v = input<Tensor<f32, Batch<dyn>, Heads<2>, Key<dyn>, HeadDim<16>>>(c.graph, "v");
  auto p = dropout(softmax<Key>(scaled(contract<HeadDim>(q, k))), 0.3, 99);
  output(contract<Key>(p, v), "out");
  output(p, "weights");
  c.feeds = random_feeds(c.graph, {{"Batch", 2}, {"Seq", 9}, {"Key", 9}}, 8);
  return c;
}

/// A pre-norm GELU encoder layer, then cross-attention to a memory with kdim 20, vdim 12.
inline GraphCase encoder_layer_then_cross_attention() {
  GraphCase c;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<32>>>(c.graph, "x");
  auto key = input<Tensor<f32, Batch<dyn>, Mem<dyn>, Hidden<20>>>(c.graph, "key");
  auto value = input<Tensor<f32, Batch<dyn>, Mem<dyn>, ValueDim<12>>>(c.graph, "value");
  auto enc = EncoderLayer<32, 4, 64, Activation::gelu>::make(c.graph, "enc.", NormPlacement::pre);
  auto cross = CrossAttention<32, 4, 20, 12>::make(c.graph, "cross.");
  output(cross(enc(x), key, value).first, "out");
  c.feeds = random_feeds(c.graph, {{"Batch", 2}, {"Seq", 6}, {"Mem", 11}}, 9, 0.5f);
  return c;
}

/// Multi-head attention with a bias per (batch, head): a mask the fused kernel cannot take, so
/// the chain stays unfused.
inline GraphCase mha_with_per_head_bias() {
  GraphCase c;
  auto x = input<Tensor<f32, Batch<dyn>, Seq<dyn>, Model<16>>>(c.graph, "x");
  auto bias = input<Tensor<f32, Batch<dyn>, Heads<2>, Seq<dyn>, Key<dyn>>>(c.graph, "bias");
  output(MultiHeadAttention<16, 2>::make(c.graph)(x, bias).first, "out");
  c.feeds = random_feeds(c.graph, {{"Batch", 2}, {"Seq", 5}, {"Key", 5}}, 3);
  return c;
}

QKV_AXIS(RelPos);  // relative positions j - i' + S - 1 of a learned bias table

/// Every built-in mod and three hand-written ones in one attention (GQA Hq / Hkv, head width D,
/// both alignments): softcap, ALiBi over [KvHeads, Group], a learned relative bias, two
/// hand-written score terms, ((a sliding window and documents) or a prefix) and a hand-written
/// mask, then key padding; the outputs and the rows' log-sum-exp. Documents of 13 queries / 11
/// keys (ids increase along the sequence), prefix 5.
template <std::int64_t H, std::int64_t Hkv, std::int64_t D>
GraphCase mods(std::int64_t batch, std::int64_t l, std::int64_t s, bool bottom_right) {
  constexpr std::int64_t G = H / Hkv;
  GraphCase c;
  Graph& g = c.graph;
  auto q = input<Tensor<f32, Batch<dyn>, KvHeads<Hkv>, Group<G>, Seq<dyn>, HeadDim<D>>>(g, "q");
  auto k = input<Tensor<f32, Batch<dyn>, KvHeads<Hkv>, Key<dyn>, HeadDim<D>>>(g, "k");
  auto v = input<Tensor<f32, Batch<dyn>, KvHeads<Hkv>, Key<dyn>, HeadDim<D>>>(g, "v");
  auto slopes = input<Tensor<f32, KvHeads<Hkv>, Group<G>>>(g, "slopes");
  auto table = input<Tensor<f32, KvHeads<Hkv>, Group<G>, RelPos<dyn>>>(g, "table");
  auto q_doc = input<Tensor<f32, Batch<dyn>, Seq<dyn>>>(g, "q_doc");
  auto kv_doc = input<Tensor<f32, Batch<dyn>, Key<dyn>>>(g, "kv_doc");
  auto keep = input<KeyPaddingMask<Batch<dyn>, Key<dyn>>>(g, "keep");
  auto scores = scaled(contract<HeadDim>(q, k));
  auto build = [&](auto align) {
    // Three hand-written mods: a score term of the positions, one of the score itself (with a
    // load from a captured tensor), and a mask that drops one diagonal.
    auto hand = score_mod([](auto x, auto, auto, auto qi, auto ki) { return x + 0.01 * min(qi, ki); }, align);
    auto hand_score = score_mod([&](auto x, auto b, auto, auto qi, auto) {
      return where(x > 0.5, x - 0.25 * log(1.0 + x), x) + 0.1 * tanh(q_doc[b][qi] - 1.0);
    });
    auto hand_mask = mask_mod([](auto, auto, auto qi, auto ki) { return ki != qi + 1; }, align);
    auto m = modded(
        scores, mods::softcap(2.0), mods::alibi(slopes, align), mods::relative_bias(table, align), hand, hand_score,
        ((mods::sliding_window(9, 3, align) && mods::document_mask(q_doc, kv_doc)) || mods::prefix_lm(5, align)) &&
            hand_mask);
    auto visible = masked(m, keep);
    output(contract<Key>(softmax<Key>(visible), v), "out");
    output(logsumexp<Key>(visible), "lse");
  };
  if (bottom_right)
    build(bottom_right_t{});
  else
    build(top_left_t{});
  c.feeds = random_feeds(g, {{"Batch", batch}, {"Seq", l}, {"Key", s}, {"RelPos", 2 * s - 1}}, 21, 0.5f);
  std::vector<float> qd, kd;
  for (std::int64_t b = 0; b < batch; ++b) {
    for (std::int64_t i = 0; i < l; ++i) qd.push_back(static_cast<float>(i / 13));
    for (std::int64_t j = 0; j < s; ++j) kd.push_back(static_cast<float>(j / 11));
  }
  c.feeds["q_doc"] = NdArray::from_f32(qd, {batch, l});
  c.feeds["kv_doc"] = NdArray::from_f32(kd, {batch, s});
  return c;
}

/// Integer ids [batch, len] in [0, n) (seeded), or positions start + i, as i64 feeds.
inline NdArray int_feed(std::int64_t batch, std::int64_t len, std::int64_t n, std::uint64_t seed,
                        std::int64_t start = -1) {
  NdArray a = NdArray::zeros(DType::i64, {batch, len});
  auto v = a.as<std::int64_t>();
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (std::size_t i = 0; i < v.size(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = start >= 0 ? start + static_cast<std::int64_t>(i % static_cast<std::size_t>(len))
                      : static_cast<std::int64_t>(x % static_cast<std::uint64_t>(n));
  }
  return a;
}

/// A tiny Llama (qkv::nn::CausalLm): 2 layers, d_model 32, GQA 4/2 with head width 8, q/k/v/o
/// biases, Llama 3 RoPE scaling, a sliding window of 4 keys on layer 1, untied lm_head over 50
/// ids; batch 2 of 9 tokens at positions 3 .. 11 (as after a prompt of 3).
inline LlamaConfig tiny_llama_config() {
  LlamaConfig cfg;
  cfg.layers = 2;
  cfg.rms_norm_eps = 1e-5;
  cfg.attention = {.heads = 4,
                   .kv_heads = 2,
                   .head_dim = 8,
                   .rope = {.theta = 10000.0, .llama3 = Llama3RopeScaling{8.0, 1.0, 4.0, 16.0}},
                   .qkv_bias = true,
                   .o_bias = true,
                   .sliding_window = 4};
  cfg.windowed = {false, true};
  return cfg;
}

/// tiny_llama_config's model as one step against a KV cache (CausalLm::cached): inputs tokens,
/// positions, past_length, cache_k.{i} / cache_v.{i}; outputs logits, present_k.{i} / present_v.{i}.
inline Graph tiny_llama_step() {
  Graph g;
  declare_cached_step(g, CausalLm<32>::make(g, tiny_llama_config()));
  return g;
}

inline GraphCase tiny_llama() {
  GraphCase c;
  const auto model = CausalLm<32>::make(c.graph, tiny_llama_config());
  auto tokens = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(c.graph, "tokens");
  auto positions = input<Tensor<i64, Batch<dyn>, Seq<dyn>>>(c.graph, "positions");
  auto logits = model(tokens, positions);
  output(logits, "out");
  output(argmax<Vocab>(logits), "next");
  c.feeds = random_feeds(
      c.graph, {{"Batch", 2}, {"Seq", 9}, {"Vocab", 50}, {"Hidden", 64}, {"QProj", 32}, {"KvProj", 16}}, 12, 0.5f);
  c.feeds["tokens"] = int_feed(2, 9, 50, 12);
  c.feeds["positions"] = int_feed(2, 9, 0, 0, 3);
  return c;
}

}  // namespace qkv::nn::cases
