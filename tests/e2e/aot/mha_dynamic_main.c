/* A plain C program against a model compiled ahead of time with run-time sizes (`qkv emit …
 * --dynamic Batch,Seq,Key`, tests/e2e/aot/run.cmake): ONE library, called at the sizes of two
 * example directories that `qkv emit --example-dir` wrote for different batch sizes and lengths,
 * each compared with the reference interpreter's output; then sizes that break the model's
 * shape check (Key != Seq in self-attention) and a negative size, which must be refused with 2.
 *
 *   usage: mha_dynamic_main DIR BATCH LEN [DIR BATCH LEN ...]     exit 0: all agree within 1e-4 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mha_dyn.h"

#include "npy_read.h"

#define E MHA_DYN_OUT_PROJ_BIAS_NUMEL /* the model width: fixed, so the header has its size */

static int check(const char* dir, int64_t batch, int64_t len) {
  const long x_count = (long)(batch * len * E);
  float* query = read_npy(dir, "query", x_count, 4);
  float* in_w = read_npy(dir, "in_proj_weight", MHA_DYN_IN_PROJ_WEIGHT_NUMEL, 4);
  float* in_b = read_npy(dir, "in_proj_bias", MHA_DYN_IN_PROJ_BIAS_NUMEL, 4);
  float* out_w = read_npy(dir, "out_proj_weight", MHA_DYN_OUT_PROJ_WEIGHT_NUMEL, 4);
  float* out_b = read_npy(dir, "out_proj_bias", MHA_DYN_OUT_PROJ_BIAS_NUMEL, 4);
  uint8_t* keep = read_npy(dir, "key_keep", (long)(batch * len), 1);
  float* want = read_npy(dir, "out", x_count, 4);
  float* out = malloc(sizeof(float) * (size_t)x_count);
  if (!out) return 1;
  for (long i = 0; i < x_count; ++i) out[i] = NAN;
  /* The sizes in the header's order: Batch, Key, Seq. */
  if (mha_dyn(batch, len, len, query, in_w, in_b, out_w, out_b, keep, out) != 0) {
    fprintf(stderr, "mha_dyn() failed at batch %lld, length %lld\n", (long long)batch, (long long)len);
    return 1;
  }
  double worst = 0.0;
  for (long i = 0; i < x_count; ++i) {
    const double err = fabs((double)out[i] - want[i]) / fmax(1.0, fabs((double)want[i]));
    if (!(err <= worst)) worst = err; /* NaN (an unwritten output) propagates */
  }
  printf("batch %lld, length %lld: max error against the reference interpreter %.3g over %ld outputs\n",
         (long long)batch, (long long)len, worst, x_count);
  int rc = worst <= 1e-4 ? 0 : 1;
  /* Refused sizes: nothing may be computed, and the call says 2. */
  const int64_t sizes_unequal[MHA_DYN_NUM_SIZES] = {batch, len + 1, len};
  void* args[MHA_DYN_NUM_ARGS] = {query, in_w, in_b, out_w, out_b, keep, out};
  if (mha_dyn_packed(sizes_unequal, args) != 2) {
    fprintf(stderr, "Key != Seq was not refused\n");
    rc = 1;
  }
  if (mha_dyn(-batch, len, len, query, in_w, in_b, out_w, out_b, keep, out) != 2) {
    fprintf(stderr, "a negative batch was not refused\n");
    rc = 1;
  }
  free(query), free(in_w), free(in_b), free(out_w), free(out_b), free(keep), free(want), free(out);
  return rc;
}

int main(int argc, char** argv) {
  if (argc < 4 || (argc - 1) % 3 != 0) {
    fprintf(stderr, "usage: %s DIR BATCH LEN [DIR BATCH LEN ...]\n", argv[0]);
    return 2;
  }
  int rc = 0;
  for (int a = 1; a + 2 < argc; a += 3) rc |= check(argv[a], atoll(argv[a + 1]), atoll(argv[a + 2]));
  return rc;
}
