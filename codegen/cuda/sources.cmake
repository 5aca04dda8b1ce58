# The GPU backend's run path (codegen/cuda): plans a lowered graph onto the NVPTX kernels and runs
# it through the dlopen'd CUDA driver (qkv::cuda, part of qkv::runtime). No LLVM headers here.
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/executor.cpp
)
