# `qkv emit train-step` for the tiny Llama of PyTorch's training fixtures, as a shared library and
# header in a directory; a plain C program (train_step_main.c) built against them with the C
# compiler alone trains the model for the fixture's steps and checks its losses, gradient norms
# and final weights against PyTorch's. Two fixtures: adamw (two state arrays per weight) and sgd
# (momentum: one).
#   cmake -DQKV=... -DCC=... -DSRC=... -DFIXTURES=.../train_fixtures -DWORK=... -P train_step.cmake
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})
include(${CMAKE_CURRENT_LIST_DIR}/step.cmake)

# The fixture `name`, trained at learning rate `lr` by the optimizer the remaining arguments give
# (make_train_fixtures.py's); every fixture's loss has label smoothing 0.1, its batch 2 x 7 tokens.
function(train_case name lr)
  set(lib ${WORK}/${name})
  step(${QKV} emit train-step --config ${FIXTURES}/${name}/config.json --batch 2 --seq 7 ${ARGN}
       --label-smoothing 0.1 --function tiny_llama --out ${lib}/)
  foreach(f tiny_llama.so tiny_llama.h)
    if(NOT EXISTS ${lib}/${f})
      message(FATAL_ERROR "qkv emit train-step wrote no ${f} into ${lib}/")
    endif()
  endforeach()
  step(readelf -d ${lib}/tiny_llama.so)
  if(last_output MATCHES "NEEDED[^\n]*(qkv|LLVM|stdc\\+\\+)")
    message(FATAL_ERROR "tiny_llama.so depends on a qkv/LLVM/C++ library:\n${last_output}")
  endif()
  step(${CC} -std=c11 -Wall -Wextra -Werror -O2 -I${lib} -I${SRC} ${SRC}/train_step_main.c ${lib}/tiny_llama.so
       -Wl,-rpath,${lib} -lm -o ${lib}/train_step_main)
  step(${lib}/train_step_main ${FIXTURES}/${name} ${lr})
endfunction()

train_case(adamw 1e-2 --optimizer adamw --beta1 0.9 --beta2 0.95 --eps 1e-8 --weight-decay 0.1)
train_case(sgd 0.05 --optimizer sgd --momentum 0.9 --weight-decay 0.01)
