// The CPU code generator: one LLVM module for a whole lowered graph (module_builder.hpp).
//
//   i32 <f>_entry(const i64* sizes, void* const* args, i32 threads)
//     load the dynamic sizes; check them (2 when invalid)
//     arena = aligned_alloc(64, its size for these sizes) (1 when that fails)
//     for each node, in graph order: its code, reading its inputs' buffers, writing its own
//     copy the outputs not computed in place into their arguments; free(arena); return 0
//
// Every size is an ir::Int: a constant when the size is fixed (the builder folds the arithmetic,
// so specialised code has the constants a specialising compiler would write), a run-time value
// otherwise. Values live in the arena slots plan_module chose; leaves are the arguments, views
// share their input's buffer, and outputs are computed in place where they can be. Kernels
// (attention, GEMM, row-wise) are emitted into the same module with internal linkage.
#include "cpu/module/module_builder.hpp"

#include <algorithm>
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

#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/lowering/storage.hpp>

#include "cpu/kernels/attention_kernel.hpp"
#include "cpu/kernels/gemm_kernel.hpp"
#include "cpu/kernels/rowwise_kernel.hpp"
#include "cpu/module/threads_ir.hpp"
#include "cpu/schedule.hpp"
#include "llvm/ir_int.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/mod_ir.hpp"
#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"
#include "lowering/graph_util.hpp"

namespace qkv::codegen::cpu {

namespace {

using util::axis_pos;
using I = ir::Int;
using Dims = std::vector<I>;
using Values = std::vector<llvm::Value*>;

class ModuleBuilder {
 public:
  ModuleBuilder(llvm::Module& module, const Graph& g, const AotSignature& sig, const ModulePlan& plan,
                const HostTarget& target)
      : m_(module), ctx_(module.getContext()), b_(ctx_), g_(g), sig_(sig), plan_(plan), target_(target) {
    f32_ = b_.getFloatTy();
    f64_ = b_.getDoubleTy();
    i8_ = b_.getInt8Ty();
    i32_ = b_.getInt32Ty();
    i64_ = b_.getInt64Ty();
    ptr_ = b_.getPtrTy();
    for (std::size_t i = 0; i < target.features.size(); ++i) features_ += (i ? "," : "") + target.features[i];
  }

  void build(const std::string& name, bool aot) {
    llvm::Function* entry = emit_entry(name + "_entry");
    std::vector<llvm::Function*> exported{entry};
    if (aot) exported = emit_c_entry_points(name, entry);
    for (llvm::Function& f : m_)
      if (!f.isDeclaration() && std::find(exported.begin(), exported.end(), &f) == exported.end())
        f.setLinkage(llvm::GlobalValue::InternalLinkage);
  }

 private:
  // --- sizes ----------------------------------------------------------------------------------
  I c64(std::int64_t v) { return I(b_, v); }

  /// The extent's size in the function being built: a constant when fixed, else from the symbol.
  I dim(const Extent& e) {
    if (auto v = e.resolve(plan_.fixed)) return c64(*v);
    auto it = sym_.find(e.symbol);
    if (it == sym_.end()) internal_error("codegen: the size `" + e.symbol + "` is unknown");
    return I(b_, it->second) * e.num / e.den + e.plus;
  }
  Dims shape(int id) {
    Dims d;
    for (const auto& a : g_.node(id).axes) d.push_back(dim(a.extent));
    return d;
  }
  I numel(const Dims& s) {
    I n = c64(1);
    for (const I& d : s) n = n * d;
    return n;
  }
  Dims strides_of(const Dims& s) {
    Dims st(s.size(), c64(1));
    for (std::size_t k = s.size(); k-- > 1;) st[k - 1] = st[k] * s[k];
    return st;
  }
  /// For each axis of `target`, the stride of the same-named axis of `src` (0: broadcast along it).
  Dims strides_by_name(const std::vector<Axis>& target, const std::vector<Axis>& src, const Dims& src_shape) {
    const Dims st = strides_of(src_shape);
    Dims out(target.size(), c64(0));
    for (std::size_t t = 0; t < target.size(); ++t)
      for (std::size_t k = 0; k < src.size(); ++k)
        if (src[k].name == target[t].name) out[t] = st[k];
    return out;
  }
  // --- helpers --------------------------------------------------------------------------------
  llvm::Type* elem(const Node& n) { return storage_dtype(n.dtype) == DType::boolean ? i8_ : f32_; }
  llvm::Value* buf(int id) const { return buf_[static_cast<std::size_t>(id)]; }

  void attributes(llvm::Function* f) {
    f->addFnAttr(llvm::Attribute::NoUnwind);
    f->addFnAttr("target-cpu", target_.cpu);
    if (!features_.empty()) f->addFnAttr("target-features", features_);
  }

  llvm::Value* load(llvm::Type* t, llvm::Value* base, const I& offset) {
    return b_.CreateLoad(t, b_.CreateGEP(t, base, offset.v()));
  }
  void store(llvm::Value* v, llvm::Value* base, const I& offset) {
    b_.CreateStore(v, b_.CreateGEP(v->getType(), base, offset.v()));
  }
  llvm::Value* to_bool(llvm::Value* byte) { return b_.CreateICmpNE(byte, b_.getInt8(0)); }
  llvm::Constant* neg_inf() { return llvm::ConstantFP::getInfinity(f32_, true); }
  llvm::Value* f64_of(const I& v) { return b_.CreateSIToFP(v.v(), f64_); }
  void memset0(llvm::Value* p, const I& bytes) { b_.CreateMemSet(p, b_.getInt8(0), bytes.v(), llvm::MaybeAlign(4)); }

  /// for i in [begin, end): body(i).
  void loop(const I& begin, const I& end, const std::function<void(I)>& body, const std::string& name,
            ir::Unroll unroll = ir::Unroll::as_written) {
    ir::emit_loop(b_, begin.v(), end.v(), 1, [&](llvm::Value* i) { body(I(b_, i)); }, name, unroll);
  }

  /// then() when c holds, else otherwise(); one of them alone when c is a constant.
  void branch(const ir::Bool& c, const std::function<void()>& then, const std::function<void()>& otherwise = {}) {
    if (auto k = c.constant()) {
      if (*k)
        then();
      else if (otherwise)
        otherwise();
      return;
    }
    auto* yes = llvm::BasicBlock::Create(ctx_, "then", fn_);
    auto* no = llvm::BasicBlock::Create(ctx_, "else", fn_);
    auto* done = llvm::BasicBlock::Create(ctx_, "endif", fn_);
    b_.CreateCondBr(c.v(), yes, no);
    b_.SetInsertPoint(yes);
    then();
    b_.CreateBr(done);
    b_.SetInsertPoint(no);
    if (otherwise) otherwise();
    b_.CreateBr(done);
    b_.SetInsertPoint(done);
  }

  llvm::Function* callee(const std::string& name) {
    llvm::Function* f = m_.getFunction(name);
    if (!f) internal_error("codegen: kernel `" + name + "` was not emitted");
    return f;
  }
  llvm::Function* rowwise(const char* name) {
    if (!rowwise_emitted_) {
      emit_rowwise_kernels(m_, target_);
      rowwise_emitted_ = true;
    }
    return callee(name);
  }

  using Body = std::function<void(const Dims& idx, const Dims& offsets)>;

  /// Loops over `dims` (outermost first); offsets[k] = bases[k] + Σ idx[d]·strides[k][d]. The
  /// innermost loop is left to the optimiser to vectorise and unroll.
  void nest(const Dims& dims, const std::vector<Dims>& strides, const Dims& bases, const Body& body) {
    Dims idx;
    nest_from(0, dims, strides, idx, bases, body);
  }
  void nest_from(std::size_t d, const Dims& dims, const std::vector<Dims>& strides, Dims& idx, const Dims& off,
                 const Body& body) {
    if (d == dims.size()) {
      body(idx, off);
      return;
    }
    loop(
        c64(0), dims[d],
        [&](I i) {
          Dims next = off;
          for (std::size_t k = 0; k < strides.size(); ++k)
            if (strides[k][d].constant() != 0) next[k] = off[k] + i * strides[k][d];
          idx.push_back(i);
          nest_from(d + 1, dims, strides, idx, next, body);
          idx.pop_back();
        },
        "d" + std::to_string(d), d + 1 == dims.size() ? ir::Unroll::allowed : ir::Unroll::as_written);
  }

  /// out[idx] = f(in_k[idx read through strides_k]) for an output of `id`'s shape (contiguous).
  void map(int id, const std::vector<int>& inputs, const std::vector<Dims>& in_strides,
           const std::function<llvm::Value*(const Dims& idx, const Values& in)>& f) {
    const Dims s = shape(id);
    std::vector<Dims> strides{strides_of(s)};
    for (const auto& st : in_strides) strides.push_back(st);
    nest(s, strides, Dims(strides.size(), c64(0)), [&](const Dims& idx, const Dims& off) {
      Values in;
      for (std::size_t k = 0; k < inputs.size(); ++k)
        in.push_back(load(elem(g_.node(inputs[k])), buf(inputs[k]), off[k + 1]));
      store(f(idx, in), buf(id), off[0]);
    });
  }

  // --- threads (threads_ir.hpp) ---------------------------------------------------------------

  /// qkv_parallel (threads_ir.hpp), emitted on first use.
  llvm::Function* parallel_runtime() {
    if (!parallel_) parallel_ = emit_parallel_runtime(m_, [this](llvm::Function* f) { attributes(f); });
    return parallel_;
  }

  using TaskBody = std::function<void(I i, const Values& captured)>;

  /// body(i, captured) for i in [0, n): on the calling thread when there is one task or less than
  /// kParallelMinFlops of work, else shared with the other threads through qkv_parallel (decided
  /// here when n and work are constants, at run time otherwise). The body may use `captured`,
  /// constants and sizes (dim(); the run-time sizes reach it with the captured values).
  void parallel_for(const I& n, const I& work, const Values& captured, const TaskBody& body) {
    const auto cn = n.constant(), cw = work.constant();
    if (cn && *cn <= 0) return;
    if ((cn && *cn == 1) || (cw && *cw < kParallelMinFlops)) {
      loop(c64(0), n, [&](I i) { body(i, captured); }, "tasks");
      return;
    }
    // The task's context: the captured values, then the run-time sizes.
    Values fields = captured;
    for (const auto& [name, v] : sym_) fields.push_back(v);
    std::vector<llvm::Type*> types;
    for (llvm::Value* v : fields) types.push_back(v->getType());
    auto* ctx_type = llvm::StructType::get(ctx_, types);
    llvm::Value* ctx = ir::entry_alloca(b_, ctx_type, 1, 8, "task_ctx");
    for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(ctx_type, ctx, f));

    auto* task = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_}, false),
                                        llvm::GlobalValue::InternalLinkage, "qkv_task", m_);
    attributes(task);
    const llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
    llvm::Function* saved_fn = fn_;
    const auto saved_sym = sym_;
    fn_ = task;
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", task));
    Values loaded;
    for (unsigned f = 0; f < fields.size(); ++f)
      loaded.push_back(b_.CreateLoad(types[f], b_.CreateStructGEP(ctx_type, task->getArg(0), f)));
    unsigned f = static_cast<unsigned>(captured.size());
    for (auto& [name, v] : sym_) v = loaded[f++];
    loaded.resize(captured.size());
    body(I(b_, task->getArg(1)), loaded);
    b_.CreateRetVoid();
    fn_ = saved_fn;
    sym_ = saved_sym;
    b_.restoreIP(saved);
    const ir::Bool worth = (n > 1) && (work >= kParallelMinFlops);
    llvm::Value* threads = b_.CreateSelect(worth.v(), threads_, b_.getInt32(1));
    b_.CreateCall(parallel_runtime(), {task, ctx, n.v(), threads});
  }

  /// fn(begin, end, captured) over [0, total) in blocks (schedule.hpp's ranges), in parallel when
  /// the work is worth it.
  void parallel_ranges(const I& total, std::int64_t grain, std::int64_t align, const I& work_per_unit,
                       const Values& captured, const std::function<void(I, I, const Values&)>& fn) {
    const Ranges<I> r = ranges(total, grain, align);
    Values cap = captured;
    cap.push_back(r.block.v());
    cap.push_back(total.v());
    parallel_for(r.tasks, total * work_per_unit, cap, [&](I t, const Values& in) {
      const I block(b_, in[in.size() - 2]), all(b_, in[in.size() - 1]);
      const I begin = t * block;
      fn(begin, imin(begin + block, all), Values(in.begin(), in.end() - 2));
    });
  }

  // --- the entry points -----------------------------------------------------------------------

  llvm::Function* emit_entry(const std::string& name) {
    fn_ = llvm::Function::Create(llvm::FunctionType::get(i32_, {ptr_, ptr_, i32_}, false),
                                 llvm::GlobalValue::ExternalLinkage, name, m_);
    attributes(fn_);
    llvm::Value *sizes = fn_->getArg(0), *args = fn_->getArg(1);
    sizes->setName("sizes");
    args->setName("args");
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    for (std::size_t k = 0; k < plan_.dynamic.size(); ++k)
      sym_[plan_.dynamic[k]] = b_.CreateLoad(i64_, b_.CreateConstGEP1_64(i64_, sizes, k), plan_.dynamic[k]);
    emit_size_checks();
    threads_ = emit_thread_count(b_, fn_->getArg(2));

    // 64-byte aligned (C11 aligned_alloc; the size a multiple of it): the kernels' packed panels
    // and tiles are read with aligned vector loads.
    auto layout = arena_layout<I>(g_, plan_, [this](const Extent& e) { return dim(e); });
    llvm::Value* arena = llvm::ConstantPointerNull::get(ptr_);
    if (layout.total.constant() != 0) {
      auto* alloc_fn = m_.getOrInsertFunction("aligned_alloc", ptr_, i64_, i64_).getCallee();
      arena = b_.CreateCall(llvm::cast<llvm::Function>(alloc_fn), {c64(64).v(), imax(layout.total, 64).v()}, "arena");
      fail_unless(b_.CreateIsNotNull(arena), 1);
    }

    // Buffers: arguments for leaves and in-place outputs, the arena for the rest, the input's for
    // views.
    auto arg = [&](std::size_t k) { return b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, args, k)); };
    buf_.assign(g_.size(), nullptr);
    std::size_t leaf = 0;
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      const Node& n = g_.node(id);
      const auto i = static_cast<std::size_t>(id);
      if (n.op == Op::input || n.op == Op::param)
        buf_[i] = arg(leaf++);
      else if (is_view(n.op))
        buf_[i] = buf_[static_cast<std::size_t>(n.inputs[0])];
      else if (plan_.output_arg[i] >= 0)
        buf_[i] = arg(static_cast<std::size_t>(plan_.output_arg[i]));
      else
        buf_[i] = block(layout, plan_.alloc[i], arena);
    }
    for (const auto& [id, k] : plan_.gemm)
      gemm_blocks_[id] = {block(layout, k.first, arena), block(layout, k.second, arena)};
    for (const auto& [id, k] : plan_.weights)
      if (k >= 0) weights_[id] = block(layout, k, arena);
    for (const auto& [id, k] : plan_.lse)
      if (k >= 0) lse_[id] = block(layout, k, arena);
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      const Node& n = g_.node(id);
      if (n.op == Op::attention_weights) weights_[n.inputs[0]] = buf(id);
      if (n.op == Op::attention_lse) lse_[n.inputs[0]] = buf(id);
    }

    for (int id = 0; id < static_cast<int>(g_.size()); ++id) emit_node(id);
    std::size_t out = leaf;
    for (const auto& o : g_.outputs()) {
      if (plan_.output_arg[static_cast<std::size_t>(o.node)] != static_cast<int>(out)) {
        const Node& n = g_.node(o.node);
        const I bytes = numel(shape(o.node)) * static_cast<std::int64_t>(storage_bytes(n.dtype));
        b_.CreateMemCpy(arg(out), llvm::MaybeAlign(1), buf(o.node), llvm::MaybeAlign(1), bytes.v());
      }
      ++out;
    }
    if (!llvm::isa<llvm::ConstantPointerNull>(arena)) {
      auto* free_fn = m_.getOrInsertFunction("free", b_.getVoidTy(), ptr_).getCallee();
      b_.CreateCall(llvm::cast<llvm::Function>(free_fn), {arena});
    }
    b_.CreateRet(b_.getInt32(0));
    return fn_;
  }

  llvm::Value* block(const ArenaLayout<I>& layout, int k, llvm::Value* arena) {
    const auto slot = static_cast<std::size_t>(plan_.allocs[static_cast<std::size_t>(k)].slot);
    return b_.CreateGEP(i8_, arena, layout.offsets[slot].v());
  }

  /// Returns `code` from the entry function unless `ok`.
  void fail_unless(llvm::Value* ok, int code) {
    auto* fail = llvm::BasicBlock::Create(ctx_, "fail", fn_);
    auto* next = llvm::BasicBlock::Create(ctx_, "ok", fn_);
    b_.CreateCondBr(ok, next, fail);
    b_.SetInsertPoint(fail);
    b_.CreateRet(b_.getInt32(code));
    b_.SetInsertPoint(next);
  }

  /// Return 2 unless every run-time size is >= 0, every extent of the graph too, and the graph's
  /// deferred shape checks hold.
  void emit_size_checks() {
    if (plan_.dynamic.empty()) return;
    ir::Bool ok(b_, b_.getTrue());
    for (const auto& n : g_.nodes())
      for (const auto& a : n.axes)
        if (a.extent.is_dynamic()) ok = ok && dim(a.extent) >= 0;
    for (const auto& s : plan_.dynamic) ok = ok && I(b_, sym_.at(s)) >= 0;
    for (const auto& c : g_.constraints()) {
      const I a = dim(c.a), d = dim(c.b);
      ok = ok && (c.kind == Constraint::Kind::equal ? a == d : (d != 0) && (a % pick(d == 0, c64(1), d) == 0));
    }
    if (ok.constant() != true) fail_unless(ok.v(), 2);
  }

  /// <f>(sizes…, arrays…), <f>_packed([sizes,] args) and <f>_set_threads, around the entry.
  std::vector<llvm::Function*> emit_c_entry_points(const std::string& name, llvm::Function* entry) {
    llvm::Function* set = nullptr;
    llvm::GlobalVariable* setting = emit_thread_setting(m_, name, [this](llvm::Function* f) { attributes(f); }, &set);
    const std::size_t n_sizes = sig_.sizes.size(), n_args = sig_.args.size();

    std::vector<llvm::Type*> params(n_sizes, i64_);
    params.insert(params.end(), n_args, ptr_);
    auto* direct = llvm::Function::Create(llvm::FunctionType::get(i32_, params, false),
                                          llvm::GlobalValue::ExternalLinkage, name, m_);
    attributes(direct);
    for (std::size_t k = 0; k < n_sizes; ++k) direct->getArg(static_cast<unsigned>(k))->setName(sig_.sizes[k].c_name);
    for (std::size_t k = 0; k < n_args; ++k)
      direct->getArg(static_cast<unsigned>(n_sizes + k))->setName(sig_.args[k].c_name);
    fn_ = direct;
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", direct));
    llvm::Value* sizes = ir::entry_alloca(b_, i64_, std::max<std::size_t>(n_sizes, 1), 8, "sizes");
    llvm::Value* args = ir::entry_alloca(b_, ptr_, std::max<std::size_t>(n_args, 1), 8, "args");
    for (std::size_t k = 0; k < n_sizes; ++k)
      b_.CreateStore(direct->getArg(static_cast<unsigned>(k)), b_.CreateConstGEP1_64(i64_, sizes, k));
    for (std::size_t k = 0; k < n_args; ++k)
      b_.CreateStore(direct->getArg(static_cast<unsigned>(n_sizes + k)), b_.CreateConstGEP1_64(ptr_, args, k));
    b_.CreateRet(b_.CreateCall(entry, {sizes, args, b_.CreateLoad(i32_, setting)}));

    std::vector<llvm::Type*> packed_params{ptr_};
    if (n_sizes > 0) packed_params.insert(packed_params.begin(), ptr_);
    auto* packed = llvm::Function::Create(llvm::FunctionType::get(i32_, packed_params, false),
                                          llvm::GlobalValue::ExternalLinkage, name + "_packed", m_);
    attributes(packed);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", packed));
    llvm::Value* packed_sizes =
        n_sizes > 0 ? static_cast<llvm::Value*>(packed->getArg(0)) : llvm::ConstantPointerNull::get(ptr_);
    b_.CreateRet(
        b_.CreateCall(entry, {packed_sizes, packed->getArg(n_sizes > 0 ? 1 : 0), b_.CreateLoad(i32_, setting)}));
    return {direct, packed, set};
  }

  // --- nodes ----------------------------------------------------------------------------------

  /// The CPU's implementation of each kernel kind (lowering/select.hpp).
  void emit_node(int id) {
    const Node& n = g_.node(id);
    switch (select_kernel(g_, id)) {
      case KernelKind::leaf:
      case KernelKind::view:
      case KernelKind::attention_weights:  // written by its fused node
      case KernelKind::attention_lse:
        return;
      case KernelKind::fused_attention:
        return emit_attention(id);
      case KernelKind::gemm:
        return emit_gemm(id);
      case KernelKind::linear_strided:
        return emit_linear_strided(id);
      case KernelKind::layer_norm_rows:
        return emit_layer_norm_rows(id);
      case KernelKind::layer_norm_strided:
        return emit_layer_norm_strided(id);
      case KernelKind::unary:
        return n.op == Op::scale ? emit_scale(id) : emit_activation(id);
      case KernelKind::add_same:
        return emit_add_same(id);
      case KernelKind::broadcast_binary:
        return emit_broadcasting(id);
      case KernelKind::strided_copy:
        if (n.op == Op::slice) return emit_slice(id);
        if (n.op == Op::concat) return emit_concat(id);
        map(id, {n.inputs[0]}, {strides_by_name(n.axes, g_.node(n.inputs[0]).axes, shape(n.inputs[0]))},
            [](const Dims&, const Values& in) { return in[0]; });
        return;
      case KernelKind::fill: {
        const bool boolean = storage_dtype(n.dtype) == DType::boolean;
        llvm::Value* c = boolean ? static_cast<llvm::Value*>(b_.getInt8(n.scalar != 0.0 ? 1 : 0))
                                 : llvm::ConstantFP::get(f32_, n.scalar);
        map(id, {}, {}, [&](const Dims&, const Values&) { return c; });
        return;
      }
      case KernelKind::softmax:
        return emit_softmax(id);
      case KernelKind::logsumexp:
        return emit_logsumexp(id);
      case KernelKind::causal:
        return emit_causal(id);
      case KernelKind::dropout:
        return emit_dropout(id);
      case KernelKind::contract:
        return emit_contract(id);
      case KernelKind::score_mod:
        return emit_score_mod(id);
    }
    internal_error("codegen: op " + std::string(op_name(n.op)) + " has no lowering");
  }

  void emit_scale(int id) {
    const Node& n = g_.node(id);
    llvm::Value* f = llvm::ConstantFP::get(f64_, n.scalar);
    if (n.dim) {
      llvm::Value* d = b_.CreateUnaryIntrinsic(llvm::Intrinsic::sqrt, f64_of(dim(*n.dim)));
      f = b_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), d);
    }
    map(id, {n.inputs[0]}, {strides_of(shape(id))}, [&](const Dims&, const Values& in) {
      return b_.CreateFPTrunc(b_.CreateFMul(b_.CreateFPExt(in[0], f64_), f), f32_);
    });
  }

  void emit_causal(int id) {
    const Node& n = g_.node(id);
    const auto& axes = g_.node(n.inputs[0]).axes;
    const std::size_t pq = axis_pos(axes, n.attr_axes[0]), pk = axis_pos(axes, n.attr_axes[1]);
    const Dims s = shape(n.inputs[0]);
    const I shift = n.align == CausalAlign::bottom_right ? s[pk] - s[pq] : c64(0);
    map(id, {n.inputs[0]}, {strides_of(s)}, [&, pq, pk](const Dims& idx, const Values& in) {
      return b_.CreateSelect((idx[pk] > idx[pq] + shift).v(), neg_inf(), in[0]);
    });
  }

  /// score_mod entry by entry: the expression on scalars (mod_ir), loads from the captured
  /// inputs' buffers.
  void emit_score_mod(int id) {
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
      llvm::Value* x = nullptr;
      Leaves(ModuleBuilder& m, const Node& nn, const std::vector<Axis>& a, const Dims& sh)
          : mb(m), n(nn), axes(a), s(sh) {}
      std::size_t pos(const std::string& axis) const { return util::axis_pos(axes, axis); }
      llvm::Value* score() override { return x; }
      llvm::Value* index(const std::string& axis) override {
        return mb.b_.CreateSIToFP((*idx)[pos(axis)].v(), mb.f32_);
      }
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
        const int tid = n.inputs[static_cast<std::size_t>(m.input)];
        const Node& t = mb.g_.node(tid);
        const Dims ts = mb.shape(tid), st = mb.strides_of(ts);
        I off = mb.c64(0);
        for (std::size_t k = 0; k < at.size(); ++k) off = off + I(mb.b_, at[k]) * st[k];
        llvm::Value* v = mb.load(mb.elem(t), mb.buf(tid), off);
        return v->getType() == mb.f32_ ? v : mb.b_.CreateUIToFP(mb.to_bool(v), mb.f32_);
      }
    } leaves(*this, n, axes, s);
    map(id, {n.inputs[0]}, {strides_of(s)}, [&](const Dims& idx, const Values& in) {
      leaves.idx = &idx;
      leaves.x = in[0];
      std::vector<llvm::Value*> cache;
      llvm::Value* out = e.score >= 0 ? emit_mod(b_, e, e.score, leaves, cache) : in[0];
      if (e.keep >= 0) out = b_.CreateSelect(emit_mod(b_, e, e.keep, leaves, cache), out, neg_inf());
      return out;
    });
  }

  /// relu / gelu on the row-wise kernels, in ranges of the flat index.
  void emit_activation(int id) {
    const Node& n = g_.node(id);
    llvm::Function* kernel = rowwise(n.op == Op::relu ? "qkv_relu" : "qkv_gelu");
    parallel_ranges(numel(shape(id)), 16384, 64, c64(n.op == Op::relu ? 1 : 30), {buf(n.inputs[0]), buf(id)},
                    [&](I i0, I i1, const Values& cap) { b_.CreateCall(kernel, {cap[0], cap[1], i0.v(), i1.v()}); });
  }

  void emit_add_same(int id) {
    const Node& n = g_.node(id);
    llvm::Function* kernel = rowwise("qkv_add");
    parallel_ranges(
        numel(shape(id)), 16384, 64, c64(1), {buf(n.inputs[0]), buf(n.inputs[1]), buf(id)},
        [&](I i0, I i1, const Values& cap) { b_.CreateCall(kernel, {cap[0], cap[1], cap[2], i0.v(), i1.v()}); });
  }

  void emit_slice(int id) {
    const Node& n = g_.node(id);
    const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
    const Dims in_strides = strides_of(shape(n.inputs[0]));
    const Dims s = shape(id);
    const I start = s[p] * n.offset;
    nest(s, {strides_of(s), in_strides}, {c64(0), start * in_strides[p]},
         [&](const Dims&, const Dims& off) { store(load(elem(n), buf(n.inputs[0]), off[1]), buf(id), off[0]); });
  }

  void emit_concat(int id) {
    const Node& n = g_.node(id);
    const std::size_t p = axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]);
    const Dims out_strides = strides_of(shape(id));
    I at = c64(0);
    for (int part : n.inputs) {
      const Dims s = shape(part);
      nest(s, {out_strides, strides_of(s)}, {at * out_strides[p], c64(0)},
           [&](const Dims&, const Dims& off) { store(load(elem(n), buf(part), off[1]), buf(id), off[0]); });
      at = at + s[p];
    }
  }

  void emit_broadcasting(int id) {
    const Node& n = g_.node(id);
    const Node &x = g_.node(n.inputs[0]), &y = g_.node(n.inputs[1]);
    const Op op = n.op;
    map(id, {n.inputs[0], n.inputs[1]},
        {strides_of(shape(n.inputs[0])), strides_by_name(x.axes, y.axes, shape(n.inputs[1]))},
        [this, op](const Dims&, const Values& in) -> llvm::Value* {
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
    if (!(p >= 0.0 && p < 1.0)) throw std::invalid_argument("codegen: dropout probability must be in [0, 1)");
    const Dims s = shape(id);
    const std::size_t rank = s.size();
    llvm::Value* seed = c64(static_cast<std::int64_t>(n.seed)).v();
    llvm::Value* keep_scale = llvm::ConstantFP::get(f64_, 1.0 / (1.0 - p));
    map(id, {n.inputs[0]}, {strides_of(s)}, [&](const Dims& idx, const Values& in) -> llvm::Value* {
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

  /// The shape around axis p as (outer, n, inner): element (o, k, i) at (o·n + k)·inner + i.
  struct Around {
    I outer, n, inner;
  };
  Around around(const Dims& s, std::size_t p) {
    Around r{c64(1), s[p], c64(1)};
    for (std::size_t k = 0; k < p; ++k) r.outer = r.outer * s[k];
    for (std::size_t k = p + 1; k < s.size(); ++k) r.inner = r.inner * s[k];
    return r;
  }

  /// Calls body(base) for every (o, i) with base = o·n·inner + i: the start of one line along p.
  void lines(const Around& r, const std::function<void(const I& base)>& body) {
    nest({r.outer, r.inner}, {{r.n * r.inner, c64(1)}}, {c64(0)}, [&](const Dims&, const Dims& off) { body(off[0]); });
  }

  /// Σ over k in [0, n) of f(k), in double.
  llvm::Value* sum(const I& n, const std::function<llvm::Value*(const I& k)>& f) {
    return ir::emit_loop(
        b_, c64(0).v(), n.v(), 1, {llvm::ConstantFP::get(f64_, 0.0)},
        [&](llvm::Value* k, const Values& acc) -> Values { return {b_.CreateFAdd(acc[0], f(I(b_, k)))}; }, "sum",
        ir::Unroll::allowed)[0];
  }

  /// softmax along attr_axes[0], max-subtracted, sums in double; a row with no visible key (all
  /// −inf) is zeros.
  /// The largest x[at(k)] over k in [0, n) (−inf when n = 0); a NaN wins, as in the interpreter.
  llvm::Value* row_max(llvm::Value* x, const I& n, const std::function<I(const I& k)>& at) {
    return ir::emit_loop(
        b_, c64(0).v(), n.v(), 1, {neg_inf()},
        [&](llvm::Value* k, const Values& cur) -> Values {
          llvm::Value* v = load(f32_, x, at(I(b_, k)));
          return {b_.CreateSelect(b_.CreateFCmpUGT(v, cur[0]), v, cur[0])};
        },
        "max")[0];
  }

  void emit_softmax(int id) {
    const Node& n = g_.node(id);
    const Around r = around(shape(id), axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
    llvm::Value *x = buf(n.inputs[0]), *y = buf(id);
    lines(r, [&](const I& base) {
      auto at = [&](const I& k) { return base + k * r.inner; };
      llvm::Value* m = row_max(x, r.n, at);
      branch(
          ir::Bool(b_, b_.CreateFCmpOEQ(m, neg_inf())),
          [&] { loop(c64(0), r.n, [&](I k) { store(llvm::ConstantFP::get(f32_, 0.0), y, at(k)); }, "zero"); },
          [&] {
            llvm::Value* total = sum(r.n, [&](const I& k) {
              llvm::Value* e = emit_exp(b_, b_.CreateFSub(load(f32_, x, at(k)), m));
              store(e, y, at(k));
              return b_.CreateFPExt(e, f64_);
            });
            llvm::Value* inv = b_.CreateFDiv(llvm::ConstantFP::get(f64_, 1.0), total);
            loop(
                c64(0), r.n,
                [&](I k) {
                  llvm::Value* e = b_.CreateFPExt(load(f32_, y, at(k)), f64_);
                  store(b_.CreateFPTrunc(b_.CreateFMul(e, inv), f32_), y, at(k));
                },
                "norm", ir::Unroll::allowed);
          });
    });
  }

  /// logsumexp along attr_axes[0] (dropped from the output, the other axes in order): m + ln Σ
  /// e^(x − m), the sum in double, the log in f32 (no library call); an all −inf row gives −inf,
  /// m = ±inf or NaN gives m.
  void emit_logsumexp(int id) {
    const Node& n = g_.node(id);
    const Around r = around(shape(n.inputs[0]), axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
    llvm::Value *x = buf(n.inputs[0]), *y = buf(id);
    nest({r.outer, r.inner}, {{r.n * r.inner, c64(1)}, {r.inner, c64(1)}}, {c64(0), c64(0)},
         [&](const Dims&, const Dims& off) {
           auto at = [&](const I& k) { return off[0] + k * r.inner; };
           llvm::Value* m = row_max(x, r.n, at);
           llvm::Value* finite =
               b_.CreateFCmpONE(b_.CreateUnaryIntrinsic(llvm::Intrinsic::fabs, m), llvm::ConstantFP::getInfinity(f32_));
           branch(
               ir::Bool(b_, finite),
               [&] {
                 llvm::Value* total = sum(r.n, [&](const I& k) {
                   return b_.CreateFPExt(emit_exp(b_, b_.CreateFSub(load(f32_, x, at(k)), m)), f64_);
                 });
                 // total >= 1 (the max term is 1): its f32 rounding moves the log by < 1e-7.
                 llvm::Value* ln =
                     b_.CreateFMul(emit_log2(b_, b_.CreateFPTrunc(total, f32_)), llvm::ConstantFP::get(f32_, kLn2));
                 store(b_.CreateFAdd(m, ln), y, off[1]);
               },
               [&] { store(m, y, off[1]); });
         });
  }

  /// layer norm over the contiguous axis (biased variance, eps inside the square root) on the
  /// row-wise kernel, in ranges of rows.
  void emit_layer_norm_rows(int id) {
    const Node& n = g_.node(id);
    const Dims s = shape(id);
    const I len = s.back(), rows = pick(len > 0, numel(s) / imax(len, 1), c64(0));
    llvm::Function* kernel = rowwise("qkv_layer_norm");
    // Blocks of about 16k elements: a grain of 16384 / len rows when len is known here.
    const auto known = len.constant();
    const std::int64_t grain = known ? std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(*known, 1)) : 1;
    parallel_ranges(rows, grain, 1, len * 8, {buf(n.inputs[0]), buf(n.inputs[1]), buf(n.inputs[2]), buf(id), len.v()},
                    [&](I r0, I r1, const Values& cap) {
                      b_.CreateCall(kernel, {cap[0], cap[1], cap[2], cap[3], cap[4],
                                             llvm::ConstantFP::get(f32_, n.scalar), r0.v(), r1.v()});
                    });
  }

  /// layer norm along another axis: a loop nest in double.
  void emit_layer_norm_strided(int id) {
    const Node& n = g_.node(id);
    const Dims s = shape(id);
    const double eps = n.scalar;
    llvm::Value *x = buf(n.inputs[0]), *gamma = buf(n.inputs[1]), *beta = buf(n.inputs[2]), *y = buf(id);
    const Around r = around(s, axis_pos(g_.node(n.inputs[0]).axes, n.attr_axes[0]));
    lines(r, [&](const I& base) {
      auto at = [&](const I& k) { return base + k * r.inner; };
      auto xd = [&](const I& k) { return b_.CreateFPExt(load(f32_, x, at(k)), f64_); };
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
  void emit_contract(int id) {
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
    nest(s, {strides_of(s), l_out, r_out}, {c64(0), c64(0), c64(0)}, [&](const Dims&, const Dims& off) {
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

  /// y[M, N] = x[M, K]·W[N, K]ᵀ + b on the GEMM kernel: Bᵀ packed into panels of NR columns
  /// (zero-padded), the bias padded alike, then the tasks of schedule.hpp's gemm_blocks.
  void emit_gemm(int id) {
    const Node& n = g_.node(id);
    const Dims w = shape(n.inputs[1]);
    const I nn = w[0], k = w[1];
    const I m = pick(k > 0, numel(shape(n.inputs[0])) / imax(k, 1), c64(0));
    llvm::Value *x = buf(n.inputs[0]), *wt = buf(n.inputs[1]), *y = buf(id);
    llvm::Value* bias = n.inputs.size() > 2 ? buf(n.inputs[2]) : nullptr;
    branch(
        k == 0,
        [&] {  // an empty sum: the bias alone
          const I rows = pick(nn > 0, numel(shape(id)) / imax(nn, 1), c64(0));
          nest({rows, nn}, {{nn, c64(1)}}, {c64(0)}, [&](const Dims& idx, const Dims& off) {
            store(bias ? load(f32_, bias, idx[1]) : llvm::ConstantFP::get(f32_, 0.0), y, off[0]);
          });
        },
        [&] { emit_gemm_call(id, x, wt, bias, y, m, nn, k); });
  }

  void emit_gemm_call(int id, llvm::Value* x, llvm::Value* wt, llvm::Value* bias, llvm::Value* y, const I& m,
                      const I& nn, const I& k) {
    if (!gemm_) {
      gemm_cfg_ = choose_gemm_config(GemmSpec{}, target_);
      emit_gemm_kernel(m_, gemm_cfg_, "qkv_gemm");
      gemm_ = callee("qkv_gemm");
    }
    const std::int64_t nr = gemm_cfg_.cols(), mr = gemm_cfg_.rows;
    const I panels = ceil_div(nn, nr);
    const auto [packed, bias_pad] = gemm_blocks_.at(id);
    // bp[(p·K + kk)·NR + r] = W[p·NR + r][kk]; zeros past N.
    const I full = nn / nr, rest = nn % nr;
    branch(rest != 0, [&] { memset0(packed, panels * k * nr * 4); });
    const I one = c64(1);
    nest({full, k, c64(nr)}, {{k * nr, c64(nr), one}, {k * nr, one, k}}, {c64(0), c64(0)},
         [&](const Dims&, const Dims& off) { store(load(f32_, wt, off[1]), packed, off[0]); });
    nest({k, rest}, {{c64(nr), one}, {one, k}}, {full * k * nr, full * k * nr},
         [&](const Dims&, const Dims& off) { store(load(f32_, wt, off[1]), packed, off[0]); });
    memset0(bias_pad, panels * nr * 4);
    if (bias) b_.CreateMemCpy(bias_pad, llvm::MaybeAlign(4), bias, llvm::MaybeAlign(4), (nn * 4).v());

    auto* args_type = llvm::StructType::get(ctx_, {ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_});
    llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "gemm_args");
    const Values fields{x, packed, bias_pad, y, m.v(), nn.v(), k.v()};
    for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
    const GemmBlocks<I> blocks = gemm_blocks(m, nn, mr, nr);
    llvm::Function* kernel = gemm_;
    parallel_for(blocks.tasks(), m * nn * k * 2,
                 {args, blocks.nblocks.v(), blocks.mc.v(), (blocks.panels_per * nr).v(), m.v(), nn.v()},
                 [&](I t, const Values& cap) {
                   const I nblocks(b_, cap[1]), mc(b_, cap[2]), cols(b_, cap[3]), rows(b_, cap[4]), width(b_, cap[5]);
                   const I m0 = (t / nblocks) * mc, n0 = (t % nblocks) * cols;
                   b_.CreateCall(kernel, {cap[0], m0.v(), imin(m0 + mc, rows).v(), n0.v(), imin(n0 + cols, width).v()});
                 });
  }

  void emit_attention(int id) {
    const AttentionCall& call = plan_.attention.at(id);
    const AttentionSpec& spec = call.spec;
    if (spec.dk < 1 || spec.dv < 1 || spec.hq < 1 || spec.hkv < 1 || spec.hq % spec.hkv != 0)
      throw std::invalid_argument("codegen: fused attention with dk " + std::to_string(spec.dk) + ", dv " +
                                  std::to_string(spec.dv) + ", " + std::to_string(spec.hq) + " query heads over " +
                                  std::to_string(spec.hkv) + " key/value heads cannot be compiled");
    if (!(spec.dropout_p >= 0.0 && spec.dropout_p < 1.0))
      throw std::invalid_argument("codegen: dropout probability must be in [0, 1)");
    const Node& n = g_.node(id);
    const KernelConfig cfg = choose_kernel_config(spec, target_);
    const std::string name = "qkv_attention_" + std::to_string(id);
    emit_attention_kernel(m_, spec, cfg, name);
    llvm::Function* kernel = callee(name);
    const I batch = dim(call.batch), lq = dim(call.len_q), lk = dim(call.len_k);

    // The mod's tensors: their base pointers and extents, as the kernel reads them.
    llvm::Value* null = llvm::ConstantPointerNull::get(ptr_);
    llvm::Value* tensors = null;
    llvm::Value* extents = null;
    if (!call.tensor_inputs.empty()) {
      std::size_t rank_sum = 0;
      for (int m : call.tensor_inputs) rank_sum += g_.node(n.inputs[static_cast<std::size_t>(m)]).axes.size();
      tensors = ir::entry_alloca(b_, ptr_, call.tensor_inputs.size(), 8, "mod_tensors");
      extents = ir::entry_alloca(b_, i64_, std::max<std::size_t>(rank_sum, 1), 8, "mod_extents");
      std::uint64_t e = 0;
      for (std::size_t t = 0; t < call.tensor_inputs.size(); ++t) {
        const int tid = n.inputs[static_cast<std::size_t>(call.tensor_inputs[t])];
        b_.CreateStore(buf(tid), b_.CreateConstInBoundsGEP1_64(ptr_, tensors, t));
        for (const auto& x : g_.node(tid).axes)
          b_.CreateStore(dim(x.extent).v(), b_.CreateConstInBoundsGEP1_64(i64_, extents, e++));
      }
    }
    llvm::Value* weights = spec.write_weights ? weights_.at(id) : null;
    llvm::Value* lse = spec.write_lse ? lse_.at(id) : null;

    // AttentionArgs, field by field (attention.hpp: its layout is the kernel ABI).
    auto* args_type = llvm::StructType::get(
        ctx_, {ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, ptr_, i64_, i64_, i64_, i64_, ptr_});
    llvm::Value* args = ir::entry_alloca(b_, args_type, 1, 8, "attention_args");
    const Values fields{buf(n.inputs[0]),
                        buf(n.inputs[1]),
                        buf(n.inputs[2]),
                        buf(id),
                        weights,
                        null,
                        null,
                        tensors,
                        extents,
                        batch.v(),
                        lq.v(),
                        lk.v(),
                        c64(static_cast<std::int64_t>(call.seed)).v(),
                        lse};
    for (unsigned f = 0; f < fields.size(); ++f) b_.CreateStore(fields[f], b_.CreateStructGEP(args_type, args, f));
    const std::int64_t rows = cfg.query_rows();
    const I blocks = ceil_div(lq, rows), bh = batch * spec.hq;
    const I work = bh * lq * lk * (spec.dk + spec.dv) * 2;
    const bool causal = triangular_work(spec);
    parallel_for(bh * blocks, work, {args, bh.v(), blocks.v()}, [&](I t, const Values& cap) {
      const I heads(b_, cap[1]), nblocks(b_, cap[2]);
      const I blk = attention_task_block(t, heads, nblocks, causal);
      const I r = t % heads;
      b_.CreateCall(kernel, {cap[0], (r / spec.hq).v(), (r % spec.hq).v(), (blk * rows).v()});
    });
  }

  llvm::Module& m_;
  llvm::LLVMContext& ctx_;
  llvm::IRBuilder<> b_;
  const Graph& g_;
  const AotSignature& sig_;
  const ModulePlan& plan_;
  const HostTarget& target_;
  std::string features_;
  llvm::Type *f32_ = nullptr, *f64_ = nullptr, *i8_ = nullptr, *i32_ = nullptr, *i64_ = nullptr;
  llvm::PointerType* ptr_ = nullptr;
  llvm::Function* fn_ = nullptr;
  std::map<std::string, llvm::Value*> sym_;  // the run-time sizes in the function being built
  std::vector<llvm::Value*> buf_;
  std::map<int, llvm::Value*> weights_, lse_;
  std::map<int, std::pair<llvm::Value*, llvm::Value*>> gemm_blocks_;
  bool rowwise_emitted_ = false;
  llvm::Function* gemm_ = nullptr;
  GemmConfig gemm_cfg_;
  llvm::Value* threads_ = nullptr;  // i32, this call's thread count
  llvm::Function* parallel_ = nullptr;
};

}  // namespace

std::unique_ptr<llvm::Module> build_graph_module(llvm::LLVMContext& context, const Graph& lowered,
                                                 const AotSignature& signature, const ModulePlan& plan,
                                                 const HostTarget& target, const std::string& function, bool aot) {
  auto module = std::make_unique<llvm::Module>(function, context);
  ModuleBuilder(*module, lowered, signature, plan, target).build(function, aot);
  return module;
}

}  // namespace qkv::codegen::cpu
