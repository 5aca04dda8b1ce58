// qkv/nn/transformer.hpp — torch.nn.TransformerEncoderLayer and TransformerDecoderLayer
// (batch_first=True, eval mode) in both arrangements, and a causal decoder block (GPT-style:
// pre-norm with a causal mask).
//
//   encoder, post-norm (norm_first=False):  x = norm1(x + sa(x));   x = norm2(x + ff(x))
//   encoder, pre-norm  (norm_first=True):   x = x + sa(norm1(x));   x = x + ff(norm2(x))
//   decoder, post-norm:  x = norm1(x + sa(x));  x = norm2(x + mha(x, memory));  x = norm3(x + ff(x))
//   decoder, pre-norm:   x = x + sa(norm1(x));  x = x + mha(norm2(x), memory);  x = x + ff(norm3(x))
//   ff(x) = linear2(activation(linear1(x)))
//
// Parameter names follow PyTorch: self_attn.*, multihead_attn.*, linear1.*, linear2.*, norm1.*,
// norm2.*, norm3.*.
#pragma once

#include <tuple>

#include <qkv/nn/attention.hpp>

namespace qkv::nn {

enum class Activation { relu, gelu };
enum class NormPlacement { post, pre };

template <auto E, auto H, auto F, Activation Act = Activation::relu>
struct EncoderLayer {
  MultiHeadAttention<E, H> self_attn;
  Linear<Model<E>, Hidden<F>> linear1;
  Linear<Hidden<F>, Model<E>> linear2;
  LayerNorm<Model<E>> norm1, norm2;
  NormPlacement placement = NormPlacement::post;

  static EncoderLayer make(Graph& g, const std::string& prefix = "", NormPlacement placement = NormPlacement::post,
                           double eps = 1e-5, std::int64_t num_heads = 0) {
    return {MultiHeadAttention<E, H>::make(g, prefix + "self_attn.", true, num_heads),
            linear_params<Model<E>, Hidden<F>>(g, prefix + "linear1"),
            linear_params<Hidden<F>, Model<E>>(g, prefix + "linear2"),
            layer_norm_params<Model<E>>(g, prefix + "norm1", eps),
            layer_norm_params<Model<E>>(g, prefix + "norm2", eps),
            placement};
  }

  template <class X>
  auto feed_forward(const X& x) const {
    auto h = linear(x, linear1);
    if constexpr (Act == Activation::relu)
      return linear(relu(h), linear2);
    else
      return linear(gelu(h), linear2);
  }

  /// x [Batch, Seq, Model] -> [Batch, Seq, Model]; masks as for attention().
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    if constexpr (any_poison<X>) {
      return poison{};
    } else {
      using Out = tensor<typename X::dtype, typename X::axis_list, trait::plain>;
      if (placement == NormPlacement::pre) {
        auto a = add(x, self_attn(layer_norm(x, norm1), masks...).first);
        return Out(add(a, feed_forward(layer_norm(a, norm2))));
      }
      auto a = layer_norm(add(x, self_attn(x, masks...).first), norm1);
      return Out(layer_norm(add(a, feed_forward(a)), norm2));
    }
  }
};

/// torch.nn.TransformerDecoderLayer: target x [Batch, Seq, Model] attends to itself (the
/// self-attention's masks: `causal_mask` as PyTorch's tgt_mask / tgt_is_causal, a
/// KeyPaddingMask<Batch, Key> as tgt_key_padding_mask, ...) and to the memory [Batch, Mem,
/// Model] (the cross-attention's masks, e.g. memory_key_padding_mask as a KeyPaddingMask<Batch,
/// Key> over the memory's positions). The memory's length has its own axis, so a source and a
/// target of different lengths never bind one size.
///
///   layer(x, memory)                                                // no masks
///   layer(x, memory, std::tuple{causal_mask}, std::tuple{mem_kpm})  // self masks, memory masks
template <auto E, auto H, auto F, Activation Act = Activation::relu>
struct DecoderLayer {
  EncoderLayer<E, H, F, Act> core;  // self_attn, linear1/2, norm1/2 and the placement
  MultiHeadAttention<E, H> multihead_attn;
  LayerNorm<Model<E>> norm3;

  static DecoderLayer make(Graph& g, const std::string& prefix = "", NormPlacement placement = NormPlacement::post,
                           double eps = 1e-5, std::int64_t num_heads = 0) {
    return {EncoderLayer<E, H, F, Act>::make(g, prefix, placement, eps, num_heads),
            MultiHeadAttention<E, H>::make(g, prefix + "multihead_attn.", true, num_heads),
            layer_norm_params<Model<E>>(g, prefix + "norm3", eps)};
  }

  template <class X, class Mm>
  auto operator()(const X& x, const Mm& memory) const {
    return (*this)(x, memory, std::tuple<>{}, std::tuple<>{});
  }

  template <class X, class Mm, class... S, class... C>
  auto operator()(const X& x, const Mm& memory, const std::tuple<S...>& self_masks,
                  const std::tuple<C...>& memory_masks) const {
    if constexpr (any_poison<X, Mm>) {
      return poison{};
    } else {
      using Out = tensor<typename X::dtype, typename X::axis_list, trait::plain>;
      auto sa = [&](const auto& y) {
        return std::apply([&](const auto&... m) { return core.self_attn(y, m...).first; }, self_masks);
      };
      auto mha = [&](const auto& y) {
        return std::apply([&](const auto&... m) { return multihead_attn.cross(y, memory, m...).first; }, memory_masks);
      };
      if (core.placement == NormPlacement::pre) {
        auto a = Out(add(x, sa(layer_norm(x, core.norm1))));
        auto b = Out(add(a, mha(layer_norm(a, core.norm2))));
        return Out(add(b, core.feed_forward(layer_norm(b, norm3))));
      }
      auto a = Out(layer_norm(add(x, sa(x)), core.norm1));
      auto b = Out(layer_norm(add(a, mha(a)), core.norm2));
      return Out(layer_norm(add(b, core.feed_forward(b)), norm3));
    }
  }
};

/// A GPT-style block: pre-norm encoder layer with a causal mask (plus any padding mask).
template <auto E, auto H, auto F, Activation Act = Activation::gelu>
struct CausalDecoderBlock {
  EncoderLayer<E, H, F, Act> layer;

  static CausalDecoderBlock make(Graph& g, const std::string& prefix = "", double eps = 1e-5,
                                 std::int64_t num_heads = 0) {
    return {EncoderLayer<E, H, F, Act>::make(g, prefix, NormPlacement::pre, eps, num_heads)};
  }
  template <class X, class... M>
  auto operator()(const X& x, const M&... masks) const {
    return layer(x, causal_mask, masks...);
  }
};

}  // namespace qkv::nn
