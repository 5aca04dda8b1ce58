# The AOT end-to-end test: `qkv emit` a multi-head attention layer (key padding) as a shared
# library + C header, build the plain C program mha_main.c against them with the C compiler
# alone, check the library depends on no qkv/LLVM/C++ library, run it; the same with run-time
# sizes, and an encoder layer taking its linear weights quantized.
#   cmake -DQKV=... -DCC=... -DSRC=... -DWORK=... -P run.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/step.cmake)

step(${QKV} emit mha --batch 3 --heads 4 --seq 37 --embed-dim 64 --padding --seed 11
     --target cpu --format so --function mha -o ${WORK}/mha.so --example-dir ${WORK}/example)
if(NOT EXISTS ${WORK}/mha.h)
  message(FATAL_ERROR "qkv emit wrote no header beside mha.so")
endif()
step(readelf -d ${WORK}/mha.so)
if(last_output MATCHES "NEEDED[^\n]*(qkv|LLVM|stdc\\+\\+)")
  message(FATAL_ERROR "mha.so depends on a qkv/LLVM/C++ library:\n${last_output}")
endif()
step(${CC} -std=c11 -Wall -Wextra -Werror -O2 -I${WORK} -I${SRC} ${SRC}/mha_main.c ${WORK}/mha.so -Wl,-rpath,${WORK} -lm
     -o ${WORK}/mha_main)
step(${WORK}/mha_main ${WORK}/example)

# The same model with Batch, Seq and Key left as run-time sizes: one library, called by a C program
# at the sizes of two example directories (written by emits at other sizes).
step(${QKV} emit mha --batch 3 --heads 4 --seq 37 --embed-dim 64 --padding --seed 11 --dynamic Batch,Seq,Key
     --target cpu --format so --function mha_dyn -o ${WORK}/mha_dyn.so --example-dir ${WORK}/example_37)
step(${QKV} emit mha --batch 2 --heads 4 --seq 90 --embed-dim 64 --padding --seed 12
     --target cpu --format so --function mha_other -o ${WORK}/other.so --example-dir ${WORK}/example_90)
step(${CC} -std=c11 -Wall -Wextra -Werror -O2 -I${WORK} -I${SRC} ${SRC}/mha_dynamic_main.c ${WORK}/mha_dyn.so
     -Wl,-rpath,${WORK} -lm -o ${WORK}/mha_dynamic_main)
step(${WORK}/mha_dynamic_main ${WORK}/example_37 3 37 ${WORK}/example_90 2 90)

# A model whose linear layers' weights the function takes quantized (--quantize q8 / q4): int8 q
# and f16 scales in their place, written to the example directory as qkv quantizes them; the
# library's outputs are the interpreter's on the same q and scales — within 2e-2, not 1e-4: a
# quantized linear rounds its input to 8 bits (docs/semantics.md), and the two compute that input
# (a layer norm, an attention) equal to ~1e-7, not bit for bit, so an entry within that of a
# rounding boundary may round either way and move a row's outputs by one 8-bit step (7e-4 and 8e-3
# seen at some sequence lengths; quantize_tests checks the kernels on identical inputs to 2e-5).
# A wrong layout of q or of the scales moves them by O(1).
foreach(q q8 q4)
  step(${QKV} emit encoder-layer --batch 2 --heads 2 --seq 11 --embed-dim 64 --seed 4 --quantize ${q}
       --target cpu --format so --function enc_${q} -o ${WORK}/enc_${q}.so --example-dir ${WORK}/example_${q})
  file(READ ${WORK}/enc_${q}.h header)
  if(NOT header MATCHES "const int8_t\\* linear1_weight_${q}")
    message(FATAL_ERROR "enc_${q}.h takes no quantized linear1 weight:\n${header}")
  endif()
  string(TOUPPER enc_${q} upper)
  step(${CC} -std=c11 -Wall -Wextra -Werror -O2 -DQKV_FN=enc_${q} -DQKV_FN_UPPER=${upper} "-DQKV_HEADER=\"enc_${q}.h\""
       -I${WORK} -I${SRC} ${SRC}/aot_check.c ${WORK}/enc_${q}.so -Wl,-rpath,${WORK} -lm -o ${WORK}/check_${q})
  step(${WORK}/check_${q} ${WORK}/example_${q} 2e-2)
endforeach()
