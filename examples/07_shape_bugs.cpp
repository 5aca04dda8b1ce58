// Lesson 07 — a guided tour of the shape bugs qkv turns into compile errors.
//
// Each entry below is a mistake from the bug catalogue (docs/diagnostics.md lists all 13),
// written the way people make it, with the first line of the diagnostic qkv gives. The
// mistakes themselves are in comments — uncomment one in a copy of this file to see the
// compiler reject it. Every entry is a real test: tests/compile_fail/<name>_fail.cpp holds the
// full program, and the harness checks that clang-19 and g++-12 print exactly this message
// first (a CTest checks this lesson quotes them verbatim).
//
//     ./build/examples/07_shape_bugs
#include <cstdio>

namespace {

struct Bug {
  const char* test;   // tests/compile_fail/<test>_fail.cpp
  const char* what;   // the mistake
  const char* code;   // the offending line
  const char* error;  // qkv's diagnostic (first error line, after the compiler's prefix)
};

// clang-format off
constexpr Bug kBugs[] = {
    {"01_view_scrambles_heads",
     "Catalogue 1 - heads scrambled: reshaping [B, S, E] straight to [B, H, S, Dh] with a view, as `x.view(B, H, S, Dh)` would in PyTorch, moves data between differently named axes.",
     "auto heads = view<Batch<2>, Heads<2>, Seq<4>, HeadDim<8>>(x);",
     "view: [Batch=2, Seq=4, Model=16] -> [Batch=2, Heads=2, Seq=4, HeadDim=8] would move data between differently named axes (axis 1 is `Seq` in x but `Heads` in the view); fix: permute<Batch, Heads, Seq, HeadDim>(split<Model, Heads<2>, HeadDim<8>>(x))"},
    {"02_padding_mask_on_query_axis",
     "Catalogue 2 - the padding mask built over the query positions (`Seq`) and broadcast over the query axis of the scores, instead of over the keys.",
     "auto p = softmax<Key>(masked(scores, pad));",
     "masked: the key-padding mask covers `Seq` (4), not the key axis `Key` of the scores [Batch=2, Seq=4, Key=4]; fix: build the mask over the keys, e.g. rename<Seq, Key>(mask)"},
    {"03_softmax_wrong_axis",
     "Catalogue 3 - softmax over the query axis (`dim=1` instead of `dim=-1`), then the weighted sum contracts the key axis: the weights do not sum to one over what is summed.",
     "auto out = contract<Key>(p, v);",
     "contract: weights are normalised over `Seq` but contracted over `Key`; fix: softmax<Key>(scores)"},
    {"04_contract_dk_mismatch",
     "Catalogue 4 - Q and K projected to different widths (d_k 64 vs 32), then Q·Kᵀ.",
     "auto scores = contract<HeadDim>(q, k);",
     "contract: `HeadDim` of lhs (64) must equal `HeadDim` of rhs (32); fix: contracted axes must have one size (Q*K^T: the same d_k; P*V: keys and values from one sequence)"},
    {"05_heads_do_not_divide_model",
     "Catalogue 5 - d_model 512 with 6 heads: head_dim = 512 / 6 = 85 loses 2 features.",
     "auto heads = split<Model, Heads<H>, HeadDim<E / H>>(x);",
     "split: `Model` (512) is not Heads (6) x HeadDim (85) = 510; fix: choose factors that divide Model (e.g. a number of heads that divides d_model)"},
    {"05b_gqa_heads_do_not_group",
     "Catalogue 5 (GQA) - 8 query heads cannot share 3 key/value heads.",
     "auto gqa = GroupedQueryAttention<64, 8, 3>::make(g);",
     "grouped_query_attention: query heads (8) must be a multiple of key/value heads (3); fix: choose a number of key/value heads that divides the query heads"},
    {"06_batch_first_confusion",
     "Catalogue 6 - a sequence-first tensor [Seq, Batch, Model] (PyTorch's default layout) fed to a block that is batch_first.",
     "auto [out, weights] = mha(x);",
     "multi_head_attention: x is [Seq=4, Batch=2, Model=16] but must be [Batch=dyn, Seq=dyn, Model=dyn] (batch first); fix: permute<Batch, Seq, Model>(x)"},
    {"07_mask_arguments_swapped",
     "Catalogue 7 - the key-padding mask passed where the attention (query x key) mask goes.",
     "auto ids = apply(allowed, pad);",
     "convert: an attention (query x key) mask [Seq=4, Key=4] was passed where a key-padding mask [Batch=2, Key=4] is expected; fix: pass each mask as its own argument (key_padding_mask and attn_mask are swapped)"},
    {"08_output_projection_width",
     "Catalogue 8 - heads x d_v (2 x 8 = 16) does not match W_o's input width (32).",
     "auto out = linear(both, w_o);",
     "linear: `Model` of x (16) must equal the input width of the projection (32); fix: the features entering a projection (e.g. heads x d_v into W_o) must match its weight"},
    {"09_merge_before_permute_back",
     "Catalogue 9 - heads merged back while still [Batch, Heads, Seq, HeadDim] (the missing transpose(1, 2) before .view(B, S, E)).",
     "auto merged = merge<Heads, HeadDim, Model>(o);",
     "merge: `Heads` and `HeadDim` are not adjacent in [Batch=2, Heads=2, Seq=4, HeadDim=8]; fix: permute<Batch, Seq, Heads, HeadDim>(x) first, then merge"},
    {"10_cross_attention_kv_lengths",
     "Catalogue 10 - cross-attention with keys from a 6-token memory and values from a 5-token one.",
     "auto out = contract<Key>(p, v);",
     "contract: `Key` of lhs (6) must equal `Key` of rhs (5); fix: contracted axes must have one size (Q*K^T: the same d_k; P*V: keys and values from one sequence)"},
    {"11_wrong_pair_transposed",
     "Catalogue 11 - transpose(2, 3) where transpose(1, 2) was meant: [B, S, H, Dh] becomes [B, S, Dh, H] instead of [B, H, S, Dh].",
     "Tensor<f32, Batch<2>, Heads<2>, Seq<4>, HeadDim<8>> per_head = transpose<Heads, HeadDim>(split_x);",
     "convert: axis 1 of [Batch=2, Seq=4, HeadDim=8, Heads=2] is `Seq` but the declared type [Batch=2, Heads=2, Seq=4, HeadDim=8] wants `Heads` there; fix: permute<Batch, Heads, Seq, HeadDim>(x)"},
    {"12_causal_without_alignment",
     "Catalogue 12 - a causal mask on 4 queries against 6 keys (a cache) without saying how the triangle is aligned.",
     "auto p = softmax<Key>(causal<Seq, Key>(scores));",
     "causal: `Seq` (4) != `Key` (6), so the alignment of the mask matters; fix: causal<Seq, Key>(s, top_left) as in PyTorch is_causal, or bottom_right as in FlashAttention"},
    {"13_softmax_unscaled",
     "Catalogue 13 - softmax straight over Q·Kᵀ, the 1/sqrt(d_k) forgotten.",
     "auto p = softmax<Key>(contract<HeadDim>(q, k));",
     "softmax: scores [Batch=2, Heads=2, Seq=4, Key=4] are raw Q*K^T, not scaled by 1/sqrt(HeadDim=64); fix: softmax<Key>(scaled(scores)), or unscaled(scores) to opt out"},
};
// clang-format on

}  // namespace

int main() {
  int n = 0;
  for (const Bug& b : kBugs) {
    std::printf("%2d. %s\n    you write:  %s\n    qkv says:   %s\n    (tests/compile_fail/%s_fail.cpp)\n\n", ++n,
                b.what, b.code, b.error, b.test);
  }
  std::printf("%d mistakes, each a compile error that names the axis and the fix.\n", n);
  return n >= 13 ? 0 : 1;
}
