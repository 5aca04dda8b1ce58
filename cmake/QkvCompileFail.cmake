# Must-not-compile tests.
#
#   qkv_compile_fail(<file.cpp> [PASS <twin.cpp>])
#
# Registers, for each compiler qkv supports (clang-19 and g++-12, whichever is installed):
#   compile_fail.<name>.<cc>  runs `<cc> -fsyntax-only` on <file.cpp> with the DSL's flags and
#                             include dirs and passes only if (1) compilation fails, (2) the
#                             FIRST `error:` line contains the text of the `// expected-error:`
#                             comment in the file, and (3) there are at most QKV_MAX_ERRORS
#                             `error:` lines (one diagnostic per mistake, no template backtrace).
#   compile_fail_auto.<name>.<cc>
#                             the same rule for <file.cpp> rewritten in a second style derived
#                             mechanically: the line after the expected-error comment (one
#                             declaration `<type> <name> = <expr>;`) becomes
#                             `<type> <name> = [&] { return <expr>; }(); qkv_cf_style::use(<name>);`
#                             — the result computed in a lambda, captured and passed on to
#                             output() (tests/compile_fail/style_auto.hpp). It must also print no
#                             more `error:` lines than the original: poison never speaks twice.
#   compile_pass.<twin>.<cc>  the positive twin: must compile with no diagnostics at all
#                             (-Werror with the project's warning set).
#
# Language modes: g++-12 runs in C++20. clang-19 runs in C++2c because clang only prints a
# computed static_assert message (P2741) in that mode; in plain C++20 clang elides NTTP strings
# after 36 characters. See docs/diagnostics.md.
set(QKV_MAX_ERRORS 2 CACHE STRING "Most `error:` lines a negative compile test may print")

find_program(QKV_CLANGXX NAMES clang++-19)
find_program(QKV_GXX NAMES g++-12)
set(QKV_COMPILE_FAIL_DRIVER ${CMAKE_CURRENT_LIST_DIR}/run_compile_test.cmake)
set(QKV_COMPILE_FAIL_STYLE_HEADER ${PROJECT_SOURCE_DIR}/tests/compile_fail/style_auto.hpp)

function(_qkv_compilers out)
  set(list "")
  if(QKV_CLANGXX)
    list(APPEND list "clang|${QKV_CLANGXX}|-std=c++2c")
  endif()
  if(QKV_GXX)
    list(APPEND list "gcc|${QKV_GXX}|-std=c++20")
  endif()
  set(${out} "${list}" PARENT_SCOPE)
endfunction()

function(_qkv_dsl_include_flags out)
  get_target_property(dirs qkv_dsl_headers INTERFACE_INCLUDE_DIRECTORIES)
  set(flags "")
  foreach(d IN LISTS dirs)
    string(REGEX REPLACE "^\\$<BUILD_INTERFACE:(.*)>$" "\\1" d "${d}")
    if(d MATCHES "^\\$<INSTALL_INTERFACE")
      continue()
    endif()
    list(APPEND flags "-I${d}")
  endforeach()
  foreach(d IN LISTS Boost_INCLUDE_DIRS)
    if(NOT d STREQUAL "/usr/include")  # already a system dir; -isystem would reorder libstdc++'s
      list(APPEND flags "-isystem${d}")
    endif()
  endforeach()
  set(${out} "${flags}" PARENT_SCOPE)
endfunction()

# _qkv_add_compile_test(<fail|pass> <file> [<style>]): one test per compiler.
function(_qkv_add_compile_test mode file)
  set(style "${ARGN}")
  get_filename_component(name ${file} NAME_WE)
  get_filename_component(abs ${file} ABSOLUTE)
  _qkv_compilers(compilers)
  _qkv_dsl_include_flags(includes)
  string(REPLACE ";" " " includes "${includes}")
  set(prefix compile_${mode})
  set(style_args "")
  foreach(entry IN LISTS compilers)
    string(REPLACE "|" ";" entry "${entry}")
    list(GET entry 0 cc_name)
    list(GET entry 1 cc)
    list(GET entry 2 std)
    if(style)
      set(prefix compile_${mode}_${style})
      set(style_args -DSTYLE=${style} -DSTYLE_HEADER=${QKV_COMPILE_FAIL_STYLE_HEADER}
                     -DDERIVED=${CMAKE_CURRENT_BINARY_DIR}/compile_${mode}_${style}/${name}.${cc_name}.cpp)
    endif()
    set(test ${prefix}.${name}.${cc_name})
    add_test(NAME ${test}
             COMMAND ${CMAKE_COMMAND} -DMODE=${mode} -DCXX=${cc} -DSTD=${std} "-DINCLUDES=${includes}"
                     -DSOURCE=${abs} -DMAX_ERRORS=${QKV_MAX_ERRORS} ${style_args} -P ${QKV_COMPILE_FAIL_DRIVER})
    set_tests_properties(${test} PROPERTIES LABELS compile_fail)
  endforeach()
endfunction()

function(qkv_compile_fail file)
  cmake_parse_arguments(ARG "" "PASS" "" ${ARGN})
  if(NOT QKV_CLANGXX AND NOT QKV_GXX)
    message(WARNING "qkv: neither clang++-19 nor g++-12 found; compile-fail tests not registered")
    return()
  endif()
  _qkv_add_compile_test(fail ${file})
  _qkv_add_compile_test(fail ${file} auto)
  if(ARG_PASS)
    _qkv_add_compile_test(pass ${ARG_PASS})
  else()
    message(FATAL_ERROR "qkv_compile_fail(${file}): every negative case needs a positive twin (PASS)")
  endif()
endfunction()
