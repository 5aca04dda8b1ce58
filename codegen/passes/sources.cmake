# The pass pipeline and the CPU executor (no LLVM headers in these files).
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/verify.cpp
  ${CMAKE_CURRENT_LIST_DIR}/canonicalize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fuse_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/buffer_plan.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
  ${CMAKE_CURRENT_LIST_DIR}/executor.cpp
)
