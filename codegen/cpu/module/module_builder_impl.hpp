// codegen/cpu/module/module_builder_impl.hpp — the ModuleBuilder of module_builder.cpp (private):
// the function, its arena, threads and <f>_entry here; the prepared handle's and the C entry
// points in module_entry_points.cpp; the attention and GEMM calls in module_builder.cpp; the
// loop-nest kernels of the other node kinds in module_nodes.cpp.
#pragma once

#include <llvm/IR/Constants.h>
#include <llvm/IR/DerivedTypes.h>
#include <llvm/IR/Function.h>
#include <llvm/IR/GlobalVariable.h>
#include <llvm/IR/IRBuilder.h>
#include <llvm/IR/Intrinsics.h>
#include <llvm/IR/LLVMContext.h>
#include <llvm/IR/Module.h>
#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <qkv/codegen/lowering/lifetimes.hpp>
#include <qkv/codegen/lowering/select.hpp>
#include <qkv/codegen/lowering/storage.hpp>
#include <qkv/ir/quant.hpp>
#include <set>
#include <stdexcept>
#include <string>
#include "cpu/kernels/attention_kernel.hpp"
#include "cpu/kernels/gemm_kernel.hpp"
#include "cpu/kernels/rowwise_kernel.hpp"
#include "cpu/module/cpu_check.hpp"
#include "cpu/module/module_builder.hpp"
#include "cpu/module/threads_ir.hpp"
#include "cpu/schedule.hpp"
#include "llvm/ir_int.hpp"
#include "llvm/ir_util.hpp"
#include "llvm/mod_ir.hpp"
#include "llvm/philox_ir.hpp"
#include "llvm/vector_math.hpp"
#include "lowering/graph_util.hpp"

namespace qkv::codegen::cpu::detail {

using util::axis_pos;
using I = ir::Int;
using Dims = std::vector<I>;
using Values = std::vector<llvm::Value*>;

/// Moves each node's code (a region of emit_region) out of the entry function into a
/// function of its own, never inlined: the optimiser then works on many small functions instead
/// of one with a loop nest per node, whose analyses grow faster than linearly with the graph (a
/// training step's thousands of nodes took minutes). Regions that return from the entry (a
/// failed check) or hold no code stay where they are. The values a region uses from outside are
/// its function's arguments, so nodes that compute alike outline to the same code whatever
/// their buffers. (outline.cpp)
/// Each region (a node's code) becomes a function named "<fn>.<label>" (labels[i], the node's
/// "n<id>_<op>", so that a profile names the node it spends its time in — after
/// merge_identical_functions, the first of the nodes that share the code).
void outline_node_regions(llvm::Function& fn, const std::vector<std::vector<llvm::BasicBlock*>>& regions,
                          const std::vector<std::string>& labels);

/// Makes one function of every set of internal functions with the same code (LLVM's
/// MergeFunctions, every internal function's address first marked insignificant so that its uses
/// are replaced, its callers then compared anew): the nodes of a decoder's layers outline to the
/// same functions, so a module's code stops growing with its depth. (outline.cpp)
void merge_identical_functions(llvm::Module& module);

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
    features_ = joined_features(target);
  }

  void build(const std::string& name, bool aot) {
    llvm::Function* entry = emit_entry(name + "_entry");
    llvm::Function* prepare = emit_prepare(name + "_prepare_entry");
    llvm::Function* release = emit_release(name + "_release_entry");
    std::vector<llvm::Function*> exported{entry, prepare, release};
    if (aot) exported = emit_c_entry_points(name, entry, prepare, release);
    exported.push_back(emit_parallel_setter(m_, name, [this](llvm::Function* f) { baseline_attributes(f, target_); }));
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
  /// The element type of node id's buffer (cpu_storage_dtype): i8 for bool, i16 for the bits of
  /// f16 / bf16, i32 / i64 for an integer input (integer_array), else float.
  llvm::Type* elem(int id) {
    switch (cpu_storage_dtype(g_, id)) {
      case DType::boolean:
      case DType::i8:
        return i8_;
      case DType::f16:
      case DType::bf16:
        return b_.getInt16Ty();
      case DType::i32:
        return i32_;
      case DType::i64:
        return i64_;
      case DType::f32:
      case DType::f64:
        return f32_;
    }
    return f32_;
  }
  /// Element `from_offset` of node `from` stored as element `to_offset` of node `to`: moved as it
  /// is when both are stored alike, else through f32 (an integer input copied into a value).
  void copy_element(int from, const I& from_offset, int to, const I& to_offset) {
    if (cpu_storage_dtype(g_, from) == cpu_storage_dtype(g_, to))
      store(load(elem(from), buf(from), from_offset), buf(to), to_offset);
    else
      put(value(from, from_offset), to, to_offset);
  }
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
  /// Element `offset` of node x's buffer, widened (ir::from_storage); and the store of node y's
  /// element, rounded (ir::to_storage): the kernels that compute in f32 read and write every float
  /// dtype through these two.
  llvm::Value* value(int x, const I& offset) {
    return ir::from_storage(b_, load(elem(x), buf(x), offset), g_.node(x).dtype);
  }
  void put(llvm::Value* f, int y, const I& offset) { store(ir::to_storage(b_, f, g_.node(y).dtype), buf(y), offset); }

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
  /// The row-wise kernel `name` whose arrays are all stored as `t` (rowwise_kernel.hpp), its
  /// module's set of kernels for that dtype emitted on first use.
  llvm::Function* rowwise(const char* name, DType t) {
    const DType s = storage_dtype(t);
    if (rowwise_emitted_.insert(s).second) emit_rowwise_kernels(m_, target_, s);
    return callee(rowwise_kernel_name(name, s));
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
    nest_parallel(s, strides, Dims(strides.size(), c64(0)), c64(4), [&](const Dims& idx, const Dims& off) {
      Values in;
      for (std::size_t k = 0; k < inputs.size(); ++k) in.push_back(load(elem(inputs[k]), buf(inputs[k]), off[k + 1]));
      store(f(idx, in), buf(id), off[0]);
    });
  }

  /// map() on values: each input widened as it is loaded, the result rounded to y's dtype as it is
  /// stored (f computes in f32; a bool input stays a byte).
  void map_values(int id, const std::vector<int>& inputs, const std::vector<Dims>& in_strides,
                  const std::function<llvm::Value*(const Dims& idx, const Values& in)>& f) {
    map(id, inputs, in_strides, [&](const Dims& idx, const Values& in) {
      Values wide;
      for (std::size_t k = 0; k < inputs.size(); ++k)
        wide.push_back(ir::from_storage(b_, in[k], g_.node(inputs[k]).dtype));
      return ir::to_storage(b_, f(idx, wide), g_.node(id).dtype);
    });
  }

  // --- threads (threads_ir.hpp) ---------------------------------------------------------------

  /// qkv_parallel (threads_ir.hpp), emitted on first use.
  llvm::Function* parallel_runtime() {
    if (!parallel_) parallel_ = emit_parallel_runtime(m_, [this](llvm::Function* f) { attributes(f); });
    return parallel_;
  }

  using TaskBody = std::function<void(I i)>;

  /// body(i) for i in [0, n): on the calling thread when there is one task or less than
  /// kParallelMinFlops of work, else shared with the other threads through qkv_parallel (decided
  /// here when n and work are constants, at run time otherwise). The body is generated into a
  /// task function of its own and may use any value of the function being built — sizes
  /// (dim()), buffers (buf()), values computed before the call: each it uses is stored into the
  /// task's context and loaded by the task (capture_into, threads_ir.hpp). Inside a task
  /// (task_depth_ > 0) the loops stay serial: no parallel region runs inside another.
  /// (module_parallel.cpp)
  void parallel_for(const I& n, const I& work, const TaskBody& body);

  /// fn(begin, end) over [0, total) in blocks (schedule.hpp's ranges), in parallel when the work
  /// is worth it.
  void parallel_ranges(const I& total, std::int64_t grain, std::int64_t align, const I& work_per_unit,
                       const std::function<void(I, I)>& fn);

  /// nest() with the outermost dimension's iterations shared out as parallel_ranges' tasks (each
  /// iteration independent of the others: no state carried between them) when the work — the
  /// iterations times `cost` per innermost body — is worth it.
  void nest_parallel(const Dims& dims, const std::vector<Dims>& strides, const Dims& bases, const I& cost,
                     const Body& body);

  // --- the entry points -----------------------------------------------------------------------

  // --- prepared handles ------------------------------------------------------------------------
  // A handle (<f>_prepare) is an array of 8-byte slots: the sizes it was prepared for, the
  // parameters' pointers (graph order), per prepared linear (plan.prepared) its packed panels and
  // padded bias, then the arena kept between runs and its capacity in bytes.
  std::size_t param_count() const {
    std::size_t n = 0;
    for (const auto& x : g_.nodes()) n += x.op == Op::param;
    return n;
  }
  std::size_t slot_param(std::size_t p) const { return plan_.dynamic.size() + p; }
  std::size_t slot_prepared(std::size_t j) const { return slot_param(param_count()) + 2 * j; }
  std::size_t slot_arena() const { return slot_prepared(plan_.prepared.size()); }
  std::size_t handle_slots() const { return slot_arena() + 2; }
  llvm::Value* slot(llvm::Value* handle, std::size_t k) { return b_.CreateConstGEP1_64(i64_, handle, k); }
  /// Whether the function being built runs with a prepared handle (false in plain calls).
  ir::Bool prepared() { return ir::Bool(b_, b_.CreateIsNotNull(handle_)); }
  ir::Bool unprepared() { return ir::Bool(b_, b_.CreateIsNull(handle_)); }
  /// The symbols the parameters' extents use: a handle serves only calls with the same values.
  std::vector<std::size_t> param_size_slots() const {
    std::vector<std::size_t> out;
    for (std::size_t k = 0; k < plan_.dynamic.size(); ++k)
      for (const auto& x : g_.nodes())
        if (x.op == Op::param && std::any_of(x.axes.begin(), x.axes.end(), [&](const Axis& a) {
              return a.extent.is_dynamic() && a.extent.symbol == plan_.dynamic[k];
            })) {
          out.push_back(k);
          break;
        }
    return out;
  }
  /// 64-byte aligned memory (C11 aligned_alloc); on Linux a block of 4 MiB or more (the runtime's
  /// detail::kHugePageBytes) is advised into transparent huge pages (MADV_HUGEPAGE; a VM's THP is
  /// often "madvise" only): 4 KiB faults, each a trap to the hypervisor, took 3 s of a first
  /// prefill that packs 1.8 GB (2 s of compute). (module_builder.cpp)
  llvm::Value* aligned_alloc(const I& bytes);
  void free(llvm::Value* p) {
    auto* fn = m_.getOrInsertFunction("free", b_.getVoidTy(), ptr_).getCallee();
    b_.CreateCall(llvm::cast<llvm::Function>(fn), {p});
  }

  /// ptr <f>_prepare_entry(const i64* sizes, void* const* args): a handle holding the parameters
  /// (args' param slots; the other args are not read) and every prepared linear's weights packed
  /// into the GEMM's panels, or null when memory runs out.
  llvm::Function* emit_prepare(const std::string& name);

  /// void <f>_release_entry(ptr handle): frees what <f>_prepare_entry made (null: nothing).
  llvm::Function* emit_release(const std::string& name);

  /// i32 <f>_entry(const i64* sizes, void* const* args, i32 threads, ptr handle): handle null or
  /// one <f>_prepare_entry made (4 when the parameters' sizes differ from the handle's).
  llvm::Function* emit_entry(const std::string& name) {
    // The release function is declared first: prepare calls it when it gives up.
    release_name_ = name.substr(0, name.size() - std::string("_entry").size()) + "_release_entry";
    auto* release = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_}, false),
                                           llvm::GlobalValue::ExternalLinkage, release_name_, m_);
    attributes(release);
    fn_ = llvm::Function::Create(llvm::FunctionType::get(i32_, {ptr_, ptr_, i32_, ptr_}, false),
                                 llvm::GlobalValue::ExternalLinkage, name, m_);
    attributes(fn_);
    llvm::Value *sizes = fn_->getArg(0), *args = fn_->getArg(1);
    sizes->setName("sizes");
    args->setName("args");
    handle_ = fn_->getArg(3);
    handle_->setName("handle");
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    for (std::size_t k = 0; k < plan_.dynamic.size(); ++k)
      sym_[plan_.dynamic[k]] = b_.CreateLoad(i64_, b_.CreateConstGEP1_64(i64_, sizes, k), plan_.dynamic[k]);
    emit_size_checks();
    if (const auto checked = param_size_slots(); !checked.empty()) {
      branch(prepared(), [&] {
        ir::Bool same(b_, b_.getTrue());
        for (std::size_t k : checked)
          same = same && I(b_, sym_[plan_.dynamic[k]]) == I(b_, b_.CreateLoad(i64_, slot(handle_, k)));
        fail_unless(same.v(), 4);
      });
    }
    threads_ = emit_thread_count(b_, fn_->getArg(2));
    // What the entry returns when every node ran: 0, or 3 once an embedding met an id out of range.
    status_ = ir::entry_alloca(b_, i32_, 1, 4, "status");
    b_.CreateStore(b_.getInt32(0), status_);

    // 64-byte aligned (C11 aligned_alloc; the size a multiple of it): the kernels' packed panels
    // and tiles are read with aligned vector loads.
    // With a handle: its arena, grown when this call needs more (kept between calls).
    auto layout = arena_layout<I>(g_, plan_, [this](const Extent& e) { return dim(e); });
    llvm::Value* arena = llvm::ConstantPointerNull::get(ptr_);
    if (layout.total.constant() != 0) {
      llvm::Value* at = ir::entry_alloca(b_, ptr_, 1, 8, "arena_at");
      branch(
          prepared(),
          [&] {
            llvm::Value* have = b_.CreateLoad(i64_, slot(handle_, slot_arena() + 1));
            branch(I(b_, have) < layout.total, [&] {
              free(b_.CreateLoad(ptr_, slot(handle_, slot_arena())));
              b_.CreateStore(b_.getInt64(0), slot(handle_, slot_arena() + 1));
              llvm::Value* grown = aligned_alloc(layout.total);
              b_.CreateStore(grown, slot(handle_, slot_arena()));
              fail_unless(b_.CreateIsNotNull(grown), 1);
              b_.CreateStore(round_up(imax(layout.total, 64), 64).v(), slot(handle_, slot_arena() + 1));
            });
            b_.CreateStore(b_.CreateLoad(ptr_, slot(handle_, slot_arena())), at);
          },
          [&] {
            llvm::Value* fresh = aligned_alloc(layout.total);
            fail_unless(b_.CreateIsNotNull(fresh), 1);
            b_.CreateStore(fresh, at);
          });
      arena = b_.CreateLoad(ptr_, at, "arena");
    }

    // Buffers: arguments for leaves and in-place outputs, the arena for the rest, the input's for
    // views and a dequantize read in place (shares_input_memory).
    auto arg = [&](std::size_t k) { return b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, args, k)); };
    buf_.assign(g_.size(), nullptr);
    std::size_t leaf = 0;
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      const Node& n = g_.node(id);
      const auto i = static_cast<std::size_t>(id);
      if (is_size_input(n))
        buf_[i] = llvm::ConstantPointerNull::get(ptr_);  // its value is among the sizes
      else if (n.op == Op::input || n.op == Op::param)
        buf_[i] = arg(leaf++);
      else if (shares_input_memory(g_, id) || plan_.kv_alias.count(id))
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
    for (const auto& [id, d] : plan_.decode) split_[id] = block(layout, d.block, arena);
    for (const auto& [id, bw] : plan_.backward) {
      BackwardBuffers& to = backward_[id];
      to.delta = block(layout, bw.delta, arena);
      to.partial = block(layout, bw.partial, arena);
      if (bw.dk >= 0) to.dk = block(layout, bw.dk, arena);
      if (bw.dv >= 0) to.dv = block(layout, bw.dv, arena);
      for (int k : bw.tensor_partial) to.tensor_partial.push_back(block(layout, k, arena));
    }
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      const Node& n = g_.node(id);
      if (n.op == Op::attention_weights) weights_[n.inputs[0]] = buf(id);
      if (n.op == Op::attention_lse) lse_[n.inputs[0]] = buf(id);
      if (n.op == Op::attention_dk) backward_.at(n.inputs[0]).dk = buf(id);
      if (n.op == Op::attention_dv) backward_.at(n.inputs[0]).dv = buf(id);
    }

    std::vector<std::vector<llvm::BasicBlock*>> regions;
    std::vector<std::string> labels;
    for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
      node_label_ = "n" + std::to_string(id) + "_" + std::string(op_name(g_.node(id).op));
      labels.push_back(node_label_);
      regions.push_back(emit_region([&] { emit_node(id); }));
    }
    node_label_.clear();
    std::size_t out = leaf;
    for (const auto& o : g_.outputs()) {
      if (integer_array(g_, o.node)) {  // an integer input as an output: its values, as f32
        llvm::Value* to = arg(out);
        loop(c64(0), numel(shape(o.node)), [&](I k) { store(value(o.node, k), to, k); }, "out");
      } else if (plan_.output_arg[static_cast<std::size_t>(o.node)] != static_cast<int>(out)) {
        const Node& n = g_.node(o.node);
        const I bytes = numel(shape(o.node)) * static_cast<std::int64_t>(storage_bytes(n.dtype));
        b_.CreateMemCpy(arg(out), llvm::MaybeAlign(1), buf(o.node), llvm::MaybeAlign(1), bytes.v());
      }
      ++out;
    }
    if (!llvm::isa<llvm::ConstantPointerNull>(arena)) branch(unprepared(), [&] { free(arena); });
    b_.CreateRet(b_.CreateLoad(i32_, status_));
    handle_ = nullptr;
    outline_node_regions(*fn_, regions, labels);
    return fn_;
  }

  /// body() in blocks of its own: the region outline_node_regions makes a function of.
  std::vector<llvm::BasicBlock*> emit_region(const std::function<void()>& body);

  /// make()'s value computed before the node's region (where it is outside the region: its
  /// outlined function takes it as an argument), for what differs between nodes that compute
  /// alike — such as the handle slots of a layer's weights — so that their regions outline to
  /// identical functions, which merge_identical_functions makes one. Outside a region, here.
  llvm::Value* outside_region(const std::function<llvm::Value*()>& make) {
    if (!before_region_) return make();
    const llvm::IRBuilderBase::InsertPointGuard guard(b_);
    b_.SetInsertPoint(before_region_);
    return make();
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

  /// The extent as a double (no i64 overflow however large the run-time size).
  llvm::Value* fdim(const Extent& e) {
    if (auto v = e.resolve(plan_.fixed)) return llvm::ConstantFP::get(f64_, static_cast<double>(*v));
    llvm::Value* s = b_.CreateSIToFP(sym_.at(e.symbol), f64_);
    return b_.CreateFAdd(b_.CreateFDiv(b_.CreateFMul(s, llvm::ConstantFP::get(f64_, static_cast<double>(e.num))),
                                       llvm::ConstantFP::get(f64_, static_cast<double>(e.den))),
                         llvm::ConstantFP::get(f64_, static_cast<double>(e.plus)));
  }

  /// Whether the run-time sizes keep every size the code computes inside int64: for each node
  /// `n` with keep(n), the largest loop nest it can run (iteration_space) times 8 bytes, and the
  /// sum over those nodes of their own buffers' bytes (the arena is smaller), are at most 2^56 —
  /// computed in f64, so sizes such as 2^62 or INT64_MAX cannot wrap them. 2^56 bytes (64 PiB)
  /// leaves a factor of 128 for the blocks derived from them (packed panels' padding, split-KV
  /// partial results). (Not the sum of the iteration spaces: a 6-layer training step's
  /// weight-gradient contractions, each far inside int64, added up past 2^56 at batch 8 × 255.)
  ir::Bool sizes_fit(const std::function<bool(const Node&)>& keep);

  /// 8 × the product of the extents of the union, by name, of these axis lists (f64); made once
  /// per product within one sizes_fit (spaces_).
  llvm::Value* space_of(std::initializer_list<const std::vector<Axis>*> lists);
  std::map<std::vector<std::string>, llvm::Value*> spaces_;  // space_of's, by the factors' str()

  /// An upper bound (× 8 bytes) of the loop nests `n` runs. A reduction iterates its output and
  /// the axes it sums over: a contraction, logsumexp or argmax the union of its output's and
  /// inputs' axes by name; a linear layer its output's and x's (the weight's [out, in] are those
  /// axes under other names: counting them again squared the layer, and refused a hidden size of
  /// 1024); an attention q ∪ k (the scores) and out ∪ v (the weighted sum; its backward d_out ∪ v,
  /// for dP). Every other node loops over its output or over one input (copies, views,
  /// element-wise maps, row-wise norms). The bound is the largest of the products returned.
  std::vector<llvm::Value*> iteration_space(const Node& n);

  /// Return 2 unless every run-time size is >= 0, every extent of the graph too, the graph's
  /// deferred shape checks hold, and every size computed from them fits (sizes_fit).
  void emit_size_checks();

  /// Where an update_slice's rows end along the updated axis: start + their extent.
  I update_end(const Node& u) {
    const auto& rows = g_.node(u.inputs[1]).axes;
    return dim(*u.dim) + dim(rows[axis_pos(rows, u.attr_axes[1])].extent);
  }

  /// The C entry points around the entry: <f>(sizes…, arrays…), <f>_packed([sizes,] args),
  /// <f>_set_threads, and the prepared pair <f>_prepare(sizes…, params…) -> handle,
  /// <f>_run(handle, sizes…, the other arrays…), <f>_release(handle), with their _packed forms.
  std::vector<llvm::Function*> emit_c_entry_points(const std::string& name, llvm::Function* entry,
                                                   llvm::Function* prepare, llvm::Function* release);

  // --- nodes ----------------------------------------------------------------------------------

  /// The CPU's implementation of each kernel kind (lowering/select.hpp).
  void emit_node(int id) {
    const Node& n = g_.node(id);
    if (elementwise_only_summed(g_, id)) return;  // computed by the sums that read it
    switch (select_kernel(g_, id)) {
      case KernelKind::leaf:
      case KernelKind::view:
      case KernelKind::attention_weights:  // written by its fused node
      case KernelKind::attention_lse:
      case KernelKind::attention_grads:       // written by their fused backward
      case KernelKind::dequantize_in_linear:  // read by the linear layers' kernels
        return;
      case KernelKind::dequantize:
        return emit_dequantize(id);
      case KernelKind::fused_attention:
        return emit_attention(id);
      case KernelKind::attention_backward:
        return emit_backward(id);
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
        if (plan_.kv_alias.count(id)) return;  // read in place by the attention (a KV cache's prefix)
        if (n.op == Op::slice) return emit_slice(id);
        if (n.op == Op::concat) return emit_concat(id);
        return emit_strided_copy(id);
      case KernelKind::fill: {
        if (fill_only_summed(g_, id)) return;
        const bool boolean = storage_dtype(n.dtype) == DType::boolean;
        llvm::Value* c = boolean ? static_cast<llvm::Value*>(b_.getInt8(n.scalar != 0.0 ? 1 : 0))
                                 : llvm::ConstantFP::get(f32_, n.scalar);
        map_values(id, {}, {}, [&](const Dims&, const Values&) { return c; });
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
      case KernelKind::rms_norm:
        return emit_rms_norm(id);
      case KernelKind::rope:
        return emit_rope(id);
      case KernelKind::embedding:
        return emit_embedding(id);
      case KernelKind::embedding_grad:
        return emit_embedding_grad(id);
      case KernelKind::argmax:
        return emit_argmax(id);
      case KernelKind::update_slice:
        return emit_update_slice(id);
      case KernelKind::convert:  // widened as loaded, rounded as stored: nothing in between
        map_values(id, {n.inputs[0]}, {strides_of(shape(n.inputs[0]))},
                   [](const Dims&, const Values& in) { return in[0]; });
        return;
    }
    internal_error("codegen: op " + std::string(op_name(n.op)) + " has no lowering");
  }

  void emit_scale(int id);
  void emit_rms_norm(int id);
  void emit_rope(int id);
  void emit_embedding(int id);
  void emit_embedding_grad(int id);
  /// Id k of node `ids` (an integer array or f32 values): (whether it names one of `rows` rows, that row or 0).
  std::pair<llvm::Value*, llvm::Value*> row_of_id(int ids, const I& k, const I& rows);
  /// A quantized weight written out (a dequantize the linear kernels do not read in place).
  void emit_dequantize(int id);
  /// Entry kk of a q4 row whose bytes start at byte `row` of q: its nibble − 8, as an i8.
  llvm::Value* q4_entry(llvm::Value* q, const I& row, const I& kk, const I& group);

  void emit_argmax(int id);

  void emit_causal(int id);

  /// score_mod entry by entry: the expression on scalars (mod_ir), loads from the captured
  /// inputs' buffers.
  void emit_score_mod(int id);

  /// relu / gelu on the row-wise kernels, in ranges of the flat index.
  void emit_activation(int id);

  void emit_add_same(int id);

  void emit_slice(int id);
  void emit_concat(int id);
  /// Bᵀ into panels; a quantized W (gemm_cfg_.quant_group) dequantized from q `wt` and `scales`;
  /// `columns`: f32 B given as [K, N] rows (B itself, not Bᵀ).
  void emit_pack_panels(llvm::Value* wt, llvm::Value* packed, const I& nn, const I& k, llvm::Value* scales = nullptr,
                        bool columns = false);
  bool emit_contract_on_gemm(int id);
  /// contract(x, fill): sums over axes of x that lead (x [C..., O...]: Σ over Batch and Seq, a
  /// bias's or a norm weight's gradient) or trail (x [O..., C...]: a row's sum, in a norm's
  /// backward). Column sums: each output's sum in double in x's order, but row by row with the
  /// outputs innermost (in vectors), the outputs split among the tasks. Row sums: each in double,
  /// reassociated into vectors of partial sums (an order the code fixes, whatever the threads).
  /// x's entries read, or computed from its inputs' (summand: elementwise_only_summed). False
  /// when the contract is of neither form.
  bool emit_fill_sums(int id);
  llvm::Value* summand(int x, const I& at);
  void emit_pad_bias(llvm::Value* bias, llvm::Value* bias_pad, const I& nn);
  void emit_update_slice(int id);
  /// permute / broadcast: moved as stored (an integer input via f32); transposes in tiles.
  void emit_strided_copy(int id);
  void emit_broadcasting(int id);

  /// keep iff dropout_keep(p, seed, batch, head, row, col), the interpreter's index convention: col
  /// = last index, row = second to last, batch = first (rank >= 3), head = the axes in between.
  void emit_dropout(int id);

  /// The shape around axis p as (outer, n, inner): element (o, k, i) at (o·n + k)·inner + i.
  struct Around {
    I outer, n, inner;
  };
  Around around(const Dims& s, std::size_t p);

  /// Calls body(base) for every (o, i) with base = o·n·inner + i: the start of one line along p.
  void lines(const Around& r, const std::function<void(const I& base)>& body);

  /// Σ over k in [0, n) of f(k), in double.
  /// `reassociate`: the sum may be taken in vectors of partial sums (an order the code fixes).
  llvm::Value* sum(const I& n, const std::function<llvm::Value*(const I& k)>& f, bool reassociate = false);

  /// The largest element at(k) of node x over k in [0, n) (−inf when n = 0); a NaN wins, as in
  /// the interpreter.
  llvm::Value* row_max(int x, const I& n, const std::function<I(const I& k)>& at);

  void emit_softmax(int id);

  /// logsumexp along attr_axes[0] (dropped from the output, the other axes in order): m + ln Σ
  /// e^(x − m), the sum in double, the log in f32 (no library call); an all −inf row gives −inf,
  /// m = ±inf or NaN gives m.
  void emit_logsumexp(int id);

  /// layer norm over the contiguous axis (biased variance, eps inside the square root) on the
  /// row-wise kernel, in ranges of rows.
  void emit_layer_norm_rows(int id);

  /// layer norm along another axis: a loop nest in double.
  void emit_layer_norm_strided(int id);
  /// linear over a non-contiguous axis: y[o, j, c] = Σ_i x[o, i, c]·W[j, i] + b[j], in double.
  void emit_linear_strided(int id);
  /// contract: out[o] = Σ_c lhs[o, c]·rhs[o, c], axes matched by name, in double.
  void emit_contract(int id);

  /// y[M, N] = x[M, K]·W[N, K]ᵀ + b on the GEMM kernel (Bᵀ packed into zero-padded panels).
  void emit_gemm(int id);
  /// The GEMM / GEMV kernels' configuration for linear node `id` (bf16 operands or f32).
  GemmConfig gemm_config(int id) const;

  void emit_gemm_call(int id, llvm::Value* x, llvm::Value* wt, llvm::Value* bias, llvm::Value* y, const I& m,
                      const I& nn, const I& k);
  /// A few rows: the GEMV kernel for m's row count, W read in place (a quantized W: q, its scales).
  void emit_gemv_call(llvm::Value* x, llvm::Value* wt, llvm::Value* bias_pad, llvm::Value* y, const I& m, const I& nn,
                      const I& k, llvm::Value* scales);
  /// The GEMM kernel's tasks over Bᵀ packed into panels (emit_pack_panels; int8_dot: x 8-bit, x_scales).
  void emit_gemm_packed(llvm::Value* x, llvm::Value* packed, llvm::Value* bias_pad, llvm::Value* y, const I& m,
                        const I& nn, const I& k, llvm::Value* x_scales = nullptr);
  void emit_quantized_linear(  // a linear on a quantized W, its rows rounded to 8 bits (module_quantized.cpp)
      int id, llvm::Value* wt, llvm::Value* scales, llvm::Value* block, llvm::Value* bias_pad, llvm::Value* y,
      const I& m, const I& nn, const I& k);
  llvm::Value* emit_round_activations(int xid, std::int64_t group, llvm::Value* out, const I& m, const I& k, bool int8);
  void emit_round_activations_in_pairs(int xid, llvm::Value* out, const I& m, const I& k);
  void emit_round_activations_in_panels(int xid, llvm::Value* out, const I& m, const I& k);
  void emit_int8_gemv(llvm::Value* wt, llvm::Value* scales, llvm::Value* xr, llvm::Value* bias_pad, llvm::Value* y,
                      const I& m, const I& nn, const I& k);
  void emit_int8_gemv_panels(llvm::Value* wt, llvm::Value* scales, llvm::Value* xr, llvm::Value* bias_pad,
                             llvm::Value* y, const I& m, const I& nn, const I& k);
  void emit_pack_int8_panels(llvm::Value* wt, llvm::Value* packed, const I& nn, const I& k, llvm::Value* scales);
  using RowBlock = std::function<void(const std::vector<I>& w_rows, const I& o0, const I& end, const I& x0)>;
  void int8_row_blocks(const I& m, const I& nn, const I& k, int outs, const I& x_step, const RowBlock& block);

  void emit_attention(int id);
  /// The mod's tensors of fused node n as its kernel reads them: their base pointers and their
  /// extents, concatenated (null, null without tensors).
  std::pair<llvm::Value*, llvm::Value*> mod_tensor_arrays(const Node& n, const AttentionCall& call);
  /// fused_attention_backward: D, the kernel's tasks (cpu/kernels/attention_backward.hpp), the
  /// dQ partial sums added in chunk order and the tensor gradients' in slot order, as
  /// run_attention_backward does.
  void emit_backward(int id);

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
  std::map<int, llvm::Value*> weights_, lse_, split_;
  struct BackwardBuffers {
    llvm::Value *delta = nullptr, *partial = nullptr, *dk = nullptr, *dv = nullptr;
    std::vector<llvm::Value*> tensor_partial;  // per spec.tensor_grads entry
  };
  std::map<int, BackwardBuffers> backward_;  // fused_attention_backward id -> where its kernel writes
  std::map<int, std::pair<llvm::Value*, llvm::Value*>> gemm_blocks_;
  std::set<DType> rowwise_emitted_;
  GemmConfig gemm_cfg_;             // of the linear being emitted (gemm_config)
  llvm::Value* threads_ = nullptr;  // i32, this call's thread count
  llvm::Function* parallel_ = nullptr;
  int task_depth_ = 0;                          // > 0 while a parallel_for's task body is generated
  llvm::Instruction* before_region_ = nullptr;  // the branch into the region being emitted (emit_region)
  std::string node_label_;                      // "n<id>_<op>" of the node being emitted: its functions' names
  llvm::Value* status_ = nullptr;               // i32 slot: the entry's return value (3: an embedding id out of range)
  llvm::Value* handle_ = nullptr;               // the entry's prepared handle (null in plain calls)
  std::string release_name_;
};

}  // namespace qkv::codegen::cpu::detail
