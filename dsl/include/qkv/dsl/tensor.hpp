// qkv/dsl/tensor.hpp — tensors typed by dtype and named axes, and the graph they record into.
//
//   Graph g;
//   auto x = input<Tensor<f32, Batch<>, Seq<>, Model<16>>>(g, "x");
//
// A tensor is a handle (graph, node id); its type carries the axes and a *trait* that records
// what the value means where that matters for a check: raw Q·Kᵀ scores (not yet scaled),
// softmax weights (normalised over which axis), or a mask (which kind); see traits.hpp.
#pragma once

#include <array>
#include <string>
#include <type_traits>
#include <utility>

#include <qkv/dsl/axis.hpp>
#include <qkv/dsl/diagnose.hpp>
#include <qkv/dsl/traits.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv {

// --- dtypes (type parameters, so bf16/f16 can follow f32) -----------------------------------
struct f32 {
  static constexpr DType value = DType::f32;
  static constexpr auto name = fixed_string("f32");
};
struct f16 {
  static constexpr DType value = DType::f16;
  static constexpr auto name = fixed_string("f16");
};
struct bf16 {
  static constexpr DType value = DType::bf16;
  static constexpr auto name = fixed_string("bf16");
};
struct boolean {
  static constexpr DType value = DType::boolean;
  static constexpr auto name = fixed_string("bool");
};
/// Integer tensors (document ids, prefix lengths): read by score and mask mods (score_mod.hpp).
struct i32 {
  static constexpr DType value = DType::i32;
  static constexpr auto name = fixed_string("i32");
};
struct i64 {
  static constexpr DType value = DType::i64;
  static constexpr auto name = fixed_string("i64");
};

template <class DT, class L, class Trait = trait::plain>
class tensor;

template <class T>
struct is_tensor_impl : std::false_type {};
template <class DT, class L, class Tr>
struct is_tensor_impl<tensor<DT, L, Tr>> : std::true_type {};
template <class T>
concept TensorType = is_tensor_impl<std::remove_cvref_t<T>>::value;

/// What an op accepts as an operand: a tensor, or the poison left by an earlier mistake.
template <class T>
concept TensorOrPoison = TensorType<T> || is_poison<T>;

/// A keep-mask tensor (KeepMask, KeyPaddingMask, AttnMask); false for anything else.
template <class T>
inline constexpr bool is_keep_mask = false;
template <class DT, class L, MaskKind K>
inline constexpr bool is_keep_mask<tensor<DT, L, trait::mask<K>>> = true;
template <class T>
  requires(!std::is_same_v<T, std::remove_cvref_t<T>>)
inline constexpr bool is_keep_mask<T> = is_keep_mask<std::remove_cvref_t<T>>;

template <MaskKind K>
constexpr auto mask_kind_fs() {
  if constexpr (K == MaskKind::key_padding)
    return fixed_string("a key-padding mask");
  else if constexpr (K == MaskKind::attention)
    return fixed_string("an attention (query x key) mask");
  else
    return fixed_string("a keep-mask");
}

/// "<op>: x [...] has no axis `F`; fix: <op> an axis the tensor has" — the first check of every
/// op that addresses one axis of one operand.
template <fixed_string Op, class L, template <auto> class F>
constexpr auto missing_axis() {
  return fail<Op + ": x " + axes_fs<L>() + " has no axis `" + family_name_fs<F> + "`; fix: " + Op +
              " an axis the tensor has">();
}

/// "permute<Batch, Seq, Model>(x)" — the fix that puts a tensor into the order L.
template <class L>
constexpr auto permute_fix() {
  return fixed_string("permute<") + names_fs<L>() + ">(x)";
}

namespace detail {
/// The first position at which two axis lists differ in name; the shorter length if one is
/// the start of the other (then, with equal lengths, the lists have the same names).
template <class L1, class L2>
constexpr std::size_t first_name_difference() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    constexpr bool differ[] = {!same_name<axis_at<L1, I>, axis_at<L2, I>>..., true};
    std::size_t i = 0;
    while (!differ[i]) ++i;
    return i;
  }(std::make_index_sequence<(L1::size < L2::size ? L1::size : L2::size)>{});
}

template <class L1, class L2>
inline constexpr bool same_names = L1::size == L2::size && first_name_difference<L1, L2>() == L1::size;

/// The first position whose static extents differ (size if none).
template <class L1, class L2>
constexpr std::size_t first_extent_difference() {
  return [&]<std::size_t... I>(std::index_sequence<I...>) {
    constexpr bool differ[] = {
        (axis_at<L1, I>::is_static && axis_at<L2, I>::is_static && axis_at<L1, I>::extent != axis_at<L2, I>::extent)...,
        true};
    std::size_t i = 0;
    while (!differ[i]) ++i;
    return i;
  }(std::make_index_sequence<L1::size>{});
}
}  // namespace detail

namespace detail {
/// The message of a deferred check: what the captureless callable Text builds from the two
/// sizes, with "{a}" and "{b}" standing for them — evaluated by the compiler, so a check that
/// passes costs no code for its text (docs/performance.md, "Compile time").
template <class Text>
inline constexpr auto deferred_text = Text{}(fixed_string("{a}"), fixed_string("{b}"));

/// The run-time half of defer_equal, one copy per program rather than one per check.
[[gnu::noinline]] inline void require_equal(Graph& g, const Extent& a, const Extent& b, std::string_view message) {
  if (a.is_static() && b.is_static()) return;
  if (a == b) return;
  g.require(Constraint{Constraint::Kind::equal, a, b, std::string(message)});
}
}  // namespace detail

/// Records that two extents must agree at bind time when either is dynamic. `Text` (a
/// captureless lambda) builds the message from the two sizes (as "{a}"/"{b}" placeholders here,
/// as numbers at compile time).
template <class Text>
void defer_equal(Graph& g, const Extent& a, const Extent& b, Text /*text*/) {
  detail::require_equal(g, a, b, detail::deferred_text<Text>.view());
}

namespace detail {
/// t[i]: one index of a load inside a score or mask mod (defined in score_mod.hpp).
template <class T, class I>
auto mod_subscript(const T& t, const I& i);
}  // namespace detail

inline const Axis& ir_axis(const Node& n, std::string_view name) {
  for (const auto& a : n.axes)
    if (a.name == name) return a;
  internal_error("node has no axis '" + std::string(name) + "'");
}

template <class DT, class... A, class Trait>
class tensor<DT, axes<A...>, Trait> {
 public:
  using dtype = DT;
  using axis_list = axes<A...>;
  using trait_type = Trait;
  static constexpr std::size_t rank = sizeof...(A);

  tensor(Graph& g, int id) : graph_(&g), id_(id) {}

  /// Conversion to a declared type: the axes must be the same names in the same order (this is
  /// where a batch_first mix-up or the wrong transpose surfaces), static extents must agree
  /// (dynamic ones are checked at bind time), and the meaning may only be forgotten (any
  /// tensor converts to a plain one; a mask only to a mask of its own kind; see forgets_only).
  template <class DT2, class L2, class Trait2>
    requires(!std::is_same_v<tensor<DT2, L2, Trait2>, tensor>)
  tensor(const tensor<DT2, L2, Trait2>& other)  // NOLINT(google-explicit-constructor)
      : graph_(&other.graph()), id_(other.id()) {
    using Src = L2;
    using Dst = axis_list;
    if constexpr (is_mask_trait<Trait>::value && is_mask_trait<Trait2>::value && !std::is_same_v<Trait, Trait2>) {
      fail<fixed_string("convert: ") + mask_kind_fs<Trait2::kind>() + " " + axes_fs<Src>() + " was passed where " +
           mask_kind_fs<Trait::kind>() + " " + axes_fs<Dst>() +
           " is expected; fix: pass each mask as its own argument "
           "(key_padding_mask and attn_mask are swapped)">();
    } else if constexpr (Src::size != Dst::size) {
      fail<fixed_string("convert: ") + axes_fs<Src>() + " has " + number<static_cast<std::int64_t>(Src::size)>() +
           " axes but the declared type " + axes_fs<Dst>() + " has " + number<static_cast<std::int64_t>(Dst::size)>() +
           "; fix: split/merge to the declared axes">();
    } else if constexpr (!detail::same_names<Src, Dst>) {
      constexpr auto i = detail::first_name_difference<Src, Dst>();
      fail<fixed_string("convert: axis ") + number<static_cast<std::int64_t>(i)>() + " of " + axes_fs<Src>() + " is `" +
           axis_at<Src, i>::name_fs + "` but the declared type " + axes_fs<Dst>() + " wants `" +
           axis_at<Dst, i>::name_fs + "` there; fix: " + permute_fix<Dst>()>();
    } else if constexpr (constexpr auto j = detail::first_extent_difference<Src, Dst>(); j != Dst::size) {
      fail<fixed_string("convert: `") + axis_at<Src, j>::name_fs + "` is " + number<axis_at<Src, j>::extent>() +
           " but the declared type wants " + number<axis_at<Dst, j>::extent>() +
           "; fix: declare the size the value has">();
    } else if constexpr (!std::is_same_v<DT2, DT>) {
      fail<fixed_string("convert: dtype ") + DT2::name + " does not convert to " + DT::name +
           " implicitly; fix: keep the dtype of the value">();
    } else if constexpr (!detail::forgets_only<Trait, Trait2>) {
      fail<fixed_string("convert: ") + axes_fs<Src>() +
           " does not have the meaning the declared type asks for (mask kind or score state); "
           "fix: declare a plain Tensor or build the value with the matching op">();
    } else {
      // Dynamic extents meeting static ones: check once the sizes are bound.
      const Node& n = graph_->node(id_);
      std::size_t k = 0;
      (defer_equal(*graph_, n.axes[k++].extent, ir_extent<A>(),
                   [](auto a, auto b) {
                     return fixed_string("convert: `") + A::name_fs + "` is " + a + " but the declared type wants " +
                            b + "; fix: declare the size the value has";
                   }),
       ...);
    }
  }

  [[nodiscard]] Graph& graph() const { return *graph_; }
  [[nodiscard]] int id() const { return id_; }
  [[nodiscard]] const Node& node() const { return graph_->node(id_); }

  /// Inside a score_mod / mask_mod: `t[h][k]` reads one element, one index per axis (an axis the
  /// scores have takes its own index variable; see score_mod.hpp).
  template <class I>
  auto operator[](const I& i) const {
    return detail::mod_subscript(*this, i);
  }

  /// The axis names in layout order, as the IR sees them.
  [[nodiscard]] static std::array<std::string_view, rank> names() { return {A::name...}; }

 private:
  Graph* graph_;
  int id_;
};

namespace detail {
template <class L, template <auto> class... F>
constexpr bool exact_families() {
  if constexpr (L::size != sizeof...(F)) {
    return false;
  } else {
    return []<std::size_t... I>(std::index_sequence<I...>) {
      return ((axis_at<L, I>::name == family_name<F>) && ...);
    }(std::make_index_sequence<L::size>{});
  }
}
}  // namespace detail

/// Checks that x's axes are exactly the families F..., in this order (e.g. batch_first
/// [Batch, Seq, Model]); returns x, or reports the mistake with the permute that fixes it.
template <fixed_string OpName, template <auto> class... F, class T>
auto expect_axes(const T& x) {
  if constexpr (any_poison<T>) {
    return poison{};
  } else {
    using L = typename T::axis_list;
    constexpr bool same = detail::exact_families<L, F...>();
    if constexpr (!same) {
      using Want = axes<F<dyn>...>;
      if constexpr (((has_family<L, F>) && ...) && L::size == sizeof...(F)) {
        return fail<OpName + ": x is " + axes_fs<L>() + " but must be " + axes_fs<Want>() +
                    " (batch first); fix: " + permute_fix<Want>()>();
      } else {
        return fail<OpName + ": x is " + axes_fs<L>() + " but must have exactly the axes " + axes_fs<Want>() +
                    "; fix: name the axes of the input as the block expects">();
      }
    } else {
      return x;
    }
  }
}

/// A typed tensor with no special meaning.
template <class DT, class... A>
using Tensor = tensor<DT, axes<A...>, trait::plain>;

/// Keep-masks (true = may attend). The mask *kind* is part of the type so that a key-padding
/// mask cannot be passed where a query×key attention mask is expected, and vice versa.
template <class... A>
using KeepMask = tensor<boolean, axes<A...>, trait::mask<MaskKind::keep>>;
template <class BatchAxis, class KeyAxis>
using KeyPaddingMask = tensor<boolean, axes<BatchAxis, KeyAxis>, trait::mask<MaskKind::key_padding>>;
template <class QueryAxis, class KeyAxis>
using AttnMask = tensor<boolean, axes<QueryAxis, KeyAxis>, trait::mask<MaskKind::attention>>;

namespace detail {
template <class T>
T leaf(Graph& g, Op op, std::string name) {
  Node n;
  n.op = op;
  n.name = std::move(name);
  n.axes = ir_axes(typename T::axis_list{});
  n.dtype = T::dtype::value;
  if constexpr (is_mask_trait<typename T::trait_type>::value) n.mask = T::trait_type::kind;
  return T(g, g.add(std::move(n)));
}
}  // namespace detail

/// A tensor fed at run time. Dynamic axes get the axis name as their size symbol, so two inputs
/// with `Seq<dyn>` must be fed the same length. (`input<decltype(p)>` of a poisoned `p` is poison.)
template <TensorOrPoison T>
T input(Graph& g, std::string name) {
  if constexpr (is_poison<T>)
    return {};
  else
    return detail::leaf<T>(g, Op::input, std::move(name));
}

/// A weight or bias, loaded by name (e.g. from a safetensors file).
template <TensorOrPoison T>
T param(Graph& g, std::string name) {
  if constexpr (is_poison<T>)
    return {};
  else
    return detail::leaf<T>(g, Op::param, std::move(name));
}

/// Marks `t` as an output of its graph (nothing, for poison).
template <TensorOrPoison T>
void output(const T& t, std::string name) {
  if constexpr (!is_poison<T>) t.graph().mark_output(t.id(), std::move(name));
}

}  // namespace qkv
