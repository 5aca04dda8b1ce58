# `qkv emit train-step` for the tiny Llama of a PyTorch training fixture, as a shared library and
# header in a directory; a plain C program (train_step_main.c) built against them with the C
# compiler alone trains the model for the fixture's steps and checks its losses, gradient norms
# and final weights against PyTorch's.
#   cmake -DQKV=... -DCC=... -DSRC=... -DFIXTURE=.../train_fixtures/adamw -DLR=1e-2 -DWORK=... -P train_step.cmake
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

# The fixture's optimizer and loss (make_train_fixtures.py): AdamW(betas 0.9, 0.95; eps 1e-8;
# weight decay 0.1), cross-entropy with label smoothing 0.1; batch 2 of 7 tokens.
step(${QKV} emit train-step --config ${FIXTURE}/config.json --batch 2 --seq 7 --optimizer adamw --beta1 0.9
     --beta2 0.95 --eps 1e-8 --weight-decay 0.1 --label-smoothing 0.1 --function tiny_llama --out ${WORK}/lib/)
foreach(f tiny_llama.so tiny_llama.h)
  if(NOT EXISTS ${WORK}/lib/${f})
    message(FATAL_ERROR "qkv emit train-step wrote no ${f} into ${WORK}/lib/")
  endif()
endforeach()
step(readelf -d ${WORK}/lib/tiny_llama.so)
if(last_output MATCHES "NEEDED[^\n]*(qkv|LLVM|stdc\\+\\+)")
  message(FATAL_ERROR "tiny_llama.so depends on a qkv/LLVM/C++ library:\n${last_output}")
endif()
step(${CC} -std=c11 -Wall -Wextra -Werror -O2 -I${WORK}/lib -I${SRC} ${SRC}/train_step_main.c ${WORK}/lib/tiny_llama.so
     -Wl,-rpath,${WORK}/lib -lm -o ${WORK}/train_step_main)
step(${WORK}/train_step_main ${FIXTURE} ${LR})
