# LLVM helpers both targets use: the host target, the JIT, the -O3 pipeline, external programs
# (linker, ptxas), IR loops and integers, vector math, Philox.
target_sources(qkv_codegen PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/target.cpp
  ${CMAKE_CURRENT_LIST_DIR}/jit.cpp
  ${CMAKE_CURRENT_LIST_DIR}/code_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimize.cpp
  ${CMAKE_CURRENT_LIST_DIR}/split_compile.cpp
  ${CMAKE_CURRENT_LIST_DIR}/process.cpp
  ${CMAKE_CURRENT_LIST_DIR}/ir_util.cpp
  ${CMAKE_CURRENT_LIST_DIR}/vector_math.cpp
  ${CMAKE_CURRENT_LIST_DIR}/philox_ir.cpp
  ${CMAKE_CURRENT_LIST_DIR}/mod_ir.cpp
)
