# The AOT end-to-end test: `qkv emit` a multi-head attention layer (key padding) as a shared
# library + C header, build the plain C program mha_main.c against them with the C compiler
# alone, check the library depends on no qkv/LLVM/C++ library, run it.
#   cmake -DQKV=... -DCC=... -DSRC=... -DWORK=... -P run.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
function(step)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (exit ${rc})")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()

step(${QKV} emit mha --batch 3 --heads 4 --seq 37 --embed-dim 64 --padding --seed 11
     --target cpu --format so --function mha -o ${WORK}/mha.so --example-dir ${WORK}/example)
if(NOT EXISTS ${WORK}/mha.h)
  message(FATAL_ERROR "qkv emit wrote no header beside mha.so")
endif()
step(readelf -d ${WORK}/mha.so)
if(last_output MATCHES "NEEDED[^\n]*(qkv|LLVM|stdc\\+\\+)")
  message(FATAL_ERROR "mha.so depends on a qkv/LLVM/C++ library:\n${last_output}")
endif()
step(${CC} -std=c11 -Wall -Wextra -Werror -O2 -I${WORK} ${SRC}/mha_main.c ${WORK}/mha.so -Wl,-rpath,${WORK} -lm
     -o ${WORK}/mha_main)
step(${WORK}/mha_main ${WORK}/example)
