# What every backend shares after the pass pipeline (no LLVM): which kernel kind runs each node,
# lifetimes and buffer slots, the fused attention's call and mask combination, storage.
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/select.cpp
  ${CMAKE_CURRENT_LIST_DIR}/lifetimes.cpp
  ${CMAKE_CURRENT_LIST_DIR}/attention_call.cpp
)
