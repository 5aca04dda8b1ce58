// qkv/dsl/train.hpp — losses for training, typed: cross_entropy<Classes>(logits, targets).
//
//   auto loss = cross_entropy<Vocab>(logits, targets);               // a scalar, PyTorch's mean
//   TrainingStep s = append_training_step(g, loss.id(), AdamW{.weight_decay = 0.1});  // lr: an input
//
// The optimizer step (qkv/ir/train.hpp) appends the gradients and the update of every parameter
// the loss depends on; its inputs and outputs are named (TrainingStep).
#pragma once

#include <qkv/dsl/grad.hpp>
#include <qkv/dsl/ops_pointwise.hpp>
#include <qkv/ir/train.hpp>

namespace qkv {

/// torch.nn.functional.cross_entropy(logits, targets, ignore_index, label_smoothing) with
/// reduction 'mean': logits [..., Classes] (float), targets [...] (integers: the logits' other
/// axes, by name); a scalar.
template <template <auto> class Classes, TensorOrPoison T, TensorOrPoison Y>
auto cross_entropy(const T& logits, const Y& targets, const CrossEntropyOptions& o = {}) {
  if constexpr (any_poison<T, Y>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    if constexpr (!has_family<L, Classes>) {
      return missing_axis<"cross_entropy", L, Classes>();
    } else if constexpr (!detail::is_float_dtype<typename T::dtype>) {
      return detail::not_float_error<"cross_entropy", T>();
    } else if constexpr (!std::is_same_v<typename Y::dtype, i64> && !std::is_same_v<typename Y::dtype, i32>) {
      return fail<fixed_string("cross_entropy: the targets ") + axes_fs<typename Y::axis_list>() + " are " +
                  Y::dtype::name + ", not class indices; fix: integer targets (i32 or i64)">();
    } else if constexpr (!detail::same_names<without<L, axes<find_family<L, Classes>>>, typename Y::axis_list>) {
      return fail<fixed_string("cross_entropy: the targets ") + axes_fs<typename Y::axis_list>() +
                  " must have the logits' axes but `" + find_family<L, Classes>::name_fs + "`, " +
                  axes_fs<without<L, axes<find_family<L, Classes>>>>() + "; fix: one class index per row of logits">();
    } else {
      Graph& g = logits.graph();
      const int id = append_cross_entropy(g, logits.id(), targets.id(), std::string(find_family<L, Classes>::name), o);
      return tensor<typename T::dtype, axes<>, trait::plain>(g, id);
    }
  }
}

}  // namespace qkv
