# qkv_warnings(target): the project's warning set. The DSL must stay warning-free with clang-19
# and g++-12 at -Wall -Wextra -Wpedantic; -Werror is on in the presets, not for packagers.
option(QKV_WERROR "Treat warnings as errors" OFF)
function(qkv_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
  if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_LESS 13)
    # GCC 12 false positives inside libstdc++'s std::string at -O2/-O3 (GCC PR 105329, 105651),
    # fixed in GCC 13; they point at no qkv code.
    target_compile_options(${target} PRIVATE -Wno-restrict -Wno-free-nonheap-object)
  endif()
  if(QKV_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
