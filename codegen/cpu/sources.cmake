# The CPU backend: kernels/ (the fused attention, GEMM and row-wise kernel generators), module/
# (a whole lowered graph as one module: plan, code generator, threads as IR), the task policy
# (schedule.hpp), the thread pool and C++ kernel drivers, the executor, and AOT files.
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/kernels/attention_spec.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/attention_kernel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/attention_tile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/attention_mod.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/attention_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/attention_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/decode_kernel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/gemm_kernel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/gemv_kernel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernels/rowwise_kernel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/threads_ir.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/cpu_check.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_builder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/outline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_nodes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_copies.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_quantized.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_parallel.cpp
  ${CMAKE_CURRENT_LIST_DIR}/module/module_entry_points.cpp
  ${CMAKE_CURRENT_LIST_DIR}/thread_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/run_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/run_attention_backward.cpp
  ${CMAKE_CURRENT_LIST_DIR}/compiled_graph.cpp
  ${CMAKE_CURRENT_LIST_DIR}/executor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aot.cpp
  ${CMAKE_CURRENT_LIST_DIR}/aot_main.cpp
)
