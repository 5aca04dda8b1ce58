/* Any model `qkv emit` compiled with fixed sizes, called from a plain C program through its packed
 * entry point on the inputs an --example-dir holds (arguments.txt says their order), its outputs
 * compared with the reference interpreter's. The cross-target matrix (matrix.cmake) builds it
 * for x86-64 and aarch64 and runs it under qemu-user with CPU models that lack AVX-512, AVX2, SVE.
 *
 *   cc -std=c11 -DQKV_FN=mha -DQKV_HEADER='"mha.h"' -I<dir of mha.h> aot_check.c mha.so -lm
 *   usage: aot_check EXAMPLE_DIR [TOLERANCE]
 *
 * Exit 0: every output within TOLERANCE · max(1, |reference|) (default 1e-4); 1: a difference, an
 * unwritten output or a failed call; 3: the library refused this CPU (it returned
 * <F>_ERROR_CPU; its <f>_check_cpu() line is printed). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include QKV_HEADER

#include "npy_read.h"

#define QKV_CAT2(a, b) a##b
#define QKV_CAT(a, b) QKV_CAT2(a, b)

enum { kMaxArgs = 256 };

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    fprintf(stderr, "usage: %s EXAMPLE_DIR [TOLERANCE]\n", argv[0]);
    return 1;
  }
  const char* dir = argv[1];
  const double tolerance = argc == 3 ? atof(argv[2]) : 1e-4;
  char path[4096];
  snprintf(path, sizeof path, "%s/arguments.txt", dir);
  FILE* list = fopen(path, "r");
  if (!list) {
    fprintf(stderr, "cannot open %s\n", path);
    return 1;
  }
  char name[kMaxArgs][128], role[kMaxArgs][16], dtype[kMaxArgs][16];
  void* args[kMaxArgs];
  void* want[kMaxArgs];
  long bytes[kMaxArgs];
  int n = 0;
  char line[512];
  while (fgets(line, sizeof line, list)) {
    if (line[0] == '#') continue;
    if (n == kMaxArgs || sscanf(line, "%127s %15s %15s", name[n], role[n], dtype[n]) != 3) {
      fprintf(stderr, "arguments.txt: cannot read \"%s\" (run-time sizes are not supported here)\n", line);
      return 1;
    }
    void* data = read_npy_bytes(dir, name[n], &bytes[n]);
    if (strcmp(role[n], "output") == 0) { /* the reference, and a buffer the call must fill */
      want[n] = data;
      args[n] = malloc((size_t)bytes[n] + 1);
      if (!args[n]) return 1;
      memset(args[n], 0xFF, (size_t)bytes[n]); /* f32 NaN: an element never written fails */
    } else {
      want[n] = NULL;
      args[n] = data;
    }
    ++n;
  }
  fclose(list);
  if (n != QKV_CAT(QKV_FN_UPPER, _NUM_ARGS)) {
    fprintf(stderr, "arguments.txt lists %d arguments, the header %d\n", n, QKV_CAT(QKV_FN_UPPER, _NUM_ARGS));
    return 1;
  }
  const int rc = QKV_CAT(QKV_FN, _packed)(args);
  if (rc == QKV_CAT(QKV_FN_UPPER, _ERROR_CPU)) {
    const char* why = QKV_CAT(QKV_FN, _check_cpu)();
    printf("refused: %s\n", why ? why : "(no reason given)");
    return why ? 3 : 1;
  }
  if (rc != 0) {
    fprintf(stderr, "the call returned %d\n", rc);
    return 1;
  }
  double worst = 0.0;
  long compared = 0;
  for (int k = 0; k < n; ++k) {
    if (!want[k]) continue;
    if (strcmp(dtype[k], "bool") == 0) {
      if (memcmp(args[k], want[k], (size_t)bytes[k]) != 0) worst = INFINITY;
      compared += bytes[k];
      continue;
    }
    if (strcmp(dtype[k], "f32") != 0 && strcmp(dtype[k], "i32") != 0 && strcmp(dtype[k], "i64") != 0) {
      fprintf(stderr, "%s: dtype %s is not compared here\n", name[k], dtype[k]);
      return 1;
    }
    const float* got = args[k];
    const float* ref = want[k];
    for (long i = 0; i < bytes[k] / 4; ++i) {
      const double err = fabs((double)got[i] - ref[i]) / fmax(1.0, fabs((double)ref[i]));
      if (!(err <= worst)) worst = err; /* NaN (an unwritten element) propagates */
    }
    compared += bytes[k] / 4;
  }
  printf("max error against the reference interpreter: %.3g over %ld outputs\n", worst, compared);
  return worst <= tolerance ? 0 : 1;
}
