// qkv/dsl/traits.hpp — what a tensor's value means where a check needs it, and how each op
// carries that meaning on. A tensor's type is tensor<dtype, axes, trait>; the trait is one of:
//
//   plain                             no special meaning
//   raw_scores<Dk, Keys, Claims...>   Q·Kᵀ straight out of contract(): not yet scaled
//   scores<Keys, Claims...>           scaled (by scaled(), scale(), mul()) or explicitly unscaled()
//   unpaired<Dk, Shared>              a contraction whose operands have no axis of their own
//                                     (Q·Kᵀ with K's sequence axis not renamed)
//   weights<Over, Keys>               softmax output, normalised over the axis named Over
//   mask<Kind>                        a boolean keep-mask (true = may attend) of a kind
//
// Nothing before softmax knows the key axis of some scores by name: contract<HeadDim>(q, k) and
// contract<HeadDim>(k, q) are both correct, laid out [.., Seq, Key] and [.., Key, Seq]. So what
// a mask or causal() says about the key axis travels with the scores as a *claim*, and
// softmax<Key> — which names the key axis — checks every claim by name. `Keys` (the axis the
// right operand of Q·Kᵀ brought) is a guess used only to word diagnostics, never to reject.
#pragma once

#include <cstdint>
#include <type_traits>

#include <qkv/dsl/fixed_string.hpp>
#include <qkv/ir/graph.hpp>

namespace qkv {

namespace trait {
struct plain {};

/// Who said which axis of the scores is the key axis: a key-padding mask [Batch, K] and an
/// attention mask [Q, K] say K (their last axis); causal<Q, K> says K; modded() says the last axis
/// of the scores (its mods take it for the key axis).
enum class claimant : std::uint8_t { key_padding_mask, attention_mask, causal, mod };

template <claimant By, fixed_string Key, fixed_string Query>
struct key_claim {
  static constexpr claimant by = By;
  static constexpr auto key = Key;
  static constexpr auto query = Query;
};

template <class Contracted, fixed_string Keys, class... Claims>
struct raw_scores {
  using contracted = Contracted;
  static constexpr auto keys = Keys;
};

template <fixed_string Keys, class... Claims>
struct scores {
  static constexpr auto keys = Keys;
};

template <class Contracted, class Shared>
struct unpaired {
  using contracted = Contracted;
  using shared = Shared;
};

template <fixed_string Over, fixed_string Keys = "">
struct weights {
  static constexpr auto over = Over;
  static constexpr auto keys = Keys;
};

template <MaskKind K>
struct mask {
  static constexpr MaskKind kind = K;
};
}  // namespace trait

// --- what a trait is ------------------------------------------------------------------------

template <class T>
struct is_mask_trait : std::false_type {};
template <MaskKind K>
struct is_mask_trait<trait::mask<K>> : std::true_type {};

template <class T>
struct is_weights_trait : std::false_type {};
template <fixed_string O, fixed_string K>
struct is_weights_trait<trait::weights<O, K>> : std::true_type {};

template <class T>
struct is_raw_trait : std::false_type {};
template <class C, fixed_string K, class... Cl>
struct is_raw_trait<trait::raw_scores<C, K, Cl...>> : std::true_type {};

template <class T>
struct is_unpaired_trait : std::false_type {};
template <class C, class S>
struct is_unpaired_trait<trait::unpaired<C, S>> : std::true_type {};

namespace detail {

/// The claims some scores carry, as a list (empty for any other trait).
template <class... C>
struct claim_list {};
template <class Tr>
struct claims_of {
  using type = claim_list<>;
};
template <class C, fixed_string K, class... Cl>
struct claims_of<trait::raw_scores<C, K, Cl...>> {
  using type = claim_list<Cl...>;
};
template <fixed_string K, class... Cl>
struct claims_of<trait::scores<K, Cl...>> {
  using type = claim_list<Cl...>;
};

/// The `Keys` guess of scores ("" for any other trait).
template <class Tr>
inline constexpr auto keys_of = fixed_string("");
template <class C, fixed_string K, class... Cl>
inline constexpr auto keys_of<trait::raw_scores<C, K, Cl...>> = K;
template <fixed_string K, class... Cl>
inline constexpr auto keys_of<trait::scores<K, Cl...>> = K;

/// Tr with one more claim (scores only: a mask on a plain tensor claims nothing).
template <class Tr, class Claim>
struct with_claim {
  using type = Tr;
};
template <class C, fixed_string K, class... Cl, class Claim>
struct with_claim<trait::raw_scores<C, K, Cl...>, Claim> {
  using type = trait::raw_scores<C, K, Cl..., Claim>;
};
template <fixed_string K, class... Cl, class Claim>
struct with_claim<trait::scores<K, Cl...>, Claim> {
  using type = trait::scores<K, Cl..., Claim>;
};
template <class Tr, class Claim>
using with_claim_t = typename with_claim<Tr, Claim>::type;

/// Tr without what its masks claimed (raw scores stay raw, scaled ones scaled).
template <class Tr>
struct unclaimed {
  using type = Tr;
};
template <class C, fixed_string K, class... Cl>
struct unclaimed<trait::raw_scores<C, K, Cl...>> {
  using type = trait::raw_scores<C, K>;
};
template <fixed_string K, class... Cl>
struct unclaimed<trait::scores<K, Cl...>> {
  using type = trait::scores<K>;
};

/// Whether a value meaning From may be stored as meaning To (a conversion to a declared type, an
/// assignment `s = masked(s, m)`): the same meaning, or part of it forgotten — all of it (plain),
/// or the claims of masks (those checks then need the value's own type: `auto`).
template <class To, class From>
inline constexpr bool forgets_only =
    std::is_same_v<To, From> || std::is_same_v<To, trait::plain> || std::is_same_v<To, typename unclaimed<From>::type>;

/// The trait after the values were multiplied on purpose (scaled, scale, mul, unscaled): raw
/// scores become scores; every other meaning stays.
template <class Tr>
struct rescaled {
  using type = Tr;
};
template <class C, fixed_string K, class... Cl>
struct rescaled<trait::raw_scores<C, K, Cl...>> {
  using type = trait::scores<K, Cl...>;
};
template <class Tr>
using rescaled_t = typename rescaled<Tr>::type;

/// The trait of softmax<Over>'s output.
template <class Tr, fixed_string Over>
using softmax_t = trait::weights<Over, keys_of<Tr>>;

/// `To` where Name is `From`, else Name (an axis name inside a trait, under rename<From, To>).
template <fixed_string Name, fixed_string From, fixed_string To>
constexpr auto renamed_name() {
  if constexpr (Name == From)
    return To;
  else
    return Name;
}

/// Tr with the axis `From` called `To` (rename keeps the meaning, and what it says about axes).
template <class Tr, fixed_string From, fixed_string To>
struct renamed {
  using type = Tr;
};
template <trait::claimant By, fixed_string Key, fixed_string Query, fixed_string From, fixed_string To>
struct renamed<trait::key_claim<By, Key, Query>, From, To> {
  using type = trait::key_claim<By, renamed_name<Key, From, To>(), renamed_name<Query, From, To>()>;
};
template <class C, fixed_string K, class... Cl, fixed_string From, fixed_string To>
struct renamed<trait::raw_scores<C, K, Cl...>, From, To> {
  using type = trait::raw_scores<C, renamed_name<K, From, To>(), typename renamed<Cl, From, To>::type...>;
};
template <fixed_string K, class... Cl, fixed_string From, fixed_string To>
struct renamed<trait::scores<K, Cl...>, From, To> {
  using type = trait::scores<renamed_name<K, From, To>(), typename renamed<Cl, From, To>::type...>;
};
template <fixed_string O, fixed_string K, fixed_string From, fixed_string To>
struct renamed<trait::weights<O, K>, From, To> {
  using type = trait::weights<renamed_name<O, From, To>(), renamed_name<K, From, To>()>;
};
template <class Tr, fixed_string From, fixed_string To>
using renamed_t = typename renamed<Tr, From, To>::type;

}  // namespace detail

}  // namespace qkv
