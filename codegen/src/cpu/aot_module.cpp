// The AOT compiler's IR generator: one function for a whole lowered graph under concrete sizes.
//
//   i32 <function>(ptr arg0, …)                 inputs and parameters in graph order, then outputs
//     arena = aligned_alloc(64, plan.arena_bytes) (return 1 when that fails)
//     for each node, in graph order: its code, reading its inputs' buffers, writing its own
//     memcpy each output's buffer into its argument; free(arena); return 0
//   i32 <function>_packed(ptr args)             loads args[i] and calls the above
//
// Values live in the arena at the offsets plan_aot chose; leaves are the arguments themselves and
// views (split, merge, rename, view) share their input's buffer. Kernels (attention, GEMM,
// row-wise) are emitted into the same module with internal linkage, so the optimiser sees the
// calls with constant sizes and the shared library exports only the two entry points.
#include "aot_module.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>

#include <qkv/codegen/cpu/fused_call.hpp>
#include <qkv/codegen/passes/buffer_plan.hpp>

#include "../graph_util.hpp"
#include "aot_threads.hpp"
#include "attention_kernel.hpp"
#include "gemm_kernel.hpp"
#include "ir_util.hpp"
#include "philox_ir.hpp"
#include "rowwise_kernel.hpp"
#include "vector_math.hpp"

namespace qkv::codegen::cpu {

namespace {

using namespace util;  // graph_util.hpp: numel, strides_of, strides_by_name, axis_pos, …

}  // namespace

namespace {

class AotEmitter {
 public:
  AotEmitter(llvm::Module& module, const Graph& g, const Bindings& sizes, const AotSignature& sig, const AotPlan& plan,
             const HostTarget& target)
      : m_(module), ctx_(module.getContext()), b_(ctx_), g_(g), sizes_(sizes), sig_(sig), plan_(plan), target_(target) {
    f32_ = b_.getFloatTy();
    f64_ = b_.getDoubleTy();
    i8_ = b_.getInt8Ty();
    i32_ = b_.getInt32Ty();
    i64_ = b_.getInt64Ty();
    ptr_ = b_.getPtrTy();
    for (std::size_t i = 0; i < target.features.size(); ++i) features_ += (i ? "," : "") + target.features[i];
  }

  void emit(const std::string& name) {
    std::vector<llvm::Type*> params(sig_.args.size(), ptr_);
    auto* type = llvm::FunctionType::get(i32_, params, false);
    fn_ = llvm::Function::Create(type, llvm::GlobalValue::ExternalLinkage, name, m_);
    attributes(fn_);
    for (std::size_t k = 0; k < sig_.args.size(); ++k)
      fn_->getArg(static_cast<unsigned>(k))->setName(sig_.args[k].c_name);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));

    // 64-byte aligned (C11 aligned_alloc; the size a multiple of it): the kernels' packed panels
    // and tiles are read with aligned vector loads.
    auto* alloc_fn = m_.getOrInsertFunction("aligned_alloc", ptr_, i64_, i64_).getCallee();
    auto* free_fn = m_.getOrInsertFunction("free", b_.getVoidTy(), ptr_).getCallee();
    llvm::Value* arena = llvm::ConstantPointerNull::get(ptr_);
    if (plan_.arena_bytes > 0) {
      const auto bytes = static_cast<std::int64_t>((plan_.arena_bytes + 63) / 64 * 64);
      arena = b_.CreateCall(llvm::cast<llvm::Function>(alloc_fn), {c64(64), c64(bytes)}, "arena");
      auto* fail = llvm::BasicBlock::Create(ctx_, "no_memory", fn_);
      auto* ok = llvm::BasicBlock::Create(ctx_, "run", fn_);
      b_.CreateCondBr(b_.CreateIsNull(arena), fail, ok);
      b_.SetInsertPoint(fail);
      b_.CreateRet(b_.getInt32(1));
      b_.SetInsertPoint(ok);
    }
    arena_ = arena;
    threads_ = emit_thread_count(name);

    // Buffers: arguments for leaves, the arena for the rest, the input's for views.
    buf_.assign(g_.size(), nullptr);
    std::size_t arg = 0;
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      const Node& n = g_.node(id);
      const auto i = static_cast<std::size_t>(id);
      if (n.op == Op::input || n.op == Op::param)
        buf_[i] = fn_->getArg(static_cast<unsigned>(arg++));
      else if (is_view(n.op))
        buf_[i] = buf_[static_cast<std::size_t>(n.inputs[0])];
      else
        buf_[i] = block(plan_.alloc[i]);
    }
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) emit_node(id);
    for (const auto& o : g_.outputs()) {
      const auto i = static_cast<std::size_t>(o.node);
      const auto bytes = static_cast<std::uint64_t>(numel(plan_.shape[i])) * element_bytes(g_.node(o.node).dtype);
      if (bytes > 0)
        b_.CreateMemCpy(fn_->getArg(static_cast<unsigned>(arg)), llvm::MaybeAlign(1), buf_[i], llvm::MaybeAlign(1),
                        bytes);
      ++arg;
    }
    if (plan_.arena_bytes > 0) b_.CreateCall(llvm::cast<llvm::Function>(free_fn), {arena_});
    b_.CreateRet(b_.getInt32(0));

    // The packed entry: args[i] → argument i.
    auto* packed = llvm::Function::Create(llvm::FunctionType::get(i32_, {ptr_}, false),
                                          llvm::GlobalValue::ExternalLinkage, name + "_packed", m_);
    attributes(packed);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", packed));
    std::vector<llvm::Value*> args;
    for (std::size_t k = 0; k < sig_.args.size(); ++k)
      args.push_back(b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, packed->getArg(0), k), sig_.args[k].c_name));
    b_.CreateRet(b_.CreateCall(fn_, args));

    // Only the two entry points are visible from outside.
    for (llvm::Function& f : m_)
      if (!f.isDeclaration() && &f != fn_ && &f != packed &&
          std::find(exported_.begin(), exported_.end(), &f) == exported_.end())
        f.setLinkage(llvm::GlobalValue::InternalLinkage);
  }

 private:
  // --- helpers --------------------------------------------------------------------------------
  llvm::Value* c64(std::int64_t v) { return ir::i64c(b_, v); }
  llvm::Type* elem(const Node& n) { return n.dtype == DType::boolean ? i8_ : f32_; }
  const Shape& shape(int id) const { return plan_.shape[static_cast<std::size_t>(id)]; }
  llvm::Value* buf(int id) const { return buf_[static_cast<std::size_t>(id)]; }
  llvm::Value* block(int k) {
    return b_.CreateConstGEP1_64(i8_, arena_, plan_.allocs[static_cast<std::size_t>(k)].offset);
  }

  void attributes(llvm::Function* f) {
    f->addFnAttr(llvm::Attribute::NoUnwind);
    f->addFnAttr("target-cpu", target_.cpu);
    if (!features_.empty()) f->addFnAttr("target-features", features_);
  }

  llvm::Value* load(llvm::Type* t, llvm::Value* base, llvm::Value* offset) {
    return b_.CreateLoad(t, b_.CreateGEP(t, base, offset));
  }
  void store(llvm::Value* v, llvm::Value* base, llvm::Value* offset) {
    b_.CreateStore(v, b_.CreateGEP(v->getType(), base, offset));
  }
  llvm::Value* to_bool(llvm::Value* byte) { return b_.CreateICmpNE(byte, b_.getInt8(0)); }
  llvm::Constant* neg_inf() { return llvm::ConstantFP::getInfinity(f32_, true); }

  llvm::Function* callee(const std::string& name) {
    llvm::Function* f = m_.getFunction(name);
    if (!f) throw std::logic_error("qkv internal error: aot: kernel `" + name + "` was not emitted");
    return f;
  }
  llvm::Function* rowwise(const char* name) {
    if (!rowwise_emitted_) {
      emit_rowwise_kernels(m_, target_);
      rowwise_emitted_ = true;
    }
    return callee(name);
  }

  using Values = std::vector<llvm::Value*>;
  using Body = std::function<void(const Values& idx, const Values& offsets)>;

  /// Loops over `dims` (outermost first); offsets[k] = bases[k] + Σ idx[d]·strides[k][d]. The
  /// innermost loop is left to the optimiser to vectorise and unroll.
  void nest(const Shape& dims, const std::vector<Shape>& strides, const Shape& bases, const Body& body) {
    Values idx, off;
    for (auto base : bases) off.push_back(c64(base));
    nest_from(0, dims, strides, idx, off, body);
  }
  void nest_from(std::size_t d, const Shape& dims, const std::vector<Shape>& strides, Values& idx, const Values& off,
                 const Body& body) {
    if (d == dims.size()) {
      body(idx, off);
      return;
    }
    ir::emit_loop(
        b_, c64(0), c64(dims[d]), 1,
        [&](llvm::Value* i) {
          Values next = off;
          for (std::size_t k = 0; k < strides.size(); ++k)
            if (strides[k][d] != 0) next[k] = b_.CreateAdd(off[k], b_.CreateMul(i, c64(strides[k][d])));
          idx.push_back(i);
          nest_from(d + 1, dims, strides, idx, next, body);
          idx.pop_back();
        },
        "d" + std::to_string(d), d + 1 == dims.size() ? ir::Unroll::allowed : ir::Unroll::as_written);
  }

  /// out[idx] = f(in_k[idx read through strides_k]) for an output of `id`'s shape (contiguous).
  void map(int id, const std::vector<int>& inputs, const std::vector<Shape>& in_strides,
           const std::function<llvm::Value*(const Values& idx, const Values& in)>& f) {
    const Node& n = g_.node(id);
    std::vector<Shape> strides{strides_of(shape(id))};
    for (const auto& s : in_strides) strides.push_back(s);
    nest(shape(id), strides, Shape(strides.size(), 0), [&](const Values& idx, const Values& off) {
      Values in;
      for (std::size_t k = 0; k < inputs.size(); ++k)
        in.push_back(load(elem(g_.node(inputs[k])), buf(inputs[k]), off[k + 1]));
      store(f(idx, in), buf(id), off[0]);
    });
    (void)n;
  }

  // --- threads (aot_threads.hpp) ---------------------------------------------------------------

  /// The thread count for this call (an i32 in the entry function); adds <name>_set_threads.
  llvm::Value* emit_thread_count(const std::string& name) {
    llvm::Function* set = nullptr;
    llvm::Value* t = emit_thread_setting(b_, name, [this](llvm::Function* f) { attributes(f); }, &set);
    exported_.push_back(set);
    return t;
  }

  /// qkv_parallel (aot_threads.hpp), emitted on first use.
  llvm::Function* parallel_runtime() {
    if (!parallel_) parallel_ = emit_parallel_runtime(m_, [this](llvm::Function* f) { attributes(f); });
    return parallel_;
  }

  using TaskBody = std::function<void(llvm::Value* i, const Values& captured)>;

  /// body(i, captured) for i in [0, n): inline on the calling thread when there is one task or
  /// less than about a million flops of work (`work`), else through qkv_parallel. The body may
  /// use only `captured` (values of the entry function reach it through a context struct) and
  /// constants.
  void parallel_for(std::int64_t n, double work, const Values& captured, const TaskBody& body) {
    if (n <= 0) return;
    if (n == 1 || work < 1e6) {
      ir::emit_loop(b_, c64(0), c64(n), 1, [&](llvm::Value* i) { body(i, captured); }, "tasks");
      return;
    }
    std::vector<llvm::Type*> types;
    for (llvm::Value* v : captured) types.push_back(v->getType());
    auto* ctx_type = llvm::StructType::get(ctx_, types);
    llvm::Value* ctx = ir::entry_alloca(b_, ctx_type, 1, 8, "task_ctx");
    for (unsigned f = 0; f < captured.size(); ++f) b_.CreateStore(captured[f], b_.CreateStructGEP(ctx_type, ctx, f));

    auto* task = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_}, false),
                                        llvm::GlobalValue::InternalLinkage, "qkv_task", m_);
    attributes(task);
    const llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
    llvm::Function* saved_fn = fn_;
    fn_ = task;
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", task));
    Values loaded;
    for (unsigned f = 0; f < captured.size(); ++f)
      loaded.push_back(b_.CreateLoad(types[f], b_.CreateStructGEP(ctx_type, task->getArg(0), f)));
    body(task->getArg(1), loaded);
    b_.CreateRetVoid();
    fn_ = saved_fn;
    b_.restoreIP(saved);
    b_.CreateCall(parallel_runtime(), {task, ctx, c64(n), threads_});
  }

  /// fn(begin, end, captured) over [0, total) in blocks of at least `grain` units (a multiple
  /// of `align`), about 32 blocks in all, in parallel when the work is worth it.
  void parallel_ranges(std::int64_t total, std::int64_t grain, std::int64_t align, double work_per_unit,
                       const Values& captured,
                       const std::function<void(llvm::Value*, llvm::Value*, const Values&)>& fn) {
    if (total <= 0) return;
    std::int64_t block = std::max<std::int64_t>(grain, (total + 31) / 32);
    block = (block + align - 1) / align * align;
    const std::int64_t tasks = (total + block - 1) / block;
    parallel_for(tasks, work_per_unit * static_cast<double>(total), captured, [&](llvm::Value* t, const Values& cap) {
      llvm::Value* begin = b_.CreateMul(t, c64(block));
      llvm::Value* end = b_.CreateAdd(begin, c64(block));
      end = b_.CreateSelect(b_.CreateICmpSLT(end, c64(total)), end, c64(total));
      fn(begin, end, cap);
    });
  }

  // --- nodes ----------------------------------------------------------------------------------
  void emit_node(int id) {
    const Node& n = g_.node(id);
    switch (n.op) {
      case Op::input:
      case Op::param:
      case Op::split:
      case Op::merge:
      case Op::rename:
      case Op::view:
      case Op::attention_weights:  // written by its fused node
        return;
      case Op::permute:
      case Op::broadcast: {
        const Node& x = g_.node(n.inputs[0]);
        map(id, {n.inputs[0]}, {strides_by_name(n.axes, x.axes, shape(n.inputs[0]))},
            [](const Values&, const Values& in) { return in[0]; });
        return;
      }
      case Op::slice:
        return emit_slice(id);
      case Op::concat:
        return emit_concat(id);
      case Op::fill: {
        const double v = n.dtype == DType::boolean ? (n.scalar != 0.0 ? 1.0 : 0.0) : n.scalar;
        llvm::Value* c = n.dtype == DType::boolean ? static_cast<llvm::Value*>(b_.getInt8(v != 0.0 ? 1 : 0))
                                                   : llvm::ConstantFP::get(f32_, v);
        map(id, {}, {}, [&](const Values&, const Values&) { return c; });
        return;
      }
      case Op::add:
      case Op::mul:
      case Op::bias:
      case Op::keep_mask:
        return emit_broadcasting(id);
      case Op::scale: {
        double factor = n.scalar;
        if (n.dim) {
          const auto d = n.dim->resolve(sizes_);
          if (!d) throw ShapeError("aot: the scale's extent " + n.dim->str() + " is not bound; give its size");
          factor = 1.0 / std::sqrt(static_cast<double>(*d));
        }
        llvm::Value* f = llvm::ConstantFP::get(f64_, factor);
        map(id, {n.inputs[0]}, {strides_of(shape(id))}, [&](const Values&, const Values& in) {
          return b_.CreateFPTrunc(b_.CreateFMul(b_.CreateFPExt(in[0], f64_), f), f32_);
        });
        return;
      }
      case Op::causal: {
        const auto& axes = g_.node(n.inputs[0]).axes;
        const std::size_t pq = axis_pos(axes, n.attr_axes[0]), pk = axis_pos(axes, n.attr_axes[1]);
        const Shape& s = shape(n.inputs[0]);
        const std::int64_t shift = n.align == CausalAlign::bottom_right ? s[pk] - s[pq] : 0;
        map(id, {n.inputs[0]}, {strides_of(s)}, [&, pq, pk, shift](const Values& idx, const Values& in) {
          llvm::Value* hidden = b_.CreateICmpSGT(idx[pk], b_.CreateAdd(idx[pq], c64(shift)));
          return b_.CreateSelect(hidden, neg_inf(), in[0]);
        });
        return;
      }
      case Op::dropout:
        return emit_dropout(id);
      case Op::relu:
      case Op::gelu: {
        llvm::Function* kernel = rowwise(n.op == Op::relu ? "qkv_relu" : "qkv_gelu");
        parallel_ranges(numel(shape(id)), 16384, 64, n.op == Op::relu ? 1.0 : 30.0, {buf(n.inputs[0]), buf(id)},
                        [&](llvm::Value* i0, llvm::Value* i1, const Values& cap) {
                          b_.CreateCall(kernel, {cap[0], cap[1], i0, i1});
                        });
        return;
      }
      case Op::softmax:
        return emit_softmax(id);
      case Op::layer_norm:
        return emit_layer_norm(id);
      case Op::linear:
        return util::linear_on_last_axis(g_, n) ? emit_gemm(id) : emit_linear_strided(id);
      case Op::contract:
        return emit_contract(id);
      case Op::fused_attention:
        return emit_attention(id);
    }
    throw std::logic_error("qkv internal error: aot: op " + std::string(op_name(n.op)) + " has no lowering");
  }

  void emit_slice(int id) {
    const Node& n = g_.node(id);
    const auto& in_axes = g_.node(n.inputs[0]).axes;
    const std::size_t p = axis_pos(in_axes, n.attr_axes[0]);
    const Shape in_strides = strides_of(shape(n.inputs[0]));
    const std::int64_t start = n.offset * shape(id)[p];
    std::vector<Shape> strides{strides_of(shape(id)), in_strides};
    nest(shape(id), strides, {0, start * in_strides[p]},
         [&](const Values&, const Values& off) { store(load(elem(n), buf(n.inputs[0]), off[1]), buf(id), off[0]); });
  }

  void emit_concat(int id) {
    const Node& n = g_.node(id);
    const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
    const Shape out_strides = strides_of(shape(id));
    std::int64_t at = 0;
    for (int part : n.inputs) {
      const Shape& s = shape(part);
      nest(s, {out_strides, strides_of(s)}, {at * out_strides[p], 0},
           [&](const Values&, const Values& off) { store(load(elem(n), buf(part), off[1]), buf(id), off[0]); });
      at += s[p];
    }
  }

  void emit_broadcasting(int id) {
    const Node& n = g_.node(id);
    const Node &x = g_.node(n.inputs[0]), &y = g_.node(n.inputs[1]);
    const std::int64_t count = numel(shape(id));
    if (n.op == Op::add && same_axes(x.axes, y.axes) && shape(n.inputs[0]) == shape(n.inputs[1])) {
      llvm::Function* kernel = rowwise("qkv_add");
      parallel_ranges(count, 16384, 64, 1.0, {buf(n.inputs[0]), buf(n.inputs[1]), buf(id)},
                      [&](llvm::Value* i0, llvm::Value* i1, const Values& cap) {
                        b_.CreateCall(kernel, {cap[0], cap[1], cap[2], i0, i1});
                      });
      return;
    }
    const Op op = n.op;
    map(id, {n.inputs[0], n.inputs[1]},
        {strides_of(shape(n.inputs[0])), strides_by_name(x.axes, y.axes, shape(n.inputs[1]))},
        [this, op](const Values&, const Values& in) -> llvm::Value* {
          switch (op) {
            case Op::mul:
              return b_.CreateFMul(in[0], in[1]);
            case Op::keep_mask:
              return b_.CreateSelect(to_bool(in[1]), in[0], neg_inf());
            default:
              return b_.CreateFAdd(in[0], in[1]);
          }
        });
  }

  /// keep iff dropout_keep(p, seed, batch, head, row, col), the interpreter's index convention:
  /// col = last index, row = second to last, batch = first (rank >= 3), head = the flattened
  /// index over the axes in between.
  void emit_dropout(int id) {
    const Node& n = g_.node(id);
    const double p = n.scalar;
    if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("aot: dropout probability must be in [0, 1)");
    const Shape& s = shape(id);
    const std::size_t rank = s.size();
    llvm::Value* seed = c64(static_cast<std::int64_t>(n.seed));
    llvm::Value* keep_scale = llvm::ConstantFP::get(f64_, 1.0 / (1.0 - p));
    map(id, {n.inputs[0]}, {strides_of(s)}, [&](const Values& idx, const Values& in) -> llvm::Value* {
      if (p == 0.0) return in[0];
      auto i32 = [&](llvm::Value* v) { return b_.CreateTrunc(v, i32_); };
      llvm::Value* zero = b_.getInt32(0);
      llvm::Value* col = rank >= 1 ? i32(idx[rank - 1]) : zero;
      llvm::Value* row = rank >= 2 ? i32(idx[rank - 2]) : zero;
      llvm::Value* batch = rank >= 3 ? i32(idx[0]) : zero;
      llvm::Value* head = c64(0);
      for (std::size_t k = 1; k + 2 < rank; ++k) head = b_.CreateAdd(b_.CreateMul(head, c64(s[k])), idx[k]);
      llvm::Value* keep = emit_dropout_keep(b_, p, seed, batch, i32(head), row, col);
      llvm::Value* scaled = b_.CreateFPTrunc(b_.CreateFMul(b_.CreateFPExt(in[0], f64_), keep_scale), f32_);
      return b_.CreateSelect(keep, scaled, llvm::ConstantFP::get(f32_, 0.0));
    });
  }

  /// The shape around axis p as (outer, n, inner): element (o, k, i) at (o·n + k)·inner + i.
  struct Around {
    std::int64_t outer = 1, n = 1, inner = 1;
  };
  static Around around(const Shape& s, std::size_t p) {
    Around r;
    for (std::size_t k = 0; k < p; ++k) r.outer *= s[k];
    r.n = s[p];
    for (std::size_t k = p + 1; k < s.size(); ++k) r.inner *= s[k];
    return r;
  }

  /// Calls body(base) for every (o, i) with base = o·n·inner + i: the start of one line along p.
  void lines(const Around& r, const std::function<void(llvm::Value* base)>& body) {
    nest({r.outer, r.inner}, {{r.n * r.inner, 1}}, {0}, [&](const Values&, const Values& off) { body(off[0]); });
  }

  /// Σ over k in [0, n) of f(k), in double.
  llvm::Value* sum(std::int64_t n, const std::function<llvm::Value*(llvm::Value* k)>& f) {
    return ir::emit_loop(
        b_, c64(0), c64(n), 1, {llvm::ConstantFP::get(f64_, 0.0)},
        [&](llvm::Value* k, const Values& acc) -> Values { return {b_.CreateFAdd(acc[0], f(k))}; }, "sum",
        ir::Unroll::allowed)[0];
  }

  /// softmax along attr_axes[0], max-subtracted, sums in double; a row with no visible key (all
  /// −inf) is zeros.
  void emit_softmax(int id) {
    const Node& n = g_.node(id);
    const Around r = around(shape(id), axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
    llvm::Value *x = buf(n.inputs[0]), *y = buf(id);
    lines(r, [&](llvm::Value* base) {
      auto at = [&](llvm::Value* k) { return b_.CreateAdd(base, b_.CreateMul(k, c64(r.inner))); };
      llvm::Value* m = ir::emit_loop(
          b_, c64(0), c64(r.n), 1, {neg_inf()},
          [&](llvm::Value* k, const Values& cur) -> Values {
            llvm::Value* v = load(f32_, x, at(k));
            // v > m, or v is NaN: NaN wins, as in the interpreter.
            return {b_.CreateSelect(b_.CreateFCmpUGT(v, cur[0]), v, cur[0])};
          },
          "max")[0];
      auto* visible = llvm::BasicBlock::Create(ctx_, "visible", fn_);
      auto* hidden = llvm::BasicBlock::Create(ctx_, "hidden", fn_);
      auto* done = llvm::BasicBlock::Create(ctx_, "done", fn_);
      b_.CreateCondBr(b_.CreateFCmpOEQ(m, neg_inf()), hidden, visible);
      b_.SetInsertPoint(hidden);
      ir::emit_loop(
          b_, c64(0), c64(r.n), 1, [&](llvm::Value* k) { store(llvm::ConstantFP::get(f32_, 0.0), y, at(k)); }, "zero");
      b_.CreateBr(done);
      b_.SetInsertPoint(visible);
      llvm::Value* total = sum(r.n, [&](llvm::Value* k) {
        llvm::Value* e = emit_exp(b_, b_.CreateFSub(load(f32_, x, at(k)), m));
        store(e, y, at(k));
        return b_.CreateFPExt(e, f64_);
      });
      llvm::Value* inv = b_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), total);
      ir::emit_loop(
          b_, c64(0), c64(r.n), 1,
          [&](llvm::Value* k) {
            llvm::Value* e = b_.CreateFPExt(load(f32_, y, at(k)), f64_);
            store(b_.CreateFPTrunc(b_.CreateFMul(e, inv), f32_), y, at(k));
          },
          "norm", ir::Unroll::allowed);
      b_.CreateBr(done);
      b_.SetInsertPoint(done);
    });
  }

  /// layer norm along attr_axes[0] (biased variance, eps inside the square root): the row-wise
  /// kernel when that axis is the contiguous one, a loop nest in double otherwise.
  void emit_layer_norm(int id) {
    const Node& n = g_.node(id);
    const Shape& s = shape(id);
    const double eps = n.scalar;
    llvm::Value *x = buf(n.inputs[0]), *gamma = buf(n.inputs[1]), *beta = buf(n.inputs[2]), *y = buf(id);
    if (util::layer_norm_on_last_axis(g_, n)) {
      const std::int64_t len = s.back(), rows = len > 0 ? numel(s) / len : 0;
      llvm::Function* kernel = rowwise("qkv_layer_norm");
      parallel_ranges(
          rows, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(len, 1)), 1, 8.0 * static_cast<double>(len),
          {x, gamma, beta, y}, [&](llvm::Value* r0, llvm::Value* r1, const Values& cap) {
            b_.CreateCall(kernel, {cap[0], cap[1], cap[2], cap[3], c64(len), llvm::ConstantFP::get(f32_, eps), r0, r1});
          });
      return;
    }
    const Around r = around(s, axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
    lines(r, [&](llvm::Value* base) {
      auto at = [&](llvm::Value* k) { return b_.CreateAdd(base, b_.CreateMul(k, c64(r.inner))); };
      auto xd = [&](llvm::Value* k) { return b_.CreateFPExt(load(f32_, x, at(k)), f64_); };
      llvm::Value* count = llvm::ConstantFP::get(f64_, static_cast<double>(r.n));
      llvm::Value* mean = b_.CreateFDiv(sum(r.n, xd), count);
      llvm::Value* var = b_.CreateFDiv(sum(r.n,
                                           [&](llvm::Value* k) {
                                             llvm::Value* d = b_.CreateFSub(xd(k), mean);
                                             return b_.CreateFMul(d, d);
                                           }),
                                       count);
      llvm::Value* inv_std = b_.CreateFDiv(
          llvm::ConstantFP::get(f64_, 1.0),
          b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, b_.CreateFAdd(var, llvm::ConstantFP::get(f64_, eps))));
      ir::emit_loop(
          b_, c64(0), c64(r.n), 1,
          [&](llvm::Value* k) {
            llvm::Value* v = b_.CreateFMul(b_.CreateFSub(xd(k), mean), inv_std);
            v = b_.CreateFAdd(b_.CreateFMul(v, b_.CreateFPExt(load(f32_, gamma, k), f64_)),
                              b_.CreateFPExt(load(f32_, beta, k), f64_));
            store(b_.CreateFPTrunc(v, f32_), y, at(k));
          },
          "ln", ir::Unroll::allowed);
    });
  }

  /// linear over a non-contiguous axis: y[o, j, c] = Σ_i x[o, i, c]·W[j, i] + b[j], in double.
  void emit_linear_strided(int id) {
    const Node& n = g_.node(id);
    const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
    const Around r = around(shape(n.inputs[0]), p);
    const Shape& w = shape(n.inputs[1]);
    const std::int64_t n_out = w[0], n_in = w[1];
    llvm::Value *x = buf(n.inputs[0]), *wt = buf(n.inputs[1]), *y = buf(id);
    llvm::Value* bias = n.inputs.size() > 2 ? buf(n.inputs[2]) : nullptr;
    nest({r.outer, n_out, r.inner}, {{n_out * r.inner, r.inner, 1}, {n_in * r.inner, 0, 1}, {0, n_in, 0}}, {0, 0, 0},
         [&](const Values& idx, const Values& off) {
           llvm::Value* acc = sum(n_in, [&](llvm::Value* i) {
             llvm::Value* xv = load(f32_, x, b_.CreateAdd(off[1], b_.CreateMul(i, c64(r.inner))));
             llvm::Value* wv = load(f32_, wt, b_.CreateAdd(off[2], i));
             return b_.CreateFMul(b_.CreateFPExt(xv, f64_), b_.CreateFPExt(wv, f64_));
           });
           if (bias) acc = b_.CreateFAdd(acc, b_.CreateFPExt(load(f32_, bias, idx[1]), f64_));
           store(b_.CreateFPTrunc(acc, f32_), y, off[0]);
         });
  }

  /// contract: out[o] = Σ_c lhs[o, c]·rhs[o, c], axes matched by name, in double.
  void emit_contract(int id) {
    const Node& n = g_.node(id);
    const Node &ln = g_.node(n.inputs[0]), &rn = g_.node(n.inputs[1]);
    std::vector<Axis> contracted;
    Shape c_shape;
    for (const auto& c : n.attr_axes) {
      contracted.push_back({c, Extent::fixed(0)});
      c_shape.push_back(shape(n.inputs[0])[axis_pos(ln.axes, c)]);
    }
    const Shape l_out = strides_by_name(n.axes, ln.axes, shape(n.inputs[0]));
    const Shape r_out = strides_by_name(n.axes, rn.axes, shape(n.inputs[1]));
    const Shape l_c = strides_by_name(contracted, ln.axes, shape(n.inputs[0]));
    const Shape r_c = strides_by_name(contracted, rn.axes, shape(n.inputs[1]));
    llvm::Value *lhs = buf(n.inputs[0]), *rhs = buf(n.inputs[1]), *y = buf(id);
    nest(shape(id), {strides_of(shape(id)), l_out, r_out}, {0, 0, 0}, [&](const Values&, const Values& off) {
      llvm::Value* acc_slot = ir::entry_alloca(b_, f64_, 1, 8, "acc");
      b_.CreateStore(llvm::ConstantFP::get(f64_, 0.0), acc_slot);
      Values inner_idx;
      nest(c_shape, {l_c, r_c}, {0, 0}, [&](const Values&, const Values& c_off) {
        llvm::Value* lv = load(f32_, lhs, b_.CreateAdd(off[1], c_off[0]));
        llvm::Value* rv = load(f32_, rhs, b_.CreateAdd(off[2], c_off[1]));
        llvm::Value* prod = b_.CreateFMul(b_.CreateFPExt(lv, f64_), b_.CreateFPExt(rv, f64_));
        b_.CreateStore(b_.CreateFAdd(b_.CreateLoad(f64_, acc_slot), prod), acc_slot);
      });
      store(b_.CreateFPTrunc(b_.CreateLoad(f64_, acc_slot), f32_), y, off[0]);
    });
  }

  /// y[M, N] = x[M, K]·W[N, K]ᵀ + b on the GEMM kernel: Bᵀ packed into panels of NR columns
  /// (zero-padded), the bias padded alike, then row blocks × panel blocks as run_linear makes
  /// them for one thread.
  void emit_gemm(int id) {
    const Node& n = g_.node(id);
    const Shape& w = shape(n.inputs[1]);
    const std::int64_t nn = w[0], k = w[1], m = k > 0 ? numel(shape(n.inputs[0])) / k : 0;
    llvm::Value *x = buf(n.inputs[0]), *wt = buf(n.inputs[1]), *y = buf(id);
    llvm::Value* bias = n.inputs.size() > 2 ? buf(n.inputs[2]) : nullptr;
    if (m == 0 || nn == 0) return;
    if (k == 0) {  // an empty sum: the bias alone
      nest({m, nn}, {{nn, 1}}, {0}, [&](const Values& idx, const Values& off) {
        store(bias ? load(f32_, bias, idx[1]) : llvm::ConstantFP::get(f32_, 0.0), y, off[0]);
      });
      return;
    }
    if (!gemm_) {
      gemm_cfg_ = choose_gemm_config(GemmSpec{}, target_);
      emit_gemm_kernel(m_, gemm_cfg_, "qkv_gemm");
      gemm_ = callee("qkv_gemm");
    }
    const std::int64_t nr = gemm_cfg_.cols(), mr = gemm_cfg_.rows, panels = (nn + nr - 1) / nr;
    const auto [packed_k, bias_k] = plan_.gemm.at(id);
    llvm::Value *packed = block(packed_k), *bias_pad = block(bias_k);
    // bp[(p·K + kk)·NR + r] = W[p·NR + r][kk]; zeros past N.
    if (nn % nr != 0)
      b_.CreateMemSet(packed, b_.getInt8(0), static_cast<std::uint64_t>(panels * k * nr) * 4, llvm::MaybeAlign(64));
    const std::int64_t full = nn / nr;
    if (full > 0)
      nest({full, k, nr}, {{k * nr, nr, 1}, {nr * k, 1, k}}, {0, 0},
           [&](const Values&, const Values& off) { store(load(f32_, wt, off[1]), packed, off[0]); });
    if (nn % nr != 0)
      nest({k, nn % nr}, {{nr, 1}, {1, k}}, {full * k * nr, full * nr * k},
           [&](const Values&, const Values& off) { store(load(f32_, wt, off[1]), packed, off[0]); });
    b_.CreateMemSet(bias_pad, b_.getInt8(0), static_cast<std::uint64_t>(panels * nr) * 4, llvm::MaybeAlign(64));
    if (bias)
      b_.CreateMemCpy(bias_pad, llvm::MaybeAlign(4), bias, llvm::MaybeAlign(4), static_cast<std::uint64_t>(nn) * 4);

    auto* args_type = llvm::StructType::get(ctx_, {ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_});
    llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "gemm_args");
    const Values fields{x, packed, bias_pad, y, c64(m), c64(nn), c64(k)};
    for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
    // Blocks as run_linear makes them for four workers (enough tasks that up to a few threads
    // finish together; few enough that each reuses its packed A and B).
    constexpr std::int64_t kWant = 32;
    std::int64_t mc = (m + kWant - 1) / kWant;
    mc = std::clamp<std::int64_t>((mc + mr - 1) / mr * mr, mr, 8 * mr);
    const std::int64_t mblocks = (m + mc - 1) / mc;
    std::int64_t panels_per = std::min<std::int64_t>(panels, std::max<std::int64_t>(1, 512 / nr));
    if (mblocks * ((panels + panels_per - 1) / panels_per) < kWant) {
      const std::int64_t nb = std::min<std::int64_t>(panels, (kWant + mblocks - 1) / mblocks);
      panels_per = (panels + nb - 1) / nb;
    }
    const std::int64_t nblocks = (panels + panels_per - 1) / panels_per;
    llvm::Function* kernel = gemm_;
    parallel_for(mblocks * nblocks, 2.0 * static_cast<double>(m) * static_cast<double>(nn) * static_cast<double>(k),
                 {args}, [&](llvm::Value* t, const Values& cap) {
                   auto min = [&](llvm::Value* a, std::int64_t v) {
                     return b_.CreateSelect(b_.CreateICmpSLT(a, c64(v)), a, c64(v));
                   };
                   llvm::Value* m0 = b_.CreateMul(b_.CreateSDiv(t, c64(nblocks)), c64(mc));
                   llvm::Value* n0 = b_.CreateMul(b_.CreateSRem(t, c64(nblocks)), c64(panels_per * nr));
                   b_.CreateCall(kernel, {cap[0], m0, min(b_.CreateAdd(m0, c64(mc)), m), n0,
                                          min(b_.CreateAdd(n0, c64(panels_per * nr)), nn)});
                 });
  }

  void emit_attention(int id) {
    const FusedAttentionCall call = describe_fused_attention(g_, id, sizes_);
    const AttentionSpec& spec = call.spec;
    if (spec.dk < 1 || spec.dv < 1 || spec.hq < 1 || spec.hkv < 1 || spec.hq % spec.hkv != 0)
      throw std::invalid_argument("aot: fused attention with dk " + std::to_string(spec.dk) + ", dv " +
                                  std::to_string(spec.dv) + ", " + std::to_string(spec.hq) + " query heads over " +
                                  std::to_string(spec.hkv) + " key/value heads cannot be compiled");
    if (!(spec.dropout_p >= 0.0 && spec.dropout_p < 1.0))
      throw std::invalid_argument("aot: dropout probability must be in [0, 1)");
    if (call.batch == 0 || call.len_q == 0) return;
    const Node& n = g_.node(id);
    const KernelConfig cfg = choose_kernel_config(spec, target_);
    const std::string name = "qkv_attention_" + std::to_string(id);
    emit_attention_kernel(m_, spec, cfg, name);
    llvm::Function* kernel = callee(name);

    llvm::Value* bias = llvm::ConstantPointerNull::get(ptr_);
    if (!call.bias_terms.empty()) {
      bias = block(plan_.bias.at(id));
      b_.CreateMemSet(bias, b_.getInt8(0), static_cast<std::uint64_t>(call.len_q * call.len_k) * 4,
                      llvm::MaybeAlign(64));
      for (const auto& term : call.bias_terms) {
        const int mask = n.inputs[static_cast<std::size_t>(term.input)];
        llvm::Type* t = elem(g_.node(mask));
        const bool keep = term.keep_mask;
        nest({call.len_q, call.len_k}, {{call.len_k, 1}, {term.stride_q, term.stride_k}}, {0, 0},
             [&](const Values&, const Values& off) {
               llvm::Value* cur = load(f32_, bias, off[0]);
               llvm::Value* v = load(t, buf(mask), off[1]);
               store(keep ? b_.CreateSelect(to_bool(v), cur, neg_inf()) : b_.CreateFAdd(cur, v), bias, off[0]);
             });
      }
    }
    llvm::Value* keep = call.key_padding_input >= 0 ? buf(n.inputs[static_cast<std::size_t>(call.key_padding_input)])
                                                    : llvm::ConstantPointerNull::get(ptr_);
    llvm::Value* weights = spec.write_weights ? block(plan_.weights.at(id)) : llvm::ConstantPointerNull::get(ptr_);

    // AttentionArgs, field by field (attention.hpp: its layout is the kernel ABI).
    auto* args_type = llvm::StructType::get(ctx_, {ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_, i64_});
    llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "attention_args");
    const Values fields{buf(n.inputs[0]),
                        buf(n.inputs[1]),
                        buf(n.inputs[2]),
                        buf(id),
                        weights,
                        keep,
                        bias,
                        c64(call.batch),
                        c64(call.len_q),
                        c64(call.len_k),
                        c64(static_cast<std::int64_t>(call.seed))};
    for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
    // Tasks (batch, head, block of query rows), the block index outermost and, when causal,
    // descending: the heaviest blocks (most keys visible) are handed out first.
    const std::int64_t rows = cfg.query_rows(), blocks = (call.len_q + rows - 1) / rows;
    const std::int64_t bh = call.batch * spec.hq;
    const double work = 2.0 * static_cast<double>(bh * call.len_q * call.len_k * (spec.dk + spec.dv));
    const bool heavy_first = spec.causal;
    parallel_for(bh * blocks, work, {args}, [&](llvm::Value* t, const Values& cap) {
      llvm::Value* blk = b_.CreateSDiv(t, c64(bh));
      if (heavy_first) blk = b_.CreateSub(c64(blocks - 1), blk);
      llvm::Value* r = b_.CreateSRem(t, c64(bh));
      b_.CreateCall(kernel, {cap[0], b_.CreateSDiv(r, c64(spec.hq)), b_.CreateSRem(r, c64(spec.hq)),
                             b_.CreateMul(blk, c64(rows))});
    });
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const Graph& g_;
  const Bindings& sizes_;
  const AotSignature& sig_;
  const AotPlan& plan_;
  const HostTarget& target_;
  std::string features_;
  llvm::Type *f32_ = nullptr, *f64_ = nullptr, *i8_ = nullptr, *i32_ = nullptr, *i64_ = nullptr;
  llvm::PointerType* ptr_ = nullptr;
  llvm::Function* fn_ = nullptr;
  llvm::Value* arena_ = nullptr;
  std::vector<llvm::Value*> buf_;
  bool rowwise_emitted_ = false;
  llvm::Function* gemm_ = nullptr;
  GemmConfig gemm_cfg_;
  llvm::Value* threads_ = nullptr;  // i32, this call's thread count
  llvm::Function* parallel_ = nullptr;
  std::vector<llvm::Function*> exported_;  // besides the entry points: <function>_set_threads
};

}  // namespace

std::unique_ptr<llvm::Module> build_aot_module(llvm::LLVMContext& context, const Graph& lowered, const Bindings& sizes,
                                               const AotSignature& signature, const AotPlan& plan,
                                               const HostTarget& target, const std::string& function) {
  auto module = std::make_unique<llvm::Module>(function, context);
  AotEmitter(*module, lowered, sizes, signature, plan, target).emit(function);
  return module;
}

}  // namespace qkv::codegen::cpu
