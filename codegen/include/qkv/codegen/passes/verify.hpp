// qkv/codegen/passes/verify.hpp — the Graph IR's invariants.
//
// After this pass (it changes nothing): every input of a node precedes it; leaves have no
// inputs; each op has the number of inputs it takes; axis names are unique within a node;
// shape-keeping ops keep their input's axes; permutes reorder the same names; a contraction's
// output is lhs \ C followed by rhs \ C \ lhs; softmax and causal name axes their input has;
// graph outputs name existing nodes. A violation is qkv's bug, not the user's.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include <qkv/ir/graph.hpp>

namespace qkv::codegen {

/// Which grammar a graph must follow: any graph the DSL or a pass makes, or additionally the
/// operand orders the kernels rely on once the layout pass has run: a fused_attention's q is
/// batch ++ heads ++ group ++ [query, dk], k is batch ++ heads ++ [key, dk], v is batch ++ heads ++
/// [key, dv], its output batch ++ heads ++ group ++ [query, dv], a key-padding mask [batch, key],
/// every other mask a subsequence of [query, key]; attention_weights reads a fused_attention
/// directly and is batch ++ heads ++ group ++ [query, key].
enum class Stage { any, laid_out };

/// Every violated invariant, as "%12 (softmax): <problem>; axes [...]" (empty: the graph is valid).
std::vector<std::string> verify(const Graph& g, Stage stage = Stage::any);

/// Throws InternalError("qkv internal error: graph invalid after <pass>: ...") on the first
/// violation.
void verify_or_throw(const Graph& g, std::string_view after_pass, Stage stage = Stage::any);

}  // namespace qkv::codegen
