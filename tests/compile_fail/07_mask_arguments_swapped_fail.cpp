// Catalogue 7 - the key-padding mask passed where the attention (query x key) mask goes.
#include <utility>

#include <qkv/qkv.hpp>

using namespace qkv;
using namespace qkv::nn;

int main() {
  Graph g;
  auto pad = input<KeyPaddingMask<Batch<2>, Key<4>>>(g, "key_padding_mask");
  auto allowed = input<AttnMask<Seq<4>, Key<4>>>(g, "attn_mask");
  auto apply = [](const KeyPaddingMask<Batch<2>, Key<4>>& key_padding_mask, const AttnMask<Seq<4>, Key<4>>& attn_mask) {
    return std::pair{key_padding_mask.id(), attn_mask.id()};
  };
  // expected-error: convert: an attention (query x key) mask [Seq=4, Key=4] was passed where a key-padding mask [Batch=2, Key=4] is expected; fix: pass each mask as its own argument (key_padding_mask and attn_mask are swapped)
  auto ids = apply(allowed, pad);
  (void)ids;
}
