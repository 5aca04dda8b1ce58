/* A plain C program against a model compiled ahead of time by `qkv emit` (tests/e2e/aot/run.cmake):
 * it includes the generated header, links only the generated shared library (no qkv, no LLVM, no
 * C++ runtime), reads the inputs `qkv emit --example-dir` wrote, calls the function both ways
 * (typed and packed) and compares its output with the reference interpreter's.
 *
 *   usage: mha_main EXAMPLE_DIR        exit 0: agrees within 1e-4 · max(1, |ref|); 3: the library
 *   refused this CPU (the line naming the missing features on stderr); 1 otherwise */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha.h"

#include "npy_read.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: %s EXAMPLE_DIR\n", argv[0]);
    return 2;
  }
  const char* dir = argv[1];
  float* query = read_npy(dir, "query", MHA_QUERY_NUMEL, 4);
  float* in_w = read_npy(dir, "in_proj_weight", MHA_IN_PROJ_WEIGHT_NUMEL, 4);
  float* in_b = read_npy(dir, "in_proj_bias", MHA_IN_PROJ_BIAS_NUMEL, 4);
  float* out_w = read_npy(dir, "out_proj_weight", MHA_OUT_PROJ_WEIGHT_NUMEL, 4);
  float* out_b = read_npy(dir, "out_proj_bias", MHA_OUT_PROJ_BIAS_NUMEL, 4);
  uint8_t* keep = read_npy(dir, "key_keep", MHA_KEY_KEEP_NUMEL, 1);
  float* want = read_npy(dir, "out", MHA_OUT_NUMEL, 4);
  float* out = malloc(sizeof(float) * MHA_OUT_NUMEL);
  float* out_packed = malloc(sizeof(float) * MHA_OUT_NUMEL);
  if (!out || !out_packed) return 1;
  for (long i = 0; i < MHA_OUT_NUMEL; ++i) out[i] = out_packed[i] = NAN;

  const int rc = mha(query, in_w, in_b, out_w, out_b, keep, out);
  if (rc == MHA_ERROR_CPU) { /* built for a CPU this one is not: it says which features are missing */
    fprintf(stderr, "mha: %s\n", mha_check_cpu());
    return 3;
  }
  if (rc != 0) {
    fprintf(stderr, "mha() failed (%d)\n", rc);
    return 1;
  }
  void* args[MHA_NUM_ARGS] = {query, in_w, in_b, out_w, out_b, keep, out_packed};
  if (mha_packed(args) != 0) {
    fprintf(stderr, "mha_packed() failed\n");
    return 1;
  }
  double worst = 0.0;
  for (long i = 0; i < MHA_OUT_NUMEL; ++i) {
    if (out[i] != out_packed[i]) {
      fprintf(stderr, "typed and packed calls differ at %ld\n", i);
      return 1;
    }
    const double err = fabs((double)out[i] - want[i]) / fmax(1.0, fabs((double)want[i]));
    if (!(err <= worst)) worst = err; /* NaN (an unwritten output) propagates */
  }
  printf("max error against the reference interpreter: %.3g over %d outputs\n", worst, MHA_OUT_NUMEL);
  return worst <= 1e-4 ? 0 : 1;
}
