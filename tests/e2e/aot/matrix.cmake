# The cross-target matrix (docs/aot.md, "Portability"): small models emitted for x86-64-v2, -v3,
# -v4 and native, and for aarch64 (generic, neoverse-n1, neoverse-v1), each called from the plain
# C program aot_check.c under qemu-user with a CPU model chosen to have — or to lack — what the
# library needs: a library that fits its CPU must give the interpreter's outputs; one that does
# not must refuse with its error code and the line naming the missing features (never SIGILL).
#   cmake -DQKV=... -DCC=... -DSRC=... -DWORK=... [-DQEMU_X86=...] [-DAARCH64_CC=... -DQEMU_AARCH64=...]
#         -P matrix.cmake
# A part whose qemu or cross compiler is missing is skipped with a line saying so (CTest reports
# the test as skipped when nothing ran).
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(run)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(rc "${rc}" PARENT_SCOPE)
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()

# name -> the `qkv emit` model arguments: the fused attention and GEMM (mha), the row-wise kernels
# and activations (encoder-layer), the split-KV decode kernel (two queries over 150 keys, GQA).
set(model_mha mha --batch 2 --heads 4 --seq 19 --embed-dim 32 --padding --seed 3)
set(model_enc encoder-layer --batch 2 --heads 2 --seq 11 --embed-dim 32 --seed 4)
set(model_dec sdpa --batch 1 --heads 4 --kv-heads 2 --seq 2 --kv-seq 150 --head-dim 32 --causal bottom-right --seed 5)

set(ran 0)
set(failures "")

# Emits `model` for (target, cpu) and builds aot_check against it with `cc`: ${dir}/check.
function(build target cpu model cc)
  set(dir ${WORK}/${target}_${cpu}_${model})
  file(MAKE_DIRECTORY ${dir})
  run(${QKV} emit ${model_${model}} --target ${target} --cpu ${cpu} --format so --function m -o ${dir}/m.so
      --example-dir ${dir}/example)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "qkv emit ${model} --target ${target} --cpu ${cpu} failed (${rc}):\n${out}")
  endif()
  run(${cc} -std=c11 -O2 -DQKV_FN=m -DQKV_FN_UPPER=M "-DQKV_HEADER=\"m.h\"" -I${dir} -I${SRC} ${SRC}/aot_check.c
      ${dir}/m.so -Wl,-rpath,${dir} -lm -o ${dir}/check)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "building aot_check for ${target}/${cpu}/${model} failed:\n${out}")
  endif()
endfunction()

# Runs ${dir}/check (through `runner…`, may be empty) and expects `want`: "ok" or "refused".
function(check target cpu model want label)
  set(dir ${WORK}/${target}_${cpu}_${model})
  run(${ARGN} ${dir}/check ${dir}/example)
  set(verdict "${target} --cpu ${cpu}, ${model}, on ${label}: exit ${rc}: ${out}")
  string(STRIP "${verdict}" verdict)
  message(STATUS "${verdict}")
  if(want STREQUAL "ok" AND NOT rc EQUAL 0)
    set(failures "${failures}\n  expected the interpreter's outputs: ${verdict}" PARENT_SCOPE)
  elseif(want STREQUAL "refused" AND NOT (rc EQUAL 3 AND out MATCHES "this CPU lacks"))
    set(failures "${failures}\n  expected a refusal (error code, missing features named): ${verdict}" PARENT_SCOPE)
  endif()
  math(EXPR n "${ran} + 1")
  set(ran ${n} PARENT_SCOPE)
endfunction()

# --- x86-64 ------------------------------------------------------------------------------------
execute_process(COMMAND uname -m OUTPUT_VARIABLE host_arch OUTPUT_STRIP_TRAILING_WHITESPACE)
# Whether this host runs AVX-512 code, as qkv (LLVM's host detection: cpuid and XCR0) sees it.
execute_process(COMMAND ${QKV} host OUTPUT_VARIABLE host_report)
string(REGEX MATCH "requires:[^\n]* avx512f" HOST_AVX512 "${host_report}")
if(host_arch STREQUAL "x86_64")
  foreach(model mha enc dec)
    foreach(cpu x86-64-v2 x86-64-v3 x86-64-v4 native)
      build(x86_64 ${cpu} ${model} ${CC})
    endforeach()
    check(x86_64 native ${model} ok "this host")
    if(HOST_AVX512)
      check(x86_64 x86-64-v4 ${model} ok "this host (AVX-512)")
    else()
      check(x86_64 x86-64-v4 ${model} refused "this host (no AVX-512)")
    endif()
    if(QEMU_X86)
      # Nehalem: SSE4.2, no AVX. Haswell: AVX2 and FMA, no AVX-512 (qemu's TCG runs up to AVX2).
      check(x86_64 x86-64-v2 ${model} ok "qemu Nehalem" ${QEMU_X86} -cpu Nehalem)
      check(x86_64 x86-64-v3 ${model} ok "qemu Haswell" ${QEMU_X86} -cpu Haswell-noTSX)
      check(x86_64 x86-64-v3 ${model} refused "qemu Nehalem" ${QEMU_X86} -cpu Nehalem)
      check(x86_64 x86-64-v4 ${model} refused "qemu Haswell" ${QEMU_X86} -cpu Haswell-noTSX)
    endif()
  endforeach()
  if(NOT QEMU_X86)
    message(STATUS "skipped: x86-64 levels under qemu (no qemu-x86_64; scripts/setup installs qemu-user)")
  endif()
else()
  message(STATUS "skipped: the x86-64 part (this host is ${host_arch})")
endif()

# --- aarch64 -----------------------------------------------------------------------------------
if(AARCH64_CC AND QEMU_AARCH64)
  set(qemu ${QEMU_AARCH64} -L /usr/aarch64-linux-gnu)
  foreach(model mha enc dec)
    build(aarch64 generic ${model} ${AARCH64_CC})
    check(aarch64 generic ${model} ok "qemu cortex-a57" ${qemu} -cpu cortex-a57)
  endforeach()
  build(aarch64 neoverse-n1 mha ${AARCH64_CC})
  check(aarch64 neoverse-n1 mha ok "qemu neoverse-n1" ${qemu} -cpu neoverse-n1)
  check(aarch64 neoverse-n1 mha refused "qemu cortex-a57" ${qemu} -cpu cortex-a57)
  build(aarch64 neoverse-v1 mha ${AARCH64_CC})
  check(aarch64 neoverse-v1 mha ok "qemu max (SVE)" ${qemu} -cpu max)
  check(aarch64 neoverse-v1 mha refused "qemu neoverse-n1 (no SVE)" ${qemu} -cpu neoverse-n1)
else()
  message(STATUS "skipped: aarch64 (needs aarch64-linux-gnu-gcc and qemu-aarch64; scripts/setup installs them)")
endif()

if(NOT failures STREQUAL "")
  message(FATAL_ERROR "the cross-target matrix failed:${failures}")
endif()
if(ran EQUAL 0)
  message(STATUS "QKV_MATRIX_SKIPPED: nothing could run here")
else()
  message(STATUS "${ran} runs as expected")
endif()
