# Installs the build tree into a fresh prefix, then configures, builds and runs the consumer
# project in tests/install/consumer against it with find_package(qkv CONFIG REQUIRED).
file(REMOVE_RECURSE ${QKV_WORK})
set(prefix ${QKV_WORK}/prefix)
function(run)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed: ${ARGN}\n${out}\n${err}")
  endif()
  message(STATUS "${out}")
endfunction()
run(${CMAKE_COMMAND} --install ${QKV_BUILD_DIR} --prefix ${prefix})
run(${CMAKE_COMMAND} -S ${QKV_CONSUMER_SRC} -B ${QKV_WORK}/build -G ${QKV_GENERATOR}
    -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_CXX_COMPILER=${QKV_CXX} -DCMAKE_BUILD_TYPE=Release)
run(${CMAKE_COMMAND} --build ${QKV_WORK}/build)
run(${QKV_WORK}/build/consumer)
