// The loop-nest kernels of the CPU module (ModuleBuilder, module_builder_impl.hpp): scale, causal,
// score mods, activations, adds, slices, concatenation, broadcasting, dropout, softmax,
// logsumexp, layer norm over any axis, linear over another axis and general contractions, and
// the decoder ops (RMSNorm, RoPE, embedding, argmax), with the interpreter's semantics.
#include "cpu/module/module_builder_impl.hpp"

namespace qkv::codegen::cpu::detail {

void ModuleBuilder::emit_scale(int id) {
  const Node& n = g_.node(id);
  llvm::Value* f = llvm::ConstantFP::get(f64_, n.scalar);
  if (n.dim) {
    llvm::Value* d = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, f64_of(dim(*n.dim)));
    f = b_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), d);
  }
  map_values(id, {n.inputs[0]}, {strides_of(shape(id))}, [&](const Dims&, const Values& in) {
    return b_.CreateFPTrunc(b_.CreateFMul(b_.CreateFPExt(in[0], f64_), f), f32_);
  });
}

void ModuleBuilder::emit_causal(int id) {
  const Node& n = g_.node(id);
  const auto& axes = g_.node(n.inputs[0]).axes;
  const std::size_t pq = axis_pos(axes, n.attr_axes[0]), pk = axis_pos(axes, n.attr_axes[1]);
  const Dims s = shape(n.inputs[0]);
  const I shift = n.align == CausalAlign::bottom_right ? s[pk] - s[pq] : c64(0);
  map_values(id, {n.inputs[0]}, {strides_of(s)}, [&, pq, pk](const Dims& idx, const Values& in) {
    return b_.CreateSelect((idx[pk] > idx[pq] + shift).v(), neg_inf(), in[0]);
  });
}

namespace {
/// Whether every load of input `input` reads it at index(its axis k) along each of its axes k
/// (mod_loads_in_place along its own axes), each an axis of the entry's `axes` with the same
/// extent (so that no load is clamped).
bool loads_by_name(const ModExpr& e, int input, const std::vector<Axis>& own, const std::vector<Axis>& axes) {
  for (const Axis& a : own)
    if (std::none_of(axes.begin(), axes.end(), [&](const Axis& b) { return b.name == a.name && b.extent == a.extent; }))
      return false;
  return mod_loads_in_place(e, input, own);
}
}  // namespace

/// score_mod entry by entry: the expression on scalars (mod_ir), loads from the captured
/// inputs' buffers.
void ModuleBuilder::emit_score_mod(int id) {
  const Node& n = g_.node(id);
  const ModExpr& e = *n.mod;
  const auto& axes = g_.node(n.inputs[0]).axes;
  const Dims s = shape(n.inputs[0]);
  struct Leaves final : ModLeaves {
    ModuleBuilder& mb;
    const Node& n;
    const std::vector<Axis>& axes;
    const Dims& s;
    const Dims* idx = nullptr;
    const Values* vals = nullptr;  // the entry's values of the inputs read in place
    std::vector<int> direct;       // per input: its slot in `vals`, or −1 (loaded by index)
    llvm::Value* x = nullptr;
    Leaves(ModuleBuilder& m, const Node& nn, const std::vector<Axis>& a, const Dims& sh)
        : mb(m), n(nn), axes(a), s(sh) {}
    std::size_t pos(const std::string& axis) const { return util::axis_pos(axes, axis); }
    llvm::Value* score() override { return x; }
    llvm::Value* index(const std::string& axis) override { return mb.b_.CreateSIToFP((*idx)[pos(axis)].v(), mb.f32_); }
    llvm::Value* position(const std::string& axis) override {
      const ModExpr& e = *n.mod;
      llvm::Value* v = index(axis);
      if (e.shifts(axis)) v = mb.b_.CreateFAdd(v, mb.b_.CreateSIToFP((s[pos(e.key)] - s[pos(e.query)]).v(), mb.f32_));
      return v;
    }
    llvm::Value* length(const std::string& axis) override { return mb.b_.CreateSIToFP(s[pos(axis)].v(), mb.f32_); }
    llvm::Value* extent(const ModNode& m, std::size_t k) override {
      const Node& t = mb.g_.node(n.inputs[static_cast<std::size_t>(m.input)]);
      return mb.b_.CreateSIToFP(mb.dim(t.axes[k].extent).v(), mb.f32_);
    }
    llvm::Value* load(const ModNode& m, const std::vector<llvm::Value*>& at) override {
      if (const int slot = direct[static_cast<std::size_t>(m.input)]; slot >= 0) {
        llvm::Value* v = (*vals)[static_cast<std::size_t>(slot)];
        return v->getType() == mb.f32_ ? v : mb.b_.CreateUIToFP(mb.to_bool(v), mb.f32_);
      }
      const int tid = n.inputs[static_cast<std::size_t>(m.input)];
      const Dims ts = mb.shape(tid), st = mb.strides_of(ts);
      I off = mb.c64(0);
      for (std::size_t k = 0; k < at.size(); ++k) off = off + I(mb.b_, at[k]) * st[k];
      llvm::Value* v = mb.value(tid, off);
      return v->getType() == mb.f32_ ? v : mb.b_.CreateUIToFP(mb.to_bool(v), mb.f32_);
    }
  } leaves(*this, n, axes, s);
  // Inputs loaded at the entry's coordinates along their own axes, each an axis of the entry
  // with the same extent (a pointwise node's operands of one shape, or broadcast along the
  // entry's other axes: a [tokens] factor of a [tokens, width] value): read beside the first
  // input through strides, 0 along the axes they lack, not through index arithmetic.
  std::vector<int> read{n.inputs[0]};
  std::vector<Dims> strides{strides_of(s)};
  leaves.direct.assign(n.inputs.size(), -1);
  for (std::size_t k = 1; k < n.inputs.size(); ++k) {
    const Node& t = g_.node(n.inputs[k]);
    if (loads_by_name(e, static_cast<int>(k), t.axes, axes)) {
      leaves.direct[k] = static_cast<int>(read.size());
      read.push_back(n.inputs[k]);
      strides.push_back(strides_by_name(axes, t.axes, shape(n.inputs[k])));
    }
  }
  map_values(id, read, strides, [&](const Dims& idx, const Values& in) {
    leaves.idx = &idx;
    leaves.vals = &in;
    leaves.x = in[0];
    std::vector<llvm::Value*> cache;
    llvm::Value* out = e.score >= 0 ? emit_mod(b_, e, e.score, leaves, cache) : in[0];
    if (e.keep >= 0) out = b_.CreateSelect(emit_mod(b_, e, e.keep, leaves, cache), out, neg_inf());
    return out;
  });
}

/// relu / gelu / silu on the row-wise kernels, in ranges of the flat index.
void ModuleBuilder::emit_activation(int id) {
  const Node& n = g_.node(id);
  const char* name = nullptr;
  switch (n.op) {
    case Op::relu:
      name = "qkv_relu";
      break;
    case Op::silu:
      name = "qkv_silu";
      break;
    case Op::gelu:
      name = "qkv_gelu";
      break;
    default:
      internal_error("codegen: " + std::string(op_name(n.op)) + " is not an activation of the row-wise kernels");
  }
  llvm::Function* kernel = rowwise(name, n.dtype);
  parallel_ranges(numel(shape(id)), 16384, 64, c64(n.op == Op::relu ? 1 : 30),
                  [&](I i0, I i1) { b_.CreateCall(kernel, {buf(n.inputs[0]), buf(id), i0.v(), i1.v()}); });
}

void ModuleBuilder::emit_add_same(int id) {
  const Node& n = g_.node(id);
  llvm::Function* kernel = rowwise("qkv_add", n.dtype);
  parallel_ranges(numel(shape(id)), 16384, 64, c64(4), [&](I i0, I i1) {  // 4: as map()'s entries
    b_.CreateCall(kernel, {buf(n.inputs[0]), buf(n.inputs[1]), buf(id), i0.v(), i1.v()});
  });
}

void ModuleBuilder::emit_broadcasting(int id) {
  const Node& n = g_.node(id);
  const Node &x = g_.node(n.inputs[0]), &y = g_.node(n.inputs[1]);
  const Op op = n.op;
  map_values(id, {n.inputs[0], n.inputs[1]},
             {strides_of(shape(n.inputs[0])), strides_by_name(x.axes, y.axes, shape(n.inputs[1]))},
             [this, op](const Dims&, const Values& in) -> llvm::Value* {
               switch (op) {
                 case Op::mul:
                   return b_.CreateFMul(in[0], in[1]);
                 case Op::keep_mask:
                   return b_.CreateSelect(to_bool(in[1]), in[0], neg_inf());
                 case Op::add:
                 case Op::bias:
                   return b_.CreateFAdd(in[0], in[1]);
                 default:  // never another op as an add (select_kernel sends only these four here)
                   internal_error("codegen: " + std::string(op_name(op)) + " is not a broadcasting binary op");
               }
             });
}

/// keep iff dropout_keep(p, seed, batch, head, row, col), the interpreter's index convention:
/// col = last index, row = second to last, batch = first (rank >= 3), head = the flattened
/// index over the axes in between.
void ModuleBuilder::emit_dropout(int id) {
  const Node& n = g_.node(id);
  const double p = n.scalar;
  if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("codegen: dropout probability must be in [0, 1)");
  const Dims s = shape(id);
  const std::size_t rank = s.size();
  llvm::Value* seed = c64(static_cast<std::int64_t>(n.seed)).v();
  llvm::Value* keep_scale = llvm::ConstantFP::get(f64_, 1.0 / (1.0 - p));
  map_values(id, {n.inputs[0]}, {strides_of(s)}, [&](const Dims& idx, const Values& in) -> llvm::Value* {
    if (p == 0.0) return in[0];
    auto i32 = [&](const I& v) { return b_.CreateTrunc(v.v(), i32_); };
    llvm::Value* zero = b_.getInt32(0);
    llvm::Value* col = rank >= 1 ? i32(idx[rank - 1]) : zero;
    llvm::Value* row = rank >= 2 ? i32(idx[rank - 2]) : zero;
    llvm::Value* batch = rank >= 3 ? i32(idx[0]) : zero;
    I head = c64(0);
    for (std::size_t k = 1; k + 2 < rank; ++k) head = head * s[k] + idx[k];
    llvm::Value* keep = emit_dropout_keep(b_, p, seed, batch, i32(head), row, col);
    llvm::Value* scaled = b_.CreateFPTrunc(b_.CreateFMul(b_.CreateFPExt(in[0], f64_), keep_scale), f32_);
    return b_.CreateSelect(keep, scaled, llvm::ConstantFP::get(f32_, 0.0));
  });
}

ModuleBuilder::Around ModuleBuilder::around(const Dims& s, std::size_t p) {
  Around r{c64(1), s[p], c64(1)};
  for (std::size_t k = 0; k < p; ++k) r.outer = r.outer * s[k];
  for (std::size_t k = p + 1; k < s.size(); ++k) r.inner = r.inner * s[k];
  return r;
}

/// Calls body(base) for every (o, i) with base = o·n·inner + i: the start of one line along p.
void ModuleBuilder::lines(const Around& r, const std::function<void(const I& base)>& body) {
  nest_parallel({r.outer, r.inner}, {{r.n * r.inner, c64(1)}}, {c64(0)}, r.n * 8,
                [&](const Dims&, const Dims& off) { body(off[0]); });
}

/// Σ over k in [0, n) of f(k), in double.
llvm::Value* ModuleBuilder::sum(const I& n, const std::function<llvm::Value*(const I& k)>& f, bool reassociate) {
  return ir::emit_loop(
      b_, c64(0).v(), n.v(), 1, {llvm::ConstantFP::get(f64_, 0.0)},
      [&](llvm::Value* k, const Values& acc) -> Values {
        llvm::Value* total = b_.CreateFAdd(acc[0], f(I(b_, k)));
        if (reassociate) llvm::cast<llvm::Instruction>(total)->setHasAllowReassoc(true);
        return {total};
      },
      "sum", ir::Unroll::allowed)[0];
}

llvm::Value* ModuleBuilder::row_max(int x, const I& n, const std::function<I(const I& k)>& at) {
  return ir::emit_loop(
      b_, c64(0).v(), n.v(), 1, {neg_inf()},
      [&](llvm::Value* k, const Values& cur) -> Values {
        // llvm.maximum: NaN-propagating, so the loop vectorises into lanes of maxima.
        return {b_.CreateBinaryIntrinsic(llvm::Intrinsic::maximum, value(x, at(I(b_, k))), cur[0])};
      },
      "max", ir::Unroll::allowed)[0];
}

/// softmax along attr_axes[0], max-subtracted, sums in double; a row with no visible key (all
/// −inf) is zeros. An f32 y holds the exponentials between the two passes; a half-precision y
/// cannot (they would be rounded twice), so the second pass computes them again.
void ModuleBuilder::emit_softmax(int id) {
  const Node& n = g_.node(id);
  const int x = n.inputs[0];
  const Around r = around(shape(id), axis_pos(g_.node(x).axes, n.attr_axes[0]));
  llvm::Value* y = buf(id);
  const bool keep = storage_dtype(n.dtype) == DType::f32;
  lines(r, [&](const I& base) {
    auto at = [&](const I& k) { return base + k * r.inner; };
    llvm::Value* m = row_max(x, r.n, at);
    auto exp_at = [&](const I& k) { return emit_exp(b_, b_.CreateFSub(value(x, at(k)), m)); };
    branch(
        ir::Bool(b_, b_.CreateFCmpOEQ(m, neg_inf())),
        [&] { loop(c64(0), r.n, [&](I k) { put(llvm::ConstantFP::get(f32_, 0.0), id, at(k)); }, "zero"); },
        [&] {
          llvm::Value* total = sum(r.n, [&](const I& k) {
            llvm::Value* e = exp_at(k);
            if (keep) store(e, y, at(k));
            return b_.CreateFPExt(e, f64_);
          });
          llvm::Value* inv = b_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), total);
          loop(
              c64(0), r.n,
              [&](I k) {
                llvm::Value* e = b_.CreateFPExt(keep ? load(f32_, y, at(k)) : exp_at(k), f64_);
                put(b_.CreateFPTrunc(b_.CreateFMul(e, inv), f32_), id, at(k));
              },
              "norm", ir::Unroll::allowed);
        });
  });
}

/// logsumexp along attr_axes[0] (dropped from the output, the other axes in order): m + ln Σ
/// e^(x − m), the sum in double, the log in f32 (no library call); an all −inf row gives −inf,
/// m = ±inf or NaN gives m.
void ModuleBuilder::emit_logsumexp(int id) {
  const Node& n = g_.node(id);
  const Around r = around(shape(n.inputs[0]), axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
  const int x = n.inputs[0];
  // The rows on the tasks (a language model's loss: a row of the vocabulary per token).
  nest_parallel(
      {r.outer, r.inner}, {{r.n * r.inner, c64(1)}, {r.inner, c64(1)}}, {c64(0), c64(0)}, r.n * 16,
      [&](const Dims&, const Dims& off) {
        auto at = [&](const I& k) { return off[0] + k * r.inner; };
        llvm::Value* m = row_max(x, r.n, at);
        llvm::Value* finite =
            b_.CreateFCmpONE(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, m), llvm::ConstantFP::getInfinity(f32_));
        branch(
            ir::Bool(b_, finite),
            [&] {
              llvm::Value* total = sum(
                  r.n,
                  [&](const I& k) { return b_.CreateFPExt(emit_exp(b_, b_.CreateFSub(value(x, at(k)), m)), f64_); },
                  /*reassociate=*/true);
              // total >= 1 (the max term is 1): its f32 rounding moves the log by < 1e-7.
              llvm::Value* ln =
                  b_.CreateFMul(emit_log2(b_, b_.CreateFPTrunc(total, f32_)), llvm::ConstantFP::get(f32_, kLn2));
              put(b_.CreateFAdd(m, ln), id, off[1]);
            },
            [&] { put(m, id, off[1]); });
      });
}

/// layer norm over the contiguous axis (biased variance, eps inside the square root) on the
/// row-wise kernel, in ranges of rows.
void ModuleBuilder::emit_layer_norm_rows(int id) {
  const Node& n = g_.node(id);
  const Dims s = shape(id);
  const I len = s.back(), rows = pick(len > 0, numel(s) / imax(len, 1), c64(0));
  llvm::Function* kernel = rowwise("qkv_layer_norm", n.dtype);
  // Blocks of about 16k elements: a grain of 16384 / len rows when len is known here.
  const auto known = len.constant();
  const std::int64_t grain = known ? std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(*known, 1)) : 1;
  parallel_ranges(rows, grain, 1, len * 8, [&](I r0, I r1) {
    b_.CreateCall(kernel, {buf(n.inputs[0]), buf(n.inputs[1]), buf(n.inputs[2]), buf(id), len.v(),
                           llvm::ConstantFP::get(f32_, n.scalar), r0.v(), r1.v()});
  });
}

/// layer norm along another axis: a loop nest in double.
void ModuleBuilder::emit_layer_norm_strided(int id) {
  const Node& n = g_.node(id);
  const Dims s = shape(id);
  const double eps = n.scalar;
  const int x = n.inputs[0], gamma = n.inputs[1], beta = n.inputs[2];
  const Around r = around(s, axis_pos(g_.node(x).axes, n.attr_axes[0]));
  lines(r, [&](const I& base) {
    auto at = [&](const I& k) { return base + k * r.inner; };
    auto xd = [&](const I& k) { return b_.CreateFPExt(value(x, at(k)), f64_); };
    llvm::Value* count = f64_of(r.n);
    llvm::Value* mean = b_.CreateFDiv(sum(r.n, xd), count);
    llvm::Value* var = b_.CreateFDiv(sum(r.n,
                                         [&](const I& k) {
                                           llvm::Value* d = b_.CreateFSub(xd(k), mean);
                                           return b_.CreateFMul(d, d);
                                         }),
                                     count);
    llvm::Value* inv_std = b_.CreateFDiv(
        llvm::ConstantFP::get(f64_, 1.0),
        b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFAdd(var, llvm::ConstantFP::get(f64_, eps))));
    loop(
        c64(0), r.n,
        [&](I k) {
          llvm::Value* v = b_.CreateFMul(b_.CreateFSub(xd(k), mean), inv_std);
          v = b_.CreateFAdd(b_.CreateFMul(v, b_.CreateFPExt(value(gamma, k), f64_)),
                            b_.CreateFPExt(value(beta, k), f64_));
          put(b_.CreateFPTrunc(v, f32_), id, at(k));
        },
        "ln", ir::Unroll::allowed);
  });
}

/// linear over a non-contiguous axis: y[o, j, c] = Σ_i x[o, i, c]·W[j, i] + b[j], in double.
void ModuleBuilder::emit_linear_strided(int id) {
  const Node& n = g_.node(id);
  const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
  const Around r = around(shape(n.inputs[0]), p);
  const Dims w = shape(n.inputs[1]);
  const I n_out = w[0], n_in = w[1];
  llvm::Value *x = buf(n.inputs[0]), *wt = buf(n.inputs[1]), *y = buf(id);
  llvm::Value* bias = n.inputs.size() > 2 ? buf(n.inputs[2]) : nullptr;
  const I zero = c64(0), one = c64(1);
  nest({r.outer, n_out, r.inner}, {{n_out * r.inner, r.inner, one}, {n_in * r.inner, zero, one}, {zero, n_in, zero}},
       {zero, zero, zero}, [&](const Dims& idx, const Dims& off) {
         llvm::Value* acc = sum(n_in, [&](const I& i) {
           llvm::Value* xv = load(f32_, x, off[1] + i * r.inner);
           llvm::Value* wv = load(f32_, wt, off[2] + i);
           return b_.CreateFMul(b_.CreateFPExt(xv, f64_), b_.CreateFPExt(wv, f64_));
         });
         if (bias) acc = b_.CreateFAdd(acc, b_.CreateFPExt(load(f32_, bias, idx[1]), f64_));
         store(b_.CreateFPTrunc(acc, f32_), y, off[0]);
       });
}

/// contract: out[o] = Σ_c lhs[o, c]·rhs[o, c], axes matched by name, in double.
/// A contraction as GEMMs: the output's axes split into batch axes (in both inputs), M (the left
/// input's alone) and N (the right's); per batch index the left block is copied to [M, K] rows,
/// the right block to [N, K] and packed into panels, the GEMM kernel writes [M, N], which is
/// scattered into the output. The copies are O(M·K + N·K + M·N) against the product's
/// O(M·N·K). f32 operands, or bf16 ones (the bf16 kernel: vdpbf16ps where the host has it), into an
/// f32 value; false (nothing emitted) for any other contraction.
bool ModuleBuilder::emit_contract_on_gemm(int id) {
  const Node& n = g_.node(id);
  // f32 operands, or both bf16 (legalize-dtypes leaves them so: half_operand), into f32.
  const DType st = cpu_storage_dtype(g_, n.inputs[0]);
  if ((st != DType::f32 && st != DType::bf16) || cpu_storage_dtype(g_, n.inputs[1]) != st ||
      cpu_storage_dtype(g_, id) != DType::f32)
    return false;
  const auto roles = contract_gemm_roles(g_, id);
  if (!roles) return false;
  const int li = roles->a, ri = roles->b;
  const Node &ln = g_.node(li), &rn = g_.node(ri);
  const std::vector<Axis>&batch = roles->batch, &mx = roles->m, &nx = roles->n, &kx = roles->k;

  const Dims ls = shape(li), rs = shape(ri), os = shape(id);
  auto extents = [&](const std::vector<Axis>& axes) {
    Dims d;
    for (const Axis& a : axes) d.push_back(dim(a.extent));
    return d;
  };
  auto cat = [](auto a, const auto& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const Dims bd = extents(batch), md = extents(mx), nd = extents(nx), kd = extents(kx);
  const I m = numel(md), nn = numel(nd), k = numel(kd);
  const bool bf16 = st == DType::bf16;
  const std::int64_t elem = bf16 ? 2 : 4;
  GemmSpec spec;
  spec.bf16 = bf16;
  gemm_cfg_ = choose_gemm_config(spec, target_);
  const std::int64_t nr = gemm_cfg_.cols();
  // Without batch axes an operand laid out as a matrix is read where it is: A as [M, K] rows, or
  // as [K, M] (a weight's gradient, Σ over Batch and Seq: read down its columns); Bᵀ's panels
  // packed from [N, K] or [K, N]; C written into the output when that is [M, N]. Otherwise each
  // is copied into a matrix first.
  using util::laid_out;
  const auto mn = util::names(mx), nn_names = util::names(nx), kn = util::names(kx);
  const bool a_rows = batch.empty() && laid_out(ln.axes, mn, kn);
  const bool a_cols = batch.empty() && !a_rows && laid_out(ln.axes, kn, mn);
  const bool b_rows = batch.empty() && laid_out(rn.axes, nn_names, kn);
  const bool b_cols = batch.empty() && !b_rows && laid_out(rn.axes, kn, nn_names);
  const bool c_direct = batch.empty() && laid_out(n.axes, mn, nn_names);
  gemm_cfg_.a_transposed = a_cols;
  llvm::Value *lhs = buf(li), *rhs = buf(ri), *y = buf(id);
  std::vector<llvm::Value*> owned;  // what this node allocates (and frees)
  auto scratch = [&](const I& bytes) { return owned.emplace_back(aligned_alloc(bytes)); };
  llvm::Value* a = a_rows || a_cols ? lhs : scratch(m * k * elem);
  llvm::Value* bt = b_rows || b_cols ? rhs : scratch(nn * k * elem);  // b_cols: B itself
  llvm::Value* packed = scratch(gemm_panel_bytes(gemm_cfg_, nn, k));
  llvm::Value* bias = scratch(ceil_div(nn, nr) * nr * 4);
  llvm::Value* c = c_direct ? y : scratch(m * nn * 4);
  ir::Bool ok(b_, b_.getTrue());
  for (llvm::Value* p : owned) ok = ok && ir::Bool(b_, b_.CreateIsNotNull(p));
  branch(
      ok,
      [&] {
        memset0(bias, ceil_div(nn, nr) * nr * 4);
        const Dims lb = strides_by_name(batch, ln.axes, ls), rb = strides_by_name(batch, rn.axes, rs),
                   ob = strides_by_name(batch, n.axes, os);
        nest(bd, {lb, rb, ob}, {c64(0), c64(0), c64(0)}, [&](const Dims&, const Dims& base) {
          auto copy = [&](llvm::Value* dst, llvm::Value* src, llvm::Type* t) {
            return [&, dst, src, t](const Dims&, const Dims& off) { store(load(t, src, off[1]), dst, off[0]); };
          };
          llvm::Type* operand = bf16 ? b_.getInt16Ty() : f32_;  // moved as stored
          // A = the left block as [M, K] rows; Bᵀ = the right block as [N, K] rows, then panels.
          const Dims mk = cat(md, kd), nk = cat(nd, kd);
          if (a != lhs)
            nest_parallel(mk, {strides_of(mk), cat(strides_by_name(mx, ln.axes, ls), strides_by_name(kx, ln.axes, ls))},
                          {c64(0), base[0]}, c64(8), copy(a, lhs, operand));
          if (bt != rhs)
            nest_parallel(nk, {strides_of(nk), cat(strides_by_name(nx, rn.axes, rs), strides_by_name(kx, rn.axes, rs))},
                          {c64(0), base[1]}, c64(8), copy(bt, rhs, operand));
          emit_pack_panels(bt, packed, nn, k, nullptr, b_cols);
          emit_gemm_packed(a, packed, bias, c, m, nn, k);
          if (c != y) {
            const Dims out_dims = cat(md, nd);
            nest_parallel(out_dims,
                          {cat(strides_by_name(mx, n.axes, os), strides_by_name(nx, n.axes, os)), strides_of(out_dims)},
                          {base[2], c64(0)}, c64(8), copy(y, c, f32_));
          }
        });
      },
      [&] { b_.CreateStore(b_.getInt32(1), status_); });
  for (llvm::Value* p : owned) free(p);
  return true;
}

llvm::Value* ModuleBuilder::summand(int x, const I& at) {
  const Node& n = g_.node(x);
  if (!elementwise_only_summed(g_, x)) return value(x, at);
  // As stored and read back: a bf16 or f16 value rounded.
  auto stored = [&](llvm::Value* f) { return ir::from_storage(b_, ir::to_storage(b_, f, n.dtype), n.dtype); };
  if (n.op == Op::add) return stored(b_.CreateFAdd(value(n.inputs[0], at), value(n.inputs[1], at)));
  if (n.op == Op::mul) return stored(b_.CreateFMul(value(n.inputs[0], at), value(n.inputs[1], at)));
  // Every input has x's axes and is loaded at x's own coordinates: its entry `at`.
  struct Leaves final : ModLeaves {
    ModuleBuilder& mb;
    const Node& n;
    const I& at;
    Leaves(ModuleBuilder& m, const Node& nn, const I& a) : mb(m), n(nn), at(a) {}
    llvm::Value* score() override { return mb.value(n.inputs[0], at); }
    llvm::Value* load(const ModNode& m, const std::vector<llvm::Value*>&) override {
      return mb.value(n.inputs[static_cast<std::size_t>(m.input)], at);
    }
    // Only a load's coordinates, which load() does not read.
    llvm::Value* index(const std::string&) override { return llvm::ConstantFP::get(mb.f32_, 0.0); }
    llvm::Value* extent(const ModNode&, std::size_t) override { return llvm::ConstantFP::get(mb.f32_, 1.0); }
    llvm::Value* position(const std::string&) override { internal_error("codegen: a position in summed values"); }
    llvm::Value* length(const std::string& axis) override {
      return mb.b_.CreateSIToFP(mb.dim(n.axes[util::axis_pos(n.axes, axis)].extent).v(), mb.f32_);
    }
  } leaves(*this, n, at);
  std::vector<llvm::Value*> cache;
  return stored(emit_mod(b_, *n.mod, n.mod->score, leaves, cache));
}

bool ModuleBuilder::emit_fill_sums(int id) {
  // x as [C..., O...] (column sums) or [O..., C...] (row sums), C the contracted axes in order;
  // x read as stored (f32, or a bf16 / f16 value widened: half_operand).
  const auto form = contract_fill_sums(g_, id);
  if (!form) return false;
  const int x = form->x;
  const bool columns = form->columns;
  const Node& fn = g_.node(form->fill);
  const I outputs = numel(shape(id)), per = numel(shape(x)) / outputs;
  // The fill's value as the interpreter has it (an f32), times each entry, summed in double.
  llvm::Value* factor = llvm::ConstantFP::get(f64_, static_cast<double>(static_cast<float>(fn.scalar)));
  auto term = [&](const I& at) { return b_.CreateFMul(b_.CreateFPExt(summand(x, at), f64_), factor); };
  if (!columns && outputs.constant() && *outputs.constant() < 8) {
    // A few long sums (a gradient's squared norm: a whole weight summed): each output's run in
    // kParts parts on the tasks, each part's sum reassociated as below, then the parts' sums in
    // order — an order fixed by the sizes, not by the threads.
    constexpr std::int64_t kParts = 16;
    const I part = ceil_div(per, kParts);
    llvm::Value* partial = ir::entry_alloca(b_, f64_, *outputs.constant() * kParts, 64, "part_sums");
    parallel_for(outputs * kParts, outputs * per * 2, [&](I t) {
      const I o = t / kParts, k0 = (t % kParts) * part, n = imax(imin(per - k0, part), c64(0));
      store(sum(n, [&](const I& k) { return term(o * per + k0 + k); }, /*reassociate=*/true), partial, t);
    });
    loop(
        c64(0), outputs,
        [&](I o) {
          llvm::Value* total = llvm::ConstantFP::get(f64_, 0.0);
          for (std::int64_t q = 0; q < kParts; ++q) total = b_.CreateFAdd(total, load(f64_, partial, o * kParts + q));
          put(b_.CreateFPTrunc(total, f32_), id, o);
        },
        "parts");
    return true;
  }
  if (!columns) {
    // Each output sums a contiguous run; the sum may be reassociated (vectors of double partial
    // sums, in an order fixed by the code, not by the threads).
    parallel_ranges(outputs, 16, 1, per * 2, [&](I o0, I o1) {
      loop(
          o0, o1,
          [&](I o) {
            put(b_.CreateFPTrunc(sum(
                                     per, [&](const I& k) { return term(o * per + k); }, /*reassociate=*/true),
                                 f32_),
                id, o);
          },
          "rows");
    });
    return true;
  }
  // Outputs a task sums (its double sums on its stack): 64, so that a bias of 384 gives six tasks
  // (not 256 + 128) and a task's sums stay in L1; each output is summed in x's row order whatever
  // the split, so the split does not change a bit. The loops over a task's outputs are vectorised.
  constexpr std::int64_t kChunk = 64;
  constexpr auto vectorised = ir::Unroll::allowed;
  parallel_for(ceil_div(outputs, kChunk), outputs * per * 2, [&](I t) {
    const I c0 = t * kChunk, width = imin(outputs - c0, c64(kChunk));
    llvm::Value* acc = ir::entry_alloca(b_, f64_, kChunk, 64, "column_sums");
    loop(c64(0), width, [&](I j) { store(llvm::ConstantFP::get(f64_, 0.0), acc, j); }, "zero", vectorised);
    loop(
        c64(0), per,
        [&](I r) {
          const I at = r * outputs + c0;
          loop(
              c64(0), width, [&](I j) { store(b_.CreateFAdd(load(f64_, acc, j), term(at + j)), acc, j); }, "columns",
              vectorised);
        },
        "rows");
    loop(c64(0), width, [&](I j) { put(b_.CreateFPTrunc(load(f64_, acc, j), f32_), id, c0 + j); }, "out", vectorised);
  });
  return true;
}

void ModuleBuilder::emit_contract(int id) {
  if (emit_contract_on_gemm(id) || emit_fill_sums(id)) return;
  const Node& n = g_.node(id);
  const Node &ln = g_.node(n.inputs[0]), &rn = g_.node(n.inputs[1]);
  const Dims ls = shape(n.inputs[0]), rs = shape(n.inputs[1]);
  std::vector<Axis> contracted;
  Dims c_shape;
  for (const auto& c : n.attr_axes) {
    contracted.push_back({c, Extent::fixed(0)});
    c_shape.push_back(ls[axis_pos(ln.axes, c)]);
  }
  const Dims l_out = strides_by_name(n.axes, ln.axes, ls), r_out = strides_by_name(n.axes, rn.axes, rs);
  const Dims l_c = strides_by_name(contracted, ln.axes, ls), r_c = strides_by_name(contracted, rn.axes, rs);
  llvm::Value *lhs = buf(n.inputs[0]), *rhs = buf(n.inputs[1]), *y = buf(id);
  const Dims s = shape(id);
  nest_parallel(s, {strides_of(s), l_out, r_out}, {c64(0), c64(0), c64(0)}, numel(c_shape) * 2,
                [&](const Dims&, const Dims& off) {
                  llvm::Value* acc_slot = ir::entry_alloca(b_, f64_, 1, 8, "acc");
                  b_.CreateStore(llvm::ConstantFP::get(f64_, 0.0), acc_slot);
                  nest(c_shape, {l_c, r_c}, {c64(0), c64(0)}, [&](const Dims&, const Dims& c_off) {
                    llvm::Value* lv = load(f32_, lhs, off[1] + c_off[0]);
                    llvm::Value* rv = load(f32_, rhs, off[2] + c_off[1]);
                    llvm::Value* prod = b_.CreateFMul(b_.CreateFPExt(lv, f64_), b_.CreateFPExt(rv, f64_));
                    b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f64_, acc_slot), prod), acc_slot);
                  });
                  store(b_.CreateFPTrunc(b_.CreateLoad(f64_, acc_slot), f32_), y, off[0]);
                });
}

/// RMSNorm along attr_axes[0]: x · (1/sqrt(Σx²/n + eps)) · weight, the sum in double.
void ModuleBuilder::emit_rms_norm(int id) {
  const Node& n = g_.node(id);
  const int x = n.inputs[0], w = n.inputs[1];
  const Around r = around(shape(id), axis_pos(g_.node(x).axes, n.attr_axes[0]));
  lines(r, [&](const I& base) {
    auto at = [&](const I& k) { return base + k * r.inner; };
    llvm::Value* ss = sum(r.n, [&](const I& k) {
      llvm::Value* v = b_.CreateFPExt(value(x, at(k)), f64_);
      return b_.CreateFMul(v, v);
    });
    llvm::Value* mean = b_.CreateFAdd(b_.CreateFDiv(ss, f64_of(r.n)), llvm::ConstantFP::get(f64_, n.scalar));
    llvm::Value* inv =
        b_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, mean));
    loop(
        c64(0), r.n,
        [&](I k) {
          llvm::Value* v = b_.CreateFMul(b_.CreateFPExt(value(x, at(k)), f64_), inv);
          v = b_.CreateFMul(v, b_.CreateFPExt(value(w, k), f64_));
          put(b_.CreateFPTrunc(v, f32_), id, at(k));
        },
        "rms", ir::Unroll::allowed);
  });
}

/// RoPE (qkv/ir/rope.hpp): for every index of x with feature i < D/2, the pair (i, i + D/2)
/// turned by the angle f32(inv_freq[i]) · f32(position), inv_freq and the sine and cosine in
/// double (no calls: vector_math's exp2 and sincos), the rotation in f32 as Hugging Face's.
void ModuleBuilder::emit_rope(int id) {
  const Node& n = g_.node(id);
  const RopeAttrs& ra = *n.rope;
  const auto& axes = g_.node(n.inputs[0]).axes;
  const std::size_t p = axis_pos(axes, n.attr_axes[0]);
  const Dims s = shape(id);
  Dims half_shape = s;
  const I d = s[p], half = d / 2;
  half_shape[p] = half;
  const Dims xs = strides_of(s);
  const Dims ps = strides_by_name(axes, g_.node(n.inputs[1]).axes, shape(n.inputs[1]));
  const int x = n.inputs[0], pos = n.inputs[1];
  auto f64c = [&](double v) { return llvm::ConstantFP::get(f64_, v); };
  llvm::Value* log2_theta = f64c(std::log2(ra.theta));
  llvm::Value* d_f = f64_of(d);
  nest(half_shape, {xs, ps}, {c64(0), c64(0)}, [&](const Dims& idx, const Dims& off) {
    // inv_freq[i] = f32(theta^(−2i/D)), then Llama 3's rescaling in double.
    llvm::Value* e = b_.CreateFDiv(b_.CreateFMul(f64_of(idx[p] * 2), log2_theta), d_f);
    llvm::Value* f = b_.CreateFPExt(b_.CreateFPTrunc(emit_exp2_f64(b_, b_.CreateFNeg(e)), f32_), f64_);
    if (ra.llama3) {
      llvm::Value* wavelen = b_.CreateFDiv(f64c(2.0 * 3.14159265358979323846), f);
      const double low = ra.original_max_positions / ra.low_freq_factor;
      const double high = ra.original_max_positions / ra.high_freq_factor;
      llvm::Value* slow = b_.CreateFDiv(f, f64c(ra.factor));
      llvm::Value* smooth = b_.CreateFDiv(
          b_.CreateFSub(b_.CreateFDiv(f64c(ra.original_max_positions), wavelen), f64c(ra.low_freq_factor)),
          f64c(ra.high_freq_factor - ra.low_freq_factor));
      llvm::Value* mid = b_.CreateFAdd(b_.CreateFMul(b_.CreateFSub(f64c(1.0), smooth), slow), b_.CreateFMul(smooth, f));
      llvm::Value* v = b_.CreateSelect(b_.CreateFCmpOGT(wavelen, f64c(low)), slow, mid);
      f = b_.CreateSelect(b_.CreateFCmpOLT(wavelen, f64c(high)), f, v);
    }
    llvm::Value* angle = b_.CreateFMul(b_.CreateFPTrunc(f, f32_), value(pos, off[1]));
    auto [sin64, cos64] = emit_sincos_f64(b_, b_.CreateFPExt(angle, f64_));
    llvm::Value *sn = b_.CreateFPTrunc(sin64, f32_), *cs = b_.CreateFPTrunc(cos64, f32_);
    const I hi = off[0] + half * xs[p];
    llvm::Value *x0 = value(x, off[0]), *x1 = value(x, hi);
    put(b_.CreateFAdd(b_.CreateFMul(x0, cs), b_.CreateFMul(b_.CreateFNeg(x1), sn)), id, off[0]);
    put(b_.CreateFAdd(b_.CreateFMul(x1, cs), b_.CreateFMul(x0, sn)), id, hi);
  });
}

/// embedding: out[k, :] = table[ids[k], :] for every flat index k of the ids (a memcpy per
/// row, as stored: the table and the output share a dtype, storage.hpp). An id outside
/// [0, rows) (NaN included) reads row 0 and sets the entry's status to 3.
void ModuleBuilder::emit_dequantize(int id) {
  const Node& n = g_.node(id);
  const int q = n.inputs[0], s = n.inputs[1];
  const Dims ns = shape(id);
  const I k = ns.back(), rows = pick(k > 0, numel(ns) / imax(k, 1), c64(0));
  const I groups = shape(s).back(), group = c64(n.offset), bytes = shape(q).back();
  const bool q4 = dequantizes_q4(n);
  nest({rows, k}, {{k, c64(1)}, {bytes, c64(1)}}, {c64(0), c64(0)}, [&](const Dims& idx, const Dims& off) {
    llvm::Value* v = q4 ? q4_entry(buf(q), idx[0] * bytes, idx[1], group) : load(i8_, buf(q), off[1]);
    put(b_.CreateFMul(b_.CreateSIToFP(v, f32_), value(s, idx[0] * groups + idx[1] / group)), id, off[0]);
  });
}

llvm::Value* ModuleBuilder::q4_entry(llvm::Value* q, const I& row, const I& kk, const I& group) {
  return ir::q4_nibbles(b_, load(i8_, q, row + q4_byte(kk, group)), q4_high(kk, group).v(), /*centered=*/true);
}

/// argmax along attr_axes[0] (dropped): the first index of the largest entry, a NaN the largest
/// (the first NaN stays), stored as a float.
void ModuleBuilder::emit_argmax(int id) {
  const Node& n = g_.node(id);
  const Around r = around(shape(n.inputs[0]), axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
  const int x = n.inputs[0];
  nest({r.outer, r.inner}, {{r.n * r.inner, c64(1)}, {r.inner, c64(1)}}, {c64(0), c64(0)},
       [&](const Dims&, const Dims& off) {
         branch(r.n > 0, [&] {
           llvm::Value* first = value(x, off[0]);
           const Values best = ir::emit_loop(
               b_, c64(1).v(), r.n.v(), 1, {first, c64(0).v()},
               [&](llvm::Value* k, const Values& cur) -> Values {
                 llvm::Value* v = value(x, off[0] + I(b_, k) * r.inner);
                 llvm::Value* nan_v = b_.CreateFCmpUNO(v, v);
                 llvm::Value* best_ordered = b_.CreateFCmpORD(cur[0], cur[0]);
                 llvm::Value* take = b_.CreateAnd(best_ordered, b_.CreateOr(b_.CreateFCmpOGT(v, cur[0]), nan_v));
                 return {b_.CreateSelect(take, v, cur[0]), b_.CreateSelect(take, k, cur[1])};
               },
               "argmax");
           put(b_.CreateSIToFP(best[1], f32_), id, off[1]);
         });
       });
}

}  // namespace qkv::codegen::cpu::detail
