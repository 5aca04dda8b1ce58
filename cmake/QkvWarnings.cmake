# qkv_warnings(target): the project's warning set. The DSL must stay warning-free with clang-19
# and g++-12 at -Wall -Wextra -Wpedantic; -Werror is on in the presets, not for packagers.
option(QKV_WERROR "Treat warnings as errors" OFF)
function(qkv_warnings target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor)
  if(QKV_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
endfunction()
