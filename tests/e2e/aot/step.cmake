# step(COMMAND...): runs a command in ${WORK}, prints it and what it wrote, fails the script unless
# it exits 0; its stdout is left in `last_output`. Included by the AOT end-to-end scripts.
function(step)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  message(STATUS "$ ${ARGN}\n${out}${err}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (exit ${rc})")
  endif()
  set(last_output "${out}" PARENT_SCOPE)
endfunction()
