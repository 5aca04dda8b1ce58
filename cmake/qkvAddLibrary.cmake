# qkv_add_library: a user's model compiled ahead of time as the project builds (docs/aot.md,
# lesson 13). Installed beside qkvConfig.cmake, which includes it.
#
#   qkv_add_library(<name> SOURCES model.cpp [more.cpp ...] FUNCTION <f>
#                   [CPU <cpu>] [FEATURES <+f,-g>] [TARGET <arch>]
#                   [DYNAMIC <Axis>[,<Axis> ...]] [SIZES <Axis>=<n> ...] [SHARED | STATIC])
#
# SOURCES make a generator: a program whose main() is QKV_AOT_MAIN(<function building a
# qkv::Graph>) (qkv/codegen/aot_main.hpp), linked with qkv::dsl, qkv::runtime and qkv::codegen.
# The build runs it to compile the graph into the C function <f>: lib<name>.so (SHARED, the
# default) or <name>.o (STATIC), with the header <name>.h, in ${CMAKE_CURRENT_BINARY_DIR}/<name>.qkv/.
# It runs again when the generator changes: its sources, or the qkv it links.
#
# <name> is an INTERFACE library: linking it links the compiled model and puts <name>.h on the
# include path; the generated code needs only the C library at run time. Sizes the graph leaves
# dynamic are fixed by SIZES unless DYNAMIC names them (they become int64_t arguments of <f>).
# CPU (default native) and FEATURES pick the instruction set, as `qkv emit --cpu/--features`.
function(qkv_add_library name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "SHARED;STATIC" "FUNCTION;CPU;FEATURES;TARGET" "SOURCES;DYNAMIC;SIZES")
  if(arg_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "qkv_add_library(${name}): unknown arguments: ${arg_UNPARSED_ARGUMENTS}")
  endif()
  if(NOT arg_SOURCES)
    message(FATAL_ERROR "qkv_add_library(${name}): SOURCES is required (the program building the graph)")
  endif()
  if(NOT arg_FUNCTION)
    message(FATAL_ERROR "qkv_add_library(${name}): FUNCTION is required (the C name of the compiled model)")
  endif()
  if(arg_SHARED AND arg_STATIC)
    message(FATAL_ERROR "qkv_add_library(${name}): SHARED or STATIC, not both")
  endif()
  if(NOT arg_CPU)
    set(arg_CPU native)
  endif()

  set(dir ${CMAKE_CURRENT_BINARY_DIR}/${name}.qkv)
  if(arg_STATIC)
    set(library ${dir}/${name}.o)
  else()
    set(library ${dir}/lib${name}.so)
  endif()
  set(header ${dir}/${name}.h)

  add_executable(${name}_generator ${arg_SOURCES})
  target_link_libraries(${name}_generator PRIVATE qkv::dsl qkv::runtime qkv::codegen)
  target_compile_features(${name}_generator PRIVATE cxx_std_20)

  set(flags -o ${library} --header ${header} --function ${arg_FUNCTION} --cpu ${arg_CPU})
  if(arg_FEATURES)
    list(APPEND flags --features ${arg_FEATURES})
  endif()
  if(arg_TARGET)
    list(APPEND flags --target ${arg_TARGET})
  endif()
  if(arg_DYNAMIC)
    string(REPLACE ";" "," dynamic "${arg_DYNAMIC}")
    list(APPEND flags --dynamic ${dynamic})
  endif()
  if(arg_SIZES)
    string(REPLACE ";" "," sizes "${arg_SIZES}")
    list(APPEND flags --sizes ${sizes})
  endif()
  add_custom_command(
    OUTPUT ${library} ${header}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${name}_generator ${flags}
    DEPENDS ${name}_generator
    COMMENT "qkv: compiling the model ${name} (${arg_FUNCTION}, CPU ${arg_CPU})"
    VERBATIM)
  add_custom_target(${name}_compile DEPENDS ${library} ${header})

  add_library(${name} INTERFACE)
  target_include_directories(${name} INTERFACE ${dir})
  target_link_libraries(${name} INTERFACE ${library})
  if(TARGET Threads::Threads)
    target_link_libraries(${name} INTERFACE Threads::Threads)
  endif()
  add_dependencies(${name} ${name}_compile)
endfunction()
