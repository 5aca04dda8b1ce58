# The pass pipeline: graph -> graph (no LLVM headers in these files).
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/verify.cpp
  ${CMAKE_CURRENT_LIST_DIR}/canonicalize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/fuse_attention.cpp
  ${CMAKE_CURRENT_LIST_DIR}/layout.cpp
  ${CMAKE_CURRENT_LIST_DIR}/legalize_dtypes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline.cpp
)
