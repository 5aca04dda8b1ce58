// qkv/ir/grad_rules.hpp — the one table of which ops reverse mode differentiates (kGradRules): one
// row per op of the op table, in its order (a static check keeps the two the same), each saying
// whether the op has a rule in grad.hpp's sweep, has none by nature (integers, masks: nothing
// flows), or is not differentiated (yet) and why — a GradError naming the op, never a silent zero.
//
// Plain data: the DSL, the runtime and tests include it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <qkv/ir/ops.hpp>

namespace qkv {

enum class GradRule : std::uint8_t {
  yes,      // a rule below
  leaf,     // an input, parameter or constant: where gradients arrive
  none,     // nothing to differentiate by nature (its output is an integer or mask)
  missing,  // differentiable, not done yet: a GradError saying `why`
};
struct GradRuleInfo {
  Op op;
  GradRule rule;
  std::string_view why = {};
};

inline constexpr std::array<GradRuleInfo, kOps.size()> kGradRules{{
    {Op::input, GradRule::leaf},
    {Op::param, GradRule::leaf},
    {Op::contract, GradRule::yes},
    {Op::add, GradRule::yes},
    {Op::mul, GradRule::yes},
    {Op::scale, GradRule::yes},
    {Op::split, GradRule::yes},
    {Op::merge, GradRule::yes},
    {Op::permute, GradRule::yes},
    {Op::rename, GradRule::yes},
    {Op::view, GradRule::yes},
    {Op::softmax, GradRule::yes},
    {Op::keep_mask, GradRule::yes},
    {Op::bias, GradRule::yes},
    {Op::causal, GradRule::yes},
    {Op::dropout, GradRule::yes},
    {Op::concat, GradRule::yes},
    {Op::layer_norm, GradRule::yes},
    {Op::relu, GradRule::yes},
    {Op::gelu, GradRule::yes},
    {Op::linear, GradRule::yes},
    {Op::broadcast, GradRule::yes},
    {Op::fill, GradRule::leaf},
    {Op::fused_attention, GradRule::yes},
    {Op::attention_weights, GradRule::missing, "made by the pass pipeline, after gradients"},
    {Op::slice, GradRule::yes},
    {Op::score_mod, GradRule::yes},
    {Op::logsumexp, GradRule::yes},
    {Op::attention_lse, GradRule::missing, "made by the pass pipeline, after gradients"},
    {Op::rms_norm, GradRule::yes},
    {Op::silu, GradRule::yes},
    {Op::rope, GradRule::yes},
    {Op::embedding, GradRule::yes},
    {Op::argmax, GradRule::none},
    {Op::update_slice, GradRule::missing, "a KV cache's write: decoding, not training"},
    {Op::convert, GradRule::yes},
    {Op::pointwise, GradRule::yes},
    {Op::fused_attention_backward, GradRule::missing, "a backward node: no second derivatives"},
    {Op::attention_dk, GradRule::missing, "a backward node: no second derivatives"},
    {Op::attention_dv, GradRule::missing, "a backward node: no second derivatives"},
    {Op::dequantize, GradRule::missing, "a quantized weight is for inference: train its float weight"},
    {Op::attention_dtensor, GradRule::missing, "a backward node: no second derivatives"},
    {Op::embedding_grad, GradRule::missing, "a backward node: no second derivatives"},
}};

static_assert(
    [] {
      for (std::size_t k = 0; k < kGradRules.size(); ++k)
        if (static_cast<std::size_t>(kGradRules[k].op) != k) return false;
      return true;
    }(),
    "kGradRules must list every op of kOps, in the enum's order");

}  // namespace qkv
