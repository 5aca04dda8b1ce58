# The NVPTX backend (codegen/nvptx): kernels as LLVM IR for nvptx64-nvidia-cuda, emitted as PTX.
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/launch.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ptxas.cpp
  ${CMAKE_CURRENT_LIST_DIR}/kernel_builder.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_mod_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_backward_mma_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_backward_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_backward_common.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_mma_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/decode_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/dense_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/linear_mma_ptx.cpp
  ${CMAKE_CURRENT_LIST_DIR}/emit.cpp
)
