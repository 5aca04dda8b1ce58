// The CPU module's nodes that move values rather than compute them: slices, concatenations, a KV
// cache's update, permutes and broadcasts (transposes in tiles), and the embedding's gather and its
// gradient's scatter (module_builder_impl.hpp).
#include "cpu/module/module_builder_impl.hpp"

namespace qkv::codegen::cpu::detail {

void ModuleBuilder::emit_slice(int id) {
  const Node& n = g_.node(id);
  const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
  const Dims in_strides = strides_of(shape(n.inputs[0]));
  const Dims s = shape(id);
  const I start = n.dim ? dim(*n.dim) : s[p] * n.offset;
  nest_parallel(s, {strides_of(s), in_strides}, {c64(0), start * in_strides[p]}, c64(4),
                [&](const Dims&, const Dims& off) { copy_element(n.inputs[0], off[1], id, off[0]); });
}

void ModuleBuilder::emit_concat(int id) {
  const Node& n = g_.node(id);
  const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
  const Dims out_strides = strides_of(shape(id));
  I at = c64(0);
  for (int part : n.inputs) {
    const Dims s = shape(part);
    nest_parallel(s, {out_strides, strides_of(s)}, {at * out_strides[p], c64(0)}, c64(4),
                  [&](const Dims&, const Dims& off) { copy_element(part, off[1], id, off[0]); });
    at = at + s[p];
  }
}

/// x's values (unless the output is x's own buffer: a session's KV cache, updated in place), then
/// the rows at [start, start + n) of the updated axis.
void ModuleBuilder::emit_update_slice(int id) {
  const Node& n = g_.node(id);
  const int x = n.inputs[0], rows = n.inputs[1];
  const std::size_t p = axis_pos(g_.node(x).axes, n.attr_axes[0]);
  const Dims out_strides = strides_of(shape(id));
  branch(ir::Bool(b_, b_.CreateICmpNE(buf(id), buf(x))), [&] {
    if (integer_array(g_, x)) {
      loop(c64(0), numel(shape(id)), [&](I k) { copy_element(x, k, id, k); }, "copy");
      return;
    }
    const I bytes = numel(shape(id)) * static_cast<std::int64_t>(storage_bytes(n.dtype));
    b_.CreateMemCpy(buf(id), llvm::MaybeAlign(1), buf(x), llvm::MaybeAlign(1), bytes.v());
  });
  const Dims s = shape(rows);
  nest(s, {out_strides, strides_of(s)}, {dim(*n.dim) * out_strides[p], c64(0)},
       [&](const Dims&, const Dims& off) { copy_element(rows, off[1], id, off[0]); });
}

void ModuleBuilder::emit_strided_copy(int id) {
  const Node& n = g_.node(id);
  const int x = n.inputs[0];
  const Dims s = shape(id), from = strides_by_name(n.axes, g_.node(x).axes, shape(x));
  auto same = [](const Dims&, const Values& in) { return in[0]; };
  if (cpu_storage_dtype(g_, x) != cpu_storage_dtype(g_, id)) return map_values(id, {x}, {from}, same);
  // The axis x has innermost, if it is not the output's innermost (a transpose: [out, in] weights
  // to [in, out]): read along it, the output written along its last axis, in tiles of kTile × kTile
  // entries — element by element, every read of a row-by-row copy would touch a line (and a page)
  // of its own.
  const std::size_t r = s.size();
  std::size_t q = r;
  for (std::size_t k = 0; k + 1 < r; ++k)
    if (from[k].constant() == 1 && s[k].constant() != 1) q = k;
  if (q == r || s[r - 1].constant() == 1) return map(id, {x}, {from}, same);
  constexpr std::int64_t kTile = 16;
  const Dims out = strides_of(s);
  Dims dims, to, in;
  for (std::size_t k = 0; k + 1 < r; ++k) {
    if (k == q) continue;
    dims.push_back(s[k]);
    to.push_back(out[k]);
    in.push_back(from[k]);
  }
  for (std::size_t k : {q, r - 1}) {
    dims.push_back(ceil_div(s[k], kTile));
    to.push_back(out[k] * kTile);
    in.push_back(from[k] * kTile);
  }
  const std::size_t tq = dims.size() - 2;
  nest_parallel(dims, {to, in}, {c64(0), c64(0)}, c64(4 * kTile * kTile), [&](const Dims& idx, const Dims& off) {
    const I rows = imin(s[q] - idx[tq] * kTile, c64(kTile)), cols = imin(s[r - 1] - idx[tq + 1] * kTile, c64(kTile));
    loop(
        c64(0), rows,
        [&](I i) {
          loop(
              c64(0), cols,
              [&](I j) {
                const I at = off[1] + i + j * from[r - 1];
                store(load(elem(x), buf(x), at), buf(id), off[0] + i * out[q] + j);
              },
              "cols", ir::Unroll::allowed);
        },
        "rows");
  });
}

std::pair<llvm::Value*, llvm::Value*> ModuleBuilder::row_of_id(int ids, const I& k, const I& rows) {
  // Integer ids (an input) are compared as the integers they are; computed ids are f32.
  if (integer_array(g_, ids)) {
    llvm::Value* v = b_.CreateSExtOrTrunc(load(elem(ids), buf(ids), k), i64_);
    llvm::Value* ok = b_.CreateAnd(b_.CreateICmpSGE(v, b_.getInt64(0)), b_.CreateICmpSLT(v, rows.v()));
    return {ok, b_.CreateSelect(ok, v, b_.getInt64(0))};
  }
  llvm::Value* v = value(ids, k);
  llvm::Value* ok = b_.CreateAnd(b_.CreateFCmpOGE(v, llvm::ConstantFP::get(f32_, 0.0)),
                                 b_.CreateFCmpOLT(v, b_.CreateSIToFP(rows.v(), f32_)));
  return {ok, b_.CreateFPToSI(b_.CreateSelect(ok, v, llvm::ConstantFP::get(f32_, 0.0)), i64_)};
}

void ModuleBuilder::emit_embedding(int id) {
  const Node& n = g_.node(id);
  const Dims ts = shape(n.inputs[0]), is = shape(n.inputs[1]);
  const I rows = ts[0], width = ts[1];
  llvm::Value *table = buf(n.inputs[0]), *y = buf(id);
  llvm::Type* row_elem = elem(id);
  const std::int64_t elem_bytes = static_cast<std::int64_t>(storage_bytes(n.dtype));
  loop(
      c64(0), numel(is),
      [&](I k) {
        const auto [ok, row_id] = row_of_id(n.inputs[1], k, rows);
        branch(ir::Bool(b_, b_.CreateNot(ok)), [&] { b_.CreateStore(b_.getInt32(3), status_); });
        const I row(b_, row_id);
        const I bytes = width * elem_bytes;
        b_.CreateMemCpy(b_.CreateGEP(row_elem, y, (k * width).v()), llvm::MaybeAlign(elem_bytes),
                        b_.CreateGEP(row_elem, table, (row * width).v()), llvm::MaybeAlign(elem_bytes), bytes.v());
      },
      "rows");
}

/// y[r, f] = Σ of dy[t, f] over the entries t (in the ids' order) whose id is r; an id outside
/// the rows adds to none. The features are shared out among the tasks, each task's columns summed
/// in token order: the same sums, bit for bit, on any number of threads — and the same as the
/// contraction with a one-hot of the ids that the GEMM ran before (its zero products add nothing).
void ModuleBuilder::emit_embedding_grad(int id) {
  const Node& n = g_.node(id);
  const int dy = n.inputs[0], ids = n.inputs[1];
  const Dims ys = shape(id);
  const I rows = ys[0], width = ys[1], tokens = numel(shape(ids));
  memset0(buf(id), rows * width * 4);
  constexpr std::int64_t kColumns = 64;  // a task's features
  parallel_for(ceil_div(width, kColumns), tokens * width * 2, [&](I t) {
    const I f0 = t * kColumns, f1 = imin(f0 + kColumns, width);
    loop(
        c64(0), tokens,
        [&](I k) {
          const auto [ok, row_id] = row_of_id(ids, k, rows);
          branch(ir::Bool(b_, ok), [&] {
            const I out = I(b_, row_id) * width, in = k * width;
            loop(
                f0, f1,
                [&](I f) { store(b_.CreateFAdd(load(f32_, buf(id), out + f), value(dy, in + f)), buf(id), out + f); },
                "features", ir::Unroll::allowed);
          });
        },
        "tokens");
  });
}

}  // namespace qkv::codegen::cpu::detail
