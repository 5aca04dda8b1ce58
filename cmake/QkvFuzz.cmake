# Fuzz targets (libFuzzer, clang's -fsanitize=fuzzer, with ASan + UBSan).
#
#   qkv_fuzz_target(<name> SOURCES <files...> LIBS <targets...> CORPUS <dir> [ARGS <libFuzzer flags...>])
#
# Built only when QKV_BUILD_FUZZ is ON and the compiler is clang (the LIBS are then instrumented
# for coverage as well). Each target gets a CTest `fuzz.<name>` (label `fuzz`) that runs it for
# QKV_FUZZ_SECONDS on a copy of its committed seed corpus; any crash, leak or sanitizer report
# fails the test.
set(QKV_FUZZ_SECONDS 20 CACHE STRING "Seconds each fuzz target runs under CTest")

function(qkv_fuzz_target name)
  cmake_parse_arguments(ARG "" "CORPUS" "SOURCES;LIBS;ARGS" ${ARGN})
  if(NOT QKV_BUILD_FUZZ)
    return()
  endif()
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(WARNING "qkv: fuzz target ${name} needs clang (-fsanitize=fuzzer); skipped")
    return()
  endif()
  # The libraries under test get libFuzzer's coverage instrumentation too, so that the fuzzer is
  # guided by the code it is testing and not only by the target's own file.
  foreach(lib IN LISTS ARG_LIBS)
    get_target_property(real ${lib} ALIASED_TARGET)
    if(NOT real)
      set(real ${lib})
    endif()
    target_compile_options(${real} PRIVATE -fsanitize=fuzzer-no-link)
  endforeach()
  add_executable(fuzz_${name} ${ARG_SOURCES})
  target_link_libraries(fuzz_${name} PRIVATE ${ARG_LIBS})
  target_compile_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=all)
  target_link_options(fuzz_${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  set(work ${CMAKE_CURRENT_BINARY_DIR}/fuzz_${name}_corpus)
  list(JOIN ARG_ARGS " " args)  # one shell command line
  add_test(NAME fuzz.${name}
           COMMAND ${CMAKE_COMMAND} -E env UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
                   sh -c "rm -rf '${work}' && mkdir -p '${work}' && cp -r '${ARG_CORPUS}'/. '${work}'/ && \
exec '$<TARGET_FILE:fuzz_${name}>' -max_total_time=${QKV_FUZZ_SECONDS} -timeout=10 -rss_limit_mb=2048 \
-print_final_stats=1 ${args} '${work}'")
  set_tests_properties(fuzz.${name} PROPERTIES LABELS fuzz TIMEOUT 300)
endfunction()
