// The module's entry points beside <f>_entry (ModuleBuilder, module_builder_impl.hpp): the
// prepared handle's <f>_prepare_entry / <f>_release_entry, and the C entry points of an AOT
// build (<f>, <f>_packed, <f>_set_threads, <f>_prepare, <f>_run, <f>_release and their packed forms);
// and the run-time size checks both kinds of entry make before anything runs.
#include "cpu/module/cpu_check.hpp"
#include "cpu/module/module_builder_impl.hpp"

namespace qkv::codegen::cpu::detail {

/// ptr <f>_prepare_entry(const i64* sizes, void* const* args): a handle holding the parameters
/// (args' param slots; the other args are not read) and every prepared linear's weights packed
/// into the GEMM's panels, or null when memory runs out.
llvm::Function* ModuleBuilder::emit_prepare(const std::string& name) {
  fn_ = llvm::Function::Create(llvm::FunctionType::get(ptr_, {ptr_, ptr_}, false), llvm::GlobalValue::ExternalLinkage,
                               name, m_);
  attributes(fn_);
  llvm::Value *sizes = fn_->getArg(0), *args = fn_->getArg(1);
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
  threads_ = emit_thread_count(b_, b_.getInt32(0));  // the packing runs on one thread per online CPU
  sym_.clear();
  for (std::size_t k = 0; k < plan_.dynamic.size(); ++k)
    sym_[plan_.dynamic[k]] = b_.CreateLoad(i64_, b_.CreateConstGEP1_64(i64_, sizes, k), plan_.dynamic[k]);
  // The sizes of the parameters (the only ones read here) must be >= 0 and fit (sizes_fit).
  if (!plan_.dynamic.empty()) {
    ir::Bool fits = sizes_fit([](const Node& n) { return n.op == Op::param; });
    std::set<std::string> seen;  // each extent once
    for (const auto& n : g_.nodes())
      if (n.op == Op::param)
        for (const auto& a : n.axes)
          if (a.extent.is_dynamic() && seen.insert(a.extent.str()).second) fits = fits && dim(a.extent) >= 0;
    auto* bad = llvm::BasicBlock::Create(ctx_, "bad_sizes", fn_);
    auto* fine = llvm::BasicBlock::Create(ctx_, "sizes_fit", fn_);
    b_.CreateCondBr(fits.v(), fine, bad);
    b_.SetInsertPoint(bad);
    b_.CreateRet(llvm::ConstantPointerNull::get(ptr_));
    b_.SetInsertPoint(fine);
  }
  auto* calloc_fn = m_.getOrInsertFunction("calloc", ptr_, i64_, i64_).getCallee();
  llvm::Value* handle =
      b_.CreateCall(llvm::cast<llvm::Function>(calloc_fn), {b_.getInt64(handle_slots()), b_.getInt64(8)}, "handle");
  auto give_up_unless = [&](llvm::Value* ok) {  // null (after freeing what was made) unless ok
    auto* fail = llvm::BasicBlock::Create(ctx_, "fail", fn_);
    auto* next = llvm::BasicBlock::Create(ctx_, "ok", fn_);
    b_.CreateCondBr(ok, next, fail);
    b_.SetInsertPoint(fail);
    b_.CreateCall(m_.getFunction(release_name_), {handle});
    b_.CreateRet(llvm::ConstantPointerNull::get(ptr_));
    b_.SetInsertPoint(next);
  };
  auto* null_fail = llvm::BasicBlock::Create(ctx_, "no_handle", fn_);
  auto* made = llvm::BasicBlock::Create(ctx_, "made", fn_);
  b_.CreateCondBr(b_.CreateIsNull(handle), null_fail, made);
  b_.SetInsertPoint(null_fail);
  b_.CreateRet(llvm::ConstantPointerNull::get(ptr_));
  b_.SetInsertPoint(made);
  for (std::size_t k = 0; k < plan_.dynamic.size(); ++k) b_.CreateStore(sym_[plan_.dynamic[k]], slot(handle, k));
  std::size_t leaf = 0, param = 0;
  std::map<int, llvm::Value*> leaves;
  for (int id = 0; id < static_cast<int>(g_.size()); ++id) {
    const Node& n = g_.node(id);
    if (!is_array_leaf(n)) continue;
    llvm::Value* a = b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, args, leaf++));
    if (n.op != Op::param) continue;
    b_.CreateStore(a, slot(handle, slot_param(param++)));
    leaves[id] = a;
  }
  std::vector<std::vector<llvm::BasicBlock*>> regions;
  std::vector<std::string> labels;
  for (std::size_t j = 0; j < plan_.prepared.size(); ++j) {
    const Node& n = g_.node(plan_.prepared[j]);
    gemm_cfg_ = gemm_config(plan_.prepared[j]);
    const std::int64_t nr = gemm_cfg_.cols();
    const Dims w = shape(n.inputs[1]);
    const I panels = ceil_div(w[0], nr);
    llvm::Value* packed = aligned_alloc(gemm_panel_bytes(gemm_cfg_, w[0], w[1]));  // f32, 16-bit or bf16 pairs
    b_.CreateStore(packed, slot(handle, slot_prepared(j)));
    llvm::Value* bias_pad = aligned_alloc(panels * nr * 4);
    b_.CreateStore(bias_pad, slot(handle, slot_prepared(j) + 1));
    give_up_unless(b_.CreateAnd(b_.CreateIsNotNull(packed), b_.CreateIsNotNull(bias_pad)));
    // A function per linear, one for the linears of every layer (outline_node_regions).
    regions.push_back(emit_region([&] {
      emit_pack_panels(leaves.at(n.inputs[1]), packed, w[0], w[1]);
      emit_pad_bias(n.inputs.size() > 2 ? leaves.at(n.inputs[2]) : nullptr, bias_pad, w[0]);
    }));
    labels.push_back("pack.n" + std::to_string(plan_.prepared[j]));
  }
  b_.CreateRet(handle);
  outline_node_regions(*fn_, regions, labels);
  return fn_;
}

/// void <f>_release_entry(ptr handle): frees what <f>_prepare_entry made (null: nothing).
llvm::Function* ModuleBuilder::emit_release(const std::string& name) {
  llvm::Function* f = m_.getFunction(name);
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", f));
  llvm::Value* handle = f->getArg(0);
  auto* body = llvm::BasicBlock::Create(ctx_, "free", f);
  auto* done = llvm::BasicBlock::Create(ctx_, "done", f);
  b_.CreateCondBr(b_.CreateIsNull(handle), done, body);
  b_.SetInsertPoint(body);
  for (std::size_t j = 0; j < plan_.prepared.size(); ++j)
    for (std::size_t k : {slot_prepared(j), slot_prepared(j) + 1}) free(b_.CreateLoad(ptr_, slot(handle, k)));
  free(b_.CreateLoad(ptr_, slot(handle, slot_arena())));
  free(handle);
  b_.CreateBr(done);
  b_.SetInsertPoint(done);
  b_.CreateRetVoid();
  return f;
}

/// The C entry points around the entry: <f>(sizes…, arrays…), <f>_packed([sizes,] args),
/// <f>_set_threads, and the prepared pair <f>_prepare(sizes…, params…) -> handle,
/// <f>_run(handle, sizes…, the other arrays…), <f>_release(handle), with their _packed forms.
//
/// They are compiled for the architecture's baseline (cpu_check.hpp) and run the CPU check first:
/// a CPU without a feature the kernels were compiled for gets 6 (NULL from the _prepare pair, and
/// _release frees nothing) before any instruction it lacks runs.
std::vector<llvm::Function*> ModuleBuilder::emit_c_entry_points(const std::string& name, llvm::Function* entry,
                                                                llvm::Function* prepare, llvm::Function* release) {
  for (llvm::Function* f : {entry, prepare, release}) f->addFnAttr(llvm::Attribute::NoInline);
  const CpuCheck cpu = emit_cpu_check(m_, target_, name);
  auto baseline = [this](llvm::Function* f) { baseline_attributes(f, target_); };
  llvm::Function* set = nullptr;
  llvm::GlobalVariable* setting = emit_thread_setting(m_, name, baseline, &set);
  const std::size_t n_sizes = sig_.sizes.size(), n_args = sig_.args.size();
  std::vector<bool> is_param(n_args, false);
  {
    std::size_t k = 0;
    for (const auto& n : g_.nodes())
      if (is_array_leaf(n)) is_param[k++] = n.op == Op::param;
  }
  llvm::Value* null = llvm::ConstantPointerNull::get(ptr_);
  // A function of `params` (after a leading handle when `handle`), sizes first unless packed.
  auto begin = [&](const std::string& fname, llvm::Type* ret, std::vector<llvm::Type*> params) {
    fn_ = llvm::Function::Create(llvm::FunctionType::get(ret, params, false), llvm::GlobalValue::ExternalLinkage, fname,
                                 m_);
    baseline(fn_);
    b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", fn_));
    // The CPU check: 6 (or NULL, or nothing) unless this CPU has every feature the code needs.
    auto* refuse = llvm::BasicBlock::Create(ctx_, "cpu_lacks", fn_);
    auto* go = llvm::BasicBlock::Create(ctx_, "cpu_ok", fn_);
    b_.CreateCondBr(b_.CreateIsNull(b_.CreateCall(cpu.check)), go, refuse);
    b_.SetInsertPoint(refuse);
    if (ret->isVoidTy())
      b_.CreateRetVoid();
    else if (ret->isPointerTy())
      b_.CreateRet(llvm::ConstantPointerNull::get(ptr_));
    else
      b_.CreateRet(b_.getInt32(kCpuLacksFeatures));
    b_.SetInsertPoint(go);
    return fn_;
  };
  auto arrays = [&](std::size_t n) { return ir::entry_alloca(b_, ptr_, std::max<std::size_t>(n, 1), 8, "args"); };
  auto size_array = [&](llvm::Function* f, unsigned first) {
    llvm::Value* sizes = ir::entry_alloca(b_, i64_, std::max<std::size_t>(n_sizes, 1), 8, "sizes");
    for (std::size_t k = 0; k < n_sizes; ++k) {
      f->getArg(first + static_cast<unsigned>(k))->setName(sig_.sizes[k].c_name);
      b_.CreateStore(f->getArg(first + static_cast<unsigned>(k)), b_.CreateConstGEP1_64(i64_, sizes, k));
    }
    return sizes;
  };
  auto packed_sizes = [&](llvm::Function* f, unsigned at) {
    return n_sizes > 0 ? static_cast<llvm::Value*>(f->getArg(at)) : null;
  };
  const std::vector<llvm::Type*> size_types(n_sizes, i64_);
  auto with = [&](std::vector<llvm::Type*> head, std::size_t arrays_count) {
    head.insert(head.end(), size_types.begin(), size_types.end());
    head.insert(head.end(), arrays_count, ptr_);
    return head;
  };
  std::size_t n_params = 0;
  for (bool p : is_param) n_params += p;

  // <f>(sizes…, arrays…)
  llvm::Function* direct = begin(name, i32_, with({}, n_args));
  llvm::Value* sizes = size_array(direct, 0);
  llvm::Value* args = arrays(n_args);
  for (std::size_t k = 0; k < n_args; ++k) {
    llvm::Value* a = direct->getArg(static_cast<unsigned>(n_sizes + k));
    a->setName(sig_.args[k].c_name);
    b_.CreateStore(a, b_.CreateConstGEP1_64(ptr_, args, k));
  }
  b_.CreateRet(b_.CreateCall(entry, {sizes, args, b_.CreateLoad(i32_, setting), null}));

  // <f>_packed([sizes,] args)
  llvm::Function* packed = begin(name + "_packed", i32_, std::vector<llvm::Type*>(n_sizes > 0 ? 2 : 1, ptr_));
  b_.CreateRet(b_.CreateCall(
      entry, {packed_sizes(packed, 0), packed->getArg(n_sizes > 0 ? 1 : 0), b_.CreateLoad(i32_, setting), null}));

  // <f>_prepare(sizes…, params…): the args with the parameters in place, nothing else.
  auto prepare_from = [&](llvm::Value* sz, const std::function<llvm::Value*(std::size_t)>& param) {
    llvm::Value* all = arrays(n_args);
    for (std::size_t k = 0, p = 0; k < n_args; ++k)
      b_.CreateStore(is_param[k] ? param(p++) : null, b_.CreateConstGEP1_64(ptr_, all, k));
    b_.CreateRet(b_.CreateCall(prepare, {sz, all}));
  };
  llvm::Function* prep = begin(name + "_prepare", ptr_, with({}, n_params));
  {
    llvm::Value* sz = size_array(prep, 0);
    prepare_from(sz, [&](std::size_t p) { return prep->getArg(static_cast<unsigned>(n_sizes + p)); });
  }
  llvm::Function* prep_packed =
      begin(name + "_prepare_packed", ptr_, std::vector<llvm::Type*>(n_sizes > 0 ? 2 : 1, ptr_));
  {
    llvm::Value* list = prep_packed->getArg(n_sizes > 0 ? 1 : 0);
    prepare_from(packed_sizes(prep_packed, 0),
                 [&](std::size_t p) { return b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, list, p)); });
  }

  // <f>_run(handle, sizes…, the arrays that are not parameters…): those from the handle.
  auto run_from = [&](llvm::Value* handle, llvm::Value* sz, const std::function<llvm::Value*(std::size_t)>& other) {
    llvm::Value* all = arrays(n_args);
    // A null handle (a failed prepare) is refused (5) rather than read.
    auto* bad = llvm::BasicBlock::Create(ctx_, "no_handle", fn_);
    auto* ok = llvm::BasicBlock::Create(ctx_, "run", fn_);
    b_.CreateCondBr(b_.CreateIsNull(handle), bad, ok);
    b_.SetInsertPoint(bad);
    b_.CreateRet(b_.getInt32(5));
    b_.SetInsertPoint(ok);
    for (std::size_t k = 0, p = 0, o = 0; k < n_args; ++k)
      b_.CreateStore(is_param[k] ? b_.CreateLoad(ptr_, slot(handle, slot_param(p++))) : other(o++),
                     b_.CreateConstGEP1_64(ptr_, all, k));
    b_.CreateRet(b_.CreateCall(entry, {sz, all, b_.CreateLoad(i32_, setting), handle}));
  };
  llvm::Function* run = begin(name + "_run", i32_, with({ptr_}, n_args - n_params));
  {
    run->getArg(0)->setName("handle");
    llvm::Value* sz = size_array(run, 1);
    std::size_t o = 0;
    for (std::size_t k = 0; k < n_args; ++k)
      if (!is_param[k]) run->getArg(static_cast<unsigned>(1 + n_sizes + o++))->setName(sig_.args[k].c_name);
    run_from(run->getArg(0), sz, [&](std::size_t i) { return run->getArg(static_cast<unsigned>(1 + n_sizes + i)); });
  }
  llvm::Function* run_packed = begin(name + "_run_packed", i32_, std::vector<llvm::Type*>(n_sizes > 0 ? 3 : 2, ptr_));
  {
    llvm::Value* list = run_packed->getArg(n_sizes > 0 ? 2 : 1);
    run_from(run_packed->getArg(0), packed_sizes(run_packed, 1),
             [&](std::size_t i) { return b_.CreateLoad(ptr_, b_.CreateConstGEP1_64(ptr_, list, i)); });
  }
  llvm::Function* rel = begin(name + "_release", b_.getVoidTy(), {ptr_});
  b_.CreateCall(release, {rel->getArg(0)});
  b_.CreateRetVoid();
  return {direct, packed, set, prep, prep_packed, run, run_packed, rel, cpu.required, cpu.check};
}

// --- the run-time size checks ------------------------------------------------------------------

ir::Bool ModuleBuilder::sizes_fit(const std::function<bool(const Node&)>& keep) {
  // Each distinct product once, in the order first met (the module's text, hence its cache key,
  // stays the same from run to run): a decoder's layers repeat theirs, and the entry must not
  // grow with the depth by more than a call per node.
  spaces_.clear();
  std::vector<llvm::Value*> loops;  // the iteration spaces
  std::map<llvm::Value*, std::int64_t> count;
  std::vector<llvm::Value*> buffers;  // the distinct buffer sizes, each counted count[] times
  for (const auto& n : g_.nodes()) {
    if (!keep(n)) continue;
    for (llvm::Value* v : iteration_space(n))
      if (std::find(loops.begin(), loops.end(), v) == loops.end()) loops.push_back(v);
    llvm::Value* own = space_of({&n.axes});
    if (count[own]++ == 0) buffers.push_back(own);
  }
  llvm::Value* largest = llvm::ConstantFP::get(f64_, 0.0);
  for (llvm::Value* v : loops) largest = b_.CreateMaxNum(largest, v);
  llvm::Value* total = llvm::ConstantFP::get(f64_, 0.0);
  for (llvm::Value* v : buffers)
    total = b_.CreateFAdd(total, b_.CreateFMul(v, llvm::ConstantFP::get(f64_, static_cast<double>(count[v]))));
  constexpr double kLimit = 72057594037927936.0;  // 2^56
  llvm::Value* limit = llvm::ConstantFP::get(f64_, kLimit);
  return ir::Bool(b_, b_.CreateAnd(b_.CreateFCmpOLE(largest, limit), b_.CreateFCmpOLE(total, limit)));
}

llvm::Value* ModuleBuilder::space_of(std::initializer_list<const std::vector<Axis>*> lists) {
  std::map<std::string, const Extent*> space;
  for (const auto* axes : lists)
    for (const auto& a : *axes) space.emplace(a.name, &a.extent);
  std::vector<std::string> key;  // the product's factors: their order does not change it
  for (const auto& [name, e] : space) key.push_back(e->str());
  std::sort(key.begin(), key.end());
  auto [it, fresh] = spaces_.try_emplace(std::move(key), nullptr);
  if (fresh) {
    llvm::Value* product = llvm::ConstantFP::get(f64_, 8.0);
    for (const auto& [name, e] : space) product = b_.CreateFMul(product, fdim(*e));
    it->second = product;
  }
  return it->second;
}

std::vector<llvm::Value*> ModuleBuilder::iteration_space(const Node& n) {
  auto axes_of = [&](std::size_t k) { return &g_.node(n.inputs[k]).axes; };
  switch (n.op) {
    case Op::contract:
    case Op::logsumexp:
    case Op::argmax: {
      std::vector<llvm::Value*> spaces{space_of({&n.axes})};
      for (std::size_t k = 0; k < n.inputs.size(); ++k) spaces.push_back(space_of({&n.axes, axes_of(k)}));
      return spaces;
    }
    case Op::linear:
      return {space_of({&n.axes, axes_of(0)})};
    case Op::fused_attention:  // (q, k, v, …) -> out
      return {space_of({axes_of(0), axes_of(1)}), space_of({&n.axes, axes_of(2)})};
    case Op::fused_attention_backward:  // (q, k, v, out, d_out, …) -> dQ; dP = d_out · vᵀ
      return {space_of({axes_of(0), axes_of(1)}), space_of({axes_of(4), axes_of(2)})};
    default: {
      std::vector<llvm::Value*> spaces{space_of({&n.axes})};
      for (std::size_t k = 0; k < n.inputs.size(); ++k) spaces.push_back(space_of({axes_of(k)}));
      return spaces;
    }
  }
}

void ModuleBuilder::emit_size_checks() {
  if (plan_.dynamic.empty()) return;
  ir::Bool ok = sizes_fit([](const Node&) { return true; });
  std::set<std::string> seen;  // each extent once
  for (const auto& n : g_.nodes())
    for (const auto& a : n.axes)
      if (a.extent.is_dynamic() && seen.insert(a.extent.str()).second) ok = ok && dim(a.extent) >= 0;
  for (const auto& s : plan_.dynamic) ok = ok && I(b_, sym_.at(s)) >= 0;
  for (const auto& c : g_.constraints()) {
    const I a = dim(c.a), d = dim(c.b);
    switch (c.kind) {
      case Constraint::Kind::equal:
        ok = ok && a == d;
        break;
      case Constraint::Kind::divisible:
        ok = ok && (d != 0) && (a % pick(d == 0, c64(1), d) == 0);
        break;
      case Constraint::Kind::at_most:
        ok = ok && a <= d;
        break;
    }
  }
  // A concat whose joined axis has a symbol of its own (parts of different symbols): that size
  // must be the sum of the parts', or the parts would be written past the output.
  for (const auto& n : g_.nodes()) {
    if (n.op != Op::concat || n.attr_axes.empty()) continue;
    I total = c64(0);
    for (int part : n.inputs)
      total = total + dim(g_.node(part).axes[axis_pos(g_.node(part).axes, n.attr_axes[0])].extent);
    ok = ok && dim(n.axes[axis_pos(n.axes, n.attr_axes.back())].extent) == total;
  }
  // Slices inside their input; an update's rows inside the updated axis; a prefix of an update
  // as long as what it wrote (a KV cache's Key = Past + Seq).
  for (const auto& n : g_.nodes()) {
    if (n.op == Op::slice && n.attr_axes.size() == 2) {
      const auto& in = g_.node(n.inputs[0]);
      const I part = dim(n.axes[axis_pos(n.axes, n.attr_axes[1])].extent);
      const I start = n.dim ? dim(*n.dim) : part * n.offset;
      ok = ok && start >= 0 && start + part <= dim(in.axes[axis_pos(in.axes, n.attr_axes[0])].extent);
      if (in.op == Op::update_slice && n.offset == 0 && !n.dim && in.attr_axes[0] == n.attr_axes[0])
        ok = ok && part == update_end(in);
    }
    if (n.op == Op::update_slice) ok = ok && update_end(n) <= dim(n.axes[axis_pos(n.axes, n.attr_axes[0])].extent);
  }
  if (ok.constant() != true) fail_unless(ok.v(), 2);
}
}  // namespace qkv::codegen::cpu::detail
