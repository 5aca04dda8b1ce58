# Driver for one compile test (see QkvCompileFail.cmake). Invoked with cmake -P and
#   MODE=fail|pass CXX=<compiler> STD=<-std=...> INCLUDES="<-I... -isystem...>" SOURCE=<file>
#   MAX_ERRORS=<n>
separate_arguments(inc UNIX_COMMAND "${INCLUDES}")
execute_process(
  COMMAND ${CXX} ${STD} -fsyntax-only -Wall -Wextra -Wpedantic -fno-diagnostics-color ${inc} ${SOURCE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
set(log "${out}${err}")

if(MODE STREQUAL "pass")
  if(NOT rc EQUAL 0 OR NOT log STREQUAL "")
    message(FATAL_ERROR "positive twin ${SOURCE} must compile cleanly with ${CXX}, but:\n${log}")
  endif()
  return()
endif()

# Semicolons are CMake's list separator: mask them in everything we split or compare.
file(READ ${SOURCE} src)
string(REPLACE ";" "<semicolon>" src "${src}")
string(REPLACE ";" "<semicolon>" log "${log}")
string(REGEX MATCHALL "// expected-error: [^\n]*" expected_lines "${src}")
list(LENGTH expected_lines n_expected)
if(NOT n_expected EQUAL 1)
  message(FATAL_ERROR "${SOURCE}: needs exactly one `// expected-error: <text>` comment, found ${n_expected}")
endif()
string(REGEX REPLACE "^// expected-error: *" "" expected "${expected_lines}")
string(STRIP "${expected}" expected)

if(rc EQUAL 0)
  message(FATAL_ERROR "${SOURCE} compiled with ${CXX}, but it must not (expected: ${expected})")
endif()

# Every `error:` line, in order.
string(REPLACE "\n" ";" lines "${log}")
set(errors "")
foreach(line IN LISTS lines)
  if(line MATCHES "(^|[: ])error: ")
    list(APPEND errors "${line}")
  endif()
endforeach()
list(LENGTH errors n_errors)
if(n_errors EQUAL 0)
  message(FATAL_ERROR "${CXX} failed on ${SOURCE} without an `error:` line:\n${log}")
endif()
list(GET errors 0 first)
string(FIND "${first}" "${expected}" pos)
if(pos EQUAL -1)
  message(FATAL_ERROR "first error does not carry the expected text\n  expected: ${expected}\n  first error: ${first}\nfull output:\n${log}")
endif()
if(n_errors GREATER MAX_ERRORS)
  message(FATAL_ERROR "${n_errors} `error:` lines (at most ${MAX_ERRORS} allowed):\n${log}")
endif()
message(STATUS "ok: ${first}")
