/* What a fake CUDA driver (fake_cuda.c) lets tests see: exported as `fake_cuda_state`. */
#ifndef QKV_FAKE_CUDA_H
#define QKV_FAKE_CUDA_H

struct fake_cuda_state {
  int ctx_refs;                             /* primary context retains minus releases */
  int live_allocs;                          /* cuMemAlloc_v2 minus cuMemFree_v2 */
  int live_modules;                         /* cuModuleLoadDataEx minus cuModuleUnload */
  int live_events;                          /* cuEventCreate minus cuEventDestroy_v2 */
  int launches;                             /* successful cuLaunchKernel calls */
  unsigned grid[3], block[3], shared_bytes; /* of the last launch */
  int first_param;                          /* the int the last launch's first parameter points to */
  int max_dynamic_shared;                   /* the last CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES set */
};

#endif
