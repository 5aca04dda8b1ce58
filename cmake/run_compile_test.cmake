# Driver for one compile test (see QkvCompileFail.cmake). Invoked with cmake -P and
#   MODE=fail|pass CXX=<compiler> STD=<-std=...> INCLUDES="<-I... -isystem...>" SOURCE=<file>
#   MAX_ERRORS=<n>
# and, for the derived style of a negative test,
#   STYLE=auto STYLE_HEADER=<style_auto.hpp> DERIVED=<where to write the rewritten source>
separate_arguments(inc UNIX_COMMAND "${INCLUDES}")

# compile(<source> <extra flags> <rc var> <log var>)
function(compile source extra rc_var log_var)
  execute_process(
    COMMAND ${CXX} ${STD} -fsyntax-only -Wall -Wextra -Wpedantic -fno-diagnostics-color ${inc} ${extra} ${source}
    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(log "${out}${err}")
  string(REPLACE ";" "<semicolon>" log "${log}")  # CMake lists split on ;
  set(${rc_var} ${rc} PARENT_SCOPE)
  set(${log_var} "${log}" PARENT_SCOPE)
endfunction()

# error_lines(<log> <list var>): every `error:` line, in order.
function(error_lines log out_var)
  string(REPLACE "\n" ";" lines "${log}")
  set(errors "")
  foreach(line IN LISTS lines)
    if(line MATCHES "(^|[: ])error: ")
      list(APPEND errors "${line}")
    endif()
  endforeach()
  set(${out_var} "${errors}" PARENT_SCOPE)
endfunction()

# check_rejected(<what> <rc> <log>): the rule for a negative test — it fails to compile, the
# FIRST `error:` line carries the expected text, at most MAX_ERRORS `error:` lines.
function(check_rejected what rc log)
  if(rc EQUAL 0)
    message(FATAL_ERROR "${what} compiled with ${CXX}, but it must not (expected: ${expected})")
  endif()
  error_lines("${log}" errors)
  list(LENGTH errors n_errors)
  if(n_errors EQUAL 0)
    message(FATAL_ERROR "${CXX} failed on ${what} without an `error:` line:\n${log}")
  endif()
  list(GET errors 0 first)
  string(FIND "${first}" "${expected}" pos)
  if(pos EQUAL -1)
    message(FATAL_ERROR "${what}: first error does not carry the expected text\n  expected: ${expected}\n"
                        "  first error: ${first}\nfull output:\n${log}")
  endif()
  if(n_errors GREATER MAX_ERRORS)
    message(FATAL_ERROR "${what}: ${n_errors} `error:` lines (at most ${MAX_ERRORS} allowed):\n${log}")
  endif()
  set(first "${first}" PARENT_SCOPE)
  set(n_errors ${n_errors} PARENT_SCOPE)
endfunction()

if(MODE STREQUAL "pass")
  compile(${SOURCE} "" rc log)
  if(NOT rc EQUAL 0 OR NOT log STREQUAL "")
    message(FATAL_ERROR "positive twin ${SOURCE} must compile cleanly with ${CXX}, but:\n${log}")
  endif()
  return()
endif()

file(READ ${SOURCE} src)
string(REPLACE ";" "<semicolon>" src "${src}")
string(REGEX MATCHALL "// expected-error: [^\n]*" expected_lines "${src}")
list(LENGTH expected_lines n_expected)
if(NOT n_expected EQUAL 1)
  message(FATAL_ERROR "${SOURCE}: needs exactly one `// expected-error: <text>` comment, found ${n_expected}")
endif()
string(REGEX REPLACE "^// expected-error: *" "" expected "${expected_lines}")
string(STRIP "${expected}" expected)

compile(${SOURCE} "" rc log)
check_rejected(${SOURCE} ${rc} "${log}")
if(NOT STYLE STREQUAL "auto")
  message(STATUS "ok: ${first}")
  return()
endif()

# The derived style: the bad statement (the line after the expected-error comment) computed in
# a lambda, its result captured and passed on to output() (tests/compile_fail/style_auto.hpp).
string(REGEX MATCH "// expected-error: [^\n]*\n[^\n]*" marked "${src}")
string(REGEX REPLACE "^[^\n]*\n" "" bad "${marked}")
set(declaration "^([ \t]*)(.*[^ \t])[ \t]+([A-Za-z_][A-Za-z0-9_]*|\\[[^=]*\\]) = (.*)<semicolon>[ \t]*(//.*)?$")
if(NOT bad MATCHES "${declaration}")
  message(FATAL_ERROR "${SOURCE}: the derived style needs the line after `// expected-error:` to be one "
                      "declaration `<type> <name> = <expression>;`, got:\n${bad}")
endif()
set(derived_line
    "${CMAKE_MATCH_1}${CMAKE_MATCH_2} ${CMAKE_MATCH_3} = [&] { return ${CMAKE_MATCH_4}; }(); qkv_cf_style::use(<names>);")
string(REGEX REPLACE "^\\[(.*)\\]$" "\\1" names "${CMAKE_MATCH_3}")  # `[out, weights]` -> `out, weights`
string(REPLACE "<names>" "${names}" derived_line "${derived_line}")
string(FIND "${src}" "${marked}" at)
string(LENGTH "${marked}" marked_length)
string(LENGTH "${bad}" bad_length)
math(EXPR bad_at "${at} + ${marked_length} - ${bad_length}")
string(SUBSTRING "${src}" 0 ${bad_at} before)
math(EXPR after_at "${at} + ${marked_length}")
string(SUBSTRING "${src}" ${after_at} -1 after)
set(derived_src "${before}${derived_line}${after}")
string(REPLACE "<semicolon>" ";" derived_src "${derived_src}")
file(WRITE ${DERIVED} "${derived_src}")

set(original_errors ${n_errors})
compile(${DERIVED} "-include;${STYLE_HEADER}" rc log)
check_rejected("${DERIVED} (derived from ${SOURCE})" ${rc} "${log}")
if(n_errors GREATER original_errors)
  message(FATAL_ERROR "${DERIVED} (derived from ${SOURCE}): ${n_errors} `error:` lines where the original prints "
                      "${original_errors} (poison spoke again):\n${log}")
endif()
message(STATUS "ok (style auto): ${first}")
