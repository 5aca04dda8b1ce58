// How the generated code shares its loops among threads (ModuleBuilder, module_builder_impl.hpp):
// parallel_for over qkv_parallel (threads_ir.hpp), parallel_ranges, and loop nests split along
// their outermost dimension.
#include "cpu/module/module_builder_impl.hpp"

namespace qkv::codegen::cpu::detail {

void ModuleBuilder::parallel_for(const I& n, const I& work, const TaskBody& body) {
  const auto cn = n.constant(), cw = work.constant();
  if (cn && *cn <= 0) return;
  if ((cn && *cn == 1) || (cw && *cw < kParallelMinFlops) || task_depth_ > 0) {
    loop(c64(0), n, [&](I i) { body(i); }, "tasks");
    return;
  }
  auto* task = llvm::Function::Create(llvm::FunctionType::get(b_.getVoidTy(), {ptr_, i64_}, false),
                                      llvm::GlobalValue::InternalLinkage,
                                      node_label_.empty() ? "qkv_task" : "qkv_task." + node_label_, m_);
  attributes(task);
  const llvm::IRBuilderBase::InsertPoint saved = b_.saveIP();
  llvm::Function* saved_fn = fn_;
  fn_ = task;
  ++task_depth_;
  b_.SetInsertPoint(llvm::BasicBlock::Create(ctx_, "entry", task));
  body(I(b_, task->getArg(1)));
  b_.CreateRetVoid();
  --task_depth_;
  fn_ = saved_fn;
  b_.restoreIP(saved);
  llvm::Value* ctx = capture_into(b_, *task);
  const ir::Bool worth = (n > 1) && (work >= kParallelMinFlops);
  llvm::Value* threads = b_.CreateSelect(worth.v(), threads_, b_.getInt32(1));
  b_.CreateCall(parallel_runtime(), {task, ctx, n.v(), threads});
}

void ModuleBuilder::parallel_ranges(const I& total, std::int64_t grain, std::int64_t align, const I& work_per_unit,
                                    const std::function<void(I, I)>& fn) {
  const Ranges<I> r = ranges(total, grain, align);
  parallel_for(r.tasks, total * work_per_unit, [&](I t) {
    const I begin = t * r.block;
    fn(begin, imin(begin + r.block, total));
  });
}

void ModuleBuilder::nest_parallel(const Dims& dims, const std::vector<Dims>& strides, const Dims& bases, const I& cost,
                                  const Body& body) {
  if (dims.empty() || task_depth_ > 0) return nest(dims, strides, bases, body);
  Dims rest(dims.begin() + 1, dims.end());
  parallel_ranges(dims[0], 1, 1, numel(rest) * cost, [&](I begin, I end) {
    loop(
        begin, end,
        [&](I i) {
          Dims off = bases;
          for (std::size_t k = 0; k < strides.size(); ++k) off[k] = off[k] + i * strides[k][0];
          Dims idx{i};
          nest_from(1, dims, strides, idx, off, body);
        },
        "d0", dims.size() == 1 ? ir::Unroll::allowed : ir::Unroll::as_written);
  });
}

}  // namespace qkv::codegen::cpu::detail
