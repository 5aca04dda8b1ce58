/* A pretend libcuda.so.1 for tests/unit/runtime/test_cuda_driver.cpp, built several times with
 *   FAKE_INIT_RESULT   what cuInit returns (default 0)
 *   FAKE_DEVICE_COUNT  what cuDeviceGetCount reports (default 1)
 *   FAKE_NO_LAUNCH     to leave cuLaunchKernel out.
 * "Device" memory is host memory. A module fails to load (CUDA_ERROR_INVALID_PTX, with a ptxas-like
 * error log) when its text contains "invalid"; its one kernel is called "kernel". */
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_cuda.h"

#ifndef FAKE_INIT_RESULT
#define FAKE_INIT_RESULT 0
#endif
#ifndef FAKE_DEVICE_COUNT
#define FAKE_DEVICE_COUNT 1
#endif
#define API __attribute__((visibility("default")))

typedef unsigned long long CUdeviceptr;
enum { OK = 0, INVALID_VALUE = 1, OUT_OF_MEMORY = 2, INVALID_DEVICE = 101, INVALID_CONTEXT = 201, NOT_FOUND = 500 };
static const size_t total_mem = 80ull << 30;
static int ctx, module, function;

API struct fake_cuda_state fake_cuda_state;

static const char* error_text(int rc, int name) {
  switch (rc) {
    case OUT_OF_MEMORY:
      return name ? "CUDA_ERROR_OUT_OF_MEMORY" : "out of memory";
    case 100:
      return name ? "CUDA_ERROR_NO_DEVICE" : "no CUDA-capable device is detected";
    case 218:
      return name ? "CUDA_ERROR_INVALID_PTX" : "a PTX JIT compilation failed";
    case NOT_FOUND:
      return name ? "CUDA_ERROR_NOT_FOUND" : "named symbol not found";
    default:
      return NULL;
  }
}
API int cuGetErrorName(int rc, const char** s) { return (*s = error_text(rc, 1)) ? OK : INVALID_VALUE; }
API int cuGetErrorString(int rc, const char** s) { return (*s = error_text(rc, 0)) ? OK : INVALID_VALUE; }

API int cuInit(unsigned flags) { return flags ? INVALID_VALUE : FAKE_INIT_RESULT; }
API int cuDriverGetVersion(int* v) {
  *v = 12040;
  return OK;
}
API int cuDeviceGetCount(int* n) {
  *n = FAKE_DEVICE_COUNT;
  return OK;
}
API int cuDeviceGet(int* d, int ordinal) {
  *d = ordinal;
  return ordinal < FAKE_DEVICE_COUNT ? OK : INVALID_DEVICE;
}
API int cuDeviceGetName(char* s, int len, int d) {
  (void)d;
  snprintf(s, (size_t)len, "qkv fake GPU");
  return OK;
}
API int cuDeviceGetAttribute(int* v, int attr, int d) {
  (void)d;
  switch (attr) {
    case 16:
      *v = 132;
      return OK; /* SMs */
    case 75:
      *v = 9;
      return OK; /* compute capability 9.0 */
    case 76:
      *v = 0;
      return OK;
    case 97:
      *v = 232448;
      return OK; /* shared memory per block, opt-in */
    default:
      return INVALID_VALUE;
  }
}
API int cuDeviceTotalMem_v2(size_t* bytes, int d) {
  (void)d;
  *bytes = total_mem;
  return OK;
}
API int cuDevicePrimaryCtxRetain(void** c, int d) {
  (void)d;
  *c = &ctx;
  ++fake_cuda_state.ctx_refs;
  return OK;
}
API int cuDevicePrimaryCtxRelease_v2(int d) {
  (void)d;
  --fake_cuda_state.ctx_refs;
  return OK;
}
API int cuCtxSetCurrent(void* c) { return c == &ctx && fake_cuda_state.ctx_refs > 0 ? OK : INVALID_CONTEXT; }
API int cuCtxSynchronize(void) { return OK; }

API int cuMemAlloc_v2(CUdeviceptr* p, size_t n) {
  void* m = n <= total_mem ? malloc(n) : NULL;
  if (!m) return OUT_OF_MEMORY;
  *p = (CUdeviceptr)(uintptr_t)m;
  ++fake_cuda_state.live_allocs;
  return OK;
}
API int cuMemFree_v2(CUdeviceptr p) {
  free((void*)(uintptr_t)p);
  --fake_cuda_state.live_allocs;
  return OK;
}
API int cuMemcpyHtoD_v2(CUdeviceptr dst, const void* src, size_t n) {
  memcpy((void*)(uintptr_t)dst, src, n);
  return OK;
}
API int cuMemcpyDtoH_v2(void* dst, CUdeviceptr src, size_t n) {
  memcpy(dst, (void*)(uintptr_t)src, n);
  return OK;
}
API int cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) {
  memset((void*)(uintptr_t)p, v, n);
  return OK;
}

API int cuModuleLoadDataEx(void** m, const void* image, unsigned n, int* options, void** values) {
  if (!strstr((const char*)image, "invalid")) {
    *m = &module;
    ++fake_cuda_state.live_modules;
    return OK;
  }
  char* log = NULL;
  size_t size = 0;
  for (unsigned i = 0; i < n; ++i) {
    if (options[i] == 5) log = (char*)values[i];              /* CU_JIT_ERROR_LOG_BUFFER */
    if (options[i] == 6) size = (size_t)(uintptr_t)values[i]; /* CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES */
  }
  if (log && size) snprintf(log, size, "ptxas application ptx input, line 3; error   : Unknown symbol 'invalid'\n");
  return 218;
}
API int cuModuleGetFunction(void** f, void* m, const char* name) {
  if (m != &module || strcmp(name, "kernel") != 0) return NOT_FOUND;
  *f = &function;
  return OK;
}
API int cuModuleUnload(void* m) {
  (void)m;
  --fake_cuda_state.live_modules;
  return OK;
}
API int cuFuncSetAttribute(void* f, int attr, int v) {
  if (f != &function || attr != 8) return INVALID_VALUE;
  fake_cuda_state.max_dynamic_shared = v;
  return OK;
}
#ifndef FAKE_NO_LAUNCH
API int cuLaunchKernel(void* f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                       unsigned shared, void* stream, void** params, void** extra) {
  struct fake_cuda_state* s = &fake_cuda_state;
  if (f != &function || stream || extra || !params) return INVALID_VALUE;
  if (shared > 48 * 1024 && shared > (unsigned)s->max_dynamic_shared) return INVALID_VALUE;
  s->grid[0] = gx, s->grid[1] = gy, s->grid[2] = gz;
  s->block[0] = bx, s->block[1] = by, s->block[2] = bz;
  s->shared_bytes = shared;
  s->first_param = *(const int*)params[0];
  ++s->launches;
  return OK;
}
#endif

API int cuEventCreate(void** e, unsigned flags) {
  if (flags) return INVALID_VALUE;
  *e = malloc(1);
  ++fake_cuda_state.live_events;
  return OK;
}
API int cuEventRecord(void* e, void* stream) { return e && !stream ? OK : INVALID_VALUE; }
API int cuEventSynchronize(void* e) { return e ? OK : INVALID_VALUE; }
API int cuEventElapsedTime(float* ms, void* start, void* stop) {
  *ms = 1.5f;
  return start && stop ? OK : INVALID_VALUE;
}
API int cuEventDestroy_v2(void* e) {
  free(e);
  --fake_cuda_state.live_events;
  return OK;
}
